"""The engine's tokenizer for a GGUF file: built from its metadata, with llama-server's prompt rules."""
from __future__ import annotations

from collections.abc import Sequence

from engine.checkpoint import Checkpoint
from engine.loading.gguf import vocab
from engine.loading.gguf.reader import GGUFFile
from engine.text.tokenizer import TextTokenizer, longest_first
from engine.types import VocabType

_VOCAB_TYPES = {"bert": VocabType.WPM, "gpt2": VocabType.BPE, "llama": VocabType.SPM, "t5": VocabType.UGM}


class GGUFTokenizer(TextTokenizer):
    def __init__(self, checkpoint: Checkpoint, gguf: GGUFFile):
        """`checkpoint`: the file `gguf` as read (engine/loading/gguf/format.py)."""
        meta = gguf.metadata
        tok, self.rules = vocab.build(meta, str(checkpoint.path))
        super().__init__(checkpoint, tok)
        if self.rules.pad_id is not None:
            self.pad_id = self.rules.pad_id
        # /v1/models vocab_type and /tokenize pieces follow the file's tokenizer model, not the structure
        # it is emulated with (SentencePiece BPE runs on the tokenizers BPE model)
        self.vocab_type = _VOCAB_TYPES.get(meta.get("tokenizer.ggml.model"), self.vocab_type)
        if self.vocab_type is VocabType.SPM:
            self._byte_decoder = None
        # llama-server's rerank prompt of this file (Qwen3 rerankers): plain {query}/{document} substitution
        self.rerank_template: str | None = meta.get("tokenizer.chat_template.rerank")

    def encode_pairs(self, pairs: Sequence[tuple[str, str]],
                     max_length: int | None = None) -> list[tuple[list[int], list[int]]]:
        return [self._rerank_prompt(query, document, max_length) for query, document in pairs]

    def _rerank_prompt(self, first: str, second: str, max_length: int | None) -> tuple[list[int], list[int]]:
        """llama-server's rerank prompt: the file's rerank template, else [BOS] q [EOS] [SEP] d [EOS] by the
        file's flags; every token type 0. With max_length, query and document are cut longest-first."""
        if self.rerank_template is not None:
            head, _, rest = self.rerank_template.partition("{query}")
            middle, _, tail = rest.partition("{document}")
            ids = self.encode(f"{head}{first}{middle}{second}{tail}", add_special=False)
            if max_length is None or len(ids) <= max_length:
                return ids, [0] * len(ids)
            scaffold = [self.encode(part, add_special=False) for part in (head, middle, tail)]
            query, document = longest_first(self.encode(first, False, False), self.encode(second, False, False),
                                            max_length - sum(len(p) for p in scaffold))
            ids = scaffold[0] + query + scaffold[1] + document + scaffold[2]
            return ids, [0] * len(ids)
        query, document = self.encode(first, False, False), self.encode(second, False, False)
        r = self.rules
        eos = r.eos_id if r.eos_id is not None else r.sep_id
        before = [r.bos_id] if r.add_bos and r.bos_id is not None else []
        between = ([eos] if r.add_eos and eos is not None else []) + ([r.sep_id] if r.add_sep and r.sep_id is not None else [])
        after = [eos] if r.add_eos and eos is not None else []
        if max_length is not None:
            query, document = longest_first(query, document, max_length - len(before) - len(between) - len(after))
        ids = before + query + between + document + after
        return ids, [0] * len(ids)

    def _piece(self, token_id: int) -> str | list[int]:
        token = self._parsing.id_to_token(token_id)
        if self.vocab_type is VocabType.SPM and token is not None and len(token) == 6 and token.startswith("<0x") \
                and token.endswith(">") and token_id not in self._special_ids:
            return [int(token[3:5], 16)]  # a byte-fallback token is its byte
        return super()._piece(token_id)

    def decode(self, ids: Sequence[int], skip_special: bool = False) -> str:
        """llama-server's /detokenize: the pieces joined (special tokens as their text, unless skip_special)."""
        if skip_special:
            ids = [i for i in ids if i not in self._special_ids]
        out = bytearray()
        for piece in self.pieces(ids):
            out += bytes(piece) if isinstance(piece, list) else piece.encode("utf-8")
        return out.decode("utf-8", errors="replace")
