"""The Engine facade: one checkpoint served by one engine thread. Requests are tokenized, fitted to the model's
limits (engine/runtime/fitting.py) and finished on the caller's thread, one queue item per input, results in
input order; the load (engine/runtime/loader.py) runs on the engine thread."""
from __future__ import annotations

import concurrent.futures
import itertools
import math
import threading
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

import numpy as np

from engine.compute.labels import label_scores
from engine.compute.maxsim import maxsim_scores
from engine.compute.normalize import check_dimensions, finish
from engine.compute.sparse import check_max_active_dims, sparsify
from engine.errors import InvalidInput, NotLoaded, NotSparse, ReplyTimeout, SparseOnly
from engine.loading import registry
from engine.multimodal.images import InvalidImage, decode
from engine.multimodal.inputs import PreparedInput
from engine.multimodal.pairs import RerankSide
from engine.runtime import fitting, loader, threads
from engine.runtime.loader import ServedModel
from engine.runtime.scheduler import BatchLimits
from engine.runtime.worker import ImageWork, ItemResult, MaskedWork, Runner, SegmentedWork, Worker
from engine.text.late_interaction import DOCUMENT, QUERY, ROLES
from engine.text.prompts import choose_prompt, choose_task, format_prompts, is_text, task_index
from engine.text.tokenizer import TextTokenizer
from engine.types import (
    ClassifyResult,
    EmbedResult,
    EngineOptions,
    ImageInput,
    ModelInfo,
    Pooling,
    RerankItem,
    RerankResult,
    SparseResult,
    Timings,
    TokenSpan,
)

T = TypeVar("T")

CLASSIFIER_ROUTES = ("this server runs a sequence classifier ({n} labels): it serves label scores on /predict (TEI) "
                     "and /classify (vLLM), {what}")


def _label(labels: Sequence[str] | None, index: int) -> str:
    return labels[index] if labels is not None else f"input {index}"


def _labelled(label: str, build: Callable[[], T]) -> T:
    """build(), any InvalidInput it raises (a bad image, image tokens spelled in text, a template's refusal)
    naming the input it is about."""
    try:
        return build()
    except InvalidInput as exc:
        raise (InvalidImage if isinstance(exc, InvalidImage) else InvalidInput)(f"{label}: {exc}") from None


def _finished(future: concurrent.futures.Future, timeout_s: float) -> bool:
    """Whether the future ended (result, error or cancelled) within timeout_s."""
    try:
        future.exception(timeout=timeout_s)
    except concurrent.futures.TimeoutError:
        return False
    except concurrent.futures.CancelledError:
        pass
    return True


def _cost(item: list[int] | ImageWork | PreparedInput) -> int:
    """What an input counts as in usage: its tokens, image tokens included (a tower's image: its patches)."""
    if isinstance(item, ImageWork):
        return item.n_tokens
    return len(item.ids) if isinstance(item, PreparedInput) else len(item)


class Engine:
    """One checkpoint served by one engine thread. Construction returns at once; the load runs there."""

    def __init__(self, options: EngineOptions):
        self.options = options
        self.model_ref = options.model_path or options.hf_repo or ""
        self._model: ServedModel | None = None  # set by the load
        self._in_flight = 0
        self._in_flight_lock = threading.Lock()
        self.load_s: float | None = None  # how long the load took, once it succeeded
        self._closing = False
        self.released = threading.Event()  # set once close() has freed the model's memory
        self._lanes, self._blas_threads = threads.plan(options.threads)
        self._worker = Worker(self._load, options.max_queue_items, lanes=self._lanes)

    def _load(self) -> tuple[Runner, int, BatchLimits]:
        """The worker's load step (on the engine thread)."""
        runner, model = loader.load(self.options, self._lanes, self._blas_threads)
        self._model = model
        self.load_s = model.load_s
        return runner, model.tokenizer.pad_id, model.batch_limits

    # -- state ------------------------------------------------------------------------------------
    @property
    def is_loaded(self) -> bool:
        return self._worker.loaded.is_set() and self._worker.load_error is None and not self._closing

    def wait_loaded(self, timeout: float | None = None) -> ModelInfo:
        if not self._worker.loaded.wait(timeout):
            raise NotLoaded("the model is still loading")
        if self._worker.load_error is not None:
            raise self._worker.load_error
        return self.info

    def _served(self) -> ServedModel:
        if self._model is None or not self.is_loaded:
            raise NotLoaded("the model is not loaded")
        return self._model

    @property
    def info(self) -> ModelInfo:
        return self._served().info

    @property
    def tokenizer(self) -> TextTokenizer:
        return self._served().tokenizer

    # -- tokens -----------------------------------------------------------------------------------
    def encode_prompt(self, parts: Sequence[str | int], add_special: bool = True,
                      parse_special: bool = True) -> list[int]:
        return self.tokenizer.encode_prompt(parts, add_special, parse_special)

    def token_pieces(self, ids: Sequence[int]) -> list[str | list[int]]:
        model = self._served()
        return model.tokenizer.pieces(model.fitter.known(ids))

    def decode(self, ids: Sequence[int], skip_special: bool = False) -> str:
        model = self._served()
        return model.tokenizer.decode(model.fitter.known(ids), skip_special)

    def token_spans(self, text: str, add_special: bool = True) -> list[TokenSpan]:
        """`text`'s tokens with their texts, whether special, and UTF-8 byte offsets (TEI's /tokenize)."""
        return self.tokenizer.token_spans(text, add_special)

    def check_count(self, n_inputs: int) -> None:
        """TooManyInputs when one request has more inputs than the engine queue can ever hold. embed, embed_prompts
        and rerank check it before tokenizing or decoding; a server checks it before format_prompts and before
        fetching images (the Encoder calls format_prompts on more texts than one submission holds)."""
        self._worker.check_count(n_inputs)

    # -- embeddings -------------------------------------------------------------------------------
    def choose_task(self, task: str | None, prompt_name: str | None = None) -> str | None:
        """The task adapter a request runs with: `task`, else prompt_name's task, else the default (None: the
        adapters off); InvalidInput for one the model lacks (engine/text/prompts.py choose_task)."""
        return choose_task(self._require_embedder(), task, prompt_name)

    def format_prompts(self, prompts: Sequence[Sequence[str | int]], prompt_name: str | None = None,
                       instruction: str | None = None, truncate: bool | None = None,
                       truncation_direction: str = "right", task: str | None = None) -> list[list[str | int]]:
        """Apply a request's prompt_name / instruction (or the default prompt) to its text prompts; with a task
        adapter in effect (`task`, or prompt_name naming a task, or the model's default task) and neither given,
        the task's instruction (engine/text/prompts.py choose_prompt). Pass the same `task` and `prompt_name`
        to embed_prompts, which runs the adapter.

        A model whose texts go through its chat template gets them rendered and tokenized here (the prompt as a
        system message, as sentence-transformers does): those prompts come back as token ids, already truncated
        when `truncate` (None: the server's --truncate) lets an over-long one be cut (only on the right: a
        `truncation_direction` "left" is refused for such an over-long prompt). A vision-language family's
        prompts come back as they are: pass prompt_name / instruction to embed_prompts instead.
        """
        info = self._require_embedder()
        model = self._served()
        chosen = choose_task(info, task, prompt_name)
        if model.builder is not None or model.late is not None:  # the family formats its inputs (embed_prompts)
            return [list(p) for p in prompts]
        if model.chat is None:
            return format_prompts(info, prompts, prompt_name, instruction, chosen)
        choice = choose_prompt(info, prompt_name, instruction, chosen)
        cut = self.options.truncate if truncate is None else truncate
        direction = fitting.truncation_direction(truncation_direction)
        return [model.fitter.chat_ids(choice.apply(p[0]) if choice.instruction else p[0], choice.prefix, cut,
                                      direction)
                if is_text(p) else list(p) for p in prompts]

    def embed_prompts(self, prompts: Sequence[Sequence[str | int] | ImageInput], *, truncate: bool | None = None,
                      timeout_s: float = 3600, prompt_name: str | None = None, instruction: str | None = None,
                      labels: Sequence[str] | None = None, embd_normalize: int = -1,
                      dimensions: int | None = None, truncation_direction: str = "right",
                      task: str | None = None) -> EmbedResult:
        """Tokenize llama-server prompts (text and token-id parts, see encode_prompt) in one batched call on
        the caller's thread, then embed them with any images among them, finished as `embed` finishes them.

        A vision-language family builds every text or image input itself (engine/multimodal/inputs.py), receiving
        `instruction` or the text of `prompt_name` when it takes one; other families had those applied by
        format_prompts and ignore them here. A text late-interaction model (pylate's ColBERT) embeds each text as
        a query or a document, as `prompt_name` says ("query" / "document"; default: the default prompt name,
        else "document"), in pylate's format (engine/text/late_interaction.py). Token-id prompts are embedded
        verbatim by every family. `labels` name the inputs in errors (default "input 0", "input 1", ...).
        `truncation_direction` as `embed` takes it. `task` (families with task adapters): the adapter the inputs
        run with, as format_prompts chose it from `task` / `prompt_name` / the default task.
        """
        info = self._embedding(len(prompts), dimensions)
        task_at = task_index(info, choose_task(info, task, prompt_name))
        direction = fitting.truncation_direction(truncation_direction)
        model = self._served()
        if model.late is not None:
            role = self._late_role(info, prompt_name, instruction)
            return self._embed_late(prompts, [role] * len(prompts), truncate, timeout_s, labels, direction)
        started = time.monotonic()
        inputs: list = list(prompts)  # replaced by their tokens (or prepared inputs) below
        if model.builder is not None:
            system = self._builder_instruction(info, prompt_name, instruction)
            for i, prompt in enumerate(prompts):
                if isinstance(prompt, ImageInput) or is_text(prompt):
                    inputs[i] = self._prepare(_label(labels, i), prompt, system)
        texts = [i for i, item in enumerate(inputs) if not isinstance(item, (ImageInput, PreparedInput))]
        for i, ids in zip(texts, model.tokenizer.encode_prompts([prompts[i] for i in texts]), strict=True):
            inputs[i] = ids
        tokenize_s = time.monotonic() - started
        result = self._embedded(inputs, info, truncate, timeout_s, labels, embd_normalize, dimensions, direction,
                                task_at)
        result.timings.tokenize_s += tokenize_s
        return result

    def embed_late_chunks(self, chunks: Sequence[str], *, truncate: bool | None = None, timeout_s: float = 3600,
                          prompt_name: str | None = None, instruction: str | None = None, embd_normalize: int = -1,
                          dimensions: int | None = None, truncation_direction: str = "right",
                          task: str | None = None) -> EmbedResult:
        """Late chunking (Jina's `late_chunking`): `chunks` are consecutive pieces of one document, joined exactly
        as given and embedded in one pass; each chunk's vector is the model's pooling over the token rows that
        start inside it (special tokens and the prompt belong to no chunk), finished as `embed` finishes a vector.

        The prompt (prompt_name / instruction / the default prompt) applies once, to the whole document. An
        over-long document is cut as `truncate` and `truncation_direction` say (a chunk left without a token is
        InvalidInput), else InputTooLong. n_tokens: each chunk's tokens, the first one's holding the prompt's and
        the special tokens too, so that they add up to the document's.
        """
        info = self._embedding(1, dimensions)
        direction = fitting.truncation_direction(truncation_direction)
        model = self._served()
        self._check_late_chunking(info, model)
        if not chunks:
            raise InvalidInput("late chunking needs at least one chunk")
        started = time.monotonic()
        document = "".join(chunks)
        chosen = choose_task(info, task, prompt_name)
        choice = choose_prompt(info, prompt_name, instruction, chosen)
        text = choice.apply(document)
        first_char = text.rfind(document) if document else len(text)
        ids, starts = model.tokenizer.encode_with_starts(text)
        cut = self.options.truncate if truncate is None else truncate
        kept = model.fitter.fit_positions(ids, cut, direction)
        chunk_starts = list(itertools.accumulate((len(c) for c in chunks[:-1]), initial=0))
        segments = fitting.chunk_segments(starts, kept, chunk_starts, first_char)
        work = SegmentedWork([ids[p] for p in kept], tuple(segments))
        tokenize_s = time.monotonic() - started
        results, timings = self._serve([work], None, timeout_s, task_index(info, chosen))
        timings.tokenize_s += tokenize_s
        rows = results[0].value
        n_tokens = [len(rows_of) for rows_of in segments]
        n_tokens[0] += len(kept) - sum(n_tokens)
        return EmbedResult(vectors=[finish(row, embd_normalize, dimensions) for row in rows], n_tokens=n_tokens,
                           timings=timings)

    def _check_late_chunking(self, info: ModelInfo, model: ServedModel) -> None:
        """InvalidInput naming why this model cannot late-chunk, if it cannot."""
        name = info.architecture or info.model_type
        why = None
        if info.multi_vector:
            why = "it is a multi-vector model (one vector per token already: score its rows with /maxsim)"
        elif info.pooling is Pooling.NONE:
            why = "its pooling is 'none' (late chunking pools each chunk's rows as the model pools an input)"
        elif model.builder is not None or model.chat is not None:
            why = "its inputs are built by its own prompt format or chat template"
        elif info.is_sparse:
            why = "it is a sparse (SPLADE) encoder: its vectors span the vocabulary, one per input"
        elif not model.pools_segments:
            why = "it pools inside its own head"
        if why is not None:
            raise InvalidInput(f"late chunking is not supported by this model ({name}): {why}")

    def embed_sparse(self, prompts: Sequence[Sequence[str | int]], *, truncate: bool | None = None,
                     timeout_s: float = 3600, labels: Sequence[str] | None = None, truncation_direction: str = "right",
                     max_active_dims: int | None = None) -> SparseResult:
        """A sparse (SPLADE) encoder's vectors for prompts as embed_prompts takes them (format_prompts applied):
        each one's nonzero entries over the vocabulary, indices ascending, kept to the `max_active_dims` largest
        (None: the checkpoint's own max_active_dims, else all), as SparseEncoder.encode gives them."""
        info = self._require_embedder()
        if not info.is_sparse:
            raise NotSparse(f"this model ({info.architecture or info.model_type}) gives dense vectors (pooling "
                            f"{info.pooling.value}); sparse vectors need a SPLADE encoder: a sentence-transformers "
                            f"SparseEncoder checkpoint, or a masked LM started with --pooling splade")
        top = check_max_active_dims(max_active_dims) or info.max_active_dims
        result = self.embed_prompts(prompts, truncate=truncate, timeout_s=timeout_s, labels=labels,
                                    truncation_direction=truncation_direction)
        return SparseResult(vectors=[sparsify(v, top) for v in result.vectors], n_tokens=result.n_tokens,
                            timings=result.timings)

    def maxsim(self, query: Sequence[str | int] | ImageInput, documents: Sequence[Sequence[str | int] | ImageInput], *,
               truncate: bool | None = None, timeout_s: float = 3600) -> RerankResult:
        """A multi-vector model's MaxSim score of the query against each document (engine/compute/maxsim.py), in
        document order; the query and the documents are embedded in one submission, as embed_prompts does.
        n_tokens: every input's tokens (the query's first), image tokens included."""
        info = self._require_embedder()
        if not info.multi_vector:
            raise InvalidInput(f"MaxSim needs a multi-vector (late-interaction) model; this model "
                               f"({info.architecture or info.model_type}) gives one vector per input: compare its "
                               f"embeddings by cosine, or rank with a reranker")
        labels = ["query", *(f"document {i}" for i in range(len(documents)))]
        if self._served().late is not None:  # pylate's ColBERT: the query in its query format, documents in theirs
            self.check_count(len(labels))
            result = self._embed_late([query, *documents], [QUERY] + [DOCUMENT] * len(documents), truncate,
                                      timeout_s, labels)
        else:
            result = self.embed_prompts([query, *documents], truncate=truncate, timeout_s=timeout_s, labels=labels)
        scores = maxsim_scores(result.vectors[0], result.vectors[1:])
        return RerankResult(scores=scores, n_tokens=result.n_tokens, timings=result.timings)

    def _late_role(self, info: ModelInfo, prompt_name: str | None, instruction: str | None) -> str:
        """A late-interaction model's role for a request's texts: its prompt_name (or the default one)."""
        model = f"this model ({info.architecture or info.model_type}) embeds each text as a 'query' or a 'document'"
        if instruction is not None:
            raise InvalidInput(f"'instruction' is not used by {model} (pylate's formats): say which with prompt_name")
        name = prompt_name or info.default_prompt_name or DOCUMENT
        if name not in ROLES:
            raise InvalidInput(f"prompt_name {name!r}: {model} (pylate's formats); the prompt_name must be one of "
                               f"{', '.join(ROLES)}")
        return name

    def _embed_late(self, prompts: Sequence[Sequence[str | int] | ImageInput], roles: Sequence[str],
                    truncate: bool | None, timeout_s: float, labels: Sequence[str] | None,
                    direction: str = "right") -> EmbedResult:
        """Texts in their role's pylate format (engine/text/late_interaction.py): each cut to its role's length,
        an expanded query's expansion tokens run unattended (MaskedWork), a document's skiplist rows dropped from
        its vectors. Token-id prompts are embedded verbatim; `usage` counts the tokens run."""
        model = self._served()
        late = model.late
        cut = self.options.truncate if truncate is None else truncate
        started = time.monotonic()
        for i, prompt in enumerate(prompts):
            if isinstance(prompt, ImageInput):
                raise InvalidInput(f"{_label(labels, i)} is an image, but this model "
                                   f"({self.info.architecture or self.info.model_type}) embeds text only")
        texts = [i for i, prompt in enumerate(prompts) if is_text(prompt)]
        others = sorted(set(range(len(prompts))) - set(texts))
        work: list = [None] * len(prompts)
        rows: list[list[int] | None] = [None] * len(prompts)
        encoded = model.tokenizer.encode_prompts([[late.text(roles[i], prompts[i][0])] for i in texts])
        for i, ids in zip(texts, encoded, strict=True):
            built = late.build(roles[i], model.fitter.fit(ids, cut, direction), model.tokenizer)
            model.fitter.fit(built.ids, False)  # the role's length within the server's per-input limit
            if not built.rows:
                raise InvalidInput(f"{_label(labels, i)}: every token of it is in the model's skiplist (punctuation), "
                                   f"so it has no vector to embed")
            work[i] = built.ids if all(built.mask) else MaskedWork(built.ids, built.mask)
            rows[i] = built.rows
        for i, ids in zip(others, model.tokenizer.encode_prompts([prompts[i] for i in others]), strict=True):
            work[i] = model.fitter.fit(ids, cut, direction)
        preprocess_s = time.monotonic() - started
        results, timings = self._serve(work, None, timeout_s)
        timings.tokenize_s += preprocess_s
        vectors = [r.value if keep is None else r.value[keep] for r, keep in zip(results, rows, strict=True)]
        return EmbedResult(vectors=vectors, n_tokens=[len(w.ids) if isinstance(w, MaskedWork) else len(w)
                                                      for w in work], timings=timings)

    def _builder_instruction(self, info: ModelInfo, prompt_name: str | None, instruction: str | None) -> str | None:
        """What a vision-language family's prompt format receives as its instruction, if anything."""
        if instruction is not None and prompt_name is not None:
            raise InvalidInput("'instruction' and 'prompt_name' cannot be combined")
        text, asked = instruction, instruction is not None or prompt_name is not None
        if text is None:
            name = prompt_name or info.default_prompt_name
            known = dict(info.prompts)
            if name is not None and name not in known:
                raise InvalidInput(f"prompt_name {name!r} is not one of this model's prompts "
                                   f"(known: {', '.join(known) or 'none'})")
            text = known.get(name) or None if name is not None else None
        if not self._served().builder.takes_instruction:
            if asked:
                raise InvalidInput(f"this model ({info.architecture or info.model_type}) builds its own query and "
                                   f"document prompts: 'instruction' and 'prompt_name' are not used by it")
            return None
        return text

    def _prepare(self, label: str, prompt: Sequence[str | int] | ImageInput, instruction: str | None) -> PreparedInput:
        """One text or image input through the family's input builder, its images decoded (bounded) first."""
        parts = self._decoded(label, prompt)
        return _labelled(label, lambda: self._served().builder.build(parts, instruction))

    def _decoded(self, label: str, prompt: Sequence[str | int] | ImageInput) -> list:
        """An input's parts with its images decoded, each bounded by --image-max-pixels before its pixels are."""
        if not isinstance(prompt, ImageInput):
            return list(prompt)
        parts: list = []
        for part in prompt.parts:
            if isinstance(part, bytes):
                part = _labelled(label, lambda data=part: decode(data, self.options.image_max_pixels))
            parts.append(part)
        return parts

    def embed(self, token_lists: Sequence[list[int] | ImageInput | PreparedInput], *, truncate: bool | None = None,
              timeout_s: float = 3600, labels: Sequence[str] | None = None, embd_normalize: int = -1,
              dimensions: int | None = None, truncation_direction: str = "right",
              task: str | None = None) -> EmbedResult:
        """Embed already tokenized inputs, images, and prepared vision-language inputs. Each vector is finished
        as a request asks (engine/compute/normalize.py): cut to its first `dimensions` components, then
        normalized as llama's `embd_normalize` says (default -1: raw); per-token rows (pooling none) are cut
        only, a multi-vector model's rows come as the model normalized them (it refuses `dimensions`).

        Images for an image tower are decoded and preprocessed here, on the caller's thread; a bad one raises
        InvalidImage naming its input index. When an over-long input is cut, `truncation_direction` (TEI's
        field: "right" / "Right", the default, cuts its end; "left" / "Left" keeps its end) says which side goes;
        the template's special tokens stay either way. `task`: the task adapter they run with (None: the model's
        default task, engine/text/prompts.py choose_task); no instruction is added to token ids.
        """
        info = self._embedding(len(token_lists), dimensions)
        direction = fitting.truncation_direction(truncation_direction)
        return self._embedded(token_lists, info, truncate, timeout_s, labels, embd_normalize, dimensions, direction,
                              task_index(info, choose_task(info, task)))

    def _embedding(self, n_inputs: int, dimensions: int | None) -> ModelInfo:
        """An embedding request's checks before any work: an embedder, a `dimensions` it takes, a count it queues."""
        info = self._require_embedder()
        check_dimensions(dimensions, info.n_embd, info.multi_vector)
        self.check_count(n_inputs)
        return info

    def _embedded(self, token_lists: Sequence[list[int] | ImageInput | PreparedInput], info: ModelInfo,
                  truncate: bool | None, timeout_s: float, labels: Sequence[str] | None, embd_normalize: int,
                  dimensions: int | None, direction: str = "right", task: int | None = None) -> EmbedResult:
        if info.is_sparse and embd_normalize != -1:
            raise SparseOnly(f"this model ({info.architecture or info.model_type}) is a sparse (SPLADE) encoder: its "
                             f"vectors span the vocabulary ({info.n_embd} entries, mostly zeros) and are not "
                             f"normalized (TEI refuses `normalize` for SPLADE models too); ask for its sparse "
                             f"vectors (POST /embed_sparse, Encoder.embed_sparse), or for raw dense ones "
                             f"(normalize false, embd_normalize -1)")
        model = self._served()
        cut = self.options.truncate if truncate is None else truncate
        started = time.monotonic()
        if model.builder is not None:  # a vision-language family's images are built into its prompt format
            token_lists = [self._prepare(_label(labels, i), item, None) if isinstance(item, ImageInput) else item
                           for i, item in enumerate(token_lists)]
        fitted = [self._image_work(_label(labels, i), item, info) if isinstance(item, ImageInput) else
                  model.fitter.fit_prepared(_label(labels, i), item, cut, direction)
                  if isinstance(item, PreparedInput) else
                  model.fitter.fit(item, cut, direction) for i, item in enumerate(token_lists)]
        preprocess_s = time.monotonic() - started
        results, timings = self._serve(fitted, None, timeout_s, task)
        timings.tokenize_s += preprocess_s
        return EmbedResult(vectors=[finish(r.value, embd_normalize, dimensions) for r in results],
                           n_tokens=[_cost(item) for item in fitted], timings=timings)

    def _image_work(self, label: str, image: ImageInput, info: ModelInfo) -> ImageWork:
        images = self._served().images
        if images is None:
            raise InvalidInput(f"{label} is an image, but this model ({info.architecture or info.model_type}) "
                               f"embeds text only")
        if image.text.strip() or len(image.images) != 1:
            raise InvalidInput(f"{label}: this model embeds either a text or one image per input, not both "
                               f"and not several (send each as an input of its own)")
        pixels = _labelled(label, lambda: images(image.images[0], self.options.image_max_pixels))
        return ImageWork(pixels, info.image_tokens)

    def _require_embedder(self) -> ModelInfo:
        info = self.info
        if info.is_classifier:
            raise InvalidInput(CLASSIFIER_ROUTES.format(n=len(info.labels), what="not embeddings"))
        if info.is_reranker:
            raise InvalidInput("this server runs a reranker (rank pooling): it serves /rerank, not embeddings")
        return info

    def fit(self, ids: list[int], truncate: bool | None = None) -> list[int]:
        """One tokenized input as `embed` would take it: cut when `truncate` (None: the server's --truncate)
        allows, else EmptyInput, InvalidTokens or InputTooLong, so a caller can check inputs one by one."""
        self._require_embedder()
        return self._served().fitter.fit(ids, self.options.truncate if truncate is None else truncate)

    # -- reranking --------------------------------------------------------------------------------
    def rerank(self, query: RerankItem, documents: Sequence[RerankItem], *, truncate: bool | None = None,
               instruction: str | None = None, max_chunks: int | None = None, timeout_s: float = 3600,
               sigmoid: bool | None = None) -> RerankResult:
        """Score every (query, document) pair; scores come back in document order.

        `instruction` (generative rerankers only) overrides the server's <Instruct> text. The query and the
        documents are texts, or images (with any text beside them) for rerankers that take images.
        `max_chunks` (None: the server's rerank_chunks; 0: off) splits each document over the limit into at most
        that many overlapping windows (engine/runtime/fitting.py `document_windows`), scored with the other pairs;
        the document's score is its best window's, its n_tokens every window's. Text rerankers only. `sigmoid`
        (None: the server's --rerank-sigmoid): a cross-encoder's sigmoid(logit) instead of its raw logit; a
        reranker whose scores are already probabilities gives them either way, and refuses `sigmoid=False`.
        """
        info = self.info
        if info.is_classifier:
            raise InvalidInput(CLASSIFIER_ROUTES.format(n=len(info.labels), what="not relevance scores"))
        if not info.is_reranker:
            raise InvalidInput("this server runs an embedding model: start a reranker with --reranking")
        if instruction is not None and info.kind != registry.GENERATIVE_RERANKER:
            raise InvalidInput("'instruction' is only used by generative rerankers; this one is a cross-encoder")
        self.check_count(len(documents))
        labelled = [("query", query), *((f"document {i}", doc) for i, doc in enumerate(documents))]
        images = [label for label, item in labelled if isinstance(item, ImageInput)]
        if images and not info.takes_images:
            raise InvalidInput(f"{images[0]} is an image, but this reranker "
                               f"({info.architecture or info.model_type}) scores text only")
        cut = self.options.truncate if truncate is None else truncate
        chunks = self.options.rerank_chunks if max_chunks is None else max_chunks
        if isinstance(chunks, bool) or not isinstance(chunks, int) or chunks < 0:
            raise InvalidInput(f"max_chunks must be a non-negative integer (0: off), not {chunks!r}")
        model = self._served()
        if chunks and (model.pairs is not None or images):
            raise InvalidInput(f"splitting long documents into windows (max_chunks) is only for text rerankers; "
                               f"this one ({info.architecture or info.model_type}) builds pairs that may hold "
                               f"images: leave max_chunks off")
        probabilities = info.kind != registry.CROSS_ENCODER or model.scores_are_probabilities
        if sigmoid is False and probabilities:
            raise InvalidInput(f"this reranker ({info.architecture or info.model_type}) scores probabilities, not "
                               "logits: it has no raw score to return without its activation")
        if model.pairs is not None:
            return self._rerank_pairs(query, documents, instruction or self.options.rerank_instruction, info, cut,
                                      timeout_s)
        started = time.monotonic()
        owners = list(range(len(documents)))
        if chunks and model.prompt is not None:
            prompts, owners = model.fitter.chunk_prompts(query, documents,
                                                         instruction or self.options.rerank_instruction, chunks)
            pairs = [(ids, None) for ids in prompts]
        elif chunks:
            pairs, owners = model.fitter.chunk_pairs(query, documents, chunks)
        elif model.prompt is not None:
            task = instruction or self.options.rerank_instruction
            rendered = model.tokenizer.encode_batch([model.prompt.render(query, doc, task) for doc in documents],
                                                    add_special=False)
            pairs = [(model.fitter.fit_prompt(ids, query, doc, task, cut), None)
                     for ids, doc in zip(rendered, documents)]
        else:
            pairs = model.fitter.fit_pairs(query, documents, cut)
        tokenize_s = time.monotonic() - started
        type_lists = None if model.prompt is not None else [types for _, types in pairs]
        results, timings = self._serve([ids for ids, _ in pairs], type_lists, timeout_s)
        timings.tokenize_s = tokenize_s
        scores = [float(np.atleast_1d(r.value)[0]) for r in results]  # several outputs: the first (llama's embd[0])
        if (self.options.rerank_sigmoid if sigmoid is None else sigmoid) and not probabilities:
            scores = [1.0 / (1.0 + math.exp(-s)) for s in scores]
        best = [-math.inf] * len(documents)
        n_tokens = [0] * len(documents)
        for owner, score, (ids, _) in zip(owners, scores, pairs, strict=True):
            best[owner] = max(best[owner], score)
            n_tokens[owner] += len(ids)
        return RerankResult(scores=best, n_tokens=n_tokens, timings=timings)

    def _rerank_pairs(self, query: RerankItem, documents: Sequence[RerankItem], instruction: str | None,
                      info: ModelInfo, truncate: bool, timeout_s: float) -> RerankResult:
        """A reranker whose prompts may hold images: each pair built by the family (images decoded and processed
        here, the query's once); pairs holding images run alone in their pass, text-only pairs batch."""
        model = self._served()
        started = time.monotonic()
        query_side = self._rerank_side("query", query)
        limit = info.truncate_tokens if truncate else None
        pairs = []
        for i, document in enumerate(documents):
            side = self._rerank_side(f"document {i}", document)
            pairs.append(_labelled(f"document {i}", lambda: model.pairs.pair(query_side, side, instruction, limit)))
        for prepared in pairs:
            if len(prepared.ids) > info.max_input_tokens:
                model.fitter.too_long(len(prepared.ids))
        work = [prepared if prepared.images else prepared.ids for prepared in pairs]
        tokenize_s = time.monotonic() - started
        results, timings = self._serve(work, None, timeout_s)
        timings.tokenize_s = tokenize_s
        return RerankResult(scores=[float(r.value) for r in results], n_tokens=[len(p.ids) for p in pairs],
                            timings=timings)

    def _rerank_side(self, label: str, item: RerankItem) -> RerankSide:
        """The query or a document as the pair builder takes it, its images decoded (bounded) first."""
        parts = self._decoded(label, [item] if isinstance(item, str) else item)
        return _labelled(label, lambda: self._served().pairs.side(parts))

    # -- classification ---------------------------------------------------------------------------
    def classify(self, inputs: Sequence[str | tuple[str, str]], *, truncate: bool | None = None,
                 truncation_direction: str = "right", raw_scores: bool = False,
                 timeout_s: float = 3600) -> ClassifyResult:
        """Score each input (a text, or a (text, text_pair) pair) with a sequence classifier's head: one score per
        label, in label order (ModelInfo.labels). Probabilities unless `raw_scores` (the logits): softmax over the
        labels, or each label's sigmoid for a multi-label head (engine/compute/labels.py). A one-label
        cross-encoder is a classifier too (its sigmoid, label LABEL_0 unless its config names it), as in TEI.
        An over-long text is cut on the `truncation_direction` side when `truncate` (None: the server's
        --truncate) allows it, a pair longest-first as the tokenizer cuts pairs; else InputTooLong."""
        info = self.info
        if not (info.is_classifier or info.kind == registry.CROSS_ENCODER):
            raise InvalidInput(f"this server runs {'a generative reranker' if info.is_reranker else 'an embedding model'} "
                               f"({info.architecture or info.model_type}): label scores need a sequence classifier "
                               f"(a *ForSequenceClassification checkpoint)")
        model = self._served()
        probabilities = model.scores_are_probabilities
        if raw_scores and probabilities:
            raise InvalidInput(f"this model ({info.architecture or info.model_type}) scores probabilities, not "
                               "logits: it has no raw score to return without its activation")
        self.check_count(len(inputs))
        direction = fitting.truncation_direction(truncation_direction)
        cut = self.options.truncate if truncate is None else truncate
        started = time.monotonic()
        singles = [i for i, item in enumerate(inputs) if isinstance(item, str)]
        pair_at = [i for i, item in enumerate(inputs) if not isinstance(item, str)]
        work: list[list[int]] = [[] for _ in inputs]
        types: list[list[int]] = [[] for _ in inputs]
        for i, ids in zip(singles, model.tokenizer.encode_batch([inputs[i] for i in singles]), strict=True):
            work[i] = model.fitter.fit(ids, cut, direction)
            types[i] = [0] * len(work[i])
        for i, (ids, type_ids) in zip(pair_at, model.fitter.fit_text_pairs([inputs[i] for i in pair_at], cut),
                                      strict=True):
            work[i], types[i] = ids, type_ids
        tokenize_s = time.monotonic() - started
        results, timings = self._serve(work, types, timeout_s)
        timings.tokenize_s = tokenize_s
        labels = info.labels or ("LABEL_0",)
        scores = []
        for r in results:
            logits = np.atleast_1d(np.asarray(r.value, dtype=np.float64))
            row = logits if raw_scores or probabilities else label_scores(logits, info.multi_label)
            scores.append([float(v) for v in row])
        return ClassifyResult(scores=scores, labels=labels, n_tokens=[len(ids) for ids in work], timings=timings)

    # -- serving ----------------------------------------------------------------------------------
    def _serve(self, token_lists: list[list[int]], type_lists: list[list[int]] | None,
               timeout_s: float, task: int | None = None) -> tuple[list[ItemResult], Timings]:
        with self._in_flight_lock:
            self._in_flight += 1
        try:
            items = self._worker.submit(token_lists, time.monotonic() + timeout_s, type_lists, task)
            if len(items) == 1:  # a lone input waits on its own future (wait() builds a waiter for each call)
                done = _finished(items[0].future, timeout_s)
                pending = set() if done else {items[0].future}
            else:
                _, pending = concurrent.futures.wait([item.future for item in items], timeout=timeout_s)
            if pending:
                for future in pending:
                    future.cancel()
                raise ReplyTimeout(f"the request was not served within {timeout_s:g} s")
            results = [item.future.result() for item in items]
        finally:
            with self._in_flight_lock:
                self._in_flight -= 1
        # Items of one request may share a forward pass: count each distinct pass once.
        passes = {r.batch: r.inference_s for r in results}
        return results, Timings(queue_s=max((r.queue_s for r in results), default=0.0),
                                inference_s=sum(passes.values()))

    def stats(self) -> dict[str, float]:
        s = self._worker.stats
        return {"prompt_tokens_total": s.prompt_tokens_total, "prompt_seconds_total": s.prompt_seconds_total,
                "n_decode_total": s.n_decode_total, "n_tokens_max": s.n_tokens_max,
                "requests_processing": self._in_flight, "requests_deferred": self._worker.queued()}

    def close(self, wait: bool = False) -> None:
        """Stop serving and free the model's memory.

        Waiting inputs are cancelled and the engine stops being loaded at once. A load in progress finishes
        first; then the weights are dropped and MLX's buffer cache is returned, on a helper thread unless
        `wait`; `released` is set when that is done. Callers close an engine no request is using (a batch
        still computing keeps its arrays until it ends).
        """
        with self._in_flight_lock:
            if self._closing:
                return
            self._closing = True
        self._worker.close()
        if wait:
            self._release()
        else:
            threading.Thread(target=self._release, name=f"release {self.model_ref}", daemon=True).start()

    def _release(self) -> None:
        self._worker.join()  # a load in progress cannot be interrupted; it ends, then the model is dropped
        self.released.set()
