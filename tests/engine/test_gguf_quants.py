"""engine/loading/gguf/quants.py against the gguf package's reference dequantizer (llama.cpp's own Python port)."""
from __future__ import annotations

import numpy as np
import pytest

from engine.loading.gguf import quants

gguf = pytest.importorskip("gguf")
T = gguf.GGMLQuantizationType

# bytes holding float16 scales in each block format: (offset, count)
_F16_FIELDS = {T.Q4_0: (0, 1), T.Q4_1: (0, 2), T.Q5_0: (0, 1), T.Q5_1: (0, 2), T.Q8_0: (0, 1),
               T.Q4_K: (0, 2), T.Q5_K: (0, 2), T.Q6_K: (208, 1)}


def _random_blocks(qtype, n_blocks: int, seed: int) -> np.ndarray:
    """Random bytes (every bit pattern of the quants), with finite float16 scales."""
    rng = np.random.default_rng(seed)
    _, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
    blocks = rng.integers(0, 256, size=(n_blocks, block_bytes), dtype=np.uint8)
    offset, count = _F16_FIELDS[qtype]
    scales = rng.uniform(-0.05, 0.05, size=(n_blocks, count)).astype(np.float16)
    blocks[:, offset: offset + 2 * count] = scales.view(np.uint8)
    return blocks


@pytest.mark.parametrize("qtype", list(_F16_FIELDS), ids=lambda t: t.name)
def test_dequantization_equals_llama_cpp(qtype):
    blocks = _random_blocks(qtype, 64, seed=int(qtype))
    name, block_values, block_bytes, dequantize = quants.TYPES[int(qtype)]
    assert name == qtype.name and (block_values, block_bytes) == gguf.GGML_QUANT_SIZES[qtype]
    ours = dequantize(blocks)
    reference = gguf.quants.dequantize(blocks.reshape(1, -1), qtype).reshape(64, block_values)
    np.testing.assert_array_equal(ours, reference)


def test_unsupported_types_have_names():
    assert quants.type_name(int(T.IQ2_XXS)) == "IQ2_XXS"
    assert quants.type_name(int(T.Q2_K)) == "Q2_K"
