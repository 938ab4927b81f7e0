"""engine/families/nomic_bert.py against transformers' NomicBertModel on the same random weights (torch CPU, fp32).

transformers >= 5 ships NomicBERT natively; its save_pretrained writes the hub's weight keys (encoder.layers.N.
attn.Wqkv, mlp.fc11/fc12/fc2, norm1/norm2, emb_ln) and its own config names, and its loader maps those keys
back, independently of ours. The checkpoints are served twice: with transformers' config.json and rewritten in
the hub's GPT-2 names (n_embd, n_layer, rotary_emb_fraction, qkv_proj_bias, ...) as nomic-embed-text-v1.5 ships
it. Tiny (hidden 64, 2 layers, 4 heads, rope base 1000) on all-MiniLM-L6-v2's WordPiece tokenizer.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from engine import Pooling
from engine.errors import UnsupportedCheckpoint
from engine.families import nomic_bert
from tests.engine.helpers import (cosine, hf_hidden, load_hf_model, perturb_vectors, start_engine, torch,
                                   with_minilm_tokenizer)

TEXTS = [
    "hello",
    "search_query: what is rotary position embedding?",
    "search_document: Rotary embeddings rotate query and key pairs by an angle that grows with the position, "
    "so attention scores depend on relative offsets. " * 3,
    "a " * 90 + "b",
    "def f(x):\n    return x ** 2  # square",
]


def hub_config(native: dict) -> dict:
    """transformers' NomicBertConfig as the hub's config.json spells it (nomic-embed-text-v1.5's keys)."""
    return {
        "architectures": ["NomicBertModel"], "model_type": "nomic_bert", "activation_function":
            {"silu": "swiglu", "gelu": "geglu"}[native["hidden_act"]],
        "vocab_size": native["vocab_size"], "n_embd": native["hidden_size"], "n_head": native["num_attention_heads"],
        "n_layer": native["num_hidden_layers"], "n_inner": native["intermediate_size"], "n_positions": 8192,
        "max_trained_positions": 2048, "layer_norm_epsilon": native["layer_norm_eps"],
        "type_vocab_size": native["type_vocab_size"], "rotary_emb_fraction": 1.0,
        "rotary_emb_base": native["rope_parameters"]["rope_theta"], "rotary_emb_interleaved": False,
        "rotary_emb_scale_base": None, "rotary_scaling_factor": None, "qkv_proj_bias": False, "mlp_fc1_bias": False,
        "mlp_fc2_bias": False, "prenorm": False, "parallel_block": False, "causal": False, "use_rms_norm": False,
        "pad_vocab_size_multiple": 1, "fused_bias_fc": True, "use_flash_attn": True, "bos_token_id": None,
    }


def make_random_nomic(out: Path, *, seed: int, hidden_act: str = "silu", hub_layout: bool = False) -> Path:
    t = torch()
    import transformers

    n_vocab = with_minilm_tokenizer(out)
    t.manual_seed(seed)
    config = transformers.NomicBertConfig(
        vocab_size=n_vocab, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=96,
        hidden_act=hidden_act, rope_parameters={"rope_type": "default", "rope_theta": 1000.0},
        initializer_range=0.2)
    model = transformers.NomicBertModel(config)
    perturb_vectors(model, seed)
    model.eval()
    model.save_pretrained(str(out))
    if hub_layout:
        native = json.loads((out / "config.json").read_text(encoding="utf-8"))
        (out / "config.json").write_text(json.dumps(hub_config(native)), encoding="utf-8")
    return out


@pytest.fixture(scope="module")
def native(tmp_path_factory):
    """transformers' own config.json; the reference loads the very same folder."""
    path = make_random_nomic(tmp_path_factory.mktemp("nomic-native"), seed=31)
    ref = load_hf_model(path, "NomicBertModel")
    eng = start_engine(path, pooling=Pooling.NONE)
    yield path, eng, ref
    eng.close()


@pytest.fixture(scope="module")
def hub(tmp_path_factory, native):
    """The same weights with the hub's config.json (what nomic-embed-text-v1.5 ships); mean pooling."""
    path = tmp_path_factory.mktemp("nomic-hub") / "model"
    shutil.copytree(native[0], path)
    config = hub_config(json.loads((native[0] / "config.json").read_text(encoding="utf-8")))
    (path / "config.json").write_text(json.dumps(config), encoding="utf-8")
    eng = start_engine(path)
    yield path, eng
    eng.close()


def token_lists(eng) -> list[list[int]]:
    lists = [eng.encode_prompt([t]) for t in TEXTS]
    assert max(map(len, lists)) > 64  # long enough for the rotary angles to wrap on the fast pairs
    return lists


def test_weights_are_the_hub_layout(native):
    keys = set(load_file(str(native[0] / "model.safetensors")))
    assert {"emb_ln.weight", "encoder.layers.0.attn.Wqkv.weight", "encoder.layers.1.mlp.fc12.weight"} <= keys
    assert not any("bias" in k for k in keys if ".attn." in k or ".mlp." in k)


def test_hidden_states_match_transformers(native):
    _, eng, ref = native
    lists = token_lists(eng)
    result = eng.embed(lists)  # one padded batch
    for ids, ours in zip(lists, result.vectors, strict=True):
        expected = hf_hidden(ref, ids)
        assert ours.shape == expected.shape == (len(ids), 64)
        np.testing.assert_allclose(ours, expected, rtol=0, atol=1e-4)
        assert min(cosine(a, b) for a, b in zip(ours, expected, strict=True)) >= 0.99999


def test_hub_config_gives_the_same_vectors_mean_pooled(native, hub):
    _, eng_native, ref = native
    _, eng = hub
    assert eng.info.pooling is Pooling.MEAN and eng.info.n_embd == 64 and eng.info.n_ctx_train == 8192
    assert eng_native.info.n_ctx_train == 2048  # transformers' max_position_embeddings
    lists = token_lists(eng)
    for ids, ours in zip(lists, eng.embed(lists).vectors, strict=True):
        expected = hf_hidden(ref, ids).astype(np.float64).mean(axis=0)
        assert cosine(ours, expected) >= 0.99999
        np.testing.assert_allclose(ours, expected, rtol=0, atol=1e-4)


def test_padded_batch_equals_each_row_alone(hub):
    _, eng = hub
    lists = token_lists(eng)
    batched = eng.embed(lists).vectors
    for ids, row in zip(lists, batched, strict=True):
        np.testing.assert_allclose(row, eng.embed([ids]).vectors[0], rtol=0, atol=1e-5)


def test_geglu_matches_transformers(tmp_path):
    path = make_random_nomic(tmp_path / "geglu", seed=32, hidden_act="gelu", hub_layout=True)
    assert json.loads((path / "config.json").read_text())["activation_function"] == "geglu"
    ref = load_hf_model(make_random_nomic(tmp_path / "geglu-native", seed=32, hidden_act="gelu"), "NomicBertModel")
    eng = start_engine(path, pooling=Pooling.NONE)
    try:
        ids = token_lists(eng)[2]
        np.testing.assert_allclose(eng.embed([ids]).vectors[0], hf_hidden(ref, ids), rtol=0, atol=1e-4)
    finally:
        eng.close()


def test_pretraining_export_keeps_only_the_trunk(native, tmp_path):
    """NomicBertForPreTraining (bert. prefix, cls.* MLM head): the same trunk."""
    path, eng, _ = native
    export = tmp_path / "pretraining"
    shutil.copytree(path, export)
    weights = load_file(str(export / "model.safetensors"))
    weights = {f"bert.{k}": v for k, v in weights.items()}
    weights["cls.predictions.decoder.weight"] = np.zeros((10, 64), dtype=np.float32)
    save_file(weights, str(export / "model.safetensors"))
    config = json.loads((export / "config.json").read_text())
    (export / "config.json").write_text(json.dumps({**config, "architectures": ["NomicBertForPreTraining"]}))
    other = start_engine(export, pooling=Pooling.NONE)
    try:
        ids = token_lists(other)[1]
        np.testing.assert_array_equal(other.embed([ids]).vectors[0], eng.embed([ids]).vectors[0])
    finally:
        other.close()


@pytest.mark.parametrize("change,named", [
    ({"rotary_scaling_factor": 2.0}, "rotary_scaling_factor"),
    ({"prenorm": True}, "prenorm"),
    ({"moe_every_n_layers": 2, "num_experts": 4, "moe_top_k": 2}, "mixture of experts needs plain experts"),
    ({"activation_function": "gelu", "moe_every_n_layers": 2, "num_experts": 2, "moe_top_k": 3}, "moe_top_k"),
    ({"num_shared_experts": 1}, "num_shared_experts"),
    ({"expert_choice_router": True}, "expert_choice_router"),
    ({"rotary_emb_fraction": 0.5}, "rotary_emb_fraction 0.5"),
    ({"activation_function": "relu"}, "activation_function 'relu'"),
])
def test_unsupported_variants_are_named(native, change, named):
    config = {**hub_config(json.loads((native[0] / "config.json").read_text())), **change}
    with pytest.raises(UnsupportedCheckpoint, match=named):
        nomic_bert.ModelArgs.from_dict(config)


def test_vocab_is_padded_as_the_hub_stores_it():
    args = nomic_bert.ModelArgs.from_dict({**hub_config({"hidden_act": "silu", "vocab_size": 30522,
                                                         "hidden_size": 64, "num_attention_heads": 4,
                                                         "num_hidden_layers": 1, "intermediate_size": 96,
                                                         "layer_norm_eps": 1e-12, "type_vocab_size": 2,
                                                         "rope_parameters": {"rope_theta": 1000.0}}),
                                           "pad_vocab_size_multiple": 64})
    assert args.vocab_size == 30528  # nomic-embed-text's table
