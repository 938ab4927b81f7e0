"""engine/families/gte.py against transformers' GteModel / GteForSequenceClassification on the same random
weights (torch CPU, fp32).

transformers >= 5 ships Alibaba-NLP's "new" architecture as `gte`; its save_pretrained writes the hub's weight
keys (encoder.layer.N.attention.qkv_proj, mlp.up_gate_proj, attn_ln, mlp_ln) and its loader maps them back,
independently of ours. The folders are served with transformers' config.json and rewritten as the hub ships
them (model_type "new", NewModel / NewForSequenceClassification, rope_theta, rope_scaling). The hub's fixed NTK
scaling has no transformers equivalent: its reference is transformers' model with the rotary inverse
frequencies replaced by the formula of Alibaba-NLP's modeling.py (NTKScalingRotaryEmbedding, mixed_b None).
Tiny (hidden 64, 2 layers, 4 heads) on all-MiniLM-L6-v2's WordPiece tokenizer.
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
from engine.families import gte
from tests.engine.helpers import (cosine, hf_hidden, load_hf_model, perturb_vectors, start_engine, torch,
                                   with_minilm_tokenizer)

THETA = 500.0
TEXTS = [
    "hello",
    "what is the capital of China?",
    "General text embeddings: a post-norm encoder with rotary positions and a gated MLP, "
    "trained with multi-stage contrastive learning. " * 3,
    "a " * 90 + "b",
    "def f(x):\n    return x ** 2  # square",
]
QUERY = "what is a gated linear unit"
DOCS = ["gate", "A gated linear unit multiplies one projection by the activation of another one. " * 2,
        "The Eiffel Tower is in Paris."]


def make_random_gte(out: Path, *, seed: int, architecture: str = "GteModel", type_vocab_size: int = 1) -> Path:
    t = torch()
    import transformers

    n_vocab = with_minilm_tokenizer(out)
    t.manual_seed(seed)
    config = transformers.GteConfig(
        vocab_size=n_vocab, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=96,
        type_vocab_size=type_vocab_size, pad_token_id=0, initializer_range=0.2, num_labels=1,
        rope_parameters={"rope_type": "default", "rope_theta": THETA})
    model = getattr(transformers, architecture)(config)
    perturb_vectors(model, seed)
    model.eval()
    model.save_pretrained(str(out))
    return out


def as_hub(src: Path, dst: Path, architecture: str = "NewModel", rope_scaling: dict | None = None) -> Path:
    """The folder with config.json as Alibaba-NLP's repositories spell it."""
    shutil.copytree(src, dst)
    native = json.loads((src / "config.json").read_text(encoding="utf-8"))
    config = {k: native[k] for k in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                                     "intermediate_size", "hidden_act", "max_position_embeddings",
                                     "type_vocab_size", "layer_norm_eps", "pad_token_id")}
    config.update(model_type="new", architectures=[architecture], rope_theta=THETA, rope_scaling=rope_scaling,
                  position_embedding_type="rope", layer_norm_type="layer_norm", pack_qkv=True,
                  unpad_inputs=False, use_memory_efficient_attention=False, logn_attention_scale=False,
                  logn_attention_clip1=False, auto_map={"AutoModel": "Alibaba-NLP/new-impl--modeling.NewModel"})
    if "id2label" in native:
        config["id2label"] = native["id2label"]
    (dst / "config.json").write_text(json.dumps(config), encoding="utf-8")
    return dst


def with_ntk_frequencies(model, factor: float):
    """Alibaba-NLP's NTKScalingRotaryEmbedding (mixed_b None) in place of transformers' default rotary."""
    t = torch()
    dim = model.config.hidden_size // model.config.num_attention_heads
    inv_freq = 1.0 / ((THETA * factor) ** (t.arange(0, dim, 2).float() / dim))
    model.rotary_emb.inv_freq = inv_freq / factor ** (2 / dim)
    return model


def token_lists(eng) -> list[list[int]]:
    lists = [eng.encode_prompt([t]) for t in TEXTS]
    assert max(map(len, lists)) > 64
    return lists


@pytest.fixture(scope="module")
def native(tmp_path_factory):
    path = make_random_gte(tmp_path_factory.mktemp("gte-native"), seed=41)
    eng = start_engine(path, pooling=Pooling.NONE)
    yield path, eng, load_hf_model(path, "GteModel")
    eng.close()


def test_weights_are_the_hub_layout(native):
    keys = set(load_file(str(native[0] / "model.safetensors")))
    assert {"encoder.layer.0.attention.qkv_proj.weight", "encoder.layer.1.mlp.up_gate_proj.weight",
            "encoder.layer.0.attn_ln.bias", "embeddings.token_type_embeddings.weight"} <= keys


def test_hidden_states_match_transformers(native):
    _, eng, ref = native
    lists = token_lists(eng)
    for ids, ours in zip(lists, eng.embed(lists).vectors, strict=True):  # one padded batch
        expected = hf_hidden(ref, ids)
        assert ours.shape == expected.shape == (len(ids), 64)
        np.testing.assert_allclose(ours, expected, rtol=0, atol=1e-4)
        assert min(cosine(a, b) for a, b in zip(ours, expected, strict=True)) >= 0.99999


@pytest.mark.parametrize("factor", [None, 2.0])
def test_hub_config_with_and_without_ntk_scaling(native, tmp_path, factor):
    path, _, _ = native
    rope_scaling = {"type": "ntk", "factor": factor} if factor else None
    hub = as_hub(path, tmp_path / "hub", rope_scaling=rope_scaling)
    ref = load_hf_model(path, "GteModel")
    if factor:
        with_ntk_frequencies(ref, factor)
    eng = start_engine(hub)  # 1_Pooling absent: mean, as sentence-transformers does with a bare encoder
    try:
        assert eng.info.pooling is Pooling.MEAN and eng.info.model_type == "new" and eng.info.n_ctx_train == 8192
        lists = token_lists(eng)
        batched = eng.embed(lists).vectors
        for ids, ours in zip(lists, batched, strict=True):
            expected = hf_hidden(ref, ids).astype(np.float64).mean(axis=0)
            assert cosine(ours, expected) >= 0.99999
            np.testing.assert_allclose(ours, expected, rtol=0, atol=1e-4)
            np.testing.assert_allclose(ours, eng.embed([ids]).vectors[0], rtol=0, atol=1e-5)  # batch-invariant
    finally:
        eng.close()


def test_ntk_scaling_changes_the_numbers(native):
    path, eng, ref = native
    ids = max(token_lists(eng), key=len)
    scaled = with_ntk_frequencies(load_hf_model(path, "GteModel"), 8.0)
    assert np.abs(hf_hidden(scaled, ids) - hf_hidden(ref, ids)).max() > 1e-2


def test_no_token_types_and_a_token_classification_export(tmp_path):
    """gte-base-en-v1.5 has type_vocab_size 0; gte-multilingual-base ships NewForTokenClassification (new.*,
    classifier.*): the trunk embeds."""
    path = make_random_gte(tmp_path / "no-types", seed=42, type_vocab_size=0)
    ref = load_hf_model(path, "GteModel")
    export = as_hub(path, tmp_path / "token-cls", architecture="NewForTokenClassification")
    weights = {f"new.{k}": v for k, v in load_file(str(export / "model.safetensors")).items()}
    weights.update({"classifier.weight": np.ones((1, 64), np.float32), "classifier.bias": np.zeros(1, np.float32)})
    save_file(weights, str(export / "model.safetensors"))
    eng = start_engine(export, pooling=Pooling.NONE)
    try:
        assert eng.info.kind == "embedder"
        ids = token_lists(eng)[2]
        np.testing.assert_allclose(eng.embed([ids]).vectors[0], hf_hidden(ref, ids, token_types=False),
                                   rtol=0, atol=1e-4)
    finally:
        eng.close()


def test_unpacked_qkv_loads_the_same(native, tmp_path):
    """pack_qkv false checkpoints store q_proj/k_proj/v_proj."""
    path, eng, _ = native
    split = tmp_path / "unpacked"
    shutil.copytree(path, split)
    weights = load_file(str(split / "model.safetensors"))
    for key in [k for k in weights if ".qkv_proj." in k]:
        for name, part in zip(("q_proj", "k_proj", "v_proj"), np.split(weights.pop(key), 3, axis=0), strict=True):
            weights[key.replace("qkv_proj", name)] = part
    save_file(weights, str(split / "model.safetensors"))
    other = start_engine(split, pooling=Pooling.NONE)
    try:
        ids = token_lists(other)[1]
        np.testing.assert_array_equal(other.embed([ids]).vectors[0], eng.embed([ids]).vectors[0])
    finally:
        other.close()


def test_reranker_logits_match_transformers(tmp_path):
    """NewForSequenceClassification (gte-multilingual-reranker-base's layout): pooler + classifier, raw logit."""
    t = torch()
    path = make_random_gte(tmp_path / "ce", seed=43, architecture="GteForSequenceClassification", type_vocab_size=2)
    ref = load_hf_model(path, "GteForSequenceClassification")
    hub = as_hub(path, tmp_path / "ce-hub", architecture="NewForSequenceClassification")
    weights = load_file(str(hub / "model.safetensors"))  # transformers writes gte.*, the hub's checkpoint new.*
    assert "gte.pooler.dense.weight" in weights and "classifier.weight" in weights
    save_file({("new." + k[4:] if k.startswith("gte.") else k): v for k, v in weights.items()},
              str(hub / "model.safetensors"))
    eng = start_engine(hub, pooling=Pooling.RANK)
    native = start_engine(path, pooling=Pooling.RANK)  # transformers' own folder: GteForSequenceClassification
    try:
        assert eng.info.kind == native.info.kind == "cross-encoder"
        scores = eng.rerank(QUERY, DOCS).scores
        np.testing.assert_array_equal(native.rerank(QUERY, DOCS).scores, scores)
        for doc, score in zip(DOCS, scores, strict=True):
            ids, types = eng.tokenizer.encode_pair(QUERY, doc)
            with t.inference_mode():
                logit = ref(input_ids=t.tensor([ids]), attention_mask=t.ones(1, len(ids), dtype=t.long),
                            token_type_ids=t.tensor([types])).logits[0, 0]
            assert abs(score - float(logit)) < 1e-4
        assert len(set(np.round(scores, 3))) == 3
    finally:
        eng.close()
        native.close()


@pytest.mark.parametrize("change,named", [
    ({"rope_scaling": {"type": "ntk", "factor": 2.0, "mixed_b": 0.9}}, "rope_scaling"),
    ({"rope_scaling": {"type": "linear", "factor": 2.0}}, "rope_scaling"),
    ({"position_embedding_type": "absolute"}, "position_embedding_type 'absolute'"),
    ({"layer_norm_type": "rms_norm"}, "layer_norm_type 'rms_norm'"),
    ({"logn_attention_scale": True}, "logn_attention_scale"),
    ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1.0}}, "rope_type 'yarn'"),
])
def test_unsupported_variants_are_named(change, named):
    config = {"vocab_size": 100, "hidden_size": 64, "num_hidden_layers": 1, "num_attention_heads": 4,
              "intermediate_size": 96, **change}
    with pytest.raises(UnsupportedCheckpoint, match=named):
        gte.ModelArgs.from_dict(config)
