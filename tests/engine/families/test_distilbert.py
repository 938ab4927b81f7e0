"""engine/families/distilbert.py against transformers' DistilBertModel and sentence-transformers on the same random
weights (torch CPU, fp32), in the layouts the DistilBERT embedders ship: msmarco-distilbert-base-tas-b's (CLS
pooling, no Normalize), distiluse-base-multilingual's (mean pooling, then a Dense with bias and Tanh), and a bare
DistilBertForMaskedLM (the MLM head dropped, the family default pooling). Tiny (dim 64, 2 layers, 4 heads) on
all-MiniLM-L6-v2's WordPiece tokenizer (the uncased BERT vocabulary distilbert-base-uncased uses).
"""
from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import pytest

from engine import Pooling
from engine.families import distilbert
from engine.loading import formats, registry
from tests.engine.families.decoder_fixture import (
    MIN_COSINE,
    check_batch_invariant,
    check_tokens_match,
    reference_hidden,
    token_lists,
)
from tests.engine.helpers import (
    ENCODER_TEXTS as TEXTS,
    cosine,
    family_hidden,
    load_hf_model,
    perturb_vectors,
    save_sentence_transformer,
    start_engine,
    torch,
    with_minilm_tokenizer,
)

PROMPTS = {"query": "query: "}


def make_random_distilbert(out: Path, architecture: str, *, seed: int, **config) -> Path:
    t = torch()
    import transformers

    n_vocab = with_minilm_tokenizer(out)
    tok_config = json.loads((out / "tokenizer_config.json").read_text(encoding="utf-8"))
    tok_config.update(tokenizer_class="DistilBertTokenizer", model_input_names=["input_ids", "attention_mask"])
    (out / "tokenizer_config.json").write_text(json.dumps(tok_config), encoding="utf-8")
    t.manual_seed(seed)
    settings = dict(vocab_size=n_vocab, dim=64, n_layers=2, n_heads=4, hidden_dim=128, initializer_range=0.1)
    model = getattr(transformers, architecture)(transformers.DistilBertConfig(**{**settings, **config}))
    perturb_vectors(model, seed)
    model.eval()
    model.save_pretrained(str(out))
    return out


@pytest.fixture(scope="module")
def mlm(tmp_path_factory):
    """A bare DistilBertForMaskedLM with sinusoidal positions (the table is stored like a learned one)."""
    folder = make_random_distilbert(tmp_path_factory.mktemp("distilbert-mlm"), "DistilBertForMaskedLM", seed=31,
                                    sinusoidal_pos_embds=True)
    return folder, load_hf_model(folder, "DistilBertModel")  # the trunk of the same weights


@pytest.fixture(scope="module")
def backbone(tmp_path_factory):
    return make_random_distilbert(tmp_path_factory.mktemp("distilbert") / "backbone", "DistilBertModel", seed=32)


@pytest.fixture(scope="module")
def tasb(backbone):
    """msmarco-distilbert-base-tas-b's layout: CLS pooling, no Normalize (dot product); with a query prompt."""
    folder = save_sentence_transformer(backbone, backbone.parent / "tas-b", pooling="cls", normalize=False,
                                       prompts=PROMPTS)
    eng = start_engine(folder)
    yield folder, eng
    eng.close()


@pytest.fixture(scope="module")
def distiluse(backbone):
    """distiluse-base-multilingual-cased-v2's layout: mean pooling, Dense 64 -> 32 with bias and Tanh."""
    folder = save_sentence_transformer(backbone, backbone.parent / "distiluse", dense=((64, 32, True, True),),
                                       normalize=False)
    eng = start_engine(folder)
    yield folder, eng
    eng.close()


def _st_encode(folder: Path, texts: list[str], **kwargs):
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(folder), device="cpu").encode(texts, convert_to_numpy=True, **kwargs)


def _matches(ours, expected):
    assert min(cosine(a, b) for a, b in zip(ours, expected, strict=True)) >= MIN_COSINE


def test_bare_mlm_is_a_distilbert_embedder_with_mean_pooling(mlm):
    folder, _ = mlm
    ckpt = formats.open_checkpoint(folder)
    assert (registry.family_name(ckpt), registry.kind_of(ckpt)) == ("distilbert", registry.EMBEDDER)
    assert registry.default_pooling(ckpt) is Pooling.MEAN
    eng = start_engine(folder)
    try:
        info = eng.info
        assert (info.family, info.architecture, info.pooling, info.n_embd, info.n_ctx_train) == (
            "distilbert", "DistilBertForMaskedLM", Pooling.MEAN, 64, 512)
    finally:
        eng.close()


def test_tokens_match_transformers_with_the_mlm_head_dropped(mlm):
    folder, ref = mlm
    assert max(len(ids) for ids in token_lists(folder, TEXTS)) > 100
    check_tokens_match(folder, ref, TEXTS)


def test_family_model_directly(mlm):
    folder, ref = mlm
    for ids in token_lists(folder, TEXTS[:5]):
        _matches(family_hidden(distilbert, folder, ids), reference_hidden(ref, ids))


def test_tas_b_layout_cls_pooling_matches_sentence_transformers(tasb):
    folder, eng = tasb
    assert (eng.info.family, eng.info.pooling, eng.info.n_embd) == ("distilbert", Pooling.CLS, 64)
    assert [eng.encode_prompt([t]) for t in TEXTS] == token_lists(folder, TEXTS)
    _matches(eng.embed(token_lists(folder, TEXTS)).vectors, _st_encode(folder, TEXTS))


def test_prompts_are_honoured(tasb):
    folder, eng = tasb
    ours = eng.embed_prompts(eng.format_prompts([[t] for t in TEXTS], prompt_name="query")).vectors
    _matches(ours, _st_encode(folder, TEXTS, prompt_name="query"))


def test_distiluse_layout_dense_with_bias_and_tanh_matches_sentence_transformers(distiluse):
    folder, eng = distiluse
    assert (eng.info.pooling, eng.info.n_embd) == (Pooling.MEAN, 32)
    _matches(eng.embed(token_lists(folder, TEXTS)).vectors, _st_encode(folder, TEXTS))


def test_batch_invariant(distiluse):
    folder, eng = distiluse
    check_batch_invariant(eng, folder, TEXTS)


def test_sanitize_drops_the_mlm_head_and_buffers():
    w = {"distilbert.embeddings.word_embeddings.weight": mx.ones((3, 2)),
         "distilbert.embeddings.position_ids": mx.zeros((1, 4), dtype=mx.int64),
         "distilbert.transformer.layer.0.ffn.lin1.weight": mx.ones((2, 2)),
         "vocab_transform.weight": mx.ones((2, 2)), "vocab_layer_norm.weight": mx.ones(2),
         "vocab_projector.bias": mx.ones(3), "pre_classifier.weight": mx.ones((2, 2))}
    assert sorted(distilbert.Model.sanitize(w)) == ["embeddings.word_embeddings.weight",
                                                    "transformer.layer.0.ffn.lin1.weight"]
