"""engine/families/lfm2.py against transformers' Lfm2 on the same random weights (torch CPU, fp32): short
causal convolutions and attention layers interleaved, padding zeroed before each convolution; then the
bidirectional encoder (LFM2.5-Embedding: CLS pooling and its prompts, against sentence-transformers). pylate's
ColBERT layout on it: test_lfm2_colbert.py."""
from __future__ import annotations

import contextlib
import json

import mlx.core as mx
import numpy as np
import pytest

from engine import Pooling
from engine.families import lfm2
from engine.loading import formats, registry
from tests.engine.families.decoder_fixture import (
    LONG_TEXTS,
    MIN_COSINE,
    check_batch_invariant,
    check_pooled,
    check_tokens_match,
    pooled_layout,
    reference_hidden,
    save_random,
    token_lists,
)
from tests.engine.helpers import cosine, start_engine


@pytest.fixture(scope="module")
def causal(tmp_path_factory):
    return save_random(tmp_path_factory.mktemp("lfm2") / "m", "Lfm2ForCausalLM", "Lfm2Config", seed=14,
                       num_hidden_layers=3, layer_types=["conv", "full_attention", "conv"], conv_bias=True,
                       intermediate_size=96, block_multiple_of=16)


def test_lfm2_tokens_match_transformers(causal):
    check_tokens_match(*causal)


def test_lfm2_mean_pooling_matches_and_is_batch_invariant(causal):
    eng = start_engine(causal[0], pooling=Pooling.MEAN)
    try:
        assert eng.info.family == "lfm2"
        check_pooled(eng, *causal, Pooling.MEAN)
        check_batch_invariant(eng, causal[0])
    finally:
        eng.close()


# -- the bidirectional encoder: LFM2.5-Embedding, LFM2 / LFM2.5 ColBERT ------------------------------------
# transformers 5.24 has no Lfm2BidirectionalModel (it came later, as models/lfm2_bidirectional). Its reference is
# built here from transformers' Lfm2Model as that class is written: the short convolution centered
# (F.conv1d padded L_cache // 2 on each side, cut to the row's length) instead of causal, and the attention
# without the causal mask (config.is_causal = False, eager attention), patched in only while the reference runs.
BIDIRECTIONAL = dict(num_hidden_layers=4, layer_types=["conv", "full_attention", "conv", "full_attention"],
                     intermediate_size=96, block_multiple_of=16)
PROMPTS = {"query": "query: ", "document": "document: "}  # LFM2.5-Embedding's, caller-side


def centered_conv(hidden_states, weight, bias=None, activation=None, **kwargs):
    """transformers' Lfm2BidirectionalShortConv convolution in place of causal_conv1d_fn: [B, H, L] -> [B, H, L]."""
    import torch.nn.functional as F

    length = hidden_states.shape[-1]
    pad = weight.shape[-1] // 2
    return F.conv1d(hidden_states, weight.unsqueeze(1), bias, padding=pad, groups=hidden_states.shape[1])[..., :length]


@contextlib.contextmanager
def centered_convolution():
    from transformers.models.lfm2 import modeling_lfm2

    original = modeling_lfm2.causal_conv1d_fn
    modeling_lfm2.causal_conv1d_fn = centered_conv
    try:
        yield
    finally:
        modeling_lfm2.causal_conv1d_fn = original


def bidirectional(model):
    """transformers' Lfm2Model (or a sentence-transformers module's) made to attend without the causal mask."""
    model.config.is_causal = False  # create_causal_mask then builds a bidirectional padding mask
    model.config._attn_implementation = "eager"  # sdpa would read the layers' is_causal = True
    return model


class BidirectionalReference:
    """transformers' Lfm2Model run as Lfm2BidirectionalModel (see above); called like the torch model."""

    def __init__(self, inner):
        self.inner = bidirectional(inner)

    def __call__(self, **inputs):
        with centered_convolution():
            return self.inner(**inputs)


@pytest.fixture(scope="module")
def embedding(tmp_path_factory):
    """LFM2.5-Embedding-350M's layout: Lfm2BidirectionalModel, 1_Pooling CLS, query / document prompts; a conv
    bias on, so the padding of B * x is exercised too."""
    folder, model = save_random(
        tmp_path_factory.mktemp("lfm2_embedding") / "m", "Lfm2Model", "Lfm2Config", seed=15, conv_bias=True,
        config_edits={"architectures": ["Lfm2BidirectionalModel"]}, **BIDIRECTIONAL,
        files=pooled_layout("cls", PROMPTS))
    return folder, BidirectionalReference(model)


@pytest.fixture(scope="module")
def embedding_engine(embedding):
    eng = start_engine(embedding[0])
    yield eng
    eng.close()


def test_bidirectional_is_detected_by_architecture_and_model_type():
    base = dict(vocab_size=10, hidden_size=8, num_hidden_layers=1, num_attention_heads=2)
    assert lfm2.ModelArgs.from_dict(base).causal
    assert not lfm2.ModelArgs.from_dict({**base, "architectures": ["Lfm2BidirectionalModel"]}).causal
    assert not lfm2.ModelArgs.from_dict({**base, "model_type": "lfm2_bidirectional"}).causal
    assert not lfm2.ModelArgs.from_dict({**base, "is_causal": False}).causal


def test_bidirectional_tokens_match_the_reference(embedding):
    folder, ref = embedding
    lists = token_lists(folder, LONG_TEXTS)
    assert max(map(len, lists)) >= 100
    eng = start_engine(folder, pooling=Pooling.NONE)
    try:
        ours = eng.embed(lists).vectors  # one right-padded batch
    finally:
        eng.close()
    for ids, got in zip(lists, ours, strict=True):
        expected = reference_hidden(ref, ids)
        assert min(cosine(a, b) for a, b in zip(got, expected, strict=True)) >= MIN_COSINE
        np.testing.assert_allclose(got, expected, atol=1e-4 * max(1.0, float(np.abs(expected).max())), rtol=1e-4)


def test_bidirectional_family_model_on_a_padded_batch(embedding):
    """lfm2.Model directly: a row padded with arbitrary ids gives the same real tokens as the reference alone."""
    folder, ref = embedding
    args = lfm2.ModelArgs.from_dict(json.loads((folder / "config.json").read_text()))
    model = lfm2.Model(args)
    model.load_weights(list(model.sanitize(mx.load(str(folder / "model.safetensors"))).items()))
    short, long_ = token_lists(folder, [LONG_TEXTS[1], LONG_TEXTS[-1]])
    width = len(long_)
    ids = mx.array([short + [7] * (width - len(short)), long_])
    mask = mx.array([[1] * len(short) + [0] * (width - len(short)), [1] * width])
    hidden = np.array(model(ids, mask))
    for row, tokens in zip(hidden, (short, long_)):
        expected = reference_hidden(ref, tokens)
        assert min(cosine(a, b) for a, b in zip(row[:len(tokens)], expected)) >= MIN_COSINE


def test_causal_reading_of_the_same_weights_differs(embedding):
    folder, ref = embedding
    args = lfm2.ModelArgs.from_dict({**json.loads((folder / "config.json").read_text()), "architectures": []})
    model = lfm2.Model(args)
    model.load_weights(list(model.sanitize(mx.load(str(folder / "model.safetensors"))).items()))
    ids = token_lists(folder, [LONG_TEXTS[2]])[0]
    causal = np.array(model(mx.array([ids]), mx.ones((1, len(ids))))[0])
    assert cosine(causal[0], reference_hidden(ref, ids)[0]) < 0.999


def test_cls_pooling_and_prompts_match_sentence_transformers(embedding, embedding_engine):
    from sentence_transformers import SentenceTransformer

    folder, _ = embedding
    st = SentenceTransformer(str(folder), device="cpu")
    bidirectional(st[0].auto_model)
    eng = embedding_engine
    assert (eng.info.family, eng.info.pooling, eng.info.architecture) == ("lfm2", Pooling.CLS,
                                                                          "Lfm2BidirectionalModel")
    for name in (None, "query", "document"):
        with centered_convolution():  # one text a batch: the reference unpadded, as ours is whatever the batch
            expected = st.encode(LONG_TEXTS, prompt_name=name, convert_to_numpy=True, batch_size=1)
        ours = eng.embed_prompts(eng.format_prompts([[t] for t in LONG_TEXTS], prompt_name=name)).vectors
        assert min(cosine(a, b) for a, b in zip(ours, expected, strict=True)) >= MIN_COSINE, name


def test_bidirectional_is_batch_invariant(embedding, embedding_engine):
    check_batch_invariant(embedding_engine, embedding[0], LONG_TEXTS)


def test_bare_bidirectional_export_mean_pools(embedding, tmp_path):
    """Without 1_Pooling, a bidirectional embedding export mean-pools (as sentence-transformers on a bare model)."""
    folder, _ = embedding
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        (tmp_path / name).symlink_to(folder / name)
    assert registry.default_pooling(formats.open_checkpoint(tmp_path)) is Pooling.MEAN
    assert registry.kind_of(formats.open_checkpoint(tmp_path)) == registry.EMBEDDER
