"""engine/families/ministral3.py against transformers' Ministral3 on the same random weights (torch CPU, fp32).

Nemotron-3-Embed's layout: Ministral3Model with `is_causal: false` (transformers then builds a padding-only
mask), tied embeddings, mean pooling from 1_Pooling, caller-side query / passage prompts (checked against
sentence-transformers), and the mlx-community 8-bit conversion of it. The rope settings are Ministral 3's (YaRN,
Llama 4 attention scaling) with original_max_position_embeddings cut to 32, so both the YaRN ramp and the
per-position query scale (1 + 0.1 ln(1 + floor(pos / 32))) change these ~100-token inputs.
"""
from __future__ import annotations

import json

import mlx.core as mx
import numpy as np
import pytest

from engine import Pooling
from engine.errors import UnsupportedCheckpoint
from engine.families import ministral3
from engine.loading import formats, registry
from tests.engine.families.decoder_fixture import (
    LONG_TEXTS,
    MIN_COSINE,
    check_batch_invariant,
    check_tokens_match,
    pooled_layout,
    reference_hidden,
    save_random,
    token_lists,
)
from tests.engine.helpers import cosine, load_hf_model, start_engine

ROPE = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 32,
        "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0, "llama_4_scaling_beta": 0.1}
PROMPTS = {"query": "query: ", "passage": "passage: "}


def as_bidirectional(model):
    model.config.is_causal = False  # what the saved config.json says; transformers' masks read it
    model.config._attn_implementation = "eager"  # sdpa would fall back to the layers' is_causal = True
    return model


@pytest.fixture(scope="module")
def nemotron(tmp_path_factory):
    folder, model = save_random(
        tmp_path_factory.mktemp("ministral3") / "m", "Ministral3Model", "Ministral3Config", seed=21,
        rope_parameters=ROPE, tie_word_embeddings=True, num_hidden_layers=3,
        config_edits={"is_causal": False, "architectures": ["Ministral3Model"]},
        files=pooled_layout("mean", PROMPTS))
    return folder, as_bidirectional(model)


@pytest.fixture(scope="module")
def engine(nemotron):
    eng = start_engine(nemotron[0])
    yield eng
    eng.close()


def test_detected_as_a_bidirectional_mean_pooled_embedder(nemotron, engine):
    ckpt = formats.open_checkpoint(nemotron[0])
    assert registry.kind_of(ckpt) == registry.EMBEDDER and registry.family_name(ckpt) == "ministral3"
    assert registry.default_pooling(ckpt) is Pooling.MEAN
    info = engine.info
    assert (info.family, info.pooling, info.n_embd, info.architecture) == ("ministral3", Pooling.MEAN, 64,
                                                                           "Ministral3Model")
    args = ministral3.ModelArgs.from_dict(json.loads((nemotron[0] / "config.json").read_text()))
    assert not args.causal and (args.attn_scale_beta, args.attn_scale_window) == (0.1, 32)
    assert "lm_head" not in formats.load(ckpt).model


def test_tokens_match_transformers_bidirectional(nemotron):
    folder, model = nemotron
    assert max(len(ids) for ids in token_lists(folder, LONG_TEXTS)) >= 100
    check_tokens_match(folder, model, LONG_TEXTS)


def test_mean_pooling_and_prompts_match_sentence_transformers(nemotron, engine):
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(nemotron[0]), device="cpu", model_kwargs={"attn_implementation": "eager"})
    assert st[0].auto_model.config.is_causal is False
    for name in (None, "query", "passage"):
        expected = st.encode(LONG_TEXTS, prompt_name=name, convert_to_numpy=True)
        ours = engine.embed_prompts(engine.format_prompts([[t] for t in LONG_TEXTS], prompt_name=name)).vectors
        assert min(cosine(a, b) for a, b in zip(ours, expected, strict=True)) >= MIN_COSINE, name


def test_batch_invariant(nemotron, engine):
    check_batch_invariant(engine, nemotron[0], LONG_TEXTS)


def test_attention_scaling_matters_at_this_tolerance(nemotron):
    """The family's Model directly, with the Llama 4 scaling switched off: the long input's vectors move."""
    folder, model = nemotron
    ids = token_lists(folder, [LONG_TEXTS[-1]])[0]
    args = ministral3.ModelArgs.from_dict(json.loads((folder / "config.json").read_text()))
    net = ministral3.Model(args)
    net.load_weights(list(net.sanitize(mx.load(str(folder / "model.safetensors"))).items()))
    expected = reference_hidden(model, ids)
    scaled = np.array(net(mx.array([ids]), mx.ones((1, len(ids))))[0])
    assert min(cosine(a, b) for a, b in zip(scaled, expected)) >= MIN_COSINE
    args.attn_scale_beta = None
    plain = np.array(net(mx.array([ids]), mx.ones((1, len(ids))))[0])
    assert min(cosine(a, b) for a, b in zip(plain, expected)) < 0.9999


def test_mlx_community_8bit_layout_matches_on_its_dequantized_weights(nemotron, tmp_path):
    from tests.engine.test_weights import load_dequantized, quantize_folder

    src = nemotron[0]
    dequantized = quantize_folder(src, tmp_path / "q8", 8)
    ref = as_bidirectional(load_hf_model(src, "AutoModel"))
    load_dequantized(ref, dequantized)
    lists = token_lists(src, LONG_TEXTS)
    eng = start_engine(tmp_path / "q8")
    try:
        assert eng.info.ftype.startswith("MLX_Q8") and eng.info.pooling is Pooling.MEAN
        ours = eng.embed(lists).vectors
    finally:
        eng.close()
    for ids, got in zip(lists, ours, strict=True):
        assert cosine(got, reference_hidden(ref, ids).mean(axis=0)) >= MIN_COSINE


@pytest.fixture(scope="module")
def causal(tmp_path_factory):
    """Ministral3ForCausalLM with --embedding: causal, an untied head dropped, every layer sliding (window 8)."""
    return save_random(tmp_path_factory.mktemp("ministral3_causal") / "m", "Ministral3ForCausalLM",
                       "Ministral3Config", seed=22, rope_parameters=ROPE, tie_word_embeddings=False,
                       sliding_window=8)


def test_causal_sliding_tokens_match_transformers(causal):
    folder, model = causal
    assert ministral3.ModelArgs.from_dict(json.loads((folder / "config.json").read_text())).layer_types == [
        ministral3.SLIDING] * 2
    check_tokens_match(folder, model, LONG_TEXTS)


def test_bidirectional_sliding_window_matches_transformers(tmp_path):
    """|q - k| <= window without the causal mask (transformers' bidirectional sliding-window mask)."""
    folder, model = save_random(tmp_path / "m", "Ministral3Model", "Ministral3Config", seed=23, rope_parameters=ROPE,
                                sliding_window=8, config_edits={"is_causal": False})
    check_tokens_match(folder, as_bidirectional(model), LONG_TEXTS[-3:])


def test_yarn_with_an_attention_factor_is_refused():
    config = dict(model_type="ministral3", vocab_size=10, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                  intermediate_size=8, rope_parameters={**ROPE, "mscale_all_dim": 0.0})
    with pytest.raises(UnsupportedCheckpoint, match="attention factor"):
        ministral3.ModelArgs.from_dict(config)
