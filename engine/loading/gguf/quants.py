"""GGML block formats -> float32, in numpy (llama.cpp's ggml-quants.c dequantize_row_* rules).

Each function takes the raw blocks as uint8 [n_blocks, block_bytes] and returns float32 [n_blocks, block_values].
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

QK_K = 256  # values per K-quant super-block


def _f16(raw: np.ndarray) -> np.ndarray:
    """Little-endian float16 fields [n, 2] bytes -> float32 [n, 1]."""
    return np.ascontiguousarray(raw).view(np.float16).astype(np.float32)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """[n, 16] packed bytes -> [n, 32]: low nibbles are values 0-15, high nibbles values 16-31."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=1)


def _high_bits(qh: np.ndarray) -> np.ndarray:
    """Q5_0/Q5_1's 32 fifth bits (a little-endian uint32) -> [n, 32] of 0 or 16."""
    bits = np.ascontiguousarray(qh).view("<u4")
    return (((bits >> np.arange(32, dtype=np.uint32)) & 1) << 4).astype(np.uint8)


# The three formats of most GGUF files are written into a float32 output in place (the nibbles cast into its
# halves, then scaled): the same arithmetic as llama.cpp's, bit for bit, in a quarter of the time of building each
# step as a new array (SmolLM2-135M Q4_1: 3.1 s of a loaded machine's startup before). The output may be the
# memory of the MLX array that will hold the weight (engine/loading/gguf/load.py), so nothing is copied after.

def _nibbles_into(qs: np.ndarray, out: np.ndarray) -> np.ndarray:
    """[n, 16] packed bytes -> float32 out [n, 32] of their nibbles (low ones first), as _nibbles."""
    np.bitwise_and(qs, 0x0F, out=out[:, :16])
    np.right_shift(qs, 4, out=out[:, 16:])
    return out


def q8_0_into(blocks: np.ndarray, out: np.ndarray) -> None:
    np.copyto(out, blocks[:, 2:].view(np.int8), casting="unsafe")
    out *= _f16(blocks[:, :2])


def q4_0_into(blocks: np.ndarray, out: np.ndarray) -> None:
    _nibbles_into(blocks[:, 2:], out)
    out -= 8.0
    out *= _f16(blocks[:, :2])


def q4_1_into(blocks: np.ndarray, out: np.ndarray) -> None:
    _nibbles_into(blocks[:, 4:], out)
    out *= _f16(blocks[:, :2])
    out += _f16(blocks[:, 2:4])


def _allocating(into: Callable[[np.ndarray, np.ndarray], None]) -> Callable[[np.ndarray], np.ndarray]:
    def dequantize(blocks: np.ndarray) -> np.ndarray:
        out = np.empty((len(blocks), 32), np.float32)
        into(blocks, out)
        return out
    dequantize.__name__ = into.__name__.removesuffix("_into")
    return dequantize


q8_0, q4_0, q4_1 = _allocating(q8_0_into), _allocating(q4_0_into), _allocating(q4_1_into)


def q5_0(blocks: np.ndarray) -> np.ndarray:
    q = _nibbles(blocks[:, 6:]) | _high_bits(blocks[:, 2:6])
    return _f16(blocks[:, :2]) * (q.astype(np.float32) - 16.0)


def q5_1(blocks: np.ndarray) -> np.ndarray:
    q = _nibbles(blocks[:, 8:]) | _high_bits(blocks[:, 4:8])
    return _f16(blocks[:, :2]) * q.astype(np.float32) + _f16(blocks[:, 2:4])


def _k_scales(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K's 12 bytes -> 8 six-bit scales and 8 six-bit mins per super-block."""
    d, m, both = packed[:, 0:4], packed[:, 4:8], packed[:, 8:12]
    scales = np.concatenate([d & 0x3F, (both & 0x0F) | ((d >> 2) & 0x30)], axis=1)
    mins = np.concatenate([m & 0x3F, (both >> 4) | ((m >> 2) & 0x30)], axis=1)
    return scales.astype(np.float32), mins.astype(np.float32)


def _k_quant(blocks: np.ndarray, q: np.ndarray) -> np.ndarray:
    """q [n, 8, 32] sub-block values -> d * scale * q - dmin * min."""
    scales, mins = _k_scales(blocks[:, 4:16])
    d, dmin = _f16(blocks[:, 0:2]), _f16(blocks[:, 2:4])
    out = (d * scales)[:, :, None] * q.astype(np.float32) - (dmin * mins)[:, :, None]
    return out.reshape(len(blocks), QK_K)


def _k_nibbles(qs: np.ndarray) -> np.ndarray:
    """[n, 128] -> [n, 8, 32]: each 32-byte chunk gives one sub-block of low nibbles, then one of high."""
    chunks = qs.reshape(len(qs), 4, 1, 32)
    return np.concatenate([chunks & 0x0F, chunks >> 4], axis=2).reshape(len(qs), 8, 32)


def q4_k(blocks: np.ndarray) -> np.ndarray:
    return _k_quant(blocks, _k_nibbles(blocks[:, 16:144]))


def q5_k(blocks: np.ndarray) -> np.ndarray:
    qh = blocks[:, 16:48]  # bit i of byte l: the fifth bit of value l of sub-block i
    fifth = ((qh[:, None, :] >> np.arange(8, dtype=np.uint8)[None, :, None]) & 1) << 4
    return _k_quant(blocks, _k_nibbles(blocks[:, 48:176]) | fifth)


def q6_k(blocks: np.ndarray) -> np.ndarray:
    n = len(blocks)
    ql = blocks[:, 0:128].reshape(n, 2, 64)
    qh = blocks[:, 128:192].reshape(n, 2, 1, 32)
    scales = blocks[:, 192:208].view(np.int8).astype(np.float32).reshape(n, 16, 1)
    d = _f16(blocks[:, 208:210]).reshape(n, 1, 1)
    # per 128-value half: four runs of 32 from ql's low/high nibbles and qh's 2-bit fields 0..3
    low = np.stack([ql[:, :, :32] & 0x0F, ql[:, :, 32:] & 0x0F, ql[:, :, :32] >> 4, ql[:, :, 32:] >> 4], axis=2)
    high = (qh >> (2 * np.arange(4, dtype=np.uint8)).reshape(1, 1, 4, 1)) & 3
    q = ((low | (high << 4)).astype(np.float32) - 32.0).reshape(n, 16, 16)
    return (d * scales * q).reshape(n, QK_K)


# ggml_type id -> (name, values per block, bytes per block, dequantizer or None for plain floats)
Dequantizer = Callable[[np.ndarray], np.ndarray]
TYPES: dict[int, tuple[str, int, int, Dequantizer | None]] = {
    0: ("F32", 1, 4, None),
    1: ("F16", 1, 2, None),
    2: ("Q4_0", 32, 18, q4_0),
    3: ("Q4_1", 32, 20, q4_1),
    6: ("Q5_0", 32, 22, q5_0),
    7: ("Q5_1", 32, 24, q5_1),
    8: ("Q8_0", 32, 34, q8_0),
    12: ("Q4_K", QK_K, 144, q4_k),
    13: ("Q5_K", QK_K, 176, q5_k),
    14: ("Q6_K", QK_K, 210, q6_k),
    30: ("BF16", 1, 2, None),
}

# ggml_type ids we do not read, for naming them in errors.
OTHER_TYPE_NAMES = {4: "Q4_2", 5: "Q4_3", 9: "Q8_1", 10: "Q2_K", 11: "Q3_K", 15: "Q8_K", 16: "IQ2_XXS",
                    17: "IQ2_XS", 18: "IQ3_XXS", 19: "IQ1_S", 20: "IQ4_NL", 21: "IQ3_S", 22: "IQ2_S",
                    23: "IQ4_XS", 24: "I8", 25: "I16", 26: "I32", 27: "I64", 28: "F64", 29: "IQ1_M",
                    34: "TQ1_0", 35: "TQ2_0", 39: "MXFP4"}


def type_name(ggml_type: int) -> str:
    if ggml_type in TYPES:
        return TYPES[ggml_type][0]
    return OTHER_TYPE_NAMES.get(ggml_type, f"type {ggml_type}")


_INTO = {8: q8_0_into, 2: q4_0_into, 3: q4_1_into}

# Q4_0, Q4_1 and Q8_0 are affine quantizations in groups of 32 (value = scale * q + offset), which is what MLX's
# own quantized arrays are (mx.dequantize: scales * q + biases, group 32, bits 4 or 8): only the packing differs.
# Every product of a float16 scale and a q of at most 8 bits is exact in float32, so mx.dequantize of the
# repacked blocks gives the values dequantize_into gives, bit for bit.
AFFINE_BITS = {2: 4, 3: 4, 8: 8}
AFFINE_GROUP = 32


def to_mlx_affine(ggml_type: int, blocks: np.ndarray, rows: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A Q4_0 / Q4_1 / Q8_0 tensor of `rows` rows, its blocks [n_blocks, block_bytes] in order -> MLX's
    quantized form of the same values: (packed uint32 [rows, cols * bits / 32], scales float32 [rows, cols / 32],
    biases float32 [rows, cols / 32])."""
    d = _f16(blocks[:, :2])
    if ggml_type == 8:  # int8 q -> uint8 q + 128 (the sign bit flipped), offset -128 d
        codes = blocks[:, 2:] ^ np.uint8(0x80)
        biases = d * np.float32(-128.0)
    else:
        qs = blocks[:, 4:] if ggml_type == 3 else blocks[:, 2:]
        values = np.concatenate([qs & 0x0F, qs >> 4], axis=1)  # [n, 32] in order (low nibbles are values 0-15)
        codes = values[:, 0::2] | (values[:, 1::2] << 4)  # MLX packs two values a byte, the first in the low nibble
        biases = _f16(blocks[:, 2:4]) if ggml_type == 3 else d * np.float32(-8.0)
    packed = np.ascontiguousarray(codes).reshape(rows, -1).view(np.uint32)
    return packed, d.reshape(rows, -1), biases.reshape(rows, -1)


def dequantize_into(ggml_type: int, blocks: np.ndarray, out: np.ndarray) -> None:
    """Blocks of a block format [n, block_bytes] dequantized into float32 out [n, block_values]: in place for
    Q4_0, Q4_1 and Q8_0, through the format's array for the others."""
    into = _INTO.get(ggml_type)
    if into is not None:
        into(blocks, out)
    else:
        out[...] = TYPES[ggml_type][3](blocks)
