"""engine/families/lfm2.py against transformers' Lfm2 on the same random weights (torch CPU, fp32): short
causal convolutions and attention layers interleaved, padding zeroed before each convolution; then the
bidirectional encoder (LFM2.5-Embedding: CLS pooling and its prompts, against sentence-transformers) and
pylate's ColBERT layout on it (one projected, normalized vector per token; MaxSim)."""
from __future__ import annotations

import contextlib
import json

import mlx.core as mx
import numpy as np
import pytest
from safetensors.numpy import save_file

from engine import Pooling
from engine.errors import UnsupportedCheckpoint
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
    st_modules,
    token_lists,
)
from tests.engine.helpers import cosine, start_engine, torch


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


# pylate's ColBERT layout: no Pooling, a bias-free Identity Dense 64 -> 16 applied to every token, MaxSim
COLBERT_DIM = 16


@pytest.fixture(scope="module")
def colbert(tmp_path_factory):
    t = torch()
    folder, model = save_random(
        tmp_path_factory.mktemp("lfm2_colbert") / "m", "Lfm2Model", "Lfm2Config", seed=16,
        config_edits={"architectures": ["Lfm2BidirectionalModel"]}, **BIDIRECTIONAL,
        files={"modules.json": st_modules(("1_Dense", "pylate.models.Dense.Dense")),
               "1_Dense/config.json": {"in_features": 64, "out_features": COLBERT_DIM, "bias": False,
                                       "activation_function": "torch.nn.modules.linear.Identity",
                                       "use_residual": False},
               "config_sentence_transformers.json": {"similarity_fn_name": "MaxSim", "query_prefix": "[Q] ",
                                                     "document_prefix": "[D] ", "query_length": 32,
                                                     "document_length": 512}})
    gen = t.Generator().manual_seed(16)
    weight = (t.randn(COLBERT_DIM, 64, generator=gen) * 0.2).numpy()
    save_file({"linear.weight": weight}, str(folder / "1_Dense" / "model.safetensors"))
    return folder, BidirectionalReference(model), weight


def colbert_reference(ref, weight: np.ndarray, ids: list[int]) -> np.ndarray:
    projected = reference_hidden(ref, ids) @ weight.T.astype(np.float64)
    return projected / np.linalg.norm(projected, axis=-1, keepdims=True)


def test_colbert_is_multi_vector_and_matches_the_reference(colbert):
    folder, ref, weight = colbert
    loaded = formats.load(formats.open_checkpoint(folder))
    assert isinstance(loaded.model, lfm2.ColBERT) and loaded.multi_vector and loaded.hidden_size == COLBERT_DIM
    lists = token_lists(folder, LONG_TEXTS)
    eng = start_engine(folder)
    try:
        assert eng.info.multi_vector and eng.info.pooling is Pooling.NONE and eng.info.n_embd == COLBERT_DIM
        assert dict(eng.info.prompts) == {"query": "[Q] ", "document": "[D] "}  # pylate's prefixes
        ours = eng.embed(lists).vectors
        for ids, got in zip(lists, ours, strict=True):
            expected = colbert_reference(ref, weight, ids)
            assert got.shape == expected.shape == (len(ids), COLBERT_DIM)
            assert min(cosine(a, b) for a, b in zip(got, expected, strict=True)) >= MIN_COSINE
            np.testing.assert_allclose(np.linalg.norm(got, axis=-1), 1.0, atol=1e-5)
        check_batch_invariant(eng, folder, LONG_TEXTS)
        query, *documents = LONG_TEXTS[1], LONG_TEXTS[2], LONG_TEXTS[-1], LONG_TEXTS[3]
        scores = eng.maxsim([query], [[d] for d in documents]).scores
        q = colbert_reference(ref, weight, token_lists(folder, [query])[0])
        expected = [float((q @ colbert_reference(ref, weight, ids).T).max(axis=1).sum())
                    for ids in token_lists(folder, documents)]
        np.testing.assert_allclose(scores, expected, rtol=1e-5, atol=1e-5)
    finally:
        eng.close()


def test_colbert_without_its_projection_is_refused(colbert, tmp_path):
    folder, _, _ = colbert
    args = lfm2.ModelArgs.from_dict(json.loads((folder / "config.json").read_text()))
    with pytest.raises(UnsupportedCheckpoint, match="1_Dense projection"):
        lfm2.ColBERT(args).sanitize(mx.load(str(folder / "model.safetensors")))
