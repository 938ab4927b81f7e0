"""TEI's /predict (and POST / on a classifier) and vLLM's /classify over a real engine on a tiny random BERT
sequence classifier, the scores compared with transformers' AutoModelForSequenceClassification: TEI's input
forms (a text, a pair, a batch of either) and answer (every label, best first), raw_scores, vLLM's answer
(probs in label order, the best label), use_activation false, the refusals in each client's own error shape,
/props, /v1/models and TEI's /info describing the labels, and a one-label cross-encoder on /predict."""
from __future__ import annotations

import numpy as np
import pytest

from compat.wire.classify import parse_classify_request, parse_predict_request
from compat.wire.tei import TeiError
from compat.errors import ApiError
from engine import Pooling
from tests.engine.helpers import make_random_bert, start_engine
from tests.engine.test_classifier import PAIRS, SENTIMENT, TEXTS, make_bert_classifier, reference

ATOL = 1e-4
LABELS = [SENTIMENT[i] for i in range(3)]


@pytest.fixture(scope="module")
def classifier(tmp_path_factory):
    path = make_bert_classifier(tmp_path_factory.mktemp("bert-cls"), SENTIMENT)
    eng = start_engine(path)
    yield path, eng
    eng.close()


@pytest.fixture
def client(make_client, classifier):
    return make_client("--max-client-batch-size", "8", engine=classifier[1])


def ranked(probs: np.ndarray) -> list[tuple[str, float]]:
    order = np.argsort(-probs, kind="stable")
    return [(LABELS[i], float(probs[i])) for i in order]


def check_predictions(answer: list[dict], probs: np.ndarray) -> None:
    assert [p["label"] for p in answer] == [label for label, _ in ranked(probs)]
    np.testing.assert_allclose([p["score"] for p in answer], [s for _, s in ranked(probs)], rtol=0, atol=ATOL)
    assert all(list(p) == ["score", "label"] for p in answer)


def test_predict_single_text_pair_and_batch_match_transformers(client, classifier):
    path, _ = classifier
    inputs = [TEXTS[0], PAIRS[0], TEXTS[1]]
    logits, probs = reference(path, inputs)
    one = client.simulate_post("/predict", json={"inputs": TEXTS[0]})
    assert one.status_code == 200, one.text
    check_predictions(one.json, probs[0])
    pair = client.simulate_post("/predict", json={"inputs": list(PAIRS[0])})
    check_predictions(pair.json, probs[1])
    batch = client.simulate_post("/predict", json={"inputs": [[TEXTS[0]], list(PAIRS[0]), [TEXTS[1]]]})
    assert batch.status_code == 200 and len(batch.json) == 3
    for answer, row in zip(batch.json, probs):
        check_predictions(answer, row)
    raw = client.simulate_post("/predict", json={"inputs": [[TEXTS[0]], list(PAIRS[0])], "raw_scores": True})
    for answer, row in zip(raw.json, logits):
        check_predictions(answer, row)
    root = client.simulate_post("/", json={"inputs": TEXTS[0]})  # TEI routes a classifier's POST / to /predict
    assert root.json == one.json


def test_root_with_inference_api_parameters_answers_a_list_per_input(client, classifier):
    path, _ = classifier
    logits, probs = reference(path, [TEXTS[1]])
    res = client.simulate_post("/", json={"inputs": TEXTS[1], "parameters": {}})
    assert len(res.json) == 1
    check_predictions(res.json[0], probs[0])
    top = client.simulate_post("/", json={"inputs": TEXTS[1], "parameters": {"top_k": 1,
                                                                           "function_to_apply": "sigmoid"}})
    best = int(np.argmax(logits[0]))
    assert top.json == [[{"score": pytest.approx(1 / (1 + np.exp(-logits[0][best])), abs=ATOL),
                          "label": LABELS[best]}]]


@pytest.mark.parametrize("path", ["/classify", "/v1/classify"])
def test_classify_matches_transformers(client, classifier, path):
    ckpt, _ = classifier
    logits, probs = reference(ckpt, TEXTS)
    res = client.simulate_post(path, json={"input": TEXTS, "model": "sentiment"})
    assert res.status_code == 200, res.text
    body = res.json
    assert list(body) == ["id", "object", "created", "model", "data", "usage"]
    assert body["id"].startswith("classify-") and body["object"] == "list" and body["model"] == "sentiment"
    for i, item in enumerate(body["data"]):
        assert item["index"] == i and item["num_classes"] == 3
        assert item["label"] == LABELS[int(np.argmax(probs[i]))]
        np.testing.assert_allclose(item["probs"], probs[i], rtol=0, atol=ATOL)
    assert body["usage"]["prompt_tokens"] == body["usage"]["total_tokens"] > 0
    raw = client.simulate_post(path, json={"input": TEXTS[0], "use_activation": False}).json
    np.testing.assert_allclose(raw["data"][0]["probs"], logits[0], rtol=0, atol=ATOL)


def test_refusals_in_each_clients_shape(client):
    bad = client.simulate_post("/predict", json={"inputs": ["a", "b", "c"]})
    assert bad.status_code == 422 and bad.json["error_type"] == "Validation"
    empty = client.simulate_post("/predict", json={"inputs": ""})
    assert empty.status_code == 400 and empty.json["error_type"] == "Empty"
    many = client.simulate_post("/predict", json={"inputs": [["x"]] * 9})
    assert many.status_code == 413 and many.json["error_type"] == "Validation"
    long = client.simulate_post("/predict", json={"inputs": "word " * 600, "truncate": False})
    assert long.status_code == 413 and long.json["error_type"] == "Validation"
    cut = client.simulate_post("/predict", json={"inputs": "word " * 600, "truncate": True})
    assert cut.status_code == 200 and len(cut.json) == 3
    tokens = client.simulate_post("/classify", json={"input": [101, 102]})
    assert tokens.status_code == 400 and "token-id inputs are not supported" in tokens.json["error"]["message"]
    assert client.simulate_post("/classify", json={"input": []}).status_code == 400
    not_here = client.simulate_post("/v1/embeddings", json={"input": "x"})
    assert not_here.status_code in (400, 501)
    rerank = client.simulate_post("/v1/rerank", json={"query": "q", "documents": ["d"]})
    assert rerank.status_code in (400, 501)


def test_props_models_and_info_describe_the_labels(client):
    props = client.simulate_get("/props").json
    assert props["labels"] == LABELS and props["multi_label"] is False
    models = client.simulate_get("/v1/models").json
    assert models["models"][0]["capabilities"] == ["classify"]
    assert models["data"][0]["meta"]["labels"] == LABELS
    info = client.simulate_get("/info").json
    assert info["model_type"] == {"classifier": {"id2label": {"0": "negative", "1": "neutral", "2": "positive"},
                                                 "label2id": {"negative": 0, "neutral": 1, "positive": 2}}}
    doc = client.simulate_get("/openapi.json").json
    assert {"/predict", "/classify", "/v1/classify"} <= set(doc["paths"])


def test_openapi_declares_exactly_the_fields_read(client):
    from tests.compat.test_openapi import _fields_read, _properties, _validate

    document = client.simulate_get("/openapi.json").json
    assert _fields_read(parse_classify_request, {"input": "a"}) == _properties(document, "ClassifyRequest")
    assert _fields_read(parse_predict_request, {"inputs": "a", "parameters": {}}) == \
        _properties(document, "TeiPredictRequest")
    for path, body in (("/predict", {"inputs": [["a"], ["b", "c"]]}), ("/predict", {"inputs": "a"}),
                       ("/predict", {"inputs": 3}), ("/v1/classify", {"input": ["a", "b"]}),
                       ("/classify", {"input": 3})):
        res = client.simulate_post(path, json=body)
        _validate(document, path, "post", res.status_code, res.json)


def test_one_label_cross_encoder_predicts_its_sigmoid(make_client, tmp_path):
    path = make_random_bert(tmp_path / "ce", architecture="BertForSequenceClassification", seed=6)
    eng = start_engine(path, pooling=Pooling.RANK)
    try:
        client = make_client("--reranking", engine=eng)
        logit = eng.rerank(PAIRS[0][0], [PAIRS[0][1]]).scores[0]
        res = client.simulate_post("/predict", json={"inputs": list(PAIRS[0])})
        assert res.status_code == 200, res.text
        assert res.json == [{"score": pytest.approx(1 / (1 + np.exp(-logit)), abs=1e-6), "label": "LABEL_0"}]
        assert client.simulate_get("/info").json["model_type"]["reranker"]["id2label"] == {"0": "LABEL_0"}
    finally:
        eng.close()


def test_predict_inputs_follow_teis_deserializer():
    assert parse_predict_request({"inputs": "a"}).inputs == ["a"]
    single = parse_predict_request({"inputs": ["a"]})
    assert (single.inputs, single.batch) == (["a"], False)
    pair = parse_predict_request({"inputs": ["a", "b"]})
    assert (pair.inputs, pair.batch) == ([("a", "b")], False)
    batch = parse_predict_request({"inputs": [["a"], ["b", "c"]], "truncation_direction": "Left"})
    assert (batch.inputs, batch.batch, batch.truncate_left) == (["a", ("b", "c")], True, True)
    for bad in ([], ["a", "b", "c"], [["a", "b", "c"]], [1], {"a": 1}, None, [["a"], "b"]):
        with pytest.raises(TeiError):
            parse_predict_request({"inputs": bad})
    with pytest.raises(TeiError, match="function_to_apply"):
        parse_predict_request({"inputs": "a", "parameters": {"function_to_apply": "relu"}})


def test_classify_request_fields():
    request = parse_classify_request({"input": "a", "use_activation": False, "truncate_prompt_tokens": -1})
    assert (request.texts, request.use_activation, request.truncate) == (["a"], False, True)
    for body in ({"input": [[1, 2]]}, {"messages": [{"role": "user", "content": "a"}]},
                 {"input": "a", "truncate_prompt_tokens": 5}, {"input": "a", "use_activation": "no"}, {}):
        with pytest.raises(ApiError):
            parse_classify_request(body)
