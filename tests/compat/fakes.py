"""A deterministic stand-in for engine.Engine: no model, no threads."""
from __future__ import annotations

import math
import zlib
from collections.abc import Sequence

import numpy as np

from engine.compute.normalize import finish
from engine.errors import EmptyInput, InputTooLong, InvalidInput, InvalidTokens, TooManyInputs
from engine.text.prompts import choose_task, format_prompts
from engine.types import ClassifyResult, EmbedResult, ImageInput, ModelInfo, Pooling, RerankResult, Timings, TokenSpan, VocabType

CLS, SEP = 101, 102
N_VOCAB = 1000
N_EMBD = 4


def word_id(word: str) -> int:
    return 200 + zlib.crc32(word.encode()) % 700


def pooled_vector(ids: Sequence[int]) -> np.ndarray:
    """A vector that differs per input; the last input component is 0 so some norms see a zero entry."""
    return np.array([len(ids), (sum(ids) % 97) - 48.5, ids[0] / 7.0, 0.0], dtype=np.float32)


def token_rows(ids: Sequence[int]) -> np.ndarray:
    return np.array([[t, t % 7 - 3, 1.5, -2.0] for t in ids], dtype=np.float32)


def item_words(item: str | ImageInput) -> str:
    """What the fake scores an item by: its text, an image as one word naming its size before it."""
    if isinstance(item, ImageInput):
        return " ".join(f"[image:{len(part)}]" if isinstance(part, bytes) else part for part in item.parts)
    return item


def pair_score(query: str, document: str) -> float:
    """Words the document shares with the query, less a little per document word: unbounded, like a logit."""
    words = document.split()
    return len(set(query.split()) & set(words)) - len(words) / 100


def pair_tokens(query: str, document: str) -> int:
    return 3 + len(query.split()) + len(document.split())  # [CLS] query [SEP] document [SEP]


class FakeEngine:
    """Tokenizes by splitting on spaces, wraps [CLS]/[SEP] around a leading text part when add_special."""

    def __init__(self, pooling: Pooling = Pooling.MEAN, loaded: bool = True, max_input_tokens: int = 16,
                 limit_kind: str = "ubatch", kind: str = "embedder", prompts: tuple[tuple[str, str], ...] = (),
                 default_prompt_name: str | None = None, instruction_template: str | None = None,
                 max_queue_items: int = 4096, modalities: tuple[str, ...] = ("text",)):
        """kind: "embedder" | "cross-encoder" | "generative-reranker" (a reranker has rank pooling).
        prompts, default_prompt_name, instruction_template: as a loaded embedding model's ModelInfo carries them.
        modalities: ("text", "image") for a reranker that takes images (its image items score as item_words)."""
        self.is_loaded = loaded
        self.info = ModelInfo(
            path="/models/fake-minilm", model_type="bert", architecture="BertModel", vocab_type=VocabType.WPM,
            n_vocab=N_VOCAB, n_embd=N_EMBD, n_ctx_train=512, n_params=22713216, size_bytes=90868376,
            ftype="F32", pooling=Pooling.RANK if kind != "embedder" else pooling,
            max_input_tokens=max_input_tokens, truncate_tokens=512, slot_ctx=256, n_slots=2, bos_token="[CLS]",
            eos_token="[SEP]", kind=kind, batch_tokens=4096, batch_rows=16, widths=(8, 16, 512), prompts=prompts,
            default_prompt_name=default_prompt_name, instruction_template=instruction_template, family="bert",
            modalities=modalities, weights="float32", resident_bytes=90868376,
            kernels="cpu-arithmetic")
        self.limit_kind = limit_kind
        self.max_queue_items = max_queue_items
        self.embed_calls: list[dict] = []
        self.encode_calls: list[dict] = []
        self.rerank_calls: list[dict] = []
        self.raise_on_embed: Exception | None = None
        self.raise_on_rerank: Exception | None = None
        self.fixed_vector: np.ndarray | None = None  # when set, every pooled input gets this vector
        self.fixed_scores: list[float] | None = None  # when set, the scores of every rerank, in document order
        self.processing = 0
        self.counters = {"prompt_tokens_total": 0, "prompt_seconds_total": 0.0, "n_decode_total": 0,
                         "n_tokens_max": 0}
        self._words: dict[int, str] = {CLS: "[CLS]", SEP: "[SEP]"}

    def encode_prompt(self, parts: Sequence[str | int], add_special: bool = True,
                      parse_special: bool = True) -> list[int]:
        self.encode_calls.append({"parts": list(parts), "add_special": add_special, "parse_special": parse_special})
        ids: list[int] = []
        for i, part in enumerate(parts):
            if isinstance(part, int):
                ids.append(part)
                continue
            words = [word_id(w) for w in part.split()]
            self._words.update(zip(words, part.split(), strict=True))
            ids += [CLS, *words, SEP] if i == 0 and add_special else words
        return ids

    def check_count(self, n_inputs: int) -> None:
        if n_inputs > self.max_queue_items:
            raise TooManyInputs(n_inputs, self.max_queue_items)

    def format_prompts(self, prompts, prompt_name=None, instruction=None, truncate=None, task=None):
        """The engine's rule for a model without a chat template (engine.text.prompts.format_prompts)."""
        return format_prompts(self.info, prompts, prompt_name, instruction, choose_task(self.info, task, prompt_name))

    def token_pieces(self, ids: Sequence[int]) -> list[str | list[int]]:
        return [[0xE2, 0x82] if t == 7 else " " + self._words.get(t, "?") for t in ids]

    def decode(self, ids: Sequence[int], skip_special: bool = False) -> str:
        return " ".join(self._words.get(t, "?") for t in ids if not (skip_special and t in (CLS, SEP)))

    def token_spans(self, text: str, add_special: bool = True) -> list[TokenSpan]:
        """Words split on single spaces, their UTF-8 byte offsets; [CLS]/[SEP] around them when add_special."""
        spans, start = [], 0
        for word in text.split(" "):
            raw = len(word.encode("utf-8"))
            if word:
                spans.append(TokenSpan(word_id(word), word, False, start, start + raw))
                self._words[word_id(word)] = word
            start += raw + 1
        if add_special:
            spans = [TokenSpan(CLS, "[CLS]", True, None, None), *spans, TokenSpan(SEP, "[SEP]", True, None, None)]
        return spans

    def embed_prompts(self, prompts: Sequence[Sequence[str | int]], *, truncate: bool | None = None,
                      timeout_s: float = 3600, embd_normalize: int = -1, dimensions: int | None = None,
                      truncation_direction: str = "right", prompt_name: str | None = None,
                      task: str | None = None) -> EmbedResult:
        choose_task(self.info, task, prompt_name)  # the engine's refusals (the fake has no adapters to run)
        return self.embed([self.encode_prompt(parts) for parts in prompts], truncate=truncate, timeout_s=timeout_s,
                          embd_normalize=embd_normalize, dimensions=dimensions,
                          truncation_direction=truncation_direction)

    def embed_late_chunks(self, chunks: Sequence[str], *, truncate: bool | None = None, timeout_s: float = 3600,
                          prompt_name: str | None = None, instruction: str | None = None, embd_normalize: int = -1,
                          dimensions: int | None = None, truncation_direction: str = "right",
                          task: str | None = None) -> EmbedResult:
        """Engine.embed_late_chunks on the fake: each chunk's words pooled (a chunk without a word, or a document
        over the limit without truncation, refused as the engine refuses them)."""
        if self.info.is_reranker:
            raise InvalidInput("this server runs a reranker (rank pooling): it serves /rerank, not embeddings")
        if self.info.pooling is Pooling.NONE:
            raise InvalidInput("this model cannot late-chunk: its pooling is 'none'")
        ids = [[word_id(word) for word in chunk.split()] for chunk in chunks]
        if not chunks or any(not chunk_ids for chunk_ids in ids):
            raise InvalidInput("late chunking: a chunk has no token")
        n = sum(map(len, ids)) + 2
        if n > self.info.max_input_tokens and not truncate:
            raise InputTooLong(n, self.info.max_input_tokens, self.limit_kind)
        vectors = [finish(pooled_vector(chunk_ids), embd_normalize, dimensions) for chunk_ids in ids]
        return EmbedResult(vectors=vectors, n_tokens=[len(chunk_ids) + (2 if i == 0 else 0)
                                                      for i, chunk_ids in enumerate(ids)],
                           timings=Timings(tokenize_s=0.0, queue_s=0.002, inference_s=0.0125))

    def embed(self, token_lists: list[list[int]], *, truncate: bool | None = None, timeout_s: float = 3600,
              embd_normalize: int = -1, dimensions: int | None = None, truncation_direction: str = "right") -> EmbedResult:
        """Vectors finished as the engine finishes them (engine.compute.normalize.finish); a cut input keeps
        its first max_input_tokens ids (truncation_direction left: its last)."""
        self.embed_calls.append({"token_lists": token_lists, "truncate": truncate, "timeout_s": timeout_s,
                                 "truncate_left": truncation_direction.lower() == "left"})
        if self.info.is_reranker:  # the engine's own words
            raise InvalidInput("this server runs a reranker (rank pooling): it serves /rerank, not embeddings")
        if self.raise_on_embed is not None:
            raise self.raise_on_embed
        for ids in token_lists:
            if not ids:
                raise EmptyInput("empty input")
            if any(t < 0 or t >= N_VOCAB for t in ids):
                raise InvalidTokens("bad token")
            if len(ids) > self.info.max_input_tokens and not truncate:
                raise InputTooLong(len(ids), self.info.max_input_tokens, self.limit_kind)
        limit = self.info.max_input_tokens
        kept = [ids[len(ids) - limit:] if truncation_direction.lower() == "left" and len(ids) > limit else ids[:limit] for ids in token_lists]
        make = token_rows if self.info.pooling is Pooling.NONE else pooled_vector
        vectors = [finish(make(ids) if self.fixed_vector is None else self.fixed_vector, embd_normalize, dimensions)
                   for ids in kept]
        self.counters["prompt_tokens_total"] += sum(map(len, kept))
        self.counters["prompt_seconds_total"] += 0.5
        self.counters["n_decode_total"] += 1
        return EmbedResult(vectors=vectors, n_tokens=[len(ids) for ids in kept],
                           timings=Timings(tokenize_s=0.0, queue_s=0.002, inference_s=0.0125))

    def maxsim(self, query, documents, *, truncate: bool | None = None, timeout_s: float = 3600) -> RerankResult:
        """The engine's refusal: the fake is no multi-vector model."""
        raise InvalidInput("MaxSim needs a multi-vector (late-interaction) model; this model (BertModel) gives one "
                           "vector per input")

    def rerank(self, query: str | ImageInput, documents: Sequence[str | ImageInput], *, truncate: bool | None = None,
               instruction: str | None = None, max_chunks: int | None = None, timeout_s: float = 3600,
               sigmoid: bool | None = None) -> RerankResult:
        """Raises what Engine.rerank raises, in its order; truncate None means the fake's --no-truncate. Records
        `max_chunks` (the real engine's windows are tested in tests/engine/test_rerank_chunks.py). sigmoid: a
        cross-encoder's sigmoid(score) when True (None: the fake's --no-rerank-sigmoid)."""
        self.rerank_calls.append({"query": query, "documents": list(documents), "truncate": truncate,
                                  "instruction": instruction, "max_chunks": max_chunks, "timeout_s": timeout_s,
                                  **({} if sigmoid is None else {"sigmoid": sigmoid})})
        if not self.info.is_reranker:
            raise InvalidInput("this server runs an embedding model: start a reranker with --reranking")
        if instruction is not None and self.info.kind != "generative-reranker":
            raise InvalidInput("'instruction' is only used by generative rerankers; this one is a cross-encoder")
        images = [label for label, item in [("query", query), *((f"document {i}", d) for i, d in enumerate(documents))]
                  if isinstance(item, ImageInput)]
        if images and not self.info.takes_images:
            raise InvalidInput(f"{images[0]} is an image, but this reranker (BertModel) scores text only")
        if self.raise_on_rerank is not None:
            raise self.raise_on_rerank
        query, documents = item_words(query), [item_words(document) for document in documents]
        limit = self.info.max_input_tokens
        n_tokens = [pair_tokens(query, document) for document in documents]
        for n in n_tokens:
            if n > limit and not truncate:
                raise InputTooLong(n, limit, self.limit_kind)
        if sigmoid is False and self.info.kind != "cross-encoder":
            raise InvalidInput("this reranker (BertModel) scores probabilities, not logits")
        scores = (list(self.fixed_scores) if self.fixed_scores is not None
                  else [pair_score(query, document) for document in documents])
        if sigmoid and self.info.kind == "cross-encoder":
            scores = [1.0 / (1.0 + math.exp(-s)) for s in scores]
        return RerankResult(scores=scores, n_tokens=[min(n, limit) for n in n_tokens],
                            timings=Timings(tokenize_s=0.001, queue_s=0.002, inference_s=0.0125))

    def classify(self, inputs: Sequence[str | tuple[str, str]], *, truncate: bool | None = None,
                 truncation_direction: str = "right", raw_scores: bool = False,
                 timeout_s: float = 3600) -> ClassifyResult:
        """What Engine.classify does on the fake's kinds: an embedder or a generative reranker is refused; a
        cross-encoder is a one-label classifier (LABEL_0, the sigmoid of its pair score unless raw_scores)."""
        if self.info.kind != "cross-encoder":
            raise InvalidInput(f"this server runs {'a generative reranker' if self.info.is_reranker else 'an embedding model'}"
                               " (BertModel): label scores need a sequence classifier")
        pairs = [(item, "") if isinstance(item, str) else item for item in inputs]
        scores = [pair_score(item_words(a), item_words(b)) for a, b in pairs]
        if not raw_scores:
            scores = [1.0 / (1.0 + math.exp(-s)) for s in scores]
        return ClassifyResult(scores=[[s] for s in scores], labels=("LABEL_0",),
                              n_tokens=[min(pair_tokens(a, b), self.info.max_input_tokens) for a, b in pairs])

    def stats(self) -> dict[str, float]:
        return {**self.counters, "requests_processing": self.processing, "requests_deferred": 3}

    # -- what engine.Residency uses on top (a several-model server) ---------------------------------------------
    load_s = 0.125

    def wait_loaded(self, timeout: float | None = None) -> ModelInfo:
        return self.info

    def close(self, wait: bool = False) -> None:
        self.is_loaded = False
