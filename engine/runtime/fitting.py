"""Fitting inputs to the loaded model, on the caller's thread: every input checked against the per-input limit
and cut when truncation is on (never when an input holds images), or refused naming the limit that binds.

Pairs are cut longest-first (engine/text/tokenizer.py `longest_first`, the one cut every caller shares), a
rendered rerank prompt only in its query and document, a chat-templated input with the template's closing
tokens written back over its end.
"""
from __future__ import annotations

from collections.abc import Sequence

from engine.errors import EmptyInput, InvalidInput, InvalidTokens
from engine.multimodal.inputs import PreparedInput
from engine.runtime import limits
from engine.text.chat_inputs import ChatInputs
from engine.text.prompts import RerankPrompt
from engine.text.tokenizer import TextTokenizer, longest_first
from engine.types import EngineOptions, ModelInfo


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

    def fit(self, ids: list[int], truncate: bool, left: bool = False) -> list[int]:
        """One tokenized input within the limit: cut (keeping the trailing special tokens; `left`: from the
        start, keeping the leading ones too) or refused."""
        if not ids:
            raise EmptyInput("Input content cannot be empty")
        self.known(ids)
        if len(ids) <= self.info.max_input_tokens:
            return ids
        if truncate:
            return self.tokenizer.truncate(ids, self.info.truncate_tokens, left)
        self.too_long(len(ids))
        return ids

    def fit_prepared(self, label: str, prepared: PreparedInput, truncate: bool) -> PreparedInput:
        """A built input within the per-input limit: a text-only one may be cut, one holding images may not
        (its image tokens are one block with the image's features)."""
        if not prepared.images:
            return PreparedInput(self.fit(prepared.ids, truncate))
        if len(prepared.ids) > self.info.max_input_tokens:
            if truncate:  # asked to cut, but cannot: say why rather than only that it is too long
                raise InvalidInput(f"{label} ({len(prepared.ids)} tokens, {prepared.image_tokens} of them its "
                                   f"images') is over the per-input limit of {self.info.max_input_tokens} tokens, "
                                   f"and an input holding images is never truncated: send less text or smaller "
                                   f"images")
            self.too_long(len(prepared.ids))
        return prepared

    def fit_pairs(self, query: str, documents: Sequence[str], truncate: bool) -> list[tuple[list[int], list[int]]]:
        """(ids, token types) of every (query, document) pair; over-long pairs are cut (re-encoded with the
        tokenizer's longest-first truncation) or refused."""
        pairs = self.tokenizer.encode_pairs([(query, doc) for doc in documents])
        too_long = [i for i, (ids, _) in enumerate(pairs) if len(ids) > self.info.max_input_tokens]
        if too_long and not truncate:
            self.too_long(len(pairs[too_long[0]][0]))
        cut = self.tokenizer.encode_pairs([(query, documents[i]) for i in too_long],
                                          max_length=self.info.truncate_tokens)
        for i, fitted in zip(too_long, cut, strict=True):
            pairs[i] = fitted
        return pairs

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

    def chat_ids(self, text: str, system: str | None, truncate: bool) -> list[int]:
        """One chat-templated input's tokens. Truncated as sentence-transformers does: cut to the model's
        length, then the template's tail (the tokens the render ends with whatever the content) written back
        over the last ones, so last-token pooling still reads the template's final token."""
        ids = self.tokenizer.encode(self._chat.render(text, system), add_special=False)
        if not truncate or len(ids) <= self.info.max_input_tokens:
            return ids
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
