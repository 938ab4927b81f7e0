"""The engine in a program, without a listener: `from engine import Encoder, Reranker`.

Both wrap one Engine (the server's loader, detection, pooling, batching and limits), so a vector or a score
is the one the server would answer for the same input. Both are context managers (leaving the block frees
the model) and Ray Data callables (`ds.map_batches(Encoder, fn_constructor_args=(ref,), concurrency=N)`:
one engine per actor).
"""
from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from engine.compute.normalize import check_dimensions
from engine.errors import InputTooLong, InvalidInput
from engine.runtime import loader
from engine.runtime.engine import Engine
from engine.types import EngineOptions, ImageInput, ModelInfo, Pooling, RerankItem, SparseVector

# Inputs handed to the engine at once: under its queue bound, large enough to sort by length and fill batches.
SUBMIT_CHUNK = 1024

_REPOSITORY = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+(?::[\w.-]+)?")  # org/name[:quant]


def model_options(ref: str | Path, **options: Any) -> EngineOptions:
    """EngineOptions for `ref`: a local folder (or file), else an org/name repository of the Hugging Face cache.

    `options` are EngineOptions fields (pooling, truncate, max_seq, threads, offline, ...).
    """
    text = str(ref)
    local = Path(text).expanduser().exists() or not _REPOSITORY.fullmatch(text)
    if isinstance(options.get("pooling"), str):
        options["pooling"] = Pooling(options["pooling"])
    return EngineOptions(model_path=text if local else None, hf_repo=None if local else text, **options)


def token_vectors_reason(ref: str | Path, **options: Any) -> str | None:
    """Why the model `ref` names (with these EngineOptions fields) gives one vector per token rather than one per
    text, read from its configuration files without loading its weights; None when it gives one per text (or
    its family is not known here: loading it says why). A multi-vector (late-interaction) family, or pooling
    none. A corpus job asks before it writes anything."""
    return loader.token_vectors_reason(model_options(ref, **options))


def normalization(normalize: bool | int) -> int:
    """llama's embd_normalize from `normalize`: True = 2 (Euclidean), False = -1 (none), an int as llama reads it."""
    if isinstance(normalize, bool):
        return 2 if normalize else -1
    return int(normalize)


class _Loaded:
    """One Engine, loaded before the constructor returns; closing it frees the model."""

    def __init__(self, options: EngineOptions):
        self.engine = Engine(options)
        try:
            self.info: ModelInfo = self.engine.wait_loaded()
        except BaseException:
            self.engine.close(wait=True)
            raise

    @property
    def name(self) -> str:
        return self.engine.model_ref

    def close(self) -> None:
        self.engine.close(wait=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass
class Embedded:
    """`Encoder.embed`'s answer: vectors [n, d] float32 and each input's token count."""

    vectors: np.ndarray
    n_tokens: list[int]


@dataclass
class TokenVectors:
    """`Encoder.embed_token_vectors`' answer: a multi-vector model's float32 [n_tokens, d] rows per input (each
    row L2-normalized by the model) and each input's token count (image tokens included)."""

    rows: list[np.ndarray]
    n_tokens: list[int]


@dataclass
class SparseEmbedded:
    """`Encoder.embed_sparse`'s answer: a SPLADE encoder's vectors as their nonzero entries (`indices` ascending,
    `values`, over `dimension` = the vocabulary) and each input's token count."""

    vectors: list[SparseVector]
    n_tokens: list[int]

    def dense(self) -> np.ndarray:
        """The vectors as a dense float32 [n, dimension] array (what SparseEncoder.encode(...).to_dense() gives)."""
        width = self.vectors[0].dimension if self.vectors else 0
        out = np.zeros((len(self.vectors), width), np.float32)
        for row, vector in zip(out, self.vectors):
            row[vector.indices] = vector.values
        return out


@dataclass
class EncodedRows:
    """Per-row results of `Encoder.encode_rows`: a failed row has an error, a zero vector and 0 tokens."""

    vectors: np.ndarray  # [n, d] float32
    errors: list[str | None]
    n_tokens: list[int]


class Encoder(_Loaded):
    """An embedding model. `Encoder(ref, **options)`: ref is a folder or org/name; options are EngineOptions
    fields (pooling="cls", truncate=True, max_seq=256, ...)."""

    def __init__(self, ref: str | Path, **options: Any):
        opts = model_options(ref, **options)
        if opts.pooling is Pooling.RANK:
            raise InvalidInput("rank pooling is a reranker's: use Reranker")
        super().__init__(opts)

    @property
    def dimension(self) -> int:
        return self.info.n_embd

    def _prompts(self, texts: Sequence[str], prompt_name: str | None,
                 instruction: str | None, task: str | None = None) -> list[list[str | int]]:
        """Each text as the server's one-text prompt, with the prompt or instruction the server would add."""
        for text in texts:
            if not isinstance(text, str):
                raise InvalidInput(f"texts must be strings, not {type(text).__name__}")
        return self.engine.format_prompts([[text] for text in texts], prompt_name, instruction, task=task)

    def encode(self, texts: str | Sequence[str], *, normalize: bool | int = True, dimensions: int | None = None,
               prompt_name: str | None = None, instruction: str | None = None,
               batch_size: int | None = None, truncation_direction: str = "right",
               task: str | None = None) -> np.ndarray:
        """Vectors [n, d] float32 in input order (one text: still [1, d]).

        normalize: True = L2, False = raw, or llama's embd_normalize integer (0 max-abs, 1 taxicab, p>2 p-norm).
        dimensions: keep the first N components before normalizing. batch_size: the most texts one forward
        pass may hold (default: the engine's own limits). truncation_direction: with truncate=True, "left" cuts
        an over-long text's start instead of its end. task: a task-adapter model's task (jina-embeddings-v3:
        retrieval.query, ...), its instruction before each text unless prompt_name is given, as the server's
        `task` field (None: prompt_name's task, else the model's default). Raises InvalidInput (EmptyInput,
        InputTooLong) like the server answers 400.
        """
        return self.embed(texts, normalize=normalize, dimensions=dimensions, prompt_name=prompt_name,
                          instruction=instruction, batch_size=batch_size,
                          truncation_direction=truncation_direction, task=task).vectors

    def embed(self, texts: str | Sequence[str], *, normalize: bool | int = True, dimensions: int | None = None,
              prompt_name: str | None = None, instruction: str | None = None,
              batch_size: int | None = None, truncation_direction: str = "right",
              task: str | None = None) -> Embedded:
        """`encode` with each input's token count (what the server reports as usage)."""
        if isinstance(texts, str):
            texts = [texts]
        p = normalization(normalize)
        size = check_dimensions(dimensions, self.info.n_embd)
        if self.info.vision_language:  # the family formats its texts itself (engine/multimodal/inputs.py)
            self._one_vector_per_input()
            vectors, n_tokens = self._embed_prompts([[text] for text in texts], batch_size, prompt_name,
                                                    instruction, p, dimensions, truncation_direction)
        else:
            chosen = self.engine.choose_task(task, prompt_name)
            token_lists = self.engine.tokenizer.encode_prompts(self._prompts(list(texts), prompt_name, instruction,
                                                                             chosen))
            vectors, n_tokens = self._embed(token_lists, batch_size, p, dimensions, truncation_direction, chosen)
        return Embedded(_stacked(vectors, size), n_tokens)

    def embed_late_chunks(self, chunks: Sequence[str], *, normalize: bool | int = True,
                          dimensions: int | None = None, prompt_name: str | None = None,
                          instruction: str | None = None, truncation_direction: str = "right",
                          task: str | None = None) -> Embedded:
        """Late chunking: `chunks`, consecutive pieces of one document joined exactly as given, embedded in one
        pass; one vector per chunk, pooled from the tokens that start inside it (Engine.embed_late_chunks), with
        each chunk's token count (the first's holds the prompt's and the special tokens)."""
        for chunk in chunks:
            if not isinstance(chunk, str):
                raise InvalidInput(f"chunks must be strings, not {type(chunk).__name__}")
        size = check_dimensions(dimensions, self.info.n_embd)
        result = self.engine.embed_late_chunks(list(chunks), prompt_name=prompt_name, instruction=instruction,
                                               embd_normalize=normalization(normalize), dimensions=dimensions,
                                               truncation_direction=truncation_direction, task=task)
        return Embedded(_stacked(result.vectors, size), result.n_tokens)

    def embed_sparse(self, texts: str | Sequence[str], *, prompt_name: str | None = None,
                     max_active_dims: int | None = None, batch_size: int | None = None) -> SparseEmbedded:
        """A sparse (SPLADE) encoder's vectors, as the server's POST /embed_sparse answers them: per text its
        nonzero entries over the vocabulary, kept to the `max_active_dims` largest (None: the checkpoint's
        own max_active_dims, else all), as sentence-transformers' SparseEncoder.encode computes them. A dense
        model raises InvalidInput (NotSparse); a sparse one refuses `encode` / `embed` with normalization."""
        if isinstance(texts, str):
            texts = [texts]
        prompts = self._prompts(list(texts), prompt_name, None)
        results = [self.engine.embed_sparse(prompts[part], max_active_dims=max_active_dims)
                   for part in self._chunks(len(prompts), batch_size)]
        return SparseEmbedded([v for r in results for v in r.vectors], [n for r in results for n in r.n_tokens])

    def embed_images(self, images: Sequence[bytes | str | Path], *, normalize: bool | int = True,
                     dimensions: int | None = None, batch_size: int | None = None, prompt_name: str | None = None,
                     instruction: str | None = None) -> Embedded:
        """Vectors for images (encoded bytes, or image file paths) with what each counts as (its tokens), for
        models that take images; a bad one raises InvalidImage naming it, as the server answers 400.
        prompt_name / instruction reach the families that build their own prompts (engine/multimodal/inputs.py) only."""
        p = normalization(normalize)
        size = check_dimensions(dimensions, self.info.n_embd)
        self._one_vector_per_input()
        vectors, n_tokens = self._embed_prompts(_image_inputs(images), batch_size, prompt_name, instruction, p,
                                                dimensions)
        return Embedded(_stacked(vectors, size), n_tokens)

    def embed_token_vectors(self, texts: Sequence[str] = (), images: Sequence[bytes | str | Path] = (), *,
                            batch_size: int | None = None, prompt_name: str | None = None,
                            instruction: str | None = None) -> TokenVectors:
        """A multi-vector (late-interaction) model's token vectors: texts, then images (encoded bytes or file
        paths), one [n_tokens, d] array each; score them with engine.compute.maxsim. prompt_name / instruction go to the
        family, which refuses what it does not use (as the server's routes do)."""
        if not self.info.multi_vector:
            raise InvalidInput("this model gives one vector per input: use embed / embed_images")
        rows, n_tokens = self._embed_prompts([*([text] for text in texts), *_image_inputs(images)], batch_size,
                                             prompt_name, instruction)
        return TokenVectors(rows, n_tokens)

    def _one_vector_per_input(self) -> None:
        if self.info.multi_vector:
            raise InvalidInput("this model is multi-vector (one vector per token): use embed_token_vectors")
        if self.info.pooling is Pooling.NONE:
            raise InvalidInput("pooling 'none' gives one vector per token; Encoder returns one vector per text")

    def _chunks(self, n: int, batch_size: int | None) -> list[slice]:
        """The engine batches what it is given; handing it `chunk` inputs at a time bounds a pass's rows."""
        chunk = SUBMIT_CHUNK if batch_size is None else batch_size
        if chunk < 1:
            raise InvalidInput(f"batch_size must be at least 1, not {batch_size}")
        chunk = min(chunk, self.engine.options.max_queue_items)
        return [slice(start, start + chunk) for start in range(0, n, chunk)]

    def _embed(self, token_lists: list[list[int]], batch_size: int | None, embd_normalize: int,
               dimensions: int | None, truncation_direction: str = "right",
               task: str | None = None) -> tuple[list[np.ndarray], list[int]]:
        """Pooled vectors, finished by the engine (`dimensions`, then `embd_normalize`), and token counts, in order."""
        self._one_vector_per_input()
        results = [self.engine.embed(token_lists[part], embd_normalize=embd_normalize, dimensions=dimensions,
                                     truncation_direction=truncation_direction, task=task)
                   for part in self._chunks(len(token_lists), batch_size)]
        return [v for r in results for v in r.vectors], [n for r in results for n in r.n_tokens]

    def _embed_prompts(self, prompts: list[list[str] | ImageInput], batch_size: int | None,
                       prompt_name: str | None = None, instruction: str | None = None, embd_normalize: int = -1,
                       dimensions: int | None = None,
                       truncation_direction: str = "right") -> tuple[list[np.ndarray], list[int]]:
        """Vectors finished by the engine (a multi-vector model's rows as it gives them) and token counts of text
        prompts and images, through engine.embed_prompts."""
        results = [self.engine.embed_prompts(prompts[part], prompt_name=prompt_name, instruction=instruction,
                                             embd_normalize=embd_normalize, dimensions=dimensions,
                                             truncation_direction=truncation_direction)
                   for part in self._chunks(len(prompts), batch_size)]
        return [v for r in results for v in r.vectors], [n for r in results for n in r.n_tokens]

    def encode_rows(self, texts: Sequence[str | None], *, normalize: bool | int = True,
                    dimensions: int | None = None, prompt_name: str | None = None, instruction: str | None = None,
                    batch_size: int | None = None, task: str | None = None) -> EncodedRows:
        """Like encode, but a bad row (missing or empty text, too long without truncation) is reported in
        `errors` instead of failing the others: what a corpus job needs."""
        p = normalization(normalize)
        chosen = self.engine.choose_task(task, prompt_name)  # a bad task fails the job, not a row
        size = check_dimensions(dimensions, self.info.n_embd)
        errors: list[str | None] = [None] * len(texts)
        for i, text in enumerate(texts):
            if text is None:
                errors[i] = "missing text"
            elif not isinstance(text, str):
                errors[i] = f"text is a {type(text).__name__}, not a string"
            elif not text.strip():
                errors[i] = "empty text"
        present = [i for i, error in enumerate(errors) if error is None]
        vectors = np.zeros((len(texts), size), np.float32)
        n_tokens = [0] * len(texts)
        if self.info.vision_language:  # the family builds each row's prompt itself (engine/multimodal/inputs.py)
            self._one_vector_per_input()
            found = self._embed_built_rows(texts, present, errors, batch_size, prompt_name, instruction, p,
                                           dimensions)
            for i, (vector, n) in found.items():
                vectors[i], n_tokens[i] = vector, n
            return EncodedRows(vectors, errors, n_tokens)
        encoded = self.engine.tokenizer.encode_prompts(self._prompts([texts[i] for i in present], prompt_name,
                                                                     instruction, chosen))
        good: list[int] = []
        token_lists: list[list[int]] = []
        for i, ids in zip(present, encoded):
            try:
                token_lists.append(self.engine.fit(ids))
            except InputTooLong as exc:
                errors[i] = f"{exc} (--truncate cuts it instead)"
            except InvalidInput as exc:
                errors[i] = str(exc)
            else:
                good.append(i)
        if good:
            found, counts = self._embed(token_lists, batch_size, p, dimensions, task=chosen)
            vectors[good] = _stacked(found, size)
            for i, n in zip(good, counts):
                n_tokens[i] = n
        return EncodedRows(vectors, errors, n_tokens)

    def _embed_built_rows(self, texts: Sequence[str | None], rows: list[int], errors: list[str | None],
                          batch_size: int | None, prompt_name: str | None, instruction: str | None,
                          embd_normalize: int, dimensions: int | None) -> dict[int, tuple[np.ndarray, int]]:
        """Finished vectors and token counts of these rows through the family's input builder, by row; a chunk
        that fails is retried row by row so that only the bad rows carry an error."""
        def run(group: list[int]) -> dict[int, tuple[np.ndarray, int]]:
            result = self.engine.embed_prompts([[texts[i]] for i in group], prompt_name=prompt_name,
                                               instruction=instruction, embd_normalize=embd_normalize,
                                               dimensions=dimensions)
            return dict(zip(group, zip(result.vectors, result.n_tokens)))

        found: dict[int, tuple[np.ndarray, int]] = {}
        for part in self._chunks(len(rows), batch_size):
            try:
                found.update(run(rows[part]))
                continue
            except InvalidInput:
                pass
            for i in rows[part]:
                try:
                    found.update(run([i]))
                except InputTooLong as exc:
                    errors[i] = f"{exc} (--truncate cuts it instead)"
                except InvalidInput as exc:
                    errors[i] = str(exc)
        return found

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Ray Data: `batch["text"]` -> the batch with an `embedding` column ([n, d] float32, L2-normalized).
        A bad row raises, as `encode` does."""
        out = dict(batch)
        out["embedding"] = self.encode(list(batch["text"]))  # a null text is an error, never the string "None"
        return out


class Reranker(_Loaded):
    """A reranker (cross-encoder or generative). Scores follow the server's score contract: a cross-encoder's
    raw logit (sigmoid with rerank_sigmoid=True), a generative reranker's P(yes)."""

    def __init__(self, ref: str | Path, **options: Any):
        super().__init__(replace(model_options(ref, **options), pooling=Pooling.RANK))

    @property
    def kind(self) -> str:
        return self.info.kind

    def score(self, query: RerankItem, documents: Sequence[RerankItem], *, instruction: str | None = None,
              max_chunks: int | None = None) -> tuple[np.ndarray, list[int]]:
        """(scores in document order, tokens of each pair). The query and the documents are strings, or (rerankers
        that take images) an ImageInput (its text pieces and encoded images, in order). `max_chunks` (text
        rerankers; None: the rerank_chunks option, 0: off) splits a document over the model's limit into at most
        that many overlapping windows and gives it its best window's score (its tokens: every window's)."""
        if not documents:
            raise InvalidInput("documents must not be empty")
        if not all(isinstance(item, (str, ImageInput)) for item in (query, *documents)):
            raise InvalidInput("the query and the documents must be strings (or ImageInput images)")
        result = self.engine.rerank(query, list(documents), instruction=instruction, max_chunks=max_chunks)
        return np.asarray(result.scores, dtype=np.float64), list(result.n_tokens)

    def predict(self, pairs: Sequence[tuple[str, str]], *, instruction: str | None = None,
                max_chunks: int | None = None) -> np.ndarray:
        """One score per (query, document) pair, in input order; pairs sharing a query are scored together."""
        by_query: dict[str, list[int]] = {}
        for i, (query, _) in enumerate(pairs):
            by_query.setdefault(query, []).append(i)
        scores = np.zeros(len(pairs), np.float64)
        for query, rows in by_query.items():
            scores[rows] = self.score(query, [pairs[i][1] for i in rows], instruction=instruction,
                                      max_chunks=max_chunks)[0]
        return scores

    def rank(self, query: str, documents: Sequence[str], top_n: int | None = None, *,
             instruction: str | None = None, max_chunks: int | None = None) -> list[dict[str, Any]]:
        """[{"index", "score"}] by score descending, ties by ascending index, the first top_n (None: all)."""
        scores, _ = self.score(query, documents, instruction=instruction, max_chunks=max_chunks)
        return ranking(scores, top_n)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Ray Data: `batch["query"]`, `batch["document"]` -> the batch with a `score` column."""
        out = dict(batch)
        out["score"] = self.predict(list(zip(batch["query"], batch["document"])))
        return out


class Classifier(_Loaded):
    """A sequence classifier (a *ForSequenceClassification head with several labels; a one-label cross-encoder
    too): label scores as the server's /predict and /classify give them."""

    def __init__(self, ref: str | Path, **options: Any):
        super().__init__(model_options(ref, **options))

    @property
    def labels(self) -> tuple[str, ...]:
        return self.info.labels or ("LABEL_0",)

    def classify(self, inputs: str | tuple[str, str] | Sequence[str | tuple[str, str]], *,
                 raw_scores: bool = False) -> np.ndarray:
        """float64 [n, labels] in label order (`labels`): probabilities (softmax, or each label's sigmoid for a
        multi-label head), or the logits with raw_scores. An input is a text or a (text, text_pair) pair."""
        items = [inputs] if isinstance(inputs, (str, tuple)) else list(inputs)
        if not items or not all(isinstance(item, str) or (isinstance(item, tuple) and len(item) == 2 and
                                                           all(isinstance(t, str) for t in item)) for item in items):
            raise InvalidInput("inputs must be texts or (text, text_pair) pairs, at least one")
        result = self.engine.classify(items, raw_scores=raw_scores)
        return np.asarray(result.scores, dtype=np.float64)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Ray Data: `batch["text"]` -> the batch with a `label` column (the best label) and a `scores` column."""
        scores = self.classify([str(t) for t in batch["text"]])
        return {**batch, "label": np.asarray([self.labels[i] for i in scores.argmax(axis=1)]), "scores": scores}


def _stacked(vectors: Sequence[np.ndarray], width: int) -> np.ndarray:
    """Finished vectors as one float32 [n, width] array (an empty call: [0, width])."""
    return np.stack(vectors).astype(np.float32, copy=False) if vectors else np.zeros((0, width), np.float32)


def _image_inputs(images: Sequence[bytes | str | Path]) -> list[ImageInput]:
    return [ImageInput.image(image if isinstance(image, bytes) else Path(image).read_bytes()) for image in images]


def ranking(scores: Sequence[float], top_n: int | None = None) -> list[dict[str, Any]]:
    """Indices by score descending, ties by ascending index (the server's order), cut to top_n."""
    if top_n is not None and top_n < 0:
        raise InvalidInput(f"top_n must not be negative, not {top_n}")
    order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))
    return [{"index": i, "score": float(scores[i])} for i in order[:top_n]]
