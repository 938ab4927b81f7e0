"""The Engine facade: tokenize on the caller's thread, one queue item per input, results in input order."""
from __future__ import annotations

import concurrent.futures
import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

import numpy as np

from engine.checkpoint import Checkpoint
from engine.runtime import blas, limits, malloc, shapes, threads
from engine.loading import formats, hub, registry
from engine.errors import (
    EmptyInput,
    InvalidInput,
    InvalidTokens,
    NotLoaded,
    ReplyTimeout,
    UnsupportedCheckpoint,
)
from engine.compute.pipeline import (
    CrossEncoderPipeline,
    EmbeddingPipeline,
    GenerativeRerankPipeline,
)
from engine.text.chat_inputs import ChatInputs
from engine.multimodal.images import ImageProcessor, InvalidImage, decode
from engine.multimodal.qwen_images import QwenImageProcessor
from engine.text.prompts import INSTRUCTION_TEMPLATES, RerankPrompt, choose_prompt, default_prompt_name, format_prompts, is_text
from engine.runtime.scheduler import BatchLimits, warm_widths
from engine.text.tokenizer import TextTokenizer
from engine.types import (
    EmbedResult,
    EngineOptions,
    ImageInput,
    ModelInfo,
    Pooling,
    RerankItem,
    RerankResult,
    Timings,
)
from engine.compute.maxsim import maxsim_scores
from engine.compute.normalize import check_dimensions, finish
from engine.multimodal.inputs import InputBuilder, PreparedInput
from engine.multimodal.pairs import PairBuilder, RerankSide
from engine.runtime.worker import ImageWork, ItemResult, Runner, Worker

log = logging.getLogger(__name__)
T = TypeVar("T")


def _label(labels: Sequence[str] | None, index: int) -> str:
    return labels[index] if labels is not None else f"input {index}"


def _labelled(label: str, build: Callable[[], T]) -> T:
    """build(), any InvalidInput it raises (a bad image, image tokens spelled in text, a template's refusal)
    naming the input it is about."""
    try:
        return build()
    except InvalidInput as exc:
        raise (InvalidImage if isinstance(exc, InvalidImage) else InvalidInput)(f"{label}: {exc}") from None


def _cost(item: list[int] | ImageWork | PreparedInput) -> int:
    """What an input counts as in usage: its tokens, image tokens included (a tower's image: its patches)."""
    if isinstance(item, ImageWork):
        return item.n_tokens
    return len(item.ids) if isinstance(item, PreparedInput) else len(item)


def bound_image_tokens(builder: object, opts: EngineOptions, family: str) -> tuple[int, int] | None:
    """--image-min-tokens / --image-max-tokens on a family's image processor; its token bounds after them.

    They move the pixel bounds of a dynamic-resolution processor (Qwen2-VL's, which a builder keeps as
    `processor`), as llama.cpp does. Other families resize to a fixed size or a tile grid, which llama.cpp does
    not bound either: they are left as the reference makes them, and the log says so.
    """
    processor = getattr(builder, "processor", None)
    if isinstance(processor, QwenImageProcessor):
        builder.processor = processor.with_token_bounds(opts.image_min_tokens, opts.image_max_tokens)
        return builder.processor.token_bounds
    given = [flag for flag, value in (("--image-min-tokens", opts.image_min_tokens),
                                      ("--image-max-tokens", opts.image_max_tokens)) if value > 0]
    if given:
        log.warning("%s: not used by the %s family, whose images have a fixed size or a tile grid; only "
                    "dynamic-resolution models (Qwen3-VL, ColQwen2) take image token bounds", " and ".join(given),
                    family)
    return None


class Engine:
    """One checkpoint served by one engine thread. Construction returns at once; the load runs there."""

    def __init__(self, options: EngineOptions):
        self.options = options
        self.model_ref = options.model_path or options.hf_repo or ""
        self._info: ModelInfo | None = None
        self._tokenizer: TextTokenizer | None = None
        self._prompt: RerankPrompt | None = None  # generative text rerankers only
        self._pairs: PairBuilder | None = None  # generative rerankers that take images: builds each pair
        self._probabilities = False  # the model's scores are already in [0, 1]
        self._chat: ChatInputs | None = None  # embedders whose texts go through their chat template
        self._chat_tails: dict[str | None, list[int]] = {}  # per system prompt: the template's closing tokens
        self._images: ImageProcessor | None = None  # dual-encoders with an image tower only
        self._builder: InputBuilder | None = None  # vision-language families (engine/multimodal/inputs.py) only
        self._in_flight = 0
        self._in_flight_lock = threading.Lock()
        self.load_s: float | None = None  # how long the load took, once it succeeded
        self._closing = False
        self.released = threading.Event()  # set once close() has freed the model's memory
        self._lanes, self._blas_threads = threads.plan(options.threads)
        self._worker = Worker(self._load, options.max_queue_items, lanes=self._lanes)

    # -- loading (runs on the engine thread) -------------------------------------------------------
    def _load(self) -> tuple[Runner, int, BatchLimits]:
        started = time.monotonic()
        opts = self.options
        blas.set_budget(self._blas_threads)
        ckpt = formats.open_checkpoint(hub.resolve(opts.model_path, opts.hf_repo, opts.offline, opts.hf_file),
                                       label=opts.model_path or "")
        rank_mode = opts.pooling is Pooling.RANK
        kind = ckpt.format.kind_of(ckpt, rank=rank_mode)
        if rank_mode and kind == registry.EMBEDDER:
            raise UnsupportedCheckpoint(
                f"{ckpt.path}: rank mode (--reranking / --pooling rank) needs a reranker checkpoint; "
                f"{ckpt.architecture or ckpt.model_type} is an embedding model")
        if not rank_mode and kind != registry.EMBEDDER:
            raise UnsupportedCheckpoint(
                f"{ckpt.path}: {ckpt.architecture} is a reranker ({kind}), not an embedding model; "
                f"start it with --reranking")
        embedder = kind == registry.EMBEDDER
        token_bounds = None  # dynamic-resolution image processors: the fewest and most tokens of one image
        prompt_default = default_prompt_name(ckpt, opts.default_prompt_name) if embedder else None
        if embedder and ckpt.message_modality is not None:
            self._chat = ChatInputs(ckpt)
        tokenizer = ckpt.format.open_tokenizer(ckpt)
        loaded = formats.load(ckpt, kind, opts.dtype)
        # a head that already gives probabilities (a Qwen3-Reranker GGUF's softmax): --rerank-sigmoid leaves it
        self._probabilities = loaded.scores_are_probabilities
        mode = registry.choose_pooling(opts.pooling, ckpt, loaded)
        if kind == registry.GENERATIVE_RERANKER:
            if loaded.input_builder is not None:  # its prompts hold images (engine/multimodal/builders/<family>_reranker.py)
                self._pairs = loaded.input_builder(ckpt, tokenizer)
                token_bounds = bound_image_tokens(self._pairs, opts, loaded.family)
            else:
                self._prompt = RerankPrompt(ckpt, fallback=f"{loaded.family}_reranker.jinja")
            yes_id, no_id = self._answer_tokens(tokenizer, ckpt)
            runner: Runner = GenerativeRerankPipeline(loaded.model, yes_id, no_id, tokenizer.pad_id)
        elif kind == registry.CROSS_ENCODER:
            runner = CrossEncoderPipeline(loaded.model)
        else:
            runner = EmbeddingPipeline(loaded.model, mode, loaded.projection)
            if loaded.input_builder is not None:
                self._builder = loaded.input_builder(ckpt, tokenizer)
                token_bounds = bound_image_tokens(self._builder, opts, loaded.family)
            if loaded.image_size:
                self._images = ImageProcessor.from_checkpoint(ckpt.path, loaded.image_size)
                bound_image_tokens(self._images, opts, loaded.family)
                side = loaded.image_size  # run the vision tower once now, so no request compiles it
                runner.launch_images(np.zeros((1, 3, side, side), np.float32))()
        n_positions = loaded.n_positions
        slot_ctx, n_slots = limits.slots(opts.ctx_size, opts.parallel, n_positions)
        max_input = limits.input_limit(n_positions, opts.ubatch_tokens, slot_ctx if opts.ctx_size > 0 else None)
        if opts.max_seq > 0:
            max_input = min(max_input, opts.max_seq)
        fitted = shapes.prepare(runner, tokenizer.pad_id, max_input, opts.max_batch_tokens, opts.max_batch_rows,
                                loaded.fixed_width or 0)
        self._tokenizer = tokenizer
        self._info = ModelInfo(
            path=ckpt.display_path, model_type=ckpt.model_type, architecture=ckpt.architecture,
            vocab_type=tokenizer.vocab_type, n_vocab=tokenizer.n_vocab, n_embd=loaded.hidden_size,
            n_ctx_train=n_positions, n_params=loaded.n_params, size_bytes=loaded.size_bytes, ftype=loaded.ftype,
            pooling=mode, max_input_tokens=fitted.max_seq,
            truncate_tokens=limits.truncation_length(ckpt.max_seq_length, n_positions, fitted.max_seq),
            slot_ctx=slot_ctx, n_slots=n_slots, bos_token=tokenizer.bos_token, eos_token=tokenizer.eos_token,
            kind=loaded.kind, family=loaded.family, batch_tokens=fitted.max_tokens, batch_rows=fitted.max_rows,
            widths=tuple(warm_widths(fitted.max_seq, fitted.fixed_width)),
            prompts=tuple(ckpt.prompts.items()) if embedder else (), default_prompt_name=prompt_default,
            instruction_template=INSTRUCTION_TEMPLATES.get(ckpt.model_type) if embedder else None,
            file_format=ckpt.format.name, chat_template_inputs=self._chat is not None,
            modalities=("text", "image") if (self._images, self._builder, self._pairs) != (None, None, None)
            else ("text",),
            image_tokens=loaded.image_tokens, image_token_bounds=token_bounds, vision_language=self._builder is not None,
            multi_vector=loaded.multi_vector)
        log.info("loaded %s (%s, %s, %s) in %.2f s: pooling %s, %d params, per-input limit %d tokens, "
                 "batches of up to %d rows / %d tokens, %d lanes sharing %d BLAS threads, BLAS: %s; %s",
                 ckpt.path, ckpt.model_type, ckpt.architecture or "-", loaded.kind, time.monotonic() - started,
                 mode.value, loaded.n_params, fitted.max_seq, fitted.max_rows, fitted.max_tokens, self._lanes,
                 self._blas_threads, blas.description, malloc.description)
        self.load_s = time.monotonic() - started
        return runner, tokenizer.pad_id, fitted

    @classmethod
    def _answer_tokens(cls, tokenizer: TextTokenizer, ckpt: Checkpoint) -> tuple[int, int]:
        """The (yes, no) token ids a generative reranker compares: its LogitScore module's, else "yes" and "no"
        as the tokenizer encodes them."""
        if ckpt.logit_score is None:
            return cls._single_token(tokenizer, "yes", ckpt), cls._single_token(tokenizer, "no", ckpt)
        if not all(0 <= token < tokenizer.n_vocab for token in ckpt.logit_score):
            raise UnsupportedCheckpoint(f"{ckpt.path}: the LogitScore module's token ids {ckpt.logit_score} are "
                                        f"outside the vocabulary ({tokenizer.n_vocab} tokens)")
        return ckpt.logit_score

    @staticmethod
    def _single_token(tokenizer: TextTokenizer, word: str, ckpt: Checkpoint) -> int:
        ids = tokenizer.encode(word, add_special=False, parse_special=False)
        if len(ids) != 1:
            raise UnsupportedCheckpoint(f"{ckpt.path}: {word!r} is {len(ids)} tokens for this tokenizer; the yes/no "
                                        f"reranker recipe needs it to be exactly one")
        return ids[0]

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

    @property
    def info(self) -> ModelInfo:
        if self._info is None or not self.is_loaded:
            raise NotLoaded("the model is not loaded")
        return self._info

    @property
    def tokenizer(self) -> TextTokenizer:
        if self._tokenizer is None or not self.is_loaded:
            raise NotLoaded("the model is not loaded")
        return self._tokenizer

    # -- tokens -----------------------------------------------------------------------------------
    def encode_prompt(self, parts: Sequence[str | int], add_special: bool = True,
                      parse_special: bool = True) -> list[int]:
        return self.tokenizer.encode_prompt(parts, add_special, parse_special)

    def token_pieces(self, ids: Sequence[int]) -> list[str | list[int]]:
        return self.tokenizer.pieces(self._known(ids))

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(self._known(ids))

    def check_count(self, n_inputs: int) -> None:
        """TooManyInputs when one request has more inputs than the engine queue can ever hold. embed, embed_prompts
        and rerank check it before tokenizing or decoding; a server checks it before format_prompts and before
        fetching images (the Encoder calls format_prompts on more texts than one submission holds)."""
        self._worker.check_count(n_inputs)

    def _known(self, ids: Sequence[int]) -> Sequence[int]:
        """Ids in [0, n_vocab): the tokenizer library overflows (or invents text) on anything else."""
        if ids and (min(ids) < 0 or max(ids) >= self.tokenizer.n_vocab):
            raise InvalidTokens("Prompt contains invalid tokens")
        return ids

    # -- requests ---------------------------------------------------------------------------------
    def format_prompts(self, prompts: Sequence[Sequence[str | int]], prompt_name: str | None = None,
                       instruction: str | None = None, truncate: bool | None = None) -> list[list[str | int]]:
        """Apply a request's prompt_name / instruction (or the default prompt) to its text prompts.

        A model whose texts go through its chat template gets them rendered and tokenized here (the prompt as a
        system message, as sentence-transformers does): those prompts come back as token ids, already truncated
        when `truncate` (None: the server's --truncate) lets an over-long one be cut. A vision-language family's
        prompts come back as they are: pass prompt_name / instruction to embed_prompts instead.
        """
        info = self._require_embedder()
        if self._builder is not None:  # a vision-language family formats every input itself (embed_prompts)
            return [list(p) for p in prompts]
        if self._chat is None:
            return format_prompts(info, prompts, prompt_name, instruction)
        choice = choose_prompt(info, prompt_name, instruction)
        cut = self.options.truncate if truncate is None else truncate
        return [self._chat_ids(choice.apply(p[0]) if choice.instruction else p[0], choice.prefix, info, cut)
                if is_text(p) else list(p) for p in prompts]

    def _chat_ids(self, text: str, system: str | None, info: ModelInfo, truncate: bool) -> list[int]:
        """One chat-templated input's tokens. Truncated as sentence-transformers does: cut to the model's
        length, then the template's tail (the tokens the render ends with whatever the content) written back
        over the last ones, so last-token pooling still reads the template's final token."""
        ids = self.tokenizer.encode(self._chat.render(text, system), add_special=False)
        if not truncate or len(ids) <= info.max_input_tokens:
            return ids
        suffix = self._chat_tail(system)
        ids = ids[:info.truncate_tokens]
        keep = min(len(suffix), len(ids))
        if keep:
            ids[-keep:] = suffix[-keep:]
        return ids

    def _chat_tail(self, system: str | None) -> list[int]:
        """The tokens every render ends with whatever the content (found once per system prompt)."""
        if system not in self._chat_tails:
            tails = [self.tokenizer.encode(self._chat.render(filler, system), add_special=False)
                     for filler in ("0", "1 2 3 4")]
            common = 0
            for a, b in zip(reversed(tails[0]), reversed(tails[1])):
                if a != b:
                    break
                common += 1
            self._chat_tails[system] = tails[0][len(tails[0]) - common:] if 0 < common < min(map(len, tails)) else []
        return self._chat_tails[system]

    def embed_prompts(self, prompts: Sequence[Sequence[str | int] | ImageInput], *, truncate: bool | None = None,
                      timeout_s: float = 3600, prompt_name: str | None = None, instruction: str | None = None,
                      labels: Sequence[str] | None = None, embd_normalize: int = -1,
                      dimensions: int | None = None) -> EmbedResult:
        """Tokenize llama-server prompts (text and token-id parts, see encode_prompt) in one batched call on
        the caller's thread, then embed them with any images among them, finished as `embed` finishes them.

        A vision-language family builds every text or image input itself (engine/multimodal/inputs.py), receiving
        `instruction` or the text of `prompt_name` when it takes one; other families had those applied by
        format_prompts and ignore them here. Token-id prompts are embedded verbatim by every family. `labels`
        name the inputs in errors (default "input 0", "input 1", ...).
        """
        info = self._embedding(len(prompts), dimensions)
        started = time.monotonic()
        inputs: list = list(prompts)  # replaced by their tokens (or prepared inputs) below
        if self._builder is not None:
            system = self._builder_instruction(info, prompt_name, instruction)
            for i, prompt in enumerate(prompts):
                if isinstance(prompt, ImageInput) or is_text(prompt):
                    inputs[i] = self._prepare(_label(labels, i), prompt, system)
        texts = [i for i, item in enumerate(inputs) if not isinstance(item, (ImageInput, PreparedInput))]
        for i, ids in zip(texts, self.tokenizer.encode_prompts([prompts[i] for i in texts]), strict=True):
            inputs[i] = ids
        tokenize_s = time.monotonic() - started
        result = self._embedded(inputs, info, truncate, timeout_s, labels, embd_normalize, dimensions)
        result.timings.tokenize_s += tokenize_s
        return result

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
        result = self.embed_prompts([query, *documents], truncate=truncate, timeout_s=timeout_s, labels=labels)
        scores = maxsim_scores(result.vectors[0], result.vectors[1:])
        return RerankResult(scores=scores, n_tokens=result.n_tokens, timings=result.timings)

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
        if not self._builder.takes_instruction:
            if asked:
                raise InvalidInput(f"this model ({info.architecture or info.model_type}) builds its own query and "
                                   f"document prompts: 'instruction' and 'prompt_name' are not used by it")
            return None
        return text

    def _prepare(self, label: str, prompt: Sequence[str | int] | ImageInput, instruction: str | None) -> PreparedInput:
        """One text or image input through the family's input builder, its images decoded (bounded) first."""
        parts = self._decoded(label, prompt)
        return _labelled(label, lambda: self._builder.build(parts, instruction))

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
              dimensions: int | None = None) -> EmbedResult:
        """Embed already tokenized inputs, images, and prepared vision-language inputs. Each vector is finished
        as a request asks (engine/compute/normalize.py): cut to its first `dimensions` components, then
        normalized as llama's `embd_normalize` says (default -1: raw); per-token rows (pooling none) are cut
        only, a multi-vector model's rows come as the model normalized them (it refuses `dimensions`).

        Images for an image tower are decoded and preprocessed here, on the caller's thread; a bad one raises
        InvalidImage naming its input index.
        """
        info = self._embedding(len(token_lists), dimensions)
        return self._embedded(token_lists, info, truncate, timeout_s, labels, embd_normalize, dimensions)

    def _embedding(self, n_inputs: int, dimensions: int | None) -> ModelInfo:
        """An embedding request's checks before any work: an embedder, a `dimensions` it takes, a count it queues."""
        info = self._require_embedder()
        check_dimensions(dimensions, info.n_embd, info.multi_vector)
        self.check_count(n_inputs)
        return info

    def _embedded(self, token_lists: Sequence[list[int] | ImageInput | PreparedInput], info: ModelInfo,
                  truncate: bool | None, timeout_s: float, labels: Sequence[str] | None, embd_normalize: int,
                  dimensions: int | None) -> EmbedResult:
        cut = self.options.truncate if truncate is None else truncate
        started = time.monotonic()
        if self._builder is not None:  # a vision-language family's images are built into its prompt format
            token_lists = [self._prepare(_label(labels, i), item, None) if isinstance(item, ImageInput) else item
                           for i, item in enumerate(token_lists)]
        fitted = [self._image_work(_label(labels, i), item, info) if isinstance(item, ImageInput) else
                  self._fit_prepared(_label(labels, i), item, info, cut) if isinstance(item, PreparedInput) else
                  self._fit(item, info, cut) for i, item in enumerate(token_lists)]
        preprocess_s = time.monotonic() - started
        results, timings = self._serve(fitted, None, timeout_s)
        timings.tokenize_s += preprocess_s
        return EmbedResult(vectors=[finish(r.value, embd_normalize, dimensions) for r in results],
                           n_tokens=[_cost(item) for item in fitted], timings=timings)

    def _fit_prepared(self, label: str, prepared: PreparedInput, info: ModelInfo, truncate: bool) -> PreparedInput:
        """A built input within the per-input limit: a text-only one may be cut, one holding images may not
        (its image tokens are one block with the image's features)."""
        if not prepared.images:
            return PreparedInput(self._fit(prepared.ids, info, truncate))
        if len(prepared.ids) > info.max_input_tokens:
            if truncate:  # asked to cut, but cannot: say why rather than only that it is too long
                raise InvalidInput(f"{label} ({len(prepared.ids)} tokens, {prepared.image_tokens} of them its "
                                   f"images') is over the per-input limit of {info.max_input_tokens} tokens, and an "
                                   f"input holding images is never truncated: send less text or smaller images")
            self._too_long(len(prepared.ids), info)
        return prepared

    def _image_work(self, label: str, image: ImageInput, info: ModelInfo) -> ImageWork:
        if self._images is None:
            raise InvalidInput(f"{label} is an image, but this model ({info.architecture or info.model_type}) "
                               f"embeds text only")
        if image.text.strip() or len(image.images) != 1:
            raise InvalidInput(f"{label}: this model embeds either a text or one image per input, not both "
                               f"and not several (send each as an input of its own)")
        pixels = _labelled(label, lambda: self._images(image.images[0], self.options.image_max_pixels))
        return ImageWork(pixels, info.image_tokens)

    def _require_embedder(self) -> ModelInfo:
        info = self.info
        if info.is_reranker:
            raise InvalidInput("this server runs a reranker (rank pooling): it serves /rerank, not embeddings")
        return info

    def rerank(self, query: RerankItem, documents: Sequence[RerankItem], *, truncate: bool | None = None,
               instruction: str | None = None, timeout_s: float = 3600) -> RerankResult:
        """Score every (query, document) pair; scores come back in document order.

        `instruction` (generative rerankers only) overrides the server's <Instruct> text. The query and the
        documents are texts, or images (with any text beside them) for rerankers that take images.
        """
        info = self.info
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
        if self._pairs is not None:
            return self._rerank_pairs(query, documents, instruction or self.options.rerank_instruction, info, cut,
                                      timeout_s)
        started = time.monotonic()
        if self._prompt is not None:
            task = instruction or self.options.rerank_instruction
            rendered = self.tokenizer.encode_batch([self._prompt.render(query, doc, task) for doc in documents],
                                                   add_special=False)
            pairs = [(self._fit_prompt(ids, query, doc, task, info, cut), None)
                     for ids, doc in zip(rendered, documents)]
        else:
            pairs = self._fit_pairs(query, documents, info, cut)
        tokenize_s = time.monotonic() - started
        type_lists = None if self._prompt is not None else [types for _, types in pairs]
        results, timings = self._serve([ids for ids, _ in pairs], type_lists, timeout_s)
        timings.tokenize_s = tokenize_s
        scores = [float(r.value) for r in results]
        if self.options.rerank_sigmoid and info.kind == registry.CROSS_ENCODER and not self._probabilities:
            scores = [1.0 / (1.0 + math.exp(-s)) for s in scores]
        return RerankResult(scores=scores, n_tokens=[len(ids) for ids, _ in pairs], timings=timings)

    def _rerank_pairs(self, query: RerankItem, documents: Sequence[RerankItem], instruction: str | None,
                      info: ModelInfo, truncate: bool, timeout_s: float) -> RerankResult:
        """A reranker whose prompts may hold images: each pair built by the family (images decoded and processed
        here, the query's once); pairs holding images run alone in their pass, text-only pairs batch."""
        started = time.monotonic()
        query_side = self._rerank_side("query", query)
        limit = info.truncate_tokens if truncate else None
        pairs = []
        for i, document in enumerate(documents):
            side = self._rerank_side(f"document {i}", document)
            pairs.append(_labelled(f"document {i}", lambda: self._pairs.pair(query_side, side, instruction, limit)))
        for prepared in pairs:
            if len(prepared.ids) > info.max_input_tokens:
                self._too_long(len(prepared.ids), info)
        work = [prepared if prepared.images else prepared.ids for prepared in pairs]
        tokenize_s = time.monotonic() - started
        results, timings = self._serve(work, None, timeout_s)
        timings.tokenize_s = tokenize_s
        return RerankResult(scores=[float(r.value) for r in results], n_tokens=[len(p.ids) for p in pairs],
                            timings=timings)

    def _rerank_side(self, label: str, item: RerankItem) -> RerankSide:
        """The query or a document as the pair builder takes it, its images decoded (bounded) first."""
        parts = self._decoded(label, [item] if isinstance(item, str) else item)
        return _labelled(label, lambda: self._pairs.side(parts))

    def _serve(self, token_lists: list[list[int]], type_lists: list[list[int]] | None,
               timeout_s: float) -> tuple[list[ItemResult], Timings]:
        with self._in_flight_lock:
            self._in_flight += 1
        try:
            items = self._worker.submit(token_lists, time.monotonic() + timeout_s, type_lists)
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

    def fit(self, ids: list[int], truncate: bool | None = None) -> list[int]:
        """One tokenized input as `embed` would take it: cut when `truncate` (None: the server's --truncate)
        allows, else EmptyInput, InvalidTokens or InputTooLong, so a caller can check inputs one by one."""
        return self._fit(ids, self._require_embedder(), self.options.truncate if truncate is None else truncate)

    def _fit(self, ids: list[int], info: ModelInfo, truncate: bool) -> list[int]:
        if not ids:
            raise EmptyInput("Input content cannot be empty")
        self._known(ids)
        if len(ids) <= info.max_input_tokens:
            return ids
        if truncate:
            return self.tokenizer.truncate(ids, info.truncate_tokens)
        self._too_long(len(ids), info)
        return ids

    def _fit_pairs(self, query: str, documents: Sequence[str], info: ModelInfo,
                   truncate: bool) -> list[tuple[list[int], list[int]]]:
        """(ids, token types) of every (query, document) pair; over-long pairs are cut (re-encoded with the
        tokenizer's longest-first truncation) or refused."""
        pairs = self.tokenizer.encode_pairs([(query, doc) for doc in documents])
        too_long = [i for i, (ids, _) in enumerate(pairs) if len(ids) > info.max_input_tokens]
        if too_long and not truncate:
            self._too_long(len(pairs[too_long[0]][0]), info)
        cut = self.tokenizer.encode_pairs([(query, documents[i]) for i in too_long], max_length=info.truncate_tokens)
        for i, fitted in zip(too_long, cut, strict=True):
            pairs[i] = fitted
        return pairs

    def _fit_prompt(self, ids: list[int], query: str, document: str, instruction: str | None, info: ModelInfo,
                    truncate: bool) -> list[int]:
        """The rendered prompt's tokens `ids`; truncation cuts the query/document content, never the scaffold."""
        tok = self.tokenizer
        if len(ids) <= info.max_input_tokens:
            return ids
        if not truncate:
            self._too_long(len(ids), info)
        content = {"query": query, "document": document}
        parts = self._prompt.parts(instruction)
        kinds = [part.kind for part in parts]
        pieces = [tok.encode(part.text if part.kind == "text" else content[part.kind], add_special=False)
                  for part in parts]
        budget = info.truncate_tokens - sum(len(p) for p, kind in zip(pieces, kinds) if kind == "text")
        if budget < 2:
            self._too_long(len(ids), info)
        keep = {kind: len(p) for p, kind in zip(pieces, kinds) if kind != "text"}
        while keep["query"] + keep["document"] > budget:  # longest first, as transformers' truncation does
            longest = "document" if keep["document"] >= keep["query"] else "query"
            keep[longest] -= 1
        return [t for p, kind in zip(pieces, kinds) for t in (p if kind == "text" else p[:keep[kind]])]

    def _too_long(self, n_tokens: int, info: ModelInfo) -> None:
        """Raise InputTooLong naming whichever limit binds."""
        limits.check(n_tokens, info.n_ctx_train, self.options.ubatch_tokens,
                     info.slot_ctx if self.options.ctx_size > 0 else None, info.max_input_tokens)

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
