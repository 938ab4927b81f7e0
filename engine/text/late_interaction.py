"""pylate's query and document formats for a text late-interaction (ColBERT) checkpoint.

What pylate 1.6.0's `pylate/models/colbert.py` (ColBERT.__init__, tokenize, insert_prefix_token, encode,
skiplist_mask) does to a text before and after the model, read from the checkpoint's
config_sentence_transformers.json (pylate's defaults where a key is absent):

- **prefix**: `query_prefix` / `document_prefix` ("[Q] " / "[D] ") is one token of the tokenizer (pylate adds it
  when the tokenizer lacks it, with a new embedding row: a checkpoint it saved has it), inserted as an id right
  after the first token of the tokenized text (after BOS / [CLS]); an empty prefix inserts nothing.
- **length**: the text is cut to `query_length` / `document_length` tokens, the prefix included (the tokenizer
  cuts it to one less, its special tokens kept, then the prefix goes in), as pylate always does.
- **query expansion** (`do_query_expansion`, default true): a query is padded to `query_length` with the mask
  token (else EOS, else the pad token), on the tokenizer's `padding_side`; the padding is masked out of
  attention unless `attend_to_expansion_tokens`, yet every position's vector is kept (ColBERT's query
  augmentation). Without expansion a query is not padded.
- **skiplist** (`skiplist_words`, default Python's string.punctuation): a document's rows whose token is one of
  those words' ids are dropped from its vectors; a query keeps every row.

pylate tokenizes through sentence-transformers 5's Transformer module (the version pylate 1.x pins), which strips
each text (and lowercases it when sentence_bert_config.json says do_lower_case): so is a text here.

A request names the role: `query` or `document` (the `prompt_name` of the embedding routes; /maxsim makes its
query a query and its documents documents). The checkpoint's own `prompts` text, if it has one for the role, goes
before the text as pylate's `prompt_name` does.
"""
from __future__ import annotations

import string
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from engine.checkpoint import read_json_optional, special_token_text
from engine.errors import UnsupportedCheckpoint
from engine.text.tokenizer import TextTokenizer

QUERY, DOCUMENT = "query", "document"
ROLES = (QUERY, DOCUMENT)
# pylate's defaults (ColBERT.__init__)
DEFAULTS = {"query_prefix": "[Q] ", "document_prefix": "[D] ", "query_length": 32, "document_length": 180,
            "do_query_expansion": True, "attend_to_expansion_tokens": False}


@dataclass(frozen=True)
class LateInput:
    """One text in its role's format: the ids the model runs on, which of them attention sees (1) and which rows
    are the input's vectors (a document's skiplist rows are not)."""

    ids: list[int]
    mask: list[int]
    rows: list[int]


@dataclass(frozen=True)
class LateFormat:
    prefix_ids: dict[str, int | None]  # role -> the prefix token's id (None: no prefix)
    lengths: dict[str, int]  # role -> query_length / document_length
    prompts: dict[str, str]  # role -> the checkpoint's own prompt text for it
    expansion_id: int
    expand: bool
    attend_expansion: bool
    pad_left: bool
    skiplist: frozenset[int]
    lower: bool = False  # sentence_bert_config.json's do_lower_case

    @classmethod
    def read(cls, folder: Path, tokenizer: TextTokenizer, tokenizer_config: dict) -> LateFormat:
        path = folder / "config_sentence_transformers.json"
        cfg = {**DEFAULTS, **{k: v for k, v in read_json_optional(path).items() if v is not None}}
        prefix_ids: dict[str, int | None] = {}
        lengths: dict[str, int] = {}
        for role in ROLES:
            prefix = cfg[f"{role}_prefix"]
            if not isinstance(prefix, str):
                raise UnsupportedCheckpoint(f"{path}: {role}_prefix must be a string, not {prefix!r}")
            found = tokenizer.token_to_id(prefix) if prefix else None
            if prefix and found is None:
                raise UnsupportedCheckpoint(f"{path}: the {role} prefix {prefix!r} is not a token of the checkpoint's "
                                            f"tokenizer (pylate adds it with a new embedding row when it trains)")
            prefix_ids[role] = found
            length = cfg[f"{role}_length"]
            if not isinstance(length, int) or isinstance(length, bool) or length < (3 if prefix else 2):
                raise UnsupportedCheckpoint(f"{path}: {role}_length must be an integer of at least "
                                            f"{3 if prefix else 2}, not {length!r}")
            lengths[role] = length
        words = cfg.get("skiplist_words", list(string.punctuation))
        if not isinstance(words, list) or not all(isinstance(w, str) for w in words):
            raise UnsupportedCheckpoint(f"{path}: skiplist_words must be a list of strings")
        unk = _token(tokenizer, tokenizer_config.get("unk_token"))
        skip = {tokenizer.token_to_id(w) for w in words}
        if None in skip:  # transformers' convert_tokens_to_ids: a word that is no token is the unknown token
            skip = (skip - {None}) | ({unk} if unk is not None else set())
        expansion = next((i for i in (_token(tokenizer, tokenizer_config.get(k))
                                      for k in ("mask_token", "eos_token", "pad_token")) if i is not None), None)
        if expansion is None:
            raise UnsupportedCheckpoint(f"{path}: query expansion needs a mask, EOS or pad token, and the "
                                        f"tokenizer has none")
        raw = read_json_optional(path).get("prompts") or {}
        prompts = {role: raw[role] for role in ROLES if isinstance(raw.get(role), str)}
        return cls(prefix_ids=prefix_ids, lengths=lengths, prompts=prompts, expansion_id=expansion,
                   expand=bool(cfg["do_query_expansion"]),
                   attend_expansion=bool(cfg["do_query_expansion"]) and bool(cfg["attend_to_expansion_tokens"]),
                   pad_left=tokenizer_config.get("padding_side") == "left", skiplist=frozenset(skip),
                   lower=read_json_optional(folder / "sentence_bert_config.json").get("do_lower_case") is True)

    def text(self, role: str, text: str) -> str:
        """The text the tokenizer encodes for this role: the checkpoint's prompt for it, then the text, stripped
        (and lowercased) as sentence-transformers 5's Transformer.tokenize does."""
        text = (self.prompts.get(role, "") + text).strip()
        return text.lower() if self.lower else text

    def build(self, role: str, ids: Sequence[int], tokenizer: TextTokenizer) -> LateInput:
        """A text's tokens (special tokens included, as the tokenizer encodes it) in the role's format."""
        prefix = self.prefix_ids[role]
        limit = self.lengths[role] - (prefix is not None)
        body = tokenizer.truncate(list(ids), limit)
        mask = [1] * len(body)
        if role == QUERY and self.expand and len(body) < limit:
            pad = [self.expansion_id] * (limit - len(body))
            fill = [1 if self.attend_expansion else 0] * len(pad)
            body, mask = (pad + body, fill + mask) if self.pad_left else (body + pad, mask + fill)
        if prefix is not None:
            body, mask = body[:1] + [prefix] + body[1:], mask[:1] + [1] + mask[1:]
        if role == QUERY:
            rows = list(range(len(body)))
        else:
            rows = [i for i, token in enumerate(body) if token not in self.skiplist]
        return LateInput(body, mask, rows)


def _token(tokenizer: TextTokenizer, value: object) -> int | None:
    text = special_token_text(value)
    return tokenizer.token_to_id(text) if text else None
