"""compat.wire.rerank: request parsing, ordering and the three response shapes, without HTTP."""
from __future__ import annotations

import orjson
import pytest

from compat.errors import ApiError
from compat.wire.inputs import MediaRef
from compat.wire.rerank import parse_rerank_request, ranked_indices, render_rerank_response
from engine.types import RerankResult


def parse(body, cohere_v2=False):
    return parse_rerank_request(body, cohere_v2=cohere_v2)


def render(body, scores, n_tokens=None, cohere_v2=False, model_name="server-model", response_id="rid"):
    result = RerankResult(scores=scores, n_tokens=n_tokens or [1] * len(scores))
    return render_rerank_response(parse(body, cohere_v2), result, model_name, response_id=response_id)


def error_of(body, cohere_v2=False) -> tuple[int, str]:
    with pytest.raises(ApiError) as caught:
        parse(body, cohere_v2)
    return caught.value.status, caught.value.message


def test_parse_defaults():
    request = parse({"query": "q", "documents": ["a", {"text": "b", "id": 7}]})
    assert (request.query, request.items, request.shape) == ("q", ["a", "b"], "jina")
    assert request.documents == ["a", {"text": "b", "id": 7}]
    assert (request.top_n, request.return_documents, request.return_text) == (None, False, False)
    assert (request.truncate, request.instruction, request.model) == (None, None, None)


def test_shape_follows_the_route_and_the_texts_key():
    assert parse({"query": "q", "texts": ["a"]}).shape == "tei"
    assert parse({"query": "q", "documents": ["a"], "texts": None}).shape == "tei"  # the key, not its value
    assert parse({"query": "q", "documents": ["a"]}, cohere_v2=True).shape == "cohere-v2"
    assert parse({"query": "q", "texts": ["a"]}, cohere_v2=True).shape == "cohere-v2"


def test_documents_win_over_texts_and_null_documents_fall_back():
    assert parse({"query": "q", "documents": ["d"], "texts": ["t"]}).items == ["d"]
    assert parse({"query": "q", "documents": None, "texts": ["t"]}).items == ["t"]


@pytest.mark.parametrize("body,message", [
    ({"documents": ["a"]}, '"query" must be provided'),
    ({"query": None, "documents": ["a"]}, '"query" must be a string'),
    ({"query": ["q"], "documents": ["a"]}, '"query" must be a string'),
    ({"query": "q"}, '"documents" must be a non-empty string array'),
    ({"query": "q", "documents": []}, '"documents" must be a non-empty string array'),
    ({"query": "q", "documents": None}, '"documents" must be a non-empty string array'),
    ({"query": "q", "documents": 123}, '"documents" must be a non-empty string array'),
    ({"query": "q", "documents": "a"}, '"documents" must be a non-empty string array'),
    ({"query": "q", "documents": [1, 2, 3]}, '"documents" must be a non-empty string array'),
    ({"query": "q", "documents": ["a", None]}, '"documents" must be a non-empty string array'),
    ({"query": "q", "texts": []}, '"documents" must be a non-empty string array'),
    ({"query": "q", "documents": [{"title": "a"}]}, 'a "documents" object must have a "text" string'),
    ({"query": "q", "documents": [{"text": 5}]}, 'a "documents" object must have a "text" string'),
    ({"query": "q", "documents": ["a"], "top_n": -1}, '"top_n" must be a non-negative integer'),
    ({"query": "q", "documents": ["a"], "top_n": "2"}, '"top_n" must be a non-negative integer'),
    ({"query": "q", "documents": ["a"], "top_n": 1.5}, '"top_n" must be a non-negative integer'),
    ({"query": "q", "documents": ["a"], "top_n": True}, '"top_n" must be a non-negative integer'),
    ({"query": "q", "documents": ["a"], "return_documents": "yes"}, '"return_documents" must be a boolean'),
    ({"query": "q", "texts": ["a"], "return_text": 1}, '"return_text" must be a boolean'),
    ({"query": "q", "documents": ["a"], "truncate": "true"}, '"truncate" must be a boolean'),
    ({"query": "q", "documents": ["a"], "instruction": 3}, '"instruction" must be a string'),
    ({"query": "q", "documents": [{"text": "a"}], "rank_fields": ["title", "text"]},
     '"rank_fields" is not supported: send each document as a string or as {"text": ...}'),
])
def test_client_faults_are_400_with_their_message(body, message):
    assert error_of(body) == (400, message)


def test_checks_run_in_llama_order():
    # query before documents, documents before top_n
    assert error_of({"query": 1, "documents": [], "top_n": -1})[1] == '"query" must be a string'
    assert error_of({"query": "q", "documents": [], "top_n": -1})[1] == '"documents" must be a non-empty string array'


@pytest.mark.parametrize("top_n,expected", [(None, None), (0, 0), (2, 2), (3, 3), (99, 3)])
def test_top_n_is_clamped_and_null_means_all(top_n, expected):
    assert parse({"query": "q", "documents": ["a", "b", "c"], "top_n": top_n}).top_n == expected


def test_cohere_fields_that_cannot_change_results_are_accepted():
    request = parse({"query": "q", "documents": ["a"], "rank_fields": ["text"], "max_chunks_per_doc": 3,
                     "max_tokens_per_doc": 4096, "priority": 2, "relevant_spans": {"mode": "enabled"},
                     "raw_scores": True, "truncation_direction": "Right"})
    assert request.items == ["a"]


def test_truncate_default_is_the_servers_except_on_cohere_v2():
    assert parse({"query": "q", "documents": ["a"]}).truncate is None
    assert parse({"query": "q", "documents": ["a"], "truncate": True}).truncate is True
    assert parse({"query": "q", "documents": ["a"]}, cohere_v2=True).truncate is True
    assert parse({"query": "q", "documents": ["a"], "truncate": False}, cohere_v2=True).truncate is False


def test_model_is_echoed_only_when_a_string():
    assert parse({"query": "q", "documents": ["a"], "model": "m"}).model == "m"
    assert parse({"query": "q", "documents": ["a"], "model": 5}).model is None
    assert render({"query": "q", "documents": ["a"], "model": 5}, [0.5])["model"] == "server-model"


def test_ranked_indices_sort_descending_with_ties_by_index():
    assert ranked_indices([0.5, 2.0, 0.5, -1.0, 2.0], None) == [1, 4, 0, 2, 3]
    assert ranked_indices([0.5, 2.0, 0.5, -1.0, 2.0], 3) == [1, 4, 0]
    assert ranked_indices([0.5, 2.0], 0) == []


def test_render_jina_shape_bytes():
    body = render({"query": "q", "documents": ["a", "b", "c"], "model": "m", "top_n": 2},
                  [-1.5, 3.25, 0.125], n_tokens=[4, 5, 6])
    assert orjson.dumps(body) == (b'{"model":"m","object":"list","usage":{"prompt_tokens":15,"total_tokens":15},'
                                  b'"results":[{"index":1,"relevance_score":3.25},'
                                  b'{"index":2,"relevance_score":0.125}]}')


def test_render_return_documents_echoes_strings_as_text_objects_and_objects_as_sent():
    docs = ["plain", {"text": "obj", "title": "T"}]
    body = render({"query": "q", "documents": docs, "return_documents": True}, [1.0, 2.0])
    assert body["results"] == [{"index": 1, "relevance_score": 2.0, "document": {"text": "obj", "title": "T"}},
                               {"index": 0, "relevance_score": 1.0, "document": {"text": "plain"}}]
    assert list(body["results"][0]) == ["index", "relevance_score", "document"]
    # return_text means nothing outside TEI
    assert "text" not in render({"query": "q", "documents": docs, "return_text": True}, [1.0, 2.0])["results"][0]


def test_render_tei_shape_with_and_without_text():
    assert render({"query": "q", "texts": ["a", "b"]}, [0.1, 0.3]) == [{"index": 1, "score": 0.3},
                                                                      {"index": 0, "score": 0.1}]
    body = render({"query": "q", "texts": ["a", "b"], "return_text": True, "return_documents": True, "top_n": 1},
                  [0.1, 0.3])
    assert orjson.dumps(body) == b'[{"index":1,"score":0.3,"text":"b"}]'


def test_render_cohere_v2_shape():
    body = render({"query": "q", "documents": ["a", "b"], "model": "rerank-v3.5"}, [0.2, 0.7], n_tokens=[3, 4],
                  cohere_v2=True, response_id="abc")
    assert orjson.dumps(body) == (b'{"id":"abc","results":[{"index":1,"relevance_score":0.7},'
                                  b'{"index":0,"relevance_score":0.2}],'
                                  b'"meta":{"api_version":{"version":"2"},"billed_units":{"search_units":1}},'
                                  b'"model":"rerank-v3.5","usage":{"prompt_tokens":7,"total_tokens":7}}')


def test_cohere_v2_bills_one_search_unit_per_hundred_documents():
    for n, units in [(100, 1), (101, 2), (250, 3)]:
        body = render({"query": "q", "documents": ["d"] * n}, [0.0] * n, cohere_v2=True)
        assert body["meta"]["billed_units"] == {"search_units": units}


def test_usage_counts_every_pair_even_beyond_top_n():
    body = render({"query": "q", "documents": ["a", "b", "c"], "top_n": 0}, [1.0, 2.0, 3.0], n_tokens=[7, 8, 9])
    assert body["results"] == []
    assert body["usage"] == {"prompt_tokens": 24, "total_tokens": 24}


# ---------------------------------------------------------------- images (rerankers that take them)

URL = "data:image/png;base64,iVBORw0KGgo="


def parse_images(body):
    return parse_rerank_request(body, cohere_v2=False, takes_images=True)


@pytest.mark.parametrize("value,item", [
    ({"image": URL}, [MediaRef(URL)]),
    ({"image": {"url": URL}, "text": "a chart"}, [MediaRef(URL), "a chart"]),  # the image first, its text after
    ({"image_url": URL, "text": ""}, [MediaRef(URL)]),
    ({"image": URL, "image_url": "ignored"}, [MediaRef(URL)]),  # "image" wins
    ({"type": "image_url", "image_url": {"url": URL}}, [MediaRef(URL)]),
    ([{"type": "text", "text": "see "}, {"type": "image_url", "image_url": URL}], ["see ", MediaRef(URL)]),
    ({"prompt_string": "<__media__> caption", "multimodal_data": [URL]}, [MediaRef(URL), " caption"]),
])
def test_image_items_in_every_form(value, item):
    request = parse_images({"query": value, "documents": ["text", value]})
    assert request.query == item
    assert request.items == ["text", item]


def test_text_only_objects_and_parts_collapse_to_their_text():
    request = parse_images({"query": {"type": "text", "text": "q"},
                            "documents": [{"text": "a"}, [{"type": "text", "text": "b"}, {"type": "text", "text": "c"}],
                                          {"prompt_string": "d"}]})
    assert (request.query, request.items) == ("q", ["a", "bc", "d"])


@pytest.mark.parametrize("body,message", [
    ({"query": "q", "documents": ["a", {"image": URL}]},
     "document 1: Multimodal data provided, but model does not support multimodal requests."),
    ({"query": {"type": "image_url", "image_url": {"url": URL}}, "documents": ["a"]},
     "query: Multimodal data provided, but model does not support multimodal requests."),
    ({"query": "q", "documents": [{"prompt_string": "<__media__>", "multimodal_data": [URL]}]},
     "document 0: Multimodal data provided, but model does not support multimodal requests."),
])
def test_an_image_for_a_text_only_reranker_is_400_naming_the_item(body, message):
    assert error_of(body) == (400, message)


@pytest.mark.parametrize("body,message", [
    ({"query": "q", "documents": [{"image": 5}]},
     'document 0: "image" must be an image URL (data:, file://, http(s)://) or base64, or {"url": ...}'),
    ({"query": "q", "documents": [{"image_url": {"link": URL}}]},
     'document 0: "image_url" must be an image URL (data:, file://, http(s)://) or base64, or {"url": ...}'),
    ({"query": {"title": "x"}, "documents": ["a"]}, 'query: an object must have a "text" string, an "image" or an '
                                                    '"image_url"'),
    ({"query": "q", "documents": ["a", {"text": 3, "image": URL}]},
     'document 1: an object must have a "text" string, an "image" or an "image_url"'),
    ({"query": "q", "documents": [{"type": "video_url"}]},
     "document 0: content part type 'video_url' is not supported (supported: text, image_url)"),
    ({"query": "q", "documents": [{"prompt_string": "x", "multimodal_data": [URL]}]},
     'document 0: "prompt_string" has 0 media markers (<__media__>) for 1 "multimodal_data" images; there must be '
     'one marker per image'),
    ({"query": ["q"], "documents": ["a"]}, '"query" must be a string'),
])
def test_bad_image_items_are_400_naming_the_item(body, message):
    with pytest.raises(ApiError) as caught:
        parse_images(body)
    assert (caught.value.status, caught.value.message) == (400, message)


def test_return_documents_echoes_image_documents_as_sent_and_tei_text_is_their_text():
    docs = ["plain", {"image": URL, "text": "caption", "id": 3}, [{"type": "image_url", "image_url": {"url": URL}}]]
    body = {"query": "q", "documents": docs, "return_documents": True}
    result = RerankResult(scores=[0.1, 0.3, 0.2], n_tokens=[1, 2, 3])
    rendered = render_rerank_response(parse_images(body), result, "m", response_id="r")
    assert [r["document"] for r in rendered["results"]] == [docs[1], docs[2], {"text": "plain"}]
    tei = render_rerank_response(parse_images({"query": "q", "texts": docs, "return_text": True}), result, "m",
                                 response_id="r")
    assert tei == [{"index": 1, "score": 0.3, "text": "caption"}, {"index": 2, "score": 0.2, "text": ""},
                   {"index": 0, "score": 0.1, "text": "plain"}]
