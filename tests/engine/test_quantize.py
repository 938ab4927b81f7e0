"""engine/compute/quantize.py: binary / ubinary exactly as sentence-transformers' quantize_embeddings packs them,
int8 / uint8 on a fixed scale (the same codes alone and in a batch) whose dequantized vectors keep the cosine."""
from __future__ import annotations

import numpy as np
import pytest
from sentence_transformers.util.quantization import quantize_embeddings

from engine import QUANTIZED_TYPES, dequantize, quantize
from engine.errors import InvalidInput


def unit_vectors(n: int, d: int, seed: int = 0) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((n, d)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


@pytest.mark.parametrize("width", [384, 13])  # 13: the last byte padded with 0 bits, as numpy.packbits pads
@pytest.mark.parametrize("kind", ["binary", "ubinary"])
def test_binary_packing_is_sentence_transformers(kind, width):
    vectors = unit_vectors(5, width)
    vectors[0, :8] = [0.0, 1, -1, 0.0, 2, 0.0, -0.5, 0.25]  # 0 is not > 0: bit 0
    want = quantize_embeddings(vectors, precision=kind)
    got = quantize(vectors, kind)
    assert got.dtype == want.dtype and got.shape == want.shape == (5, -(-width // 8))
    assert np.array_equal(got, want)
    assert got[0, 0] == (0b01001001 if kind == "ubinary" else 0b01001001 - 128)


@pytest.mark.parametrize("kind", ["binary", "ubinary"])
def test_binary_round_trip_gives_the_signs(kind):
    vectors = unit_vectors(3, 20)
    back = dequantize(quantize(vectors, kind), kind, width=20)
    assert np.array_equal(back, np.where(vectors > 0, 1.0, -1.0))


@pytest.mark.parametrize("kind,dtype,low,high", [("int8", np.int8, -127, 127), ("uint8", np.uint8, 0, 255)])
def test_int8_uint8_fixed_scale(kind, dtype, low, high):
    codes = quantize(np.array([-1.0, -0.5, 0.0, 0.5, 1.0, 3.0, -3.0], dtype=np.float32), kind)
    assert codes.dtype == dtype
    assert codes[0] == low and codes[4] == high and codes[5] == high and codes[6] == low  # clipped outside [-1, 1]
    assert codes[2] == (0 if kind == "int8" else 128)  # round half to even: 127.5 -> 128


@pytest.mark.parametrize("kind", ["int8", "uint8"])
def test_int8_uint8_keep_the_cosine_and_do_not_depend_on_the_batch(kind):
    vectors = unit_vectors(64, 384)
    codes = quantize(vectors, kind)
    assert all(np.array_equal(quantize(vectors[i], kind), codes[i]) for i in range(0, 64, 7))
    back = dequantize(codes, kind)
    cosines = np.sum(back * vectors, axis=1) / np.linalg.norm(back, axis=1)
    assert cosines.min() > 0.998
    assert np.abs(back - vectors).max() <= (0.5 / 127 if kind == "int8" else 0.5 / 127.5) + 1e-6


def test_rows_quantize_one_by_one():
    rows = unit_vectors(6, 16).reshape(2, 3, 16)  # e.g. per-token rows
    for kind in QUANTIZED_TYPES:
        assert np.array_equal(quantize(rows, kind).reshape(6, -1), quantize(rows.reshape(6, 16), kind))


def test_unknown_kind_is_refused():
    with pytest.raises(InvalidInput, match="int4"):
        quantize(unit_vectors(1, 8), "int4")
