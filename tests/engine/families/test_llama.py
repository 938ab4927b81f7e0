"""engine/families/llama.py against transformers on the same random weights (torch CPU, fp32): LlamaForCausalLM
served with --embedding, Mistral with a sliding window shorter than the inputs, and the bidirectional Llama of
LLM2Vec / Nemotron-embed (`model_type: llama_bidirec`)."""
from __future__ import annotations

import json

import mlx.core as mx
import numpy as np
import pytest

from engine import Pooling
from engine.loading import formats, registry
from engine.errors import UnsupportedCheckpoint
from engine.families import llama
from tests.engine.families.decoder_fixture import (
    TEXTS,
    check_batch_invariant,
    check_pooled,
    check_tokens_match,
    reference_hidden,
    save_random,
    token_lists,
)
from tests.engine.helpers import cosine, load_hf_model, start_engine

LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 16}


@pytest.fixture(scope="module")
def causal(tmp_path_factory):
    """LlamaForCausalLM, untied head, biases everywhere, Llama 3 rope scaling that changes these lengths."""
    return save_random(tmp_path_factory.mktemp("llama") / "m", "LlamaForCausalLM", "LlamaConfig", seed=1,
                       attention_bias=True, mlp_bias=True, tie_word_embeddings=False, rope_parameters=LLAMA3_ROPE)


@pytest.fixture(scope="module")
def causal_mean(causal):
    eng = start_engine(causal[0], pooling=Pooling.MEAN)
    yield eng
    eng.close()


def test_causal_llama_tokens_match_transformers(causal):
    check_tokens_match(*causal)


def test_causal_llama_mean_and_last_pooling_match(causal, causal_mean):
    check_pooled(causal_mean, *causal, Pooling.MEAN)
    eng = start_engine(causal[0], pooling=Pooling.LAST)
    try:
        check_pooled(eng, *causal, Pooling.LAST)
    finally:
        eng.close()


def test_causal_llama_is_batch_invariant(causal, causal_mean):
    check_batch_invariant(causal_mean, causal[0])


def test_decoder_without_pooling_info_defaults_to_none_as_llama_server(causal):
    # llama-server gives a decoder GGUF without pooling_type pooling none: one vector per token
    eng = start_engine(causal[0])
    try:
        assert eng.info.pooling is Pooling.NONE
        assert eng.info.architecture == "LlamaForCausalLM" and eng.info.n_embd == 64
        assert eng.info.n_ctx_train == 512
    finally:
        eng.close()


def test_head_is_never_loaded(causal):
    model = formats.load(formats.open_checkpoint(causal[0])).model
    assert "lm_head" not in model


def test_llama3_rope_scaling_changes_the_vectors(causal, tmp_path):
    # the same weights read with plain rope give different vectors, so the comparison above pins llama3 scaling
    folder, ref = causal
    config = json.loads((folder / "config.json").read_text())
    config["rope_parameters"] = {"rope_type": "default", "rope_theta": 500000.0}
    (tmp_path / "config.json").write_text(json.dumps(config))
    for name in ("model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        (tmp_path / name).symlink_to(folder / name)
    ids = token_lists(folder, [TEXTS[2]])
    eng = start_engine(tmp_path, pooling=Pooling.LAST)
    try:
        plain = eng.embed(ids).vectors[0]
    finally:
        eng.close()
    assert cosine(plain, reference_hidden(ref, ids[0])[-1]) < 0.9999


@pytest.fixture(scope="module")
def mistral(tmp_path_factory):
    return save_random(tmp_path_factory.mktemp("mistral") / "m", "MistralModel", "MistralConfig", seed=2,
                       sliding_window=8)


def test_mistral_sliding_window_matches_transformers(mistral):
    check_tokens_match(*mistral)


def test_mistral_window_matters_at_this_tolerance(mistral):
    folder, ref = mistral
    ids = token_lists(folder, [TEXTS[2]])[0]
    assert len(ids) > 20
    args = llama.ModelArgs.from_dict({**json.loads((folder / "config.json").read_text()), "sliding_window": None})
    assert args.layer_types == [llama.FULL, llama.FULL]
    model = llama.Model(args)
    model.load_weights(list(model.sanitize(mx.load(str(folder / "model.safetensors"))).items()))
    full = np.array(model(mx.array([ids]), mx.ones((1, len(ids))))[0, -1])
    assert cosine(full, reference_hidden(ref, ids)[-1]) < 0.9999


@pytest.fixture(scope="module")
def bidirectional(tmp_path_factory):
    """LLM2Vec / Nemotron-embed layout: model_type llama_bidirec, LlamaBidirectionalModel, 1_Pooling mean."""
    folder, model = save_random(
        tmp_path_factory.mktemp("llama_bidirec") / "m", "LlamaModel", "LlamaConfig", seed=3,
        config_edits={"model_type": "llama_bidirec", "architectures": ["LlamaBidirectionalModel"]},
        files={"modules.json": [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
                                {"idx": 1, "name": "1", "path": "1_Pooling",
                                 "type": "sentence_transformers.models.Pooling"}],
               "1_Pooling/config.json": {"word_embedding_dimension": 64, "pooling_mode_mean_tokens": True}})
    model.config.is_causal = False  # transformers' LlamaModel then builds a bidirectional padding mask
    model.config._attn_implementation = "eager"
    return folder, model


def test_bidirectional_llama_matches_transformers_without_causal_mask(bidirectional):
    check_tokens_match(*bidirectional)
    eng = start_engine(bidirectional[0])
    try:
        assert eng.info.pooling is Pooling.MEAN and eng.info.model_type == "llama_bidirec"
        check_pooled(eng, *bidirectional, Pooling.MEAN)
        check_batch_invariant(eng, bidirectional[0])
    finally:
        eng.close()


def test_bidirectional_flags_in_config():
    base = dict(model_type="llama", vocab_size=10, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                intermediate_size=8)
    assert llama.ModelArgs.from_dict(base).causal
    assert not llama.ModelArgs.from_dict({**base, "is_causal": False}).causal
    assert not llama.ModelArgs.from_dict({**base, "use_bidirectional_attention": True}).causal
    assert not llama.ModelArgs.from_dict({**base, "model_type": "llama_bidirec"}).causal


@pytest.mark.parametrize("rope, words", [
    ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}, "yarn rope with attention factor"),
    ({"rope_type": "yarn", "factor": 4.0}, "yarn rope needs factor and original_max_position_embeddings"),
    ({"rope_type": "dynamic", "factor": 2.0}, "rope type 'dynamic'"),
    ({"rope_type": "default", "partial_rotary_factor": 0.5}, "partial_rotary_factor"),
])
def test_unsupported_rope_is_a_load_error_naming_it(rope, words):
    with pytest.raises(UnsupportedCheckpoint, match=words):
        llama.ModelArgs.from_dict(dict(model_type="llama", vocab_size=10, hidden_size=8, num_hidden_layers=1,
                                       num_attention_heads=2, intermediate_size=8, rope_scaling=rope))


def test_unsupported_activation_and_sequence_classifier_are_refused(tmp_path):
    with pytest.raises(UnsupportedCheckpoint, match="activation 'relu2' is not supported"):
        llama.Model(llama.ModelArgs.from_dict(dict(model_type="llama", vocab_size=10, hidden_size=8,
                                                   num_hidden_layers=1, num_attention_heads=2, intermediate_size=8,
                                                   hidden_act="relu2")))
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama",
                                                       "architectures": ["LlamaForSequenceClassification"]}))
    with pytest.raises(UnsupportedCheckpoint, match="LlamaForSequenceClassification"):
        registry.kind_of(formats.open_checkpoint(tmp_path))
    with pytest.raises(UnsupportedCheckpoint, match="LlamaForSequenceClassification"):
        registry.kind_of(formats.open_checkpoint(tmp_path), rank=True)


# -- SmolLM2-135M-Instruct: real weights ------------------------------------------------------------------
@pytest.fixture(scope="module")
def smollm2():
    from tests.engine.families.smollm2_fixture import converted_folder

    folder = converted_folder()
    return folder, load_hf_model(folder, "AutoModelForCausalLM")


def test_smollm2_mean_pooling_matches_transformers_on_its_weights(smollm2):
    """--embedding --pooling mean on a real Llama (30 layers, GQA 9/3, tied head) against transformers, with
    the llama-server fixture's twelve sentences (ASCII, CJK, Cyrillic, emoji, whitespace) in one batch."""
    from tests.engine.families.smollm2_fixture import LLAMA_SERVER_JSON

    folder, ref = smollm2
    sentences = json.loads(LLAMA_SERVER_JSON.read_text())["sentences"] if LLAMA_SERVER_JSON.is_file() else TEXTS
    eng = start_engine(folder, pooling=Pooling.MEAN, max_seq=64)  # the sentences are short: fewer shapes to warm
    try:
        info = eng.info
        assert (info.architecture, info.n_embd, info.n_ctx_train, info.pooling) == (
            "LlamaForCausalLM", 576, 8192, Pooling.MEAN)
        lists = token_lists(folder, sentences)
        ours = check_pooled(eng, folder, ref, Pooling.MEAN, sentences)
        check_batch_invariant(eng, folder, sentences[:4])
    finally:
        eng.close()
    if LLAMA_SERVER_JSON.is_file():
        served = json.loads(LLAMA_SERVER_JSON.read_text())
        assert lists == served["tokenize"]["ids"]  # the same tokens llama-server read from the GGUF itself
        # llama.cpp multiplies Q4_1 weights by 8-bit activations: close, not equal (measured 0.9992 and up)
        assert min(cosine(a, b) for a, b in zip(ours, served["embeddings"]["vectors"], strict=True)) >= 0.999
