"""engine/families/modernbert.py against transformers' ModernBERT on the same random weights (torch CPU, fp32).

The checkpoints are tiny (hidden 64, 3 layers: global, local, global) with a small local window (16: 8 tokens
each side) and inputs several times longer, so the sliding window and both RoPE bases change the numbers.
They reuse all-MiniLM-L6-v2's WordPiece tokenizer ([PAD] 0, [CLS] 101, [SEP] 102).
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from engine import Pooling
from engine.loading import formats
from engine.errors import UnsupportedCheckpoint
from engine.families import modernbert
from tests.conftest import minilm_dir
from tests.engine.helpers import (TOKENIZER_FILES, cosine, hf_logit, hf_rows, load_hf_model, perturb_vectors,
                                   start_engine, torch)

ATOL = 1e-4
LOCAL_ATTENTION = 16
TEXTS = [
    "hello",
    "The quick brown fox jumps over the lazy dog.",
    "Rotary positions, a sliding window of sixteen tokens and three layers: global, local, global. " * 2,
    "a " * 70 + "b",
    "def f(x):\n    return x ** 2  # square",
]
QUERY = "what is a sliding window attention layer"
DOCS = [
    "window",
    "Local attention layers only look at nearby tokens: each query sees eight keys on either side, "
    "while the global layers see the whole sequence, padded or not.",
    "The Eiffel Tower is a wrought-iron lattice tower in Paris.",
]


def make_random_modernbert(out: Path, architecture: str, *, seed: int, legacy_config: bool = False,
                           **overrides) -> Path:
    """A tiny random ModernBERT saved with save_pretrained, MiniLM's tokenizer files copied in.

    legacy_config: rewrite config.json as the published checkpoints have it (global_attn_every_n_layers,
    global_rope_theta, local_rope_theta; no layer_types / rope_parameters).
    """
    t = torch()
    import transformers

    out.mkdir(parents=True, exist_ok=True)
    src = minilm_dir()
    for name in TOKENIZER_FILES:
        shutil.copy(src / name, out / name)
    vocab = json.loads((src / "tokenizer.json").read_text(encoding="utf-8"))["model"]["vocab"]
    settings = dict(vocab_size=len(vocab), hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
                    intermediate_size=96, max_position_embeddings=512, local_attention=LOCAL_ATTENTION,
                    global_attn_every_n_layers=2, global_rope_theta=10_000.0, local_rope_theta=500.0,
                    pad_token_id=0, cls_token_id=101, sep_token_id=102, bos_token_id=101, eos_token_id=102,
                    initializer_range=0.2, num_labels=1)
    settings.update(overrides)
    t.manual_seed(seed)
    model = getattr(transformers, architecture)(transformers.ModernBertConfig(**settings))
    perturb_vectors(model, seed)
    model.eval()
    model.save_pretrained(str(out))
    if legacy_config:
        config = json.loads((out / "config.json").read_text(encoding="utf-8"))
        config.pop("layer_types")
        rope = config.pop("rope_parameters")
        config["global_rope_theta"] = rope["full_attention"]["rope_theta"]
        config["local_rope_theta"] = rope["sliding_attention"]["rope_theta"]
        assert config["global_attn_every_n_layers"] == settings["global_attn_every_n_layers"]
        (out / "config.json").write_text(json.dumps(config), encoding="utf-8")
    assert (out / "model.safetensors").is_file()
    return out


@pytest.fixture(scope="module")
def embedder(tmp_path_factory):
    """ModernBertModel (transformers 5 config layout), served with pooling none and with the default."""
    path = make_random_modernbert(tmp_path_factory.mktemp("mb-model"), "ModernBertModel", seed=21)
    eng_none = start_engine(path, pooling=Pooling.NONE)
    eng_default = start_engine(path)
    ref = load_hf_model(path, "ModernBertModel")
    yield path, eng_none, eng_default, ref
    eng_none.close()
    eng_default.close()


@pytest.fixture(scope="module")
def mlm(tmp_path_factory):
    """ModernBertForMaskedLM (model.*, head.*, decoder.* keys) with the published config layout, biases on
    (norm_bias, attention_bias, mlp_bias) and the tanh GELU."""
    path = make_random_modernbert(tmp_path_factory.mktemp("mb-mlm"), "ModernBertForMaskedLM", seed=22,
                                  legacy_config=True, norm_bias=True, attention_bias=True, mlp_bias=True,
                                  norm_eps=1e-6, hidden_activation="gelu_pytorch_tanh")
    eng = start_engine(path, pooling=Pooling.NONE)
    ref = load_hf_model(path, "ModernBertModel")
    yield path, eng, ref
    eng.close()


def _token_lists(eng) -> list[list[int]]:
    lists = [eng.encode_prompt([t]) for t in TEXTS]
    assert max(map(len, lists)) > 4 * LOCAL_ATTENTION  # the window matters
    return lists


# -- embedders ----------------------------------------------------------------------------------------------
def test_both_layer_kinds_exist(embedder, mlm):
    _, eng, _, ref = embedder
    assert ref.config.layer_types == ["full_attention", "sliding_attention", "full_attention"]
    assert mlm[2].config.layer_types == ref.config.layer_types  # transformers read the legacy config alike
    info = eng.info
    assert info.n_embd == 64 and info.n_ctx_train == 512 and info.architecture == "ModernBertModel"


def test_family_default_pooling_is_mean(embedder):
    _, _, eng, _ = embedder
    assert eng.info.pooling is Pooling.MEAN


def test_hidden_states_match_transformers(embedder):
    _, eng, _, ref = embedder
    token_lists = _token_lists(eng)
    result = eng.embed(token_lists)  # one padded batch: short rows' padding lies far outside their window
    for ids, ours, expected in zip(token_lists, result.vectors, hf_rows(ref, token_lists), strict=True):
        assert ours.shape == expected.shape == (len(ids), 64)
        np.testing.assert_allclose(ours, expected, rtol=0, atol=ATOL)


def test_pooled_vectors_match_transformers_masked_mean(embedder):
    _, _, eng, ref = embedder
    token_lists = _token_lists(eng)
    result = eng.embed(token_lists)
    for ours, hidden in zip(result.vectors, hf_rows(ref, token_lists), strict=True):
        expected = hidden.astype(np.float64).mean(axis=0)
        np.testing.assert_allclose(ours, expected, rtol=0, atol=ATOL)
        assert cosine(ours, expected) >= 0.999999


def test_masked_lm_with_biases_and_published_config_matches_transformers(mlm):
    path, eng, ref = mlm
    keys = set(load_file(str(path / "model.safetensors")))
    assert any(k.startswith("head.") for k in keys) and "model.embeddings.norm.bias" in keys
    assert eng.info.architecture == "ModernBertForMaskedLM" and eng.info.kind == "embedder"
    token_lists = _token_lists(eng)
    result = eng.embed(token_lists)
    for ours, expected in zip(result.vectors, hf_rows(ref, token_lists), strict=True):
        np.testing.assert_allclose(ours, expected, rtol=0, atol=ATOL)


def test_padded_batch_equals_each_row_alone(embedder):
    _, eng, _, _ = embedder
    token_lists = _token_lists(eng)
    batched = eng.embed(token_lists).vectors
    for ids, row in zip(token_lists, batched, strict=True):
        np.testing.assert_allclose(row, eng.embed([ids]).vectors[0], rtol=0, atol=1e-5)


def test_padding_rows_outside_every_window_stay_finite(embedder):
    """A padding query more than a window away from any real token still sees one key (itself): no NaN."""
    path, eng, _, _ = embedder
    model = formats.load(formats.open_checkpoint(path)).model
    width = 8 * LOCAL_ATTENTION
    ids = np.zeros((2, width), dtype=np.int32)
    mask = np.zeros((2, width), dtype=np.int32)
    ids[0], mask[0] = 1000, 1
    ids[1, :3], mask[1, :3] = [101, 2000, 102], 1
    # MLX's boolean masks happen to turn a fully masked row into a uniform average rather than NaN (an additive
    # -inf mask gives NaN): check the masks themselves, then the output.
    for kind, m in model.masks(mx.array(mask)).items():
        assert np.array(mx.broadcast_to(m.dense(), (2, 1, width, width)).any(axis=-1)).all(), kind
    hidden = np.array(model(mx.array(ids), mx.array(mask)))
    assert np.isfinite(hidden).all()
    np.testing.assert_allclose(hidden[1, :3], eng.embed([[101, 2000, 102]]).vectors[0], rtol=0, atol=1e-5)


def test_window_and_rope_bases_matter_at_this_tolerance(embedder):
    """The same weights without the window, or with the two RoPE bases swapped, differ far beyond ATOL."""
    path, eng, _, ref = embedder
    ids = max(_token_lists(eng), key=len)
    expected = hf_rows(ref, [ids])[0]
    no_window = load_hf_model(path, "ModernBertModel")
    no_window.config.local_attention = 4096
    swapped = load_hf_model(path, "ModernBertModel")
    for layer_type, other in (("full_attention", "sliding_attention"), ("sliding_attention", "full_attention")):
        setattr(swapped.rotary_emb, f"{layer_type}_inv_freq", getattr(ref.rotary_emb, f"{other}_inv_freq"))
    for variant in (no_window, swapped):
        assert np.abs(hf_rows(variant, [ids])[0] - expected).max() > 5 * ATOL


def test_missing_attn_norm_past_layer_zero_is_a_load_error(embedder, tmp_path):
    path, _, _, _ = embedder
    broken = tmp_path / "no-attn-norm"
    shutil.copytree(path, broken)
    weights = load_file(str(broken / "model.safetensors"))
    assert "layers.0.attn_norm.weight" not in weights  # layer 0 legitimately has none
    del weights["layers.1.attn_norm.weight"]
    save_file(weights, str(broken / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(UnsupportedCheckpoint, match=r"layers\.1\.attn_norm"):
        start_engine(broken)


# -- cross-encoders -----------------------------------------------------------------------------------------
@pytest.fixture(scope="module", params=["cls", "mean"])
def reranker(request, tmp_path_factory):
    pooling = request.param
    # The head's activation (classifier_activation) differs from the trunk's: using the wrong one shows.
    path = make_random_modernbert(tmp_path_factory.mktemp(f"mb-ce-{pooling}"), "ModernBertForSequenceClassification",
                                  seed=23, classifier_pooling=pooling, classifier_activation="silu",
                                  classifier_bias=pooling == "mean")
    eng = start_engine(path, pooling=Pooling.RANK)
    ref = load_hf_model(path, "ModernBertForSequenceClassification")
    yield pooling, path, eng, ref
    eng.close()


def test_reranker_logits_match_transformers(reranker):
    pooling, _, eng, ref = reranker
    assert ref.config.classifier_pooling == pooling and eng.info.kind == "cross-encoder"
    scores = eng.rerank(QUERY, DOCS).scores  # one padded batch
    pairs = [eng.tokenizer.encode_pair(QUERY, doc)[0] for doc in DOCS]
    assert max(map(len, pairs)) > 2 * LOCAL_ATTENTION
    expected = [hf_logit(ref, ids) for ids in pairs]
    assert np.ptp(expected) > 10 * ATOL
    np.testing.assert_allclose(scores, expected, rtol=0, atol=ATOL)


def test_reranker_head_activation_is_classifier_activation(reranker):
    """With the trunk's GELU in the head instead, transformers itself moves beyond ATOL."""
    from transformers.activations import ACT2FN

    _, path, eng, ref = reranker
    other = load_hf_model(path, "ModernBertForSequenceClassification")
    other.head.act = ACT2FN["gelu"]
    ids = eng.tokenizer.encode_pair(QUERY, DOCS[1])[0]
    assert abs(hf_logit(other, ids) - hf_logit(ref, ids)) > 5 * ATOL


# -- pieces of the family file ------------------------------------------------------------------------------
BASE = dict(vocab_size=10, hidden_size=8, num_hidden_layers=4, num_attention_heads=2, intermediate_size=16)


def test_published_and_transformers5_configs_parse_alike():
    legacy = modernbert.ModelArgs.from_dict({**BASE, "global_attn_every_n_layers": 3, "global_rope_theta": 160000.0,
                                             "local_rope_theta": 10000.0, "reference_compile": True})
    current = modernbert.ModelArgs.from_dict({
        **BASE, "global_attn_every_n_layers": 3,
        "layer_types": ["full_attention", "sliding_attention", "sliding_attention", "full_attention"],
        "rope_parameters": {"full_attention": {"rope_theta": 160000.0, "rope_type": "default"},
                            "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"}}})
    for args in (legacy, current):
        assert args.layer_types == ["full_attention", "sliding_attention", "sliding_attention", "full_attention"]
        assert args.rope_thetas == {"full_attention": 160000.0, "sliding_attention": 10000.0}
        assert args.window == 64


def test_unsupported_rope_and_pooling_are_refused():
    with pytest.raises(UnsupportedCheckpoint, match="yarn"):
        modernbert.ModelArgs.from_dict({**BASE, "rope_parameters": {
            "full_attention": {"rope_theta": 1.0, "rope_type": "yarn"}}})
    with pytest.raises(UnsupportedCheckpoint, match="max"):
        modernbert.ModelArgs.from_dict({**BASE, "classifier_pooling": "max"})


def test_sanitize_strips_prefix_and_drops_heads():
    w = {
        "model.embeddings.tok_embeddings.weight": mx.ones((3, 2)),
        "model.layers.1.attn.Wqkv.weight": mx.ones((6, 2)),
        "model.final_norm.weight": mx.ones(2),
        "head.dense.weight": mx.ones((2, 2)),
        "decoder.bias": mx.ones(3),
        "classifier.weight": mx.ones((1, 2)),
    }
    assert sorted(modernbert.Model.sanitize(w)) == [
        "embeddings.tok_embeddings.weight", "final_norm.weight", "layers.1.attn.Wqkv.weight"]
    assert sorted(modernbert.SequenceClassifier.sanitize(w)) == [
        "classifier.weight", "head.dense.weight", "model.embeddings.tok_embeddings.weight",
        "model.final_norm.weight", "model.layers.1.attn.Wqkv.weight"]
