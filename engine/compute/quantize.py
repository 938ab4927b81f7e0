"""Compact codes for finished embedding vectors, the one place they are made (Cohere's embedding_types and the
opt-in `encoding_format` of /v1/embeddings both come here).

- binary / ubinary: sentence-transformers' `quantize_embeddings` exactly: one bit per dimension, 1 where the
  component is > 0, 8 dimensions a byte with the first dimension in the most significant bit (numpy.packbits;
  a width that is not a multiple of 8 is padded with 0 bits); `ubinary` the bytes as uint8, `binary` the same
  bytes minus 128 as int8.
- int8 / uint8: a FIXED linear scale for L2-normalized vectors, whose components all lie in [-1, 1]: int8 =
  round(127 * x) in [-127, 127], uint8 = round(127.5 * (x + 1)) in [0, 255], components outside [-1, 1] clipped.
  The scale depends on nothing but the component, so a text gets the same codes alone and in any batch
  (sentence-transformers' own int8 calibrates ranges on the batch, which would not). `dequantize` inverts it.

Vectors are the last axis: a [n, d] batch, one [d] vector or a multi-vector model's [n_tokens, d] rows.
"""
from __future__ import annotations

import numpy as np

from engine.errors import InvalidInput

QUANTIZED_TYPES = ("int8", "uint8", "binary", "ubinary")

INT8_SCALE = 127.0  # int8 = round(INT8_SCALE * x)
UINT8_SCALE = 127.5  # uint8 = round(UINT8_SCALE * (x + 1))


def quantize(vectors: np.ndarray, kind: str) -> np.ndarray:
    """The codes of `vectors` (float, vectors on the last axis) as `kind` (one of QUANTIZED_TYPES): int8 / uint8
    keep the width, binary / ubinary pack it to ceil(d / 8) bytes."""
    x = np.asarray(vectors, dtype=np.float32)
    if kind == "int8":
        return np.rint(np.clip(x, -1.0, 1.0) * INT8_SCALE).astype(np.int8)
    if kind == "uint8":
        return np.rint((np.clip(x, -1.0, 1.0) + 1.0) * UINT8_SCALE).astype(np.uint8)
    if kind in ("binary", "ubinary"):
        packed = np.packbits(x > 0, axis=-1)
        return packed if kind == "ubinary" else (packed.astype(np.int16) - 128).astype(np.int8)
    raise InvalidInput(f"unknown quantization {kind!r}: one of {', '.join(QUANTIZED_TYPES)}")


def dequantize(codes: np.ndarray, kind: str, width: int | None = None) -> np.ndarray:
    """Float vectors back from codes: int8 / uint8 the scale's inverse; binary / ubinary each bit as +1 / -1
    (`width`: the unpacked width, default 8 per byte)."""
    c = np.asarray(codes)
    if kind == "int8":
        return c.astype(np.float32) / INT8_SCALE
    if kind == "uint8":
        return c.astype(np.float32) / UINT8_SCALE - 1.0
    if kind in ("binary", "ubinary"):
        raw = (c.astype(np.int16) + (128 if kind == "binary" else 0)).astype(np.uint8)
        bits = np.unpackbits(raw, axis=-1, count=width)
        return bits.astype(np.float32) * 2.0 - 1.0
    raise InvalidInput(f"unknown quantization {kind!r}: one of {', '.join(QUANTIZED_TYPES)}")
