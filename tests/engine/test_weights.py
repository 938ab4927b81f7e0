"""engine/loading/weights.py: MLX-quantized folders (as mlx-lm / mlx-community write them) and the compute dtype.

A tiny random checkpoint is quantized with MLX itself (embeddings included), saved in the mlx-community
layout (`model.` keys, packed `weight` + `scales` + `biases`, config.json `quantization`), and served; the
reference is transformers on the very weights MLX's dequantize gives back, so the two agree to float rounding.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx.utils import tree_flatten

from engine import Pooling
from engine.loading import formats, weights
from engine.errors import UnsupportedCheckpoint
from tests.engine.families.decoder_fixture import MIN_COSINE, TEXTS, reference_hidden, save_random, token_lists
from tests.engine.families.test_gemma3_text import GEMMA, save_sentence_transformer
from tests.engine.helpers import cosine, load_hf_model, start_engine, torch

GROUP = 32


def quantize_folder(src: Path, out: Path, bits: int, keep_float: tuple[str, ...] = ()) -> dict[str, np.ndarray]:
    """src (a float checkpoint we serve) -> out, quantized by MLX like an mlx-community conversion.

    keep_float: layer paths left unquantized (mlx-lm's per-layer `false`). Returns every quantized layer's
    dequantized weight by its `model.` key, for the reference."""
    loaded = formats.load(formats.open_checkpoint(src))
    tensors = dict(tree_flatten(loaded.model.parameters()))
    if loaded.projection is not None:
        tensors.update({k: v for k, v in tree_flatten(loaded.projection.parameters())})
    module = nn.Module()
    module.model, module.dense = loaded.model.model, (loaded.projection.dense if loaded.projection else [])
    nn.quantize(module, GROUP, bits, class_predicate=lambda path, layer: (
        hasattr(layer, "to_quantized") and path not in keep_float))
    quantized = dict(tree_flatten(module.parameters()))
    out.mkdir()
    mx.save_safetensors(str(out / "model.safetensors"), quantized)
    config = json.loads((src / "config.json").read_text())
    config["quantization"] = {"group_size": GROUP, "bits": bits, **{path: False for path in keep_float}}
    (out / "config.json").write_text(json.dumps(config))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(src / name, out / name)
    if (src / "1_Pooling").is_dir():
        shutil.copytree(src / "1_Pooling", out / "1_Pooling")
    dequantized = {}
    for key in quantized:
        if key.endswith(".scales"):
            layer = key.removesuffix(".scales")
            dequantized[f"{layer}.weight"] = np.array(mx.dequantize(
                quantized[f"{layer}.weight"], quantized[key], quantized[f"{layer}.biases"], GROUP, bits))
    assert dequantized and all(k in tensors for k in dequantized)
    return dequantized


def load_dequantized(model, dequantized: dict[str, np.ndarray]) -> None:
    """Put the dequantized weights into the transformers model (its keys lack our `model.` prefix when bare)."""
    t = torch()
    state = model.state_dict()
    with t.no_grad():
        for key, value in dequantized.items():
            if key.startswith("dense."):
                continue
            target = key if key in state else key.removeprefix("model.")
            state[target].copy_(t.from_numpy(value))


@pytest.fixture(scope="module")
def llama_float(tmp_path_factory):
    return save_random(tmp_path_factory.mktemp("q_llama") / "m", "LlamaForCausalLM", "LlamaConfig", seed=12,
                       attention_bias=True, tie_word_embeddings=True)[0]


@pytest.mark.parametrize("bits", [4, 8])
def test_quantized_llama_matches_transformers_on_its_dequantized_weights_both_ways(llama_float, tmp_path, bits):
    """Dequantized at load (a CPU's default) and on MLX's quantized kernels (--keep-quantized; a GPU's default):
    the same dequantized math, so the vectors agree with each other and with transformers on those weights."""
    src = llama_float
    ref = load_hf_model(src, "AutoModelForCausalLM")  # a fresh copy: its weights are replaced below
    dequantized = quantize_folder(src, tmp_path / f"q{bits}", bits)
    assert "model.embed_tokens.weight" in dequantized  # the embedding table is quantized too
    load_dequantized(ref, dequantized)
    lists = token_lists(src)
    runs = {}
    for keep in (False, True):
        eng = start_engine(tmp_path / f"q{bits}", pooling=Pooling.NONE, keep_quantized=keep)
        try:
            runs[keep] = eng.info, eng.embed(lists).vectors
        finally:
            eng.close()
    for _, ours in runs.values():
        for ids, got in zip(lists, ours, strict=True):
            ref_hidden = reference_hidden(ref, ids)
            assert min(cosine(a, b) for a, b in zip(got, ref_hidden)) >= MIN_COSINE
    for float_rows, kernel_rows in zip(runs[False][1], runs[True][1], strict=True):
        assert min(cosine(a, b) for a, b in zip(float_rows, kernel_rows)) >= 0.99999
    # the float model is visibly different: the comparison above checks the quantized arithmetic
    float_ref = load_hf_model(src, "AutoModelForCausalLM")
    assert min(cosine(a, b) for a, b in zip(runs[False][1][2], reference_hidden(float_ref, lists[2]))) < MIN_COSINE
    float_info = formats.load(formats.open_checkpoint(src))
    dense_info, kernel_info = runs[False][0], runs[True][0]
    assert kernel_info.weights == "quantized kernels"
    assert dense_info.weights == ("dequantized to float32 at load" if weights.on_cpu() else "quantized kernels")
    for info in (dense_info, kernel_info):
        assert info.ftype == f"MLX_Q{bits}_G{GROUP}/F32"  # what the checkpoint stores, either way
        assert info.n_params == float_info.n_params  # the values it encodes, not packed words
        assert info.resident_bytes == info.size_bytes
    assert kernel_info.size_bytes < float_info.size_bytes * (0.3 if bits == 4 else 0.45)
    if weights.on_cpu():  # dequantized to float32: as large as the float folder
        assert dense_info.size_bytes == float_info.size_bytes > kernel_info.size_bytes
    assert float_info.weights == "float32"


def test_layers_kept_float_stay_float(llama_float, tmp_path):
    src = llama_float
    quantize_folder(src, tmp_path / "mixed", 4, keep_float=("model.layers.0.mlp.down_proj",))
    ckpt = formats.open_checkpoint(tmp_path / "mixed")
    model = formats.load(ckpt, keep_quantized=True).model
    assert isinstance(model.model.layers[0].mlp.down_proj, nn.Linear)
    assert isinstance(model.model.layers[1].mlp.down_proj, nn.QuantizedLinear)
    assert isinstance(model.model.embed_tokens, nn.QuantizedEmbedding)
    if weights.on_cpu():  # dequantized at load: plain layers only, the float one untouched
        model = formats.load(ckpt).model
        quantized = [path for path, layer in model.named_modules()
                     if isinstance(layer, (nn.QuantizedLinear, nn.QuantizedEmbedding))]
        assert quantized == []
        assert isinstance(model.model.embed_tokens, nn.Embedding)
        assert model.model.layers[1].mlp.down_proj.weight.dtype == mx.float32
        raw = mx.load(str(src / "model.safetensors"))
        kept = model.model.layers[0].mlp.down_proj.weight
        assert np.array_equal(np.array(kept), np.array(raw["model.layers.0.mlp.down_proj.weight"]))


def test_dequantizing_refuses_scales_on_a_layer_that_cannot_be_quantized(llama_float, tmp_path):
    folder = tmp_path / "odd"
    quantize_folder(llama_float, folder, 4)
    tensors = mx.load(str(folder / "model.safetensors"))
    tensors["model.norm.scales"] = mx.ones((4,))
    mx.save_safetensors(str(folder / "model.safetensors"), tensors)
    for keep in (False, True):
        with pytest.raises(UnsupportedCheckpoint, match="cannot be quantized: model.norm"):
            formats.load(formats.open_checkpoint(folder), keep_quantized=keep)


def test_quantized_embeddinggemma_mlx_layout_matches_sentence_transformers_dequantized(tmp_path):
    """mlx-community/embeddinggemma-*-4bit's layout: Dense folded in as dense.0 / dense.1, quantized too."""
    from sentence_transformers import SentenceTransformer

    backbone, _ = save_random(tmp_path / "backbone", "Gemma3TextModel", "Gemma3TextConfig", seed=13,
                              use_bidirectional_attention=True, **GEMMA)
    st_folder = save_sentence_transformer(backbone, tmp_path / "st")
    dequantized = quantize_folder(st_folder, tmp_path / "q4", 4)
    assert {"dense.0.weight", "dense.1.weight"} <= set(dequantized)
    st = SentenceTransformer(str(st_folder), device="cpu")
    load_dequantized(st[0].auto_model, dequantized)
    t = torch()
    with t.no_grad():
        for i, module in ((0, st[2]), (1, st[3])):
            module.linear.weight.copy_(t.from_numpy(dequantized[f"dense.{i}.weight"]))
    expected = st.encode(TEXTS, convert_to_numpy=True)
    eng = start_engine(tmp_path / "q4")
    try:
        assert eng.info.n_embd == 64 and eng.info.ftype.startswith("MLX_Q4_G32")
        ours = eng.embed(token_lists(st_folder)).vectors
    finally:
        eng.close()
    assert min(cosine(a, b) for a, b in zip(ours, expected, strict=True)) >= MIN_COSINE


def test_unsupported_quantization_is_named():
    with pytest.raises(UnsupportedCheckpoint, match="'gptq'"):
        weights.quantization({"quantization_config": {"quant_method": "gptq", "bits": 4}})
    with pytest.raises(UnsupportedCheckpoint, match="'mxfp4'"):
        weights.quantization({"quantization": {"group_size": 32, "bits": 4, "mode": "mxfp4"}})
    assert weights.quantization({}) is None


def test_compute_dtype_is_float32_on_a_cpu_unless_forced(llama_float):
    half = {"w": mx.zeros((2,), dtype=mx.bfloat16)}
    assert weights.compute_dtype("auto", half) == (mx.float32 if mx.default_device().type == mx.DeviceType.cpu
                                                   else mx.bfloat16)
    assert weights.compute_dtype("float16", half) == mx.float16
    with pytest.raises(UnsupportedCheckpoint, match="'float8'"):
        weights.compute_dtype("float8", half)
    loaded = formats.load(formats.open_checkpoint(llama_float), dtype="bfloat16")
    assert loaded.model.model.layers[0].self_attn.q_proj.weight.dtype == mx.bfloat16
    assert loaded.ftype == "F32"  # what the checkpoint stores, not what it computes in


def test_bf16_checkpoint_computes_in_float32_and_matches(llama_float, tmp_path):
    src = llama_float
    ref = load_hf_model(src, "AutoModelForCausalLM")
    folder = tmp_path / "bf16"
    folder.mkdir()
    raw = mx.load(str(src / "model.safetensors"))
    mx.save_safetensors(str(folder / "model.safetensors"), {k: v.astype(mx.bfloat16) for k, v in raw.items()})
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(src / name, folder / name)
    t = torch()
    with t.no_grad():  # the reference on the same bf16-rounded values, computed in float32
        for p in ref.parameters():
            p.copy_(p.to(t.bfloat16).float())
    lists = token_lists(src)
    eng = start_engine(folder, pooling=Pooling.LAST)
    try:
        assert eng.info.ftype == "BF16"
        ours = eng.embed(lists).vectors
    finally:
        eng.close()
    for ids, got in zip(lists, ours, strict=True):
        assert cosine(got, reference_hidden(ref, ids)[-1]) >= MIN_COSINE
