"""engine/families/eurobert.py against transformers' EuroBertModel on the same random weights (torch CPU, fp32):
Llama's layers under a padding-only mask. The sentence-transformers layout (mean pooling) is checked against
sentence-transformers, and the EuroBertForMaskedLM export (`model.` prefix, an untied lm_head) loads the same
trunk."""
from __future__ import annotations

import json

import mlx.core as mx
import numpy as np
import pytest

from engine import Pooling
from engine.families import eurobert
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
from tests.engine.helpers import cosine, start_engine

SETTINGS = dict(num_hidden_layers=3, attention_bias=True, mlp_bias=True,
                rope_parameters={"rope_type": "default", "rope_theta": 250000.0})


@pytest.fixture(scope="module")
def encoder(tmp_path_factory):
    return save_random(tmp_path_factory.mktemp("eurobert") / "m", "EuroBertModel", "EuroBertConfig", seed=31,
                       files=pooled_layout("mean"), **SETTINGS)


@pytest.fixture(scope="module")
def engine(encoder):
    eng = start_engine(encoder[0])
    yield eng
    eng.close()


def test_detected_as_a_mean_pooled_encoder(encoder, engine):
    ckpt = formats.open_checkpoint(encoder[0])
    assert registry.kind_of(ckpt) == registry.EMBEDDER and registry.default_pooling(ckpt) is Pooling.MEAN
    assert not eurobert.ModelArgs.from_dict(ckpt.config).causal
    assert (engine.info.family, engine.info.pooling, engine.info.n_embd) == ("eurobert", Pooling.MEAN, 64)


def test_tokens_match_transformers(encoder):
    assert max(len(ids) for ids in token_lists(encoder[0], LONG_TEXTS)) >= 100
    check_tokens_match(*encoder, LONG_TEXTS)


def test_mean_pooling_matches_sentence_transformers(encoder, engine):
    from sentence_transformers import SentenceTransformer

    expected = SentenceTransformer(str(encoder[0]), device="cpu").encode(LONG_TEXTS, convert_to_numpy=True)
    ours = engine.embed(token_lists(encoder[0], LONG_TEXTS)).vectors
    assert min(cosine(a, b) for a, b in zip(ours, expected, strict=True)) >= MIN_COSINE


def test_batch_invariant(encoder, engine):
    check_batch_invariant(engine, encoder[0], LONG_TEXTS)


def test_masked_lm_export_is_the_same_trunk(tmp_path):
    folder, model = save_random(tmp_path / "mlm", "EuroBertForMaskedLM", "EuroBertConfig", seed=32, **SETTINGS)
    loaded = formats.load(formats.open_checkpoint(folder))
    assert "lm_head" not in loaded.model and loaded.default_pooling is Pooling.MEAN
    ids = token_lists(folder, LONG_TEXTS[-2:])
    width = max(map(len, ids))
    batch = mx.array([row + [0] * (width - len(row)) for row in ids])
    mask = mx.array([[1] * len(row) + [0] * (width - len(row)) for row in ids])
    hidden = np.array(loaded.model(batch, mask))  # the family's Model directly, on a padded batch
    for row, tokens in zip(hidden, ids):
        expected = reference_hidden(model, tokens)
        assert min(cosine(a, b) for a, b in zip(row[:len(tokens)], expected)) >= MIN_COSINE
    assert json.loads((folder / "config.json").read_text())["architectures"] == ["EuroBertForMaskedLM"]
