"""Fitting inputs to the loaded model, on the caller's thread: every input checked against the per-input limit
and cut when truncation is on (never when an input holds images), or refused naming the limit that binds. A
single input is cut from the right, or from the left (`truncation_direction`, TEI's field: its end kept).

Pairs are cut longest-first (engine/text/tokenizer.py `longest_first`, the one cut every caller shares), a
rendered rerank prompt only in its query and document, a chat-templated input with the template's closing
tokens written back over its end.

Long-document reranking (`max_chunks`): a document whose pair is over the limit is split into overlapping
windows of its tokens, each of which fits beside the query (`document_windows`); every window is scored as one
more pair and the document gets the best window's score (Engine.rerank).
"""
from __future__ import annotations

import bisect
from collections.abc import Sequence

from engine.errors import EmptyInput, InvalidInput, InvalidTokens
from engine.multimodal.inputs import PreparedInput
from engine.runtime import limits
from engine.text.chat_inputs import ChatInputs
from engine.text.prompts import RerankPrompt
from engine.text.tokenizer import TextTokenizer, longest_first
from engine.types import EngineOptions, ModelInfo


# Consecutive windows of one document share this share of a window's tokens (a quarter)
WINDOW_OVERLAP = 0.25


def document_windows(spans: Sequence[tuple[int, int, int | None]], size: int, max_windows: int) -> list[tuple[int, int]]:
    """A document's tokens (TextTokenizer.word_spans) as overlapping windows of at most `size` tokens, each a
    (start, end) character span of the document; at most `max_windows` of them, the first ones (the rest of the
    document is dropped).

    Each window starts `size - int(size * WINDOW_OVERLAP)` tokens after the previous one, so consecutive windows
    share a quarter of a window; window edges never split a pre-tokenizer word (an edge inside a word moves back
    to the word's first token), unless one word is longer than the whole window."""
    n = len(spans)
    step = max(1, size - int(size * WINDOW_OVERLAP))

    def same_word(a: int, b: int) -> bool:
        return spans[a][2] is not None and spans[a][2] == spans[b][2]

    def word_start(i: int, floor: int) -> int:  # token i moved back to its word's first token, staying above floor
        j = i
        while j > floor and same_word(j, j - 1):
            j -= 1
        return j if j > floor else i

    windows: list[tuple[int, int]] = []
    start = 0
    while start < n and len(windows) < max_windows:
        end = min(start + size, n)
        if end < n:
            end = word_start(end, start)
        windows.append((spans[start][0], spans[end - 1][1]))
        if end >= n:
            break
        start = word_start(min(start + step, end), start)
    return windows


TRUNCATION_DIRECTIONS = {"right": "right", "left": "left", "Right": "right", "Left": "left"}  # TEI's spellings


def truncation_direction(value: object) -> str:
    """"right" (cut the end, the default) or "left" (keep the end), from TEI's spellings; else InvalidInput."""
    if not isinstance(value, str) or value not in TRUNCATION_DIRECTIONS:
        raise InvalidInput(f"truncation direction must be one of 'right', 'left' (or 'Right', 'Left'), not {value!r}")
    return TRUNCATION_DIRECTIONS[value]


def chunk_segments(starts: Sequence[int | None], kept: Sequence[int], chunk_starts: Sequence[int],
                   first_char: int) -> list[tuple[int, ...]]:
    """Late chunking's rows: for each chunk, the rows of the fitted input whose tokens start inside
    it. `starts`: each token's character offset in the document (None: a special token, in no chunk); `kept`: the
    positions the fit kept (row r is token kept[r]); `chunk_starts`: where each chunk begins among the document's
    characters, the document's own text beginning at `first_char` (text before it, a prompt, is in no chunk).
    A chunk no kept token starts in (empty, only spaces a neighbour's token takes, or cut off) is InvalidInput."""
    bounds = [first_char + c for c in chunk_starts]
    rows: list[list[int]] = [[] for _ in bounds]
    for row, position in enumerate(kept):
        start = starts[position]
        if start is None or start < bounds[0]:
            continue
        rows[bisect.bisect_right(bounds, start) - 1].append(row)
    for i, chunk_rows in enumerate(rows):
        if not chunk_rows:
            raise InvalidInput(f"chunk {i} starts no token of the document (it is empty, only spaces or marks a "
                               f"neighbouring chunk's token takes, or truncation cut it off): join it to a "
                               f"neighbour or drop it")
    return [tuple(chunk_rows) for chunk_rows in rows]


class InputFitter:
    """One loaded model's limits (`info`) applied to its inputs; `options`: the server's length options."""

    def __init__(self, tokenizer: TextTokenizer, info: ModelInfo, options: EngineOptions,
                 prompt: RerankPrompt | None = None, chat: ChatInputs | None = None):
        self.tokenizer = tokenizer
        self.info = info
        self.options = options
        self._prompt = prompt  # a generative text reranker's prompt (fit_prompt)
        self._chat = chat  # an embedder whose texts go through its chat template (chat_ids)
        self._chat_tails: dict[str | None, list[int]] = {}  # per system prompt: the template's closing tokens

    def known(self, ids: Sequence[int]) -> Sequence[int]:
        """Ids in [0, n_vocab): the tokenizer library overflows (or invents text) on anything else."""
        if ids and (min(ids) < 0 or max(ids) >= self.tokenizer.n_vocab):
            raise InvalidTokens("Prompt contains invalid tokens")
        return ids

    def fit(self, ids: list[int], truncate: bool, direction: str = "right") -> list[int]:
        """One tokenized input within the limit: cut (keeping the template's special tokens; `direction` "left"
        keeps the end, TEI's truncation_direction) or refused."""
        if self._within(ids, truncate):
            return ids
        return self.tokenizer.truncate(ids, self.info.truncate_tokens, direction)

    def fit_positions(self, ids: list[int], truncate: bool, direction: str = "right") -> list[int]:
        """The positions of `ids` that fit keeps, in order, or fit's refusal."""
        if self._within(ids, truncate):
            return list(range(len(ids)))
        return self.tokenizer.kept_positions(ids, self.info.truncate_tokens, direction)

    def _within(self, ids: list[int], truncate: bool) -> bool:
        """True when `ids` fits whole; False when it must be cut (truncate on); else the refusal."""
        if not ids:
            raise EmptyInput("Input content cannot be empty")
        self.known(ids)
        if len(ids) <= self.info.max_input_tokens:
            return True
        if not truncate:
            self.too_long(len(ids))
        return False

    def fit_prepared(self, label: str, prepared: PreparedInput, truncate: bool,
                     direction: str = "right") -> PreparedInput:
        """A built input within the per-input limit: a text-only one may be cut, one holding images may not
        (its image tokens are one block with the image's features)."""
        if not prepared.images:
            return PreparedInput(self.fit(prepared.ids, truncate, direction))
        if len(prepared.ids) > self.info.max_input_tokens:
            if truncate:  # asked to cut, but cannot: say why rather than only that it is too long
                raise InvalidInput(f"{label} ({len(prepared.ids)} tokens, {prepared.image_tokens} of them its "
                                   f"images') is over the per-input limit of {self.info.max_input_tokens} tokens, "
                                   f"and an input holding images is never truncated: send less text or smaller "
                                   f"images")
            self.too_long(len(prepared.ids))
        return prepared

    def fit_pairs(self, query: str, documents: Sequence[str], truncate: bool) -> list[tuple[list[int], list[int]]]:
        """(ids, token types) of every (query, document) pair, as fit_text_pairs."""
        return self.fit_text_pairs([(query, doc) for doc in documents], truncate)

    def fit_text_pairs(self, pairs: Sequence[tuple[str, str]], truncate: bool) -> list[tuple[list[int], list[int]]]:
        """(ids, token types) of every (first, second) pair (a reranker's (query, document), a classifier's text
        pair); over-long pairs are cut (re-encoded with the tokenizer's longest-first truncation) or refused."""
        encoded = self.tokenizer.encode_pairs(list(pairs))
        too_long = [i for i, (ids, _) in enumerate(encoded) if len(ids) > self.info.max_input_tokens]
        if too_long and not truncate:
            self.too_long(len(encoded[too_long[0]][0]))
        cut = self.tokenizer.encode_pairs([pairs[i] for i in too_long], max_length=self.info.truncate_tokens)
        for i, fitted in zip(too_long, cut, strict=True):
            encoded[i] = fitted
        return encoded

    @property
    def pair_limit(self) -> int:
        """The most tokens one scored pair may hold (a window's pair included)."""
        return min(self.info.max_input_tokens, self.info.truncate_tokens)

    def _windows(self, document: str, room: int, query_tokens: int, max_chunks: int) -> list[str]:
        """`document` as window texts of at most `room` tokens (the limit less the query and the scaffold)."""
        if room < 1:
            raise InvalidInput(f"the query ({query_tokens} tokens with the pair's other tokens) leaves no room for "
                               f"a document window within the per-input limit of {self.pair_limit} tokens")
        return [document[a:b] for a, b in document_windows(self.tokenizer.word_spans(document), room, max_chunks)]

    def chunk_pairs(self, query: str, documents: Sequence[str],
                    max_chunks: int) -> tuple[list[tuple[list[int], list[int]]], list[int]]:
        """Cross-encoder pairs with every over-long document split into at most `max_chunks` windows: (the pairs,
        the document each pair belongs to). A document that fits is one pair, exactly as fit_pairs makes it."""
        limit = self.pair_limit
        whole = self.tokenizer.encode_pairs([(query, doc) for doc in documents])
        room = limit - len(self.tokenizer.encode_pairs([(query, "")])[0][0])
        texts: list[tuple[str, str]] = []
        owners: list[int] = []
        for i, (doc, (ids, _)) in enumerate(zip(documents, whole, strict=True)):
            pieces = [doc] if len(ids) <= limit else self._windows(doc, room, limit - room, max_chunks)
            texts.extend((query, piece) for piece in pieces)
            owners.extend([i] * len(pieces))
        # A window re-encoded on its own may differ by a token at its edges: cut any still over (longest-first).
        pairs = self.tokenizer.encode_pairs(texts)
        over = [k for k, (ids, _) in enumerate(pairs) if len(ids) > limit]
        for k, fitted in zip(over, self.tokenizer.encode_pairs([texts[k] for k in over], max_length=limit),
                             strict=True):
            pairs[k] = fitted
        return pairs, owners

    def chunk_prompts(self, query: str, documents: Sequence[str], instruction: str | None,
                      max_chunks: int) -> tuple[list[list[int]], list[int]]:
        """A generative reranker's rendered prompts with every over-long document split into at most
        `max_chunks` windows: (the prompts' tokens, the document each belongs to)."""
        limit = self.pair_limit
        render = self._prompt.render
        whole = self.tokenizer.encode_batch([render(query, doc, instruction) for doc in documents],
                                            add_special=False)
        room = limit - len(self.tokenizer.encode(render(query, "", instruction), add_special=False))
        prompts: list[list[int]] = []
        owners: list[int] = []
        for i, (doc, ids) in enumerate(zip(documents, whole, strict=True)):
            if len(ids) <= limit:
                prompts.append(ids)
                owners.append(i)
                continue
            pieces = self._windows(doc, room, limit - room, max_chunks)
            rendered = self.tokenizer.encode_batch([render(query, piece, instruction) for piece in pieces],
                                                   add_special=False)
            prompts.extend(self.fit_prompt(p, query, piece, instruction, True)
                           for p, piece in zip(rendered, pieces, strict=True))
            owners.extend([i] * len(pieces))
        return prompts, owners

    def fit_prompt(self, ids: list[int], query: str, document: str, instruction: str | None,
                   truncate: bool) -> list[int]:
        """The rendered rerank prompt's tokens `ids`; truncation cuts the query/document content, never the
        scaffold."""
        if len(ids) <= self.info.max_input_tokens:
            return ids
        if not truncate:
            self.too_long(len(ids))
        content = {"query": query, "document": document}
        pieces = [(part.kind, self.tokenizer.encode(part.text if part.kind == "text" else content[part.kind],
                                                    add_special=False))
                  for part in self._prompt.parts(instruction)]
        budget = self.info.truncate_tokens - sum(len(p) for kind, p in pieces if kind == "text")
        if budget < 2:
            self.too_long(len(ids))
        encoded = {kind: p for kind, p in pieces if kind != "text"}
        kept = dict(zip(("query", "document"), longest_first(encoded["query"], encoded["document"], budget)))
        return [t for kind, p in pieces for t in (p if kind == "text" else kept[kind])]

    def chat_ids(self, text: str, system: str | None, truncate: bool, direction: str = "right") -> list[int]:
        """One chat-templated input's tokens. Truncated as sentence-transformers does: cut to the model's
        length, then the template's tail (the tokens the render ends with whatever the content) written back
        over the last ones, so last-token pooling still reads the template's final token. Only on the right:
        cutting from the left would cut the template's head."""
        ids = self.tokenizer.encode(self._chat.render(text, system), add_special=False)
        if not truncate or len(ids) <= self.info.max_input_tokens:
            return ids
        if direction == "left":
            raise InvalidInput(f"an input of {len(ids)} tokens is over the per-input limit of "
                               f"{self.info.max_input_tokens}, and this model's texts go through its chat template, "
                               f"which is only truncated on the right: use truncation direction right")
        suffix = self._chat_tail(system)
        ids = ids[:self.info.truncate_tokens]
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

    def too_long(self, n_tokens: int) -> None:
        """Raise InputTooLong naming whichever limit binds."""
        info = self.info
        limits.check(n_tokens, info.n_ctx_train, self.options.ubatch_tokens,
                     info.slot_ctx if self.options.ctx_size > 0 else None, info.max_input_tokens)
