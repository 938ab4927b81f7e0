"""SigLIP's SentencePiece tokenizer (spiece.model, no tokenizer.json) as a `tokenizers` Tokenizer.

google/siglip-* folders ship only spiece.model, and transformers' SiglipTokenizer has no fast version. It
canonicalizes text before SentencePiece sees it (lower-case, ASCII punctuation removed, whitespace runs
collapsed, ends stripped), segments it as one word-initial piece sequence, and appends </s>. The same steps
are built here from the model file itself (a protobuf read with a minimal reader: no extra dependency).
One difference remains: text right after a literal special token ("x</s>y") gets a word-start mark here.
"""
from __future__ import annotations

import string
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer

from engine.checkpoint import special_token_text
from engine.errors import UnsupportedCheckpoint

SIGLIP_TOKENIZERS = {"SiglipTokenizer"}
_NORMAL, _UNKNOWN, _CONTROL, _USER_DEFINED, _UNUSED, _BYTE = 1, 2, 3, 4, 5, 6


@dataclass(frozen=True)
class SentencePieceModel:
    pieces: list[tuple[str, float, int]]  # (piece, score, type) in id order
    precompiled_charsmap: bytes
    model_type: int  # 1 unigram, 2 BPE, ...


def _fields(data: bytes) -> Iterator[tuple[int, int, bytes | int]]:
    """(field number, wire type, value) of one protobuf message: varints as int, length-delimited and fixed
    fields as bytes."""
    pos = 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(data, pos)
        elif wire == 1:
            value, pos = data[pos:pos + 8], pos + 8
        elif wire == 2:
            length, pos = _varint(data, pos)
            value, pos = data[pos:pos + length], pos + length
        elif wire == 5:
            value, pos = data[pos:pos + 4], pos + 4
        else:
            raise ValueError(f"protobuf wire type {wire} is not supported")
        if pos > len(data):
            raise ValueError("the message is truncated")
        yield field, wire, value


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7


def read_model(path: Path) -> SentencePieceModel:
    """ModelProto: pieces (field 1: piece 1, score 2, type 3), trainer_spec (2: model_type 3),
    normalizer_spec (3: precompiled_charsmap 2)."""
    pieces: list[tuple[str, float, int]] = []
    charsmap, model_type = b"", 1
    try:
        for field, _, value in _fields(path.read_bytes()):
            if field == 1:
                piece, score, kind = "", 0.0, _NORMAL
                for f, _, v in _fields(value):
                    if f == 1:
                        piece = v.decode("utf-8")
                    elif f == 2:
                        score = struct.unpack("<f", v)[0]
                    elif f == 3:
                        kind = v
                pieces.append((piece, score, kind))
            elif field == 2:
                model_type = next((v for f, _, v in _fields(value) if f == 3), 1)
            elif field == 3:
                charsmap = next((v for f, _, v in _fields(value) if f == 2), b"")
    except (ValueError, IndexError, UnicodeDecodeError, struct.error) as exc:
        raise UnsupportedCheckpoint(f"{path}: not a SentencePiece model this server can read ({exc})") from None
    return SentencePieceModel(pieces, charsmap, model_type)


def siglip_tokenizer(folder: Path, tokenizer_config: dict) -> Tokenizer:
    """A Tokenizer equal in effect to transformers' SiglipTokenizer on this folder's spiece.model."""
    from tokenizers import Regex, decoders, models, normalizers, pre_tokenizers, processors

    path = folder / "spiece.model"
    model = read_model(path)
    if model.model_type != 1:
        raise UnsupportedCheckpoint(f"{path}: SentencePiece model type {model.model_type} is not supported "
                                    f"(only unigram, as SigLIP's)")
    unk = next((i for i, (_, _, kind) in enumerate(model.pieces) if kind == _UNKNOWN), None)
    eos = special_token_text(tokenizer_config.get("eos_token")) or "</s>"
    eos_id = next((i for i, (piece, _, _) in enumerate(model.pieces) if piece == eos), None)
    if unk is None or eos_id is None:
        raise UnsupportedCheckpoint(f"{path}: the model has no unknown piece or no {eos!r} piece")
    tok = Tokenizer(models.Unigram([(piece, score) for piece, score, _ in model.pieces], unk, byte_fallback=False))
    steps = [normalizers.Lowercase()] if tokenizer_config.get("do_lower_case", True) else []
    # SiglipTokenizer puts its word-start mark before the text and then strips: leading whitespace survives as
    # one extra mark, trailing whitespace goes
    steps += [normalizers.Replace(Regex("[" + _regex_class(string.punctuation) + "]"), ""),
              normalizers.Replace(Regex(r"\s+"), " "), normalizers.Strip(left=False, right=True)]
    if model.precompiled_charsmap:
        steps.append(normalizers.Precompiled(model.precompiled_charsmap))
    tok.normalizer = normalizers.Sequence(steps)
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always", split=False)
    tok.post_processor = processors.TemplateProcessing(single=f"$A {eos}", pair=f"$A {eos} $B {eos}",
                                                       special_tokens=[(eos, eos_id)])
    specials = [piece for piece, _, kind in model.pieces if kind in (_UNKNOWN, _CONTROL)]
    tok.add_special_tokens(sorted(set(specials) | {eos}))
    tok.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="always", split=False)
    return tok


def _regex_class(chars: str) -> str:
    return "".join("\\" + c if c in "\\]^-[" else c for c in chars)
