"""Llama-Nemotron-VL-Embed served with `-m DIR --embedding`: text and image inputs through the real server, against
the reference composed from transformers' modules (tests/engine/families/nemotron_vl_fixture.py)."""
from __future__ import annotations

import pytest

from tests.conftest import parse_metrics
from tests.engine.families import nemotron_vl_fixture as fx
from tests.engine.helpers import cosine
from tests.server.harness import ServerProcess, b64, image_part

TEXTS = ["query: what does the chart say about 2023 revenue", "passage: Revenue grew 12% in 2023."]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    folder, ref = fx.make_checkpoint(tmp_path_factory.mktemp("nemotron-vl-server") / "model")
    return folder, ref, fx.tokenizer()


@pytest.fixture(scope="module")
def server(built):
    with ServerProcess("-m", str(built[0]), "--embedding", "-t", "2", "--image-max-count", "4", "--metrics") as srv:
        yield srv


def prompt_tokens(server: ServerProcess) -> float:
    return float(parse_metrics(server.get("/metrics").text)["llamacpp:prompt_tokens_total"])


def test_text_and_image_inputs_give_the_reference_vectors(server, built):
    _, ref, tok = built
    before = prompt_tokens(server)
    pics = fx.images()
    body = {"input": [TEXTS[0], image_part(pics["landscape"]), TEXTS[1],
                      [image_part(pics["portrait"]), {"type": "text", "text": "a caption"}]]}
    res = server.post("/v1/embeddings", json=body)
    assert res.status_code == 200, res.text
    got = [item["embedding"] for item in res.json()["data"]]
    expected = [fx.reference_embedding(ref, tok, TEXTS[0]), fx.reference_embedding(ref, tok, "", pics["landscape"]),
                fx.reference_embedding(ref, tok, TEXTS[1]),
                fx.reference_embedding(ref, tok, "a caption", pics["portrait"])]
    for ours, theirs in zip(got, expected, strict=True):
        assert cosine(ours, theirs) >= 0.9999
    # usage counts every image token: 7 tiles (landscape) and 3 tiles (portrait), 4 tokens each
    lengths = [len(tok(TEXTS[0]).input_ids), len(tok(fx.reference_prompt(7)).input_ids), len(tok(TEXTS[1]).input_ids),
               len(tok(fx.reference_prompt(3, "a caption")).input_ids)]
    assert res.json()["usage"]["prompt_tokens"] == sum(lengths)
    assert prompt_tokens(server) - before == sum(lengths)
    # llama-server's multimodal_data spelling of the same image gives the same vector
    llama = server.post("/embeddings", json={"content": [
        {"prompt_string": "<__media__>", "multimodal_data": [b64(pics["landscape"])]}]})
    assert llama.status_code == 200, llama.text
    assert max(abs(a - b) for a, b in zip(llama.json()[0]["embedding"][0], got[1])) < 1e-6


def test_props_and_models_say_the_model_takes_images(server):
    props = server.get("/props").json()
    assert props["modalities"]["vision"] is True
    assert props["input_modalities"] == ["text", "image"]
    listing = server.get("/v1/models").json()
    assert "multimodal" in listing["models"][0]["capabilities"]
    assert listing["data"][0]["meta"]["input_modalities"] == ["text", "image"]


@pytest.mark.parametrize("body,message", [
    ({"input": [[image_part(fx.images()["tiny"]), image_part(fx.images()["portrait"])]]},
     "input 0: this model takes one image per input"),
    ({"input": ["a <IMG_CONTEXT> in text"]}, "only an image may stand for"),
    ({"input": [image_part(fx.images()["tiny"])], "instruction": "Represent this"}, "not used by it"),
])
def test_bad_inputs_are_400(server, body, message):
    res = server.post("/v1/embeddings", json=body)
    assert res.status_code == 400 and message in res.json()["error"]["message"], res.text
    assert server.get("/health").status_code == 200


def test_mlx_embed_takes_an_image_beside_a_query(built, tmp_path, capsys):
    import orjson

    from compat.cli import embed_main

    _, ref, tok = built
    picture = tmp_path / "chart.png"
    picture.write_bytes(fx.images()["landscape"])
    assert embed_main(["-m", str(built[0]), "-p", TEXTS[0], "--image", str(picture), "--json"]) == 0
    body = orjson.loads(capsys.readouterr().out)
    text_vector, image_vector = body["embeddings"]
    assert cosine(text_vector, fx.reference_embedding(ref, tok, TEXTS[0])) >= 0.9999
    assert cosine(image_vector, fx.reference_embedding(ref, tok, "", fx.images()["landscape"])) >= 0.9999
    assert body["prompt_tokens"] == len(tok(TEXTS[0]).input_ids) + len(tok(fx.reference_prompt(7)).input_ids)
