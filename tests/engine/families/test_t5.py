"""engine/families/t5.py against transformers' T5EncoderModel and sentence-transformers on the same random weights
(torch CPU, fp32), in sentence-t5's / gtr-t5's layout: modules.json with Transformer, Pooling mean, a bias-free
Identity Dense (2_Dense), Normalize; here with prompts too.

Tiny (d_model 64, 4 heads of d_kv 8 = an inner width of 32, d_ff 128, 2 blocks), once with T5 v1.0's plain ReLU
feed-forward (sentence-t5-base, gtr-t5-base) and once with v1.1's gated GELU (the -xl / -xxl ones). The tokenizer
is a SentencePiece unigram trained here (<pad> 0, </s> 1, <unk> 2, as T5's), read by transformers' T5Tokenizer
and saved as tokenizer.json beside its spiece.model, as the published folders have both.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

from engine import Pooling
from engine.errors import UnsupportedCheckpoint
from engine.families import t5
from engine.loading import formats, registry
from tests.engine.families.decoder_fixture import (
    MIN_COSINE,
    check_batch_invariant,
    check_tokens_match,
    reference_hidden,
    token_lists,
)
from tests.engine.families.qwen3_fixture import CORPUS
from tests.engine.helpers import (
    ENCODER_TEXTS as TEXTS,
    cosine,
    family_hidden,
    load_hf_model,
    perturb_vectors,
    save_sentence_transformer,
    start_engine,
    torch,
    train_spiece,
)

PROMPTS = {"query": "query: "}
TOKENIZER_CONFIG = {"tokenizer_class": "T5Tokenizer", "extra_ids": 0, "eos_token": "</s>", "unk_token": "<unk>",
                    "pad_token": "<pad>", "model_max_length": 512}


def save_t5_tokenizer(out: Path) -> int:
    """spiece.model trained on a small corpus, then transformers' T5Tokenizer on it saved (tokenizer.json);
    returns the tokenizer's size."""
    from transformers import AutoTokenizer

    train_spiece(out, CORPUS + TEXTS * 10, 400)
    (out / "tokenizer_config.json").write_text(json.dumps(TOKENIZER_CONFIG), encoding="utf-8")
    tokenizer = AutoTokenizer.from_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    assert (out / "tokenizer.json").is_file() and (out / "spiece.model").is_file()
    return len(tokenizer)


def make_random_t5(out: Path, feed_forward_proj: str, *, seed: int) -> tuple[Path, object]:
    t = torch()
    import transformers

    n_vocab = save_t5_tokenizer(out)
    t.manual_seed(seed)
    # the embedding table padded past the tokenizer, as T5's 32128 rows for 32100 tokens
    config = transformers.T5Config(vocab_size=n_vocab + 4, d_model=64, d_kv=8, d_ff=128, num_layers=2, num_heads=4,
                                   feed_forward_proj=feed_forward_proj, relative_attention_num_buckets=32,
                                   relative_attention_max_distance=128)
    model = transformers.T5EncoderModel(config)
    perturb_vectors(model, seed)
    with t.no_grad():  # biases of about one, so the shared position bias moves the attention
        model.encoder.block[0].layer[0].SelfAttention.relative_attention_bias.weight.mul_(8.0)
    model.eval()
    model.save_pretrained(str(out))
    return out, model


@pytest.fixture(scope="module", params=["relu", "gated-gelu"])
def sentence_t5(request, tmp_path_factory):
    """(backbone folder, its transformers model, the sentence-transformers folder, its engine)."""
    root = tmp_path_factory.mktemp(f"t5-{request.param}")
    backbone, model = make_random_t5(root / "backbone", request.param, seed=51)
    folder = save_sentence_transformer(backbone, root / "st", dense=((64, 64),), prompts=PROMPTS)
    eng = start_engine(folder)
    yield backbone, model, folder, eng
    eng.close()


@pytest.fixture(scope="module")
def st_model(sentence_t5):
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(sentence_t5[2]), device="cpu")


def _matches(ours, expected):
    assert min(cosine(a, b) for a, b in zip(ours, expected, strict=True)) >= MIN_COSINE


def test_detected_as_a_t5_embedder_with_its_modules(sentence_t5):
    _, _, folder, eng = sentence_t5
    ckpt = formats.open_checkpoint(folder)
    assert (registry.family_name(ckpt), registry.kind_of(ckpt)) == ("t5", registry.EMBEDDER)
    assert ckpt.module_types == ("Transformer", "Pooling", "Dense", "Normalize")
    assert json.loads((folder / "2_Dense" / "config.json").read_text())["bias"] is False
    info = eng.info
    assert (info.family, info.architecture, info.pooling, info.n_embd, info.n_ctx_train) == (
        "t5", "T5EncoderModel", Pooling.MEAN, 64, 512)
    loaded = formats.load(ckpt)
    assert "bias" not in loaded.projection.dense[0]  # the bias-free Dense loads without one
    assert loaded.projection.activations[0](mx.array([-2.0])).item() == -2.0  # Identity


def test_tokenizer_matches_transformers(sentence_t5, st_model):
    _, _, folder, eng = sentence_t5
    lists = token_lists(folder, TEXTS)
    assert [eng.encode_prompt([t]) for t in TEXTS] == lists == [st_model.tokenizer(t).input_ids for t in TEXTS]
    assert all(ids[-1] == 1 for ids in lists)  # </s> appended, no leading special
    assert max(len(ids) for ids in lists) > 130  # past the buckets' max distance (128)
    assert eng.tokenizer.pad_id == 0


def test_tokens_match_transformers(sentence_t5):
    backbone, model, _, _ = sentence_t5
    check_tokens_match(backbone, model, TEXTS)


def test_vectors_and_prompts_match_sentence_transformers(sentence_t5, st_model):
    _, _, _, eng = sentence_t5
    for name in (None, "query"):
        ours = eng.embed_prompts(eng.format_prompts([[t] for t in TEXTS], prompt_name=name)).vectors
        _matches(ours, st_model.encode(TEXTS, prompt_name=name, convert_to_numpy=True))


def test_batch_invariant(sentence_t5):
    _, _, folder, eng = sentence_t5
    check_batch_invariant(eng, folder, TEXTS)


def test_family_model_directly(sentence_t5):
    backbone, model, _, _ = sentence_t5
    for ids in token_lists(backbone, TEXTS[:5]):
        _matches(family_hidden(t5, backbone, ids), reference_hidden(model, ids))


def test_the_position_bias_matters_at_this_tolerance(sentence_t5):
    backbone, model, _, _ = sentence_t5
    ids = token_lists(backbone, [TEXTS[4]])[0]
    table = model.encoder.block[0].layer[0].SelfAttention.relative_attention_bias.weight
    with torch().no_grad():
        saved = table.clone()
        table.zero_()
        try:
            unbiased = reference_hidden(model, ids)
        finally:
            table.copy_(saved)
    assert min(cosine(a, b) for a, b in zip(family_hidden(t5, backbone, ids), unbiased, strict=True)) < 0.9999


def test_a_folder_with_only_spiece_model_tokenizes_the_same(sentence_t5, tmp_path):
    """Without tokenizer.json the tokenizer is converted once at load (transformers' T5Tokenizer on spiece.model)."""
    backbone, _, _, _ = sentence_t5
    folder = tmp_path / "spiece-only"
    shutil.copytree(backbone, folder)
    (folder / "tokenizer.json").unlink()
    (folder / "tokenizer_config.json").write_text(json.dumps(TOKENIZER_CONFIG), encoding="utf-8")
    eng = start_engine(folder, pooling=Pooling.NONE)
    try:
        assert [eng.encode_prompt([t]) for t in TEXTS] == token_lists(backbone, TEXTS)
    finally:
        eng.close()


def test_feed_forward_names_read_as_transformers_reads_them():
    def args(proj):
        return t5.ModelArgs(vocab_size=10, d_model=8, d_kv=2, d_ff=16, num_layers=1, num_heads=4,
                            feed_forward_proj=proj)

    assert (args("relu").is_gated, args("relu").act) == (False, "relu")
    assert (args("gated-gelu").is_gated, args("gated-gelu").act) == (True, "gelu_new")  # the tanh GELU
    assert (args("gated-silu").is_gated, args("gated-silu").act) == (True, "silu")
    with pytest.raises(UnsupportedCheckpoint, match="feed_forward_proj"):
        args("gelu-gated-x")
    with pytest.raises(UnsupportedCheckpoint, match="'mish'"):
        t5.Model(args("gated-mish"))


def test_sanitize_keeps_the_encoder_of_any_t5_checkpoint():
    w = {"shared.weight": mx.ones((3, 2)), "encoder.embed_tokens.weight": mx.ones((3, 2)),
         "encoder.block.0.layer.0.SelfAttention.q.weight": mx.ones((2, 2)),
         "encoder.final_layer_norm.weight": mx.ones(2), "decoder.block.0.layer.0.SelfAttention.q.weight": mx.ones((2, 2)),
         "decoder.embed_tokens.weight": mx.ones((3, 2)), "lm_head.weight": mx.ones((3, 2))}
    assert sorted(t5.Model.sanitize(w)) == ["encoder.block.0.layer.0.SelfAttention.q.weight",
                                            "encoder.final_layer_norm.weight", "shared.weight"]
    only_tied = {"encoder.embed_tokens.weight": mx.full((3, 2), 2.0)}
    assert np.array(t5.Model.sanitize(only_tied)["shared.weight"]).tolist() == [[2.0, 2.0]] * 3


def test_a_t5_for_conditional_generation_serves_its_encoder(tmp_path):
    t = torch()
    import transformers

    save_t5_tokenizer(tmp_path)
    t.manual_seed(3)
    config = transformers.T5Config(vocab_size=450, d_model=32, d_kv=8, d_ff=64, num_layers=1, num_heads=4)
    transformers.T5ForConditionalGeneration(config).eval().save_pretrained(str(tmp_path))
    encoder = load_hf_model(tmp_path, "T5EncoderModel")
    ids = token_lists(tmp_path, [TEXTS[1]])[0]
    eng = start_engine(tmp_path, pooling=Pooling.NONE)
    try:
        assert eng.info.architecture == "T5ForConditionalGeneration"
        _matches(eng.embed([ids]).vectors[0], reference_hidden(encoder, ids))
    finally:
        eng.close()
