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


@pytest.mark.parametrize("qtype", [T.Q4_0, T.Q4_1, T.Q8_0], ids=lambda t: t.name)
def test_affine_tables_repacked_for_mlx_dequantize_to_llama_cpp_values(qtype):
    """A kept token table (engine/loading/gguf/load.py LOOKUP_TABLES): MLX's dequantize of the repacked blocks
    gives gguf's reference values bit for bit, every code and sign of the scales included."""
    import mlx.core as mx

    rows, cols = 6, 96
    blocks = _random_blocks(qtype, rows * cols // 32, seed=200 + int(qtype))
    packed, scales, biases = quants.to_mlx_affine(int(qtype), blocks, rows)
    bits = quants.AFFINE_BITS[int(qtype)]
    assert packed.dtype == np.uint32 and packed.shape == (rows, cols * bits // 32)
    assert scales.shape == biases.shape == (rows, cols // 32)
    ours = mx.dequantize(mx.array(packed), mx.array(scales), mx.array(biases), group_size=quants.AFFINE_GROUP,
                         bits=bits)
    reference = gguf.quants.dequantize(blocks.reshape(1, -1), qtype).reshape(rows, cols)
    np.testing.assert_array_equal(np.array(ours), reference)


def test_unsupported_types_have_names():
    assert quants.type_name(int(T.IQ2_XXS)) == "IQ2_XXS"
    assert quants.type_name(int(T.Q2_K)) == "Q2_K"


def test_tensors_dequantized_into_mlx_memory_equal_llama_cpp(tmp_path):
    """load.tensors (block formats written straight into the MLX arrays' memory, in chunks on a thread pool) gives
    what gguf's reference dequantizer gives, for every block format and across chunk boundaries."""
    import mlx.core as mx

    from engine.loading.gguf import load
    from engine.loading.gguf.reader import GGUFFile

    writer = gguf.GGUFWriter(str(tmp_path / "types.gguf"), "llama")
    expected = {}
    for qtype in _F16_FIELDS:
        block_values, _ = gguf.GGML_QUANT_SIZES[qtype]
        n_blocks = load._CHUNK + 40 if qtype in (T.Q4_1, T.Q8_0) else 96  # rows of 256 values
        blocks = _random_blocks(qtype, n_blocks, seed=100 + int(qtype))
        rows = n_blocks * block_values // 256
        writer.add_tensor(qtype.name, blocks.reshape(rows, -1), raw_dtype=qtype)
        expected[qtype.name] = gguf.quants.dequantize(blocks.reshape(1, -1), qtype).reshape(rows, 256)
    plain = np.arange(12, dtype=np.float32).reshape(3, 4)
    writer.add_tensor("F32", plain)
    expected["F32"] = plain
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    file = GGUFFile(tmp_path / "types.gguf")
    arrays = load.tensors(file, list(expected))
    for name, values in expected.items():
        assert arrays[name].dtype == mx.float32, name
        np.testing.assert_array_equal(np.array(arrays[name]), values, err_msg=name)
        np.testing.assert_array_equal(np.array(arrays[name]), np.array(load.tensor(file, name)), err_msg=name)


def test_a_file_cut_anywhere_is_refused_by_name(tmp_path):
    """The header parsed through an mmap object: a file cut inside its metadata, its string arrays, its tensor
    directory or its data is an UnsupportedCheckpoint naming the file, never another exception."""
    from engine.errors import UnsupportedCheckpoint
    from engine.loading.gguf.reader import GGUFFile

    path = tmp_path / "whole.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_token_list(["a", "bb", "\u00e9", "<s>"] * 50)
    writer.add_tensor("w", np.ones((4, 32), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    data = path.read_bytes()
    whole = GGUFFile(path)
    assert whole.metadata["tokenizer.ggml.tokens"][:4] == ["a", "bb", "\u00e9", "<s>"]
    np.testing.assert_array_equal(whole.array("w"), np.ones((4, 32), np.float32))
    for cut in (30, 60, len(data) // 3, len(data) - 600, len(data) - 1):
        part = tmp_path / f"cut{cut}.gguf"
        part.write_bytes(data[:cut])
        with pytest.raises(UnsupportedCheckpoint, match="cut"):
            GGUFFile(part)
