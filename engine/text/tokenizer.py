"""The checkpoint's tokenizer: llama-server's prompt rules on top of Hugging Face `tokenizers`."""
from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path

from tokenizers import Tokenizer

from engine.text import sentencepiece as spm
from engine.checkpoint import Checkpoint, special_token_text
from engine.errors import UnsupportedCheckpoint
from engine.types import TokenSpan, VocabType

_VOCAB_TYPES = {"WordPiece": VocabType.WPM, "BPE": VocabType.BPE, "Unigram": VocabType.UGM}


def _bytes_to_unicode() -> dict[str, int]:
    """GPT-2's byte <-> printable-character table, inverted: what byte-level BPE pieces spell."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


class TextTokenizer:
    """Encodes prompts exactly as the checkpoint's own tokenizer does, without baked-in padding/truncation."""

    def __init__(self, checkpoint: Checkpoint, tokenizer: Tokenizer | None = None):
        self._parsing = tokenizer or _load(checkpoint)
        self._literal_copy: Tokenizer | None = None
        self._truncating: dict[int, Tokenizer] = {}
        self._lock = threading.Lock()
        # read from the objects, not from a second serialization (a 49k-token BPE: 0.2 s to write, 0.2 s to parse)
        self._model_kind = type(self._parsing.model).__name__  # "BPE", "WordPiece", "Unigram", "WordLevel"
        self.vocab_type = _VOCAB_TYPES.get(self._model_kind, VocabType.NONE)
        self.n_vocab = self._parsing.get_vocab_size(with_added_tokens=True)
        self._special_ids = {i for i, t in self._parsing.get_added_tokens_decoder().items() if t.special}
        self._byte_decoder = _bytes_to_unicode() if self._model_kind == "BPE" else None
        self.leading_specials, self.trailing_specials = self._special_edges()
        cfg = checkpoint.tokenizer_config
        self.pad_id = self._token_id(cfg.get("pad_token"), checkpoint.config.get("pad_token_id"))
        self.bos_token = special_token_text(cfg.get("cls_token") or cfg.get("bos_token")) or ""
        self.eos_token = special_token_text(cfg.get("sep_token") or cfg.get("eos_token")) or ""

    @property
    def _literal(self) -> Tokenizer:
        """A second instance that treats special-token text literally (llama's parse_special=false), built on
        first use: only /tokenize's parse_special=false and a yes/no reranker's answer tokens need it, and the
        copy costs a 49k-token BPE 0.27 s of startup (a serialization written and parsed)."""
        if self._literal_copy is None:
            with self._lock:
                if self._literal_copy is None:
                    literal = Tokenizer.from_str(self._parsing.to_str())
                    literal.encode_special_tokens = True
                    self._literal_copy = literal
        return self._literal_copy

    def encode(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        tok = self._parsing if parse_special else self._literal
        return tok.encode(text, add_special_tokens=add_special).ids

    def encode_batch(self, texts: Sequence[str], add_special: bool = True,
                     parse_special: bool = True) -> list[list[int]]:
        """Many texts in one call: `tokenizers` encodes them in Rust, in parallel, without holding the GIL."""
        if not texts:
            return []
        tok = self._parsing if parse_special else self._literal
        return [enc.ids for enc in tok.encode_batch_fast(list(texts), add_special_tokens=add_special)]

    def word_spans(self, text: str) -> list[tuple[int, int, int | None]]:
        """(start, end, word) of each token of `text` (no special tokens): its characters in `text` and the
        index of the pre-tokenizer word it belongs to (None where the tokenizer does not say)."""
        enc = self._parsing.encode(text, add_special_tokens=False)
        return [(start, end, word) for (start, end), word in zip(enc.offsets, enc.word_ids, strict=True)]

    def encode_prompt(self, parts: Sequence[str | int], add_special: bool = True,
                      parse_special: bool = True) -> list[int]:
        """llama-server's mixed prompt: ints verbatim; only a leading string gets the special tokens."""
        return self.encode_prompts([parts], add_special, parse_special)[0]

    def encode_prompts(self, prompts: Sequence[Sequence[str | int]], add_special: bool = True,
                       parse_special: bool = True) -> list[list[int]]:
        """encode_prompt for every prompt, with all their text parts tokenized in two batched calls (the
        leading parts that get special tokens, then the rest)."""
        leading = [(p, i) for p, parts in enumerate(prompts) for i, part in enumerate(parts)
                   if isinstance(part, str) and i == 0 and add_special]
        inner = [(p, i) for p, parts in enumerate(prompts) for i, part in enumerate(parts)
                 if isinstance(part, str) and not (i == 0 and add_special)]
        encoded: dict[tuple[int, int], list[int]] = {}
        for where, special in ((leading, True), (inner, False)):
            texts = [prompts[p][i] for p, i in where]
            encoded.update(zip(where, self.encode_batch(texts, special, parse_special)))
        return [[token for i, part in enumerate(parts)
                 for token in (encoded[(p, i)] if isinstance(part, str) else (int(part),))]
                for p, parts in enumerate(prompts)]

    def encode_pair(self, first: str, second: str, max_length: int | None = None) -> tuple[list[int], list[int]]:
        """A sentence pair with the checkpoint's own pair template: (ids, token type ids).

        With max_length, tokens are dropped longest-first and the template's special tokens are kept.
        """
        return self.encode_pairs([(first, second)], max_length)[0]

    def encode_pairs(self, pairs: Sequence[tuple[str, str]],
                     max_length: int | None = None) -> list[tuple[list[int], list[int]]]:
        """encode_pair for many pairs in one batched call."""
        if not pairs:
            return []
        tok = self._parsing if max_length is None else self._pair_truncating(max_length)
        return [(enc.ids, enc.type_ids) for enc in tok.encode_batch_fast(list(pairs), add_special_tokens=True)]

    def _pair_truncating(self, max_length: int) -> Tokenizer:
        # Truncation is tokenizer state, so each length gets its own instance (shared by request threads).
        with self._lock:
            tok = self._truncating.get(max_length)
            if tok is None:
                tok = Tokenizer.from_str(self._parsing.to_str())
                tok.enable_truncation(max_length, strategy="longest_first")
                self._truncating[max_length] = tok
            return tok

    def decode(self, ids: Sequence[int], skip_special: bool = False) -> str:
        return self._parsing.decode(list(ids), skip_special_tokens=skip_special)

    def token_spans(self, text: str, add_special: bool = True) -> list[TokenSpan]:
        """`text`'s tokens with where each came from: (id, text, special, start, stop), offsets in UTF-8 bytes
        of `text`; a special token has its own text and no offsets (TEI's /tokenize)."""
        encoding = self._parsing.encode(text, add_special_tokens=add_special)
        raw = text.encode("utf-8")
        # the library's offsets count characters: the byte offset of each character boundary
        byte_at = [0]
        for ch in text:
            byte_at.append(byte_at[-1] + len(ch.encode("utf-8")))
        spans: list[TokenSpan] = []
        for token_id, (start, stop), special, token in zip(encoding.ids, encoding.offsets,
                                                           encoding.special_tokens_mask, encoding.tokens):
            # the template's special tokens, and one spelled out in the text ("[SEP]"; not [UNK] standing for text)
            if special or (token_id in self._special_ids and text[start:stop] == token):
                spans.append(TokenSpan(token_id, token, True, None, None))
                continue
            first, last = byte_at[start], byte_at[stop]
            spans.append(TokenSpan(token_id, raw[first:last].decode("utf-8", errors="replace"), False, first, last))
        return spans

    def token_to_id(self, token: str) -> int | None:
        """The id of the vocabulary entry (added tokens included) spelled exactly `token`, if there is one."""
        return self._parsing.token_to_id(token)

    def pieces(self, ids: Sequence[int]) -> list[str | list[int]]:
        """Each token's text as llama-server shows it: word starts keep their leading space."""
        return [self._piece(i) for i in ids]

    def truncate(self, ids: list[int], limit: int, direction: str = "right") -> list[int]:
        """Cut to `limit` tokens, keeping the trailing special tokens the template appended: from the right, or
        (direction "left", TEI's truncation_direction) from the left, keeping the end and the leading special
        tokens the template prepended."""
        if len(ids) <= limit:
            return ids
        return [ids[i] for i in self.kept_positions(ids, limit, direction)]

    def kept_positions(self, ids: list[int], limit: int, direction: str = "right") -> list[int]:
        """The positions of `ids` that truncate keeps, in order (late chunking maps its chunks through them)."""
        n = len(ids)
        if n <= limit:
            return list(range(n))
        tail = self.trailing_specials
        has_tail = bool(tail) and n >= len(tail) and ids[-len(tail):] == tail and limit > len(tail)
        if direction != "left":
            return [*range(limit - len(tail)), *range(n - len(tail), n)] if has_tail else list(range(limit))
        head = self.leading_specials
        tail = tail if has_tail else []
        if head and ids[:len(head)] == head and limit > len(head) + len(tail):
            return [*range(len(head)), *range(n - (limit - len(head)), n)]
        return list(range(n - limit, n))

    def encode_with_starts(self, text: str) -> tuple[list[int], list[int | None]]:
        """`text` encoded as encode() does (special tokens added and parsed), with the character offset where
        each token starts in `text`; None for a special token (the template's, or one spelled out in the text)."""
        encoding = self._parsing.encode(text, add_special_tokens=True)
        starts: list[int | None] = []
        for token_id, (start, stop), special, token in zip(encoding.ids, encoding.offsets,
                                                           encoding.special_tokens_mask, encoding.tokens):
            spelled = token_id in self._special_ids and text[start:stop] == token
            starts.append(None if special or spelled else start)
        return list(encoding.ids), starts

    def _special_edges(self) -> tuple[list[int], list[int]]:
        """The special tokens the template puts before and after a text's own tokens."""
        with_specials = self._parsing.encode("a", add_special_tokens=True).ids
        plain = self._parsing.encode("a", add_special_tokens=False).ids
        for start in range(len(with_specials) - len(plain) + 1):
            if with_specials[start:start + len(plain)] == plain:
                return with_specials[:start], with_specials[start + len(plain):]
        return [], []

    def _piece(self, token_id: int) -> str | list[int]:
        token = self._parsing.id_to_token(token_id)
        if token is None:
            return ""
        if token_id in self._special_ids:
            return token
        if self._model_kind == "WordPiece":
            return token[2:] if token.startswith("##") else " " + token
        if self._byte_decoder is not None and all(ch in self._byte_decoder for ch in token):
            raw = bytes(self._byte_decoder[ch] for ch in token)
            try:
                return raw.decode("utf-8")
            except UnicodeDecodeError:
                return list(raw)
        return token.replace("\u2581", " ")

    def _token_id(self, token: object, fallback: object) -> int:
        text = special_token_text(token)
        if text:
            found = self._parsing.token_to_id(text)
            if found is not None:
                return found
        return int(fallback) if isinstance(fallback, int) else 0


def longest_first(query: list[int], document: list[int], budget: int) -> tuple[list[int], list[int]]:
    """A query's and a document's tokens cut to `budget` together, a token at a time from whichever is longer
    (the document on a tie), as transformers' longest-first truncation does."""
    q, d = len(query), len(document)
    while q + d > max(budget, 0):
        if d >= q:
            d -= 1
        else:
            q -= 1
    return query[:q], document[:d]


def _load(checkpoint: Checkpoint) -> Tokenizer:
    path: Path = checkpoint.path / "tokenizer.json"
    if path.is_file():
        tok = Tokenizer.from_file(str(path))
    elif (checkpoint.path / "spiece.model").is_file() and \
            checkpoint.tokenizer_config.get("tokenizer_class") in spm.SIGLIP_TOKENIZERS:
        tok = spm.siglip_tokenizer(checkpoint.path, checkpoint.tokenizer_config)
    else:
        tok = _load_with_transformers(checkpoint)
    # The engine pads per micro-batch and truncates per checkpoint limit: strip baked-in settings.
    tok.no_padding()
    tok.no_truncation()
    return tok


def _load_with_transformers(checkpoint: Checkpoint) -> Tokenizer:
    """Only for checkpoints without tokenizer.json (vocab.txt, sentencepiece): convert once at load."""
    try:
        from transformers import (
            AutoTokenizer,  # lazy: heavy, and most checkpoints do not need it
        )
    except ImportError as exc:
        raise UnsupportedCheckpoint(
            f"{checkpoint.path}: no tokenizer.json; converting its tokenizer needs the transformers package") from exc
    fast = AutoTokenizer.from_pretrained(str(checkpoint.path), use_fast=True)
    if not getattr(fast, "is_fast", False):
        raise UnsupportedCheckpoint(f"{checkpoint.path}: its tokenizer has no fast (tokenizers) version")
    return Tokenizer.from_str(fast.backend_tokenizer.to_str())
