"""Sequence classifiers (a *ForSequenceClassification head with several labels) against transformers'
AutoModelForSequenceClassification on the same tiny random weights (torch CPU, fp32): BERT (softmax, text pairs
with segment-B token types), XLM-R (problem_type multi_label_classification: sigmoid) and ModernBERT; the labels
from id2label, raw logits on request, a one-label head still a cross-encoder reranker."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from engine import Pooling
from engine.errors import InputTooLong, InvalidInput, UnsupportedCheckpoint
from tests.engine.families.test_modernbert import make_random_modernbert
from tests.engine.families.test_xlm_roberta import PAD, TOKENIZER_CONFIG, xlmr_tokenizer_json
from tests.engine.helpers import load_hf_model, make_random_bert, perturb_vectors, start_engine, torch

ATOL = 1e-4
SENTIMENT = {0: "negative", 1: "neutral", 2: "positive"}
TEXTS = ["I loved this film.", "The plot was a mess and the actors were bored.",
         "It is a film. " * 20, "ok"]
PAIRS = [("A man is playing a guitar.", "Someone plays music."),
         ("The cat sleeps.", "A dog is running through the park at noon, barking at pigeons.")]


def reference(path: Path, inputs: list, *, multi_label: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(logits, probabilities) as transformers computes them from the checkpoint's own tokenizer and head."""
    t = torch()
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(path))
    model = load_hf_model(path, "AutoModelForSequenceClassification")
    rows = []
    with t.inference_mode():
        for item in inputs:
            enc = tok(*item, return_tensors="pt") if isinstance(item, tuple) else tok(item, return_tensors="pt")
            rows.append(model(**enc).logits[0].double().numpy())
    logits = np.stack(rows)
    x = t.tensor(logits)
    probs = t.sigmoid(x) if multi_label else t.softmax(x, dim=-1)
    return logits, probs.numpy()


def make_bert_classifier(out: Path, labels: dict[int, str], seed: int = 3) -> Path:
    t = torch()
    from transformers import BertConfig, BertForSequenceClassification

    make_random_bert(out, seed=seed)  # the tokenizer files and a config to start from
    config = BertConfig.from_pretrained(str(out), id2label=labels, label2id={v: k for k, v in labels.items()})
    t.manual_seed(seed)
    model = BertForSequenceClassification(config)
    perturb_vectors(model, seed)
    with t.no_grad():  # logits far enough apart that a swapped label or a wrong activation shows
        model.classifier.weight.mul_(20.0)
    model.eval()
    model.save_pretrained(str(out))
    return out


def make_xlmr_classifier(out: Path, n_labels: int, seed: int = 5) -> Path:
    t = torch()
    import transformers

    out.mkdir(parents=True, exist_ok=True)
    shutil.copy(xlmr_tokenizer_json(), out / "tokenizer.json")
    (out / "tokenizer_config.json").write_text(json.dumps(TOKENIZER_CONFIG), encoding="utf-8")
    vocab = len(json.loads((out / "tokenizer.json").read_text(encoding="utf-8"))["model"]["vocab"])
    t.manual_seed(seed)
    config = transformers.XLMRobertaConfig(
        vocab_size=vocab, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
        max_position_embeddings=514, type_vocab_size=1, pad_token_id=PAD, bos_token_id=0, eos_token_id=2,
        initializer_range=0.1, num_labels=n_labels, problem_type="multi_label_classification")
    model = transformers.XLMRobertaForSequenceClassification(config)
    perturb_vectors(model, seed)
    model.eval()
    model.save_pretrained(str(out))
    return out


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    path = make_bert_classifier(tmp_path_factory.mktemp("bert-cls"), SENTIMENT)
    eng = start_engine(path)  # no mode flag
    yield path, eng
    eng.close()


def test_bert_classifier_kind_labels_and_probabilities_match_transformers(bert):
    path, eng = bert
    info = eng.info
    assert (info.kind, info.labels, info.multi_label, info.pooling) == \
        ("classifier", ("negative", "neutral", "positive"), False, Pooling.RANK)
    result = eng.classify(TEXTS)  # one padded batch
    logits, probs = reference(path, TEXTS)
    assert result.labels == info.labels
    assert np.ptp(logits) > 1.0
    np.testing.assert_allclose(result.scores, probs, rtol=0, atol=ATOL)
    np.testing.assert_allclose(eng.classify(TEXTS, raw_scores=True).scores, logits, rtol=0, atol=ATOL)
    assert result.n_tokens[3] == 3  # [CLS] ok [SEP]
    for text, row in zip(TEXTS, result.scores):  # batch invariance: each input alone
        np.testing.assert_allclose(eng.classify([text]).scores[0], row, rtol=0, atol=ATOL)


def test_bert_text_pairs_use_segment_b_token_types(bert):
    path, eng = bert
    mixed = [PAIRS[0], TEXTS[0], PAIRS[1]]
    logits, _ = reference(path, mixed)
    np.testing.assert_allclose(eng.classify(mixed, raw_scores=True).scores, logits, rtol=0, atol=ATOL)


def test_over_long_inputs_are_cut_or_refused(tmp_path):
    path = make_bert_classifier(tmp_path / "short", SENTIMENT, seed=4)
    config = json.loads((path / "config.json").read_text())
    long = "word " * 40
    eng = start_engine(path, max_seq=16)
    try:
        with pytest.raises(InputTooLong):
            eng.classify([long], truncate=False)
        cut = eng.classify([long, (long, long)], truncate=True)
        assert cut.n_tokens == [16, 16]
        left = eng.classify([long + "end"], truncate=True, truncation_direction="left")
        assert left.n_tokens == [16]
    finally:
        eng.close()
    assert config["architectures"] == ["BertForSequenceClassification"]


def test_embedding_and_rerank_calls_name_the_classifier_routes(bert):
    _, eng = bert
    with pytest.raises(InvalidInput, match="/predict .* /classify"):
        eng.embed([[101, 102]])
    with pytest.raises(InvalidInput, match="/predict .* /classify"):
        eng.rerank("q", ["d"])


def test_rank_mode_serves_it_too_and_another_pooling_is_refused(bert):
    path, _ = bert
    eng = start_engine(path, pooling=Pooling.RANK)
    try:
        assert eng.info.kind == "classifier"
    finally:
        eng.close()
    with pytest.raises(UnsupportedCheckpoint, match="sequence classifier.*--pooling mean"):
        start_engine(path, pooling=Pooling.MEAN)


def test_python_api_classifier_gives_the_engines_scores(bert):
    from engine import Classifier

    path, eng = bert
    with Classifier(path, threads=2) as classifier:
        assert classifier.labels == ("negative", "neutral", "positive")
        got = classifier.classify([TEXTS[0], PAIRS[0]])
        np.testing.assert_allclose(got, eng.classify([TEXTS[0], PAIRS[0]]).scores, rtol=0, atol=1e-9)
        assert classifier.classify(TEXTS[1], raw_scores=True).shape == (1, 3)
        out = classifier({"text": np.asarray(TEXTS[:2])})
        assert list(out["label"]) == [classifier.labels[i] for i in np.argmax(out["scores"], axis=1)]
        with pytest.raises(InvalidInput):
            classifier.classify([])


def test_xlmr_multi_label_classifier_scores_each_label_by_sigmoid(tmp_path):
    path = make_xlmr_classifier(tmp_path / "xlmr-cls", 4)
    eng = start_engine(path)
    try:
        assert eng.info.labels == ("LABEL_0", "LABEL_1", "LABEL_2", "LABEL_3") and eng.info.multi_label
        inputs = [*TEXTS[:2], PAIRS[0]]
        logits, probs = reference(path, inputs, multi_label=True)
        result = eng.classify(inputs)
        np.testing.assert_allclose(result.scores, probs, rtol=0, atol=ATOL)
        assert not np.allclose(np.sum(result.scores, axis=1), 1.0, atol=1e-3)  # not a softmax
        np.testing.assert_allclose(eng.classify(inputs, raw_scores=True).scores, logits, rtol=0, atol=ATOL)
    finally:
        eng.close()


def test_modernbert_classifier_matches_transformers(tmp_path):
    path = make_random_modernbert(tmp_path / "mb-cls", "ModernBertForSequenceClassification", seed=24,
                                  num_labels=2)
    eng = start_engine(path)
    try:
        assert eng.info.kind == "classifier" and eng.info.labels == ("LABEL_0", "LABEL_1")
        logits, probs = reference(path, TEXTS)
        np.testing.assert_allclose(eng.classify(TEXTS).scores, probs, rtol=0, atol=ATOL)
        np.testing.assert_allclose(eng.classify(TEXTS, raw_scores=True).scores, logits, rtol=0, atol=ATOL)
    finally:
        eng.close()


def test_one_label_head_stays_a_cross_encoder_and_classify_gives_its_sigmoid(tmp_path):
    path = make_random_bert(tmp_path / "ce", architecture="BertForSequenceClassification", seed=6)
    with pytest.raises(UnsupportedCheckpoint, match="start it with --reranking"):
        start_engine(path)
    eng = start_engine(path, pooling=Pooling.RANK)
    try:
        assert eng.info.kind == "cross-encoder" and eng.info.labels == ("LABEL_0",)
        logit = eng.rerank(PAIRS[0][0], [PAIRS[0][1]]).scores[0]
        scored = eng.classify([PAIRS[0]])
        assert scored.labels == ("LABEL_0",)
        assert scored.scores[0][0] == pytest.approx(1 / (1 + np.exp(-logit)), abs=1e-6)
        assert eng.classify([PAIRS[0]], raw_scores=True).scores[0][0] == pytest.approx(logit, abs=1e-6)
    finally:
        eng.close()


def test_id2label_must_match_the_head(tmp_path):
    path = make_bert_classifier(tmp_path / "mismatch", SENTIMENT, seed=7)
    config = json.loads((path / "config.json").read_text())
    config["id2label"] = {"0": "a", "1": "b"}
    config["label2id"] = {"a": 0, "b": 1}
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(UnsupportedCheckpoint, match="head has 3 rows but config.json names 2 labels"):
        start_engine(path)
