"""`neo-bert` GGUFs (chandar-lab/NeoBERT), which have no transformers reference: written here with the gguf
package's writer in llama.cpp's converter layout (NeoBert, conversion/bert.py at 3f545bec: names through gguf's own
tensor-name map, feed_forward_length = int(2 * intermediate_size / 3), rope base 10000, CLS pooling) from random
weights, and checked against the real llama-server on the same file."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.engine.test_gguf_jina import embeddings_equal_llama_servers, random_weight
from tests.engine.test_gguf_written import add_minilm_vocabulary, finish

gguf = pytest.importorskip("gguf")

HIDDEN, HEADS, INTERMEDIATE, LAYERS = 96, 6, 192, 2
FF = int(2 * INTERMEDIATE / 3)  # what the converter writes: 128, the SwiGLU's width


def write_neobert_gguf(path: Path, f16: bool) -> None:
    """A tiny random NeoBERT as the converter writes `neo-bert`, all-MiniLM's WordPiece vocabulary (NeoBERT's is
    bert-base-uncased's), 2-D weights F16 when f16."""
    rng = np.random.default_rng(7)
    arch_id = next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == "neo-bert")
    names = gguf.get_tensor_name_map(arch_id, LAYERS)
    state = {"encoder.weight": (30522, HIDDEN), "layer_norm.weight": (HIDDEN,)}
    for i in range(LAYERS):
        state.update({f"transformer_encoder.{i}.{k}": shape for k, shape in {
            "attention_norm.weight": (HIDDEN,), "qkv.weight": (3 * HIDDEN, HIDDEN), "wo.weight": (HIDDEN, HIDDEN),
            "ffn_norm.weight": (HIDDEN,), "ffn.w12.weight": (2 * FF, HIDDEN), "ffn.w3.weight": (HIDDEN, FF)}.items()})
    writer = gguf.GGUFWriter(str(path), "neo-bert")
    writer.add_context_length(4096)
    writer.add_embedding_length(HIDDEN)
    writer.add_block_count(LAYERS)
    writer.add_head_count(HEADS)
    writer.add_causal_attention(False)
    writer.add_feed_forward_length(FF)
    writer.add_rope_freq_base(10000.0)
    writer.add_rope_scaling_type(gguf.RopeScalingType.NONE)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_pooling_type(gguf.PoolingType.CLS)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16 if f16 else gguf.LlamaFileType.ALL_F32)
    writer.add_token_type_count(2)
    add_minilm_vocabulary(writer)
    for key, shape in state.items():
        value = random_weight(key, shape, rng)
        base, kind = key.rsplit(".", 1)
        name = names.get_name(base)
        assert name is not None, key
        writer.add_tensor(f"{name}.{kind}", value.astype(np.float16) if f16 and value.ndim == 2 else value)
    finish(writer)


@pytest.mark.parametrize("f16", [False, True], ids=["f32", "f16"])
def test_neo_bert_gguf_ids_vectors_and_identity_equal_llama_servers(tmp_path, f16):
    path = tmp_path / "tiny-neo-bert.gguf"
    write_neobert_gguf(path, f16)
    embeddings_equal_llama_servers(path, "F16" if f16 else "all F32")
