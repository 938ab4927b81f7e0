"""A `tokenizers.Tokenizer` built from a GGUF's `tokenizer.ggml.*` metadata, tokenizing as llama.cpp does
(llama-vocab.cpp's defaults for add_bos/add_eos/add_sep, its pre-tokenizer regexes, its WordPiece vocabulary
with phantom spaces), so that ids equal llama-server's /tokenize on the same file."""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

from engine.errors import UnsupportedCheckpoint

# llama_token_type: which tokens are matched in text (CONTROL/UNKNOWN only when parsing special tokens).
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
PHANTOM_SPACE = "\u2581"

_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_LLAMA3 = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
           r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2 = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
          r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_DEFAULT = (r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", r"[0-9][0-9][0-9]")
# Mistral's Tekken (Ministral 3, Mistral Nemo), as its tokenizer.json writes it
_TEKKEN = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
           r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}"
           r"| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")


@dataclass(frozen=True)
class _PreType:
    regexes: tuple[str, ...]
    add_bos: bool = False  # llama's default before the file's own add_bos_token
    add_sep: bool = False
    ignore_merges: bool = False


# tokenizer.ggml.pre -> llama.cpp's pre-tokenizer (the BPE names embedding and reranking GGUFs use).
_BPE_PRE: dict[str, _PreType] = {
    **dict.fromkeys(("default",), _PreType(_DEFAULT)),
    **dict.fromkeys(("llama3", "llama-v3", "llama-bpe", "falcon3", "jina-v5-nano"),
                    _PreType((_LLAMA3,), add_bos=True, ignore_merges=True)),
    **dict.fromkeys(("lfm2",), _PreType((_LLAMA3,))),  # llama3's regex, merges applied
    **dict.fromkeys(("tekken",), _PreType((_TEKKEN,), add_bos=True, ignore_merges=True)),
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen", "megrez", "stablelm2", "f2llmv2"), _PreType((_QWEN2,))),
    **dict.fromkeys(("gpt-2", "phi-2", "jina-es", "jina-de", "jina-v2-es", "jina-v2-de", "modern-bert", "mpt",
                     "olmo", "exaone4"), _PreType((_GPT2,))),
    **dict.fromkeys(("jina-v1-en", "jina-v2-code", "roberta-bpe"), _PreType((_GPT2,), add_sep=True)),
    **dict.fromkeys(("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b"),
                    _PreType((r"\p{N}", _GPT2))),
}


@dataclass(frozen=True)
class SpecialRules:
    """llama.cpp's add-special flags and ids for one file."""

    add_bos: bool
    add_eos: bool
    add_sep: bool
    bos_id: int | None
    eos_id: int | None
    sep_id: int | None
    pad_id: int | None
    unk_id: int | None


# llama-vocab.cpp's defaults per tokenizer model, before the file's own tokenizer.ggml.* keys (a BPE file's
# add_bos/add_sep also follow its pre-tokenizer)
_DEFAULTS = {
    "bert": SpecialRules(add_bos=True, add_eos=False, add_sep=True, bos_id=101, eos_id=None, sep_id=102, pad_id=0,
                         unk_id=100),
    "gpt2": SpecialRules(add_bos=False, add_eos=False, add_sep=False, bos_id=11, eos_id=11, sep_id=None, pad_id=None,
                         unk_id=None),
    "t5": SpecialRules(add_bos=False, add_eos=True, add_sep=False, bos_id=None, eos_id=1, sep_id=None, pad_id=0,
                       unk_id=2),
    "llama": SpecialRules(add_bos=True, add_eos=False, add_sep=False, bos_id=1, eos_id=2, sep_id=None, pad_id=None,
                          unk_id=0),
}


def build(meta: dict[str, Any], source: str) -> tuple[Tokenizer, SpecialRules]:
    """The tokenizer of a GGUF file's metadata; `source` names the file in errors."""
    rules = special_rules(meta, source)
    model = meta.get("tokenizer.ggml.model")
    tokens: list[str] = meta["tokenizer.ggml.tokens"]
    types = [int(t) for t in meta.get("tokenizer.ggml.token_type", [NORMAL] * len(tokens))]
    if model == "bert":
        tok = _wordpiece(meta, tokens, types, rules)
    elif model == "gpt2":
        tok = _byte_level_bpe(meta, tokens, source)
    elif model == "t5":
        tok = _unigram(meta, tokens, source, rules)
    else:
        tok = _sentencepiece_bpe(meta, tokens, types, source, rules)
    _add_specials(tok, tokens, types)
    tok.post_processor = _template(rules, tokens, model == "bert")
    return tok, rules


def special_rules(meta: dict[str, Any], source: str) -> SpecialRules:
    """llama.cpp's add-special flags and special token ids for a GGUF file: its tokenizer.ggml.* keys, else the
    defaults of its tokenizer model (what llama-server tokenizes with and reports in /props)."""
    model = meta.get("tokenizer.ggml.model")
    n_tokens = len(meta.get("tokenizer.ggml.tokens") or [])
    if not n_tokens:
        raise UnsupportedCheckpoint(f"{source}: no tokenizer.ggml.tokens: the file has no vocabulary")
    defaults = _DEFAULTS.get(str(model))
    if defaults is None:
        raise UnsupportedCheckpoint(f"{source}: tokenizer model {model!r} is not supported (supported: bert "
                                    f"(WordPiece), gpt2 (byte-level BPE), llama (SentencePiece BPE), t5 (Unigram))")
    if model == "gpt2" and (pre := _BPE_PRE.get(_pre_name(meta))) is not None:
        defaults = replace(defaults, add_bos=pre.add_bos, add_sep=pre.add_sep)
    return SpecialRules(
        add_bos=_flag(meta, "add_bos_token", defaults.add_bos),
        add_eos=_flag(meta, "add_eos_token", defaults.add_eos),
        add_sep=_flag(meta, "add_sep_token", defaults.add_sep),
        bos_id=_token_id(meta, "bos_token_id", defaults.bos_id, n_tokens),
        eos_id=_token_id(meta, "eos_token_id", defaults.eos_id, n_tokens),
        # the converter's spelling of the key
        sep_id=_token_id(meta, "seperator_token_id", defaults.sep_id, n_tokens),
        pad_id=_token_id(meta, "padding_token_id", defaults.pad_id, n_tokens),
        unk_id=_token_id(meta, "unknown_token_id", defaults.unk_id, n_tokens),
    )


def _pre_name(meta: dict[str, Any]) -> str:
    return str(meta.get("tokenizer.ggml.pre") or "default")


def _flag(meta: dict[str, Any], name: str, default: bool) -> bool:
    value = meta.get(f"tokenizer.ggml.{name}")
    return default if value is None else bool(value)


def _token_id(meta: dict[str, Any], key: str, default: int | None, n_tokens: int) -> int | None:
    """The file's id when it is a token of the vocabulary; else (absent or out of range) llama's default."""
    value = meta.get(f"tokenizer.ggml.{key}")
    if value is not None and 0 <= int(value) < n_tokens:
        return int(value)
    return default if default is not None and default < n_tokens else None


def _wordpiece(meta: dict[str, Any], tokens: list[str], types: list[int], rules: SpecialRules) -> Tokenizer:
    # The converter stores word starts with a phantom space and continuations bare (`##x` -> `x`).
    vocab = {}
    for i, (text, kind) in enumerate(zip(tokens, types)):
        if kind in (CONTROL, UNKNOWN):
            word = text
        elif text.startswith(PHANTOM_SPACE):
            word = text[1:]
        else:
            word = "##" + text
        vocab.setdefault(word, i)
    unk = tokens[rules.unk_id] if rules.unk_id is not None else "[UNK]"
    # llama's WPM has no per-word length limit
    tok = Tokenizer(models.WordPiece(vocab, unk_token=unk, max_input_chars_per_word=1_000_000))
    lowercase = _flag(meta, "normalizer.lowercase", True)
    strip_accents = _flag(meta, "normalizer.strip_accents", lowercase)
    tok.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True,
                                                strip_accents=strip_accents, lowercase=lowercase)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    return tok


def _byte_level_bpe(meta: dict[str, Any], tokens: list[str], source: str) -> Tokenizer:
    pre_name = _pre_name(meta)
    pre = _BPE_PRE.get(pre_name)
    if pre is None:
        raise UnsupportedCheckpoint(f"{source}: BPE pre-tokenizer {pre_name!r} is not supported "
                                    f"(supported: {', '.join(sorted(_BPE_PRE))})")
    merges = [tuple(m.split(" ", 1)) for m in meta.get("tokenizer.ggml.merges", [])]
    vocab = {text: i for i, text in enumerate(tokens)}
    tok = Tokenizer(models.BPE(vocab, merges, ignore_merges=pre.ignore_merges))
    splits = [pre_tokenizers.Split(Regex(rx), behavior="isolated") for rx in pre.regexes]
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [*splits, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    return tok


def _unigram(meta: dict[str, Any], tokens: list[str], source: str, rules: SpecialRules) -> Tokenizer:
    """SentencePiece unigram (XLM-R and T5 conversions): llama.cpp's UGM normalization is the precompiled
    charsmap, then (remove_extra_whitespaces) runs of spaces collapsed, both ends stripped and one space before the
    first word, or else (add_space_prefix) one space more before the first word (llama.cpp adds it at the first
    character that is not a space, so a text of spaces only gets none), spaces written as the meta symbol."""
    scores = meta.get("tokenizer.ggml.scores")
    if scores is None:
        raise UnsupportedCheckpoint(f"{source}: a unigram tokenizer without tokenizer.ggml.scores")
    tok = Tokenizer(models.Unigram([(t, float(sc)) for t, sc in zip(tokens, scores)], unk_id=rules.unk_id,
                                   byte_fallback=False))
    steps = []
    charsmap = meta.get("tokenizer.ggml.precompiled_charsmap")
    if charsmap is not None and len(charsmap):
        steps.append(normalizers.Precompiled(np.asarray(charsmap).astype(np.uint8).tobytes()))
    merge = _flag(meta, "remove_extra_whitespaces", True)
    if merge:  # every word after one space: the first one too, whatever add_space_prefix says
        steps += [normalizers.Replace(Regex(" {2,}"), " "), normalizers.Strip(left=True, right=True),
                  normalizers.Replace(Regex("^(?=[^ ])"), " ")]
    elif _flag(meta, "add_space_prefix", True):  # one space more before the first word, when there is a word
        steps.append(normalizers.Replace(Regex("^(?=[ ]*[^ ])"), " "))
    tok.normalizer = normalizers.Sequence(steps)
    prepend = "always" if merge or _flag(meta, "add_space_prefix", True) else "never"
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement=PHANTOM_SPACE, prepend_scheme="never", split=True)
    tok.decoder = decoders.Metaspace(replacement=PHANTOM_SPACE, prepend_scheme=prepend, split=True)
    return tok


def _sentencepiece_bpe(meta: dict[str, Any], tokens: list[str], types: list[int], source: str,
                       rules: SpecialRules) -> Tokenizer:
    """llama.cpp's SPM tokenizer (Gemma, Llama 2, Mistral v1 vocabularies): adjacent symbols merge, highest
    token score first, while the merged text is a token; leftovers fall back to <0xXX> byte tokens. That is BPE
    whose merges are every split of a token into two tokens, ranked by the merged token's score."""
    scores = meta.get("tokenizer.ggml.scores")
    if scores is None:
        raise UnsupportedCheckpoint(f"{source}: a SentencePiece tokenizer without tokenizer.ggml.scores")
    vocab = {text: i for i, text in enumerate(tokens)}
    merged, cuts = [], []
    for i, text in enumerate(tokens):
        if len(text) < 2 or types[i] not in (NORMAL, USER_DEFINED, UNUSED):
            continue
        for cut in range(1, len(text)):
            if text[:cut] in vocab and text[cut:] in vocab:
                merged.append(i)
                cuts.append(cut)
    # highest merged-token score first; ties keep vocabulary order
    order = np.lexsort((np.arange(len(merged)), -np.asarray(scores, dtype=np.float64)[merged]))
    merges = [(tokens[merged[k]][:cuts[k]], tokens[merged[k]][cuts[k]:]) for k in order.tolist()]
    unk = tokens[rules.unk_id] if rules.unk_id is not None else None
    tok = Tokenizer(models.BPE(vocab, merges, unk_token=unk, byte_fallback=True, fuse_unk=True))
    steps = [normalizers.Replace(" ", PHANTOM_SPACE)]
    if _flag(meta, "add_space_prefix", True):
        steps.insert(0, normalizers.Prepend(PHANTOM_SPACE))
    tok.normalizer = normalizers.Sequence(steps)
    tok.decoder = decoders.Sequence([decoders.Replace(PHANTOM_SPACE, " "), decoders.ByteFallback(), decoders.Fuse()])
    return tok


def _add_specials(tok: Tokenizer, tokens: list[str], types: list[int]) -> None:
    """Control tokens are matched in text only when parsing special tokens; user-defined ones always."""
    specials = [AddedToken(t, special=True, normalized=False) for t, k in zip(tokens, types) if k in (CONTROL, UNKNOWN)]
    users = [AddedToken(t, special=False, normalized=False) for t, k in zip(tokens, types) if k == USER_DEFINED]
    tok.add_special_tokens(specials)
    tok.add_tokens(users)


def _template(rules: SpecialRules, tokens: list[str], wordpiece: bool) -> processors.TemplateProcessing:
    """add_special as llama.cpp: WPM always [BOS] text [SEP]; others BOS/EOS by flag. No pair template:
    GGUFTokenizer builds llama-server's rerank prompt itself."""
    if wordpiece:
        ends = (rules.bos_id, rules.sep_id)
    else:
        ends = (rules.bos_id if rules.add_bos else None, rules.eos_id if rules.add_eos else None)
    before, after = ([f"{tokens[i]}:0"] if i is not None else [] for i in ends)
    return processors.TemplateProcessing(single=[*before, "$A:0", *after],
                                         special_tokens=[(tokens[i], i) for i in set(ends) - {None}])
