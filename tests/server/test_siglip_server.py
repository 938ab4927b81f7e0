"""A SiglipModel served with `-m DIR --embedding`: text and images through the real server, in one space."""
from __future__ import annotations

import pytest

from tests.engine.families.siglip_fixture import TEXT_WIDTH, make_checkpoint
from tests.engine.families.test_siglip import LONG, TEXTS, image_reference, png_images, reference
from tests.engine.helpers import cosine
from tests.server.harness import ServerProcess, b64

IMAGES = png_images(3, seed=7)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("siglip-server") / "model")


@pytest.fixture(scope="module")
def media(tmp_path_factory):
    root = tmp_path_factory.mktemp("media")
    (root / "pic.png").write_bytes(IMAGES[2])
    return root


@pytest.fixture(scope="module")
def server(folder, media):
    with ServerProcess("-m", str(folder), "--embedding", "-t", "2", "--media-path", str(media),
                       "--image-max-count", "4") as srv:
        yield srv


def image_part(url: str) -> dict:
    return {"type": "image_url", "image_url": {"url": url}}


def test_llama_multimodal_data_and_openai_content_parts_give_the_reference_vectors(server, folder):
    expected = image_reference(folder, IMAGES)
    _, expected_text = reference(folder, TEXTS[:1])
    llama = server.post("/embeddings", json={"content": [
        {"prompt_string": "<__media__>", "multimodal_data": [b64(IMAGES[0])]},
        {"prompt_string": TEXTS[0]},
        {"prompt_string": "<__media__>", "multimodal_data": [b64(IMAGES[1])]}]})
    assert llama.status_code == 200, llama.text
    oai = server.post("/v1/embeddings", json={"input": [
        image_part(f"data:image/png;base64,{b64(IMAGES[0])}"), {"type": "text", "text": TEXTS[0]},
        image_part(b64(IMAGES[1])), image_part("file://pic.png")]}).json()
    llama_vectors = [item["embedding"][0] for item in llama.json()]
    oai_vectors = [item["embedding"] for item in oai["data"]]
    for ours, theirs in zip([oai_vectors[0], oai_vectors[2], oai_vectors[3]], expected, strict=True):
        assert cosine(ours, theirs) >= 0.9999
    assert cosine(oai_vectors[1], expected_text[0]) >= 0.99999
    for a, b in zip(llama_vectors, oai_vectors[:3], strict=True):  # the same image, either spelling: one vector
        assert max(abs(x - y) for x, y in zip(a, b)) < 1e-6
    n_text = len(server.post("/tokenize", json={"content": TEXTS[0], "add_special": True}).json()["tokens"])
    assert oai["usage"]["prompt_tokens"] == 3 * 16 + n_text  # an image counts its 16 patches


def test_props_and_models_say_the_model_takes_images(server):
    props = server.get("/props").json()
    assert props["modalities"] == {"vision": True, "video": False, "audio": False}
    assert props["media_marker"] == "<__media__>"
    assert props["input_modalities"] == ["text", "image"]
    listing = server.get("/v1/models").json()
    assert listing["models"][0]["capabilities"] == ["embedding", "multimodal"]
    assert listing["data"][0]["meta"]["input_modalities"] == ["text", "image"]


@pytest.mark.parametrize("body,message", [
    ({"input": [TEXTS[0], image_part(b64(b"not an image"))]}, "input 1: not an image"),
    ({"input": [image_part("file://../pic.png")]}, "input 0: file:// paths must not contain '..'"),
    ({"input": [image_part("http://127.0.0.1:9/x.png")]}, "--allow-remote-media"),
    ({"input": [[{"type": "text", "text": "a cat"}, image_part(b64(IMAGES[0]))]]},
     "input 0: this model embeds either a text or one image per input"),
    ({"content": [{"prompt_string": "a <__media__>", "multimodal_data": [b64(IMAGES[0]), b64(IMAGES[1])]}]},
     "has 1 media markers (<__media__>) for 2"),
    ({"input": [image_part(b64(IMAGES[0]))] * 5}, "at most 4 are allowed (--image-max-count)"),
])
def test_bad_images_are_400_naming_the_input(server, body, message):
    res = server.post("/v1/embeddings", json=body)
    assert res.status_code == 400 and message in res.json()["error"]["message"], res.text
    assert server.get("/health").status_code == 200


def test_text_embeddings_match_transformers(server, folder):
    _, expected = reference(folder, TEXTS)
    body = server.post("/v1/embeddings", json={"input": TEXTS}).json()
    for item, theirs in zip(body["data"], expected, strict=True):
        assert cosine(item["embedding"], theirs) >= 0.99999
    assert body["usage"]["prompt_tokens"] == sum(len(server.post("/tokenize", json={"content": t, "add_special": True})
                                                     .json()["tokens"]) for t in TEXTS)


def test_inputs_over_64_tokens_are_refused_unless_truncated(server, folder):
    refused = server.post("/v1/embeddings", json={"input": LONG})
    assert refused.status_code == 400 and "too large" in refused.json()["error"]["message"]
    _, expected = reference(folder, [LONG], truncation=True)
    body = server.post("/v1/embeddings", json={"input": LONG, "truncate": True}).json()
    assert body["usage"]["prompt_tokens"] == TEXT_WIDTH
    assert cosine(body["data"][0]["embedding"], expected[0]) >= 0.99999


def test_props_report_the_fixed_width(server):
    props = server.get("/props").json()
    assert (props["max_seq"], props["widths"]) == (TEXT_WIDTH, [TEXT_WIDTH])
    assert server.get("/v1/models").json()["data"][0]["meta"]["n_embd"] == 32


def test_several_models_route_images_to_the_one_that_takes_them(folder, media):
    from tests.conftest import minilm_dir

    expected = image_reference(folder, IMAGES[2:])
    srv = ServerProcess("--embedding-model", f"{folder}=siglip", "--embedding-model", f"{minilm_dir()}=minilm",
                        "-t", "2", "--media-path", str(media)).start()
    try:
        body = {"input": [image_part("file://pic.png")]}
        res = srv.post("/v1/embeddings", json={"model": "siglip", **body})
        assert res.status_code == 200, res.text
        assert cosine(res.json()["data"][0]["embedding"], expected[0]) >= 0.9999
        refused = srv.post("/v1/embeddings", json={"model": "minilm", **body})
        assert refused.status_code == 400
        assert refused.json()["error"]["message"] == ("Multimodal data provided, but model does not support "
                                                      "multimodal requests.")
        listed = {m["id"]: m for m in srv.get("/v1/models").json()["data"]}
        assert listed["siglip"]["meta"]["input_modalities"] == ["text", "image"]
        assert listed["minilm"]["meta"]["input_modalities"] == ["text"]
    finally:
        srv.stop()


def test_mlx_embed_takes_images_beside_texts(folder, media, capsys):
    import orjson

    from compat.cli import embed_main

    expected = image_reference(folder, IMAGES[2:])
    _, expected_text = reference(folder, TEXTS[:1])
    assert embed_main(["-m", str(folder), "-p", TEXTS[0], "--image", str(media / "pic.png"), "--json"]) == 0
    body = orjson.loads(capsys.readouterr().out)
    text_vector, image_vector = body["embeddings"]
    assert cosine(text_vector, expected_text[0]) >= 0.99999 and cosine(image_vector, expected[0]) >= 0.9999
    import transformers

    n_text = len(transformers.AutoTokenizer.from_pretrained(folder)(TEXTS[0]).input_ids)
    assert body["prompt_tokens"] == n_text + 16  # the image counts its patches
    assert abs(body["similarity"][0][1] - cosine(text_vector, image_vector)) < 1e-6
    assert embed_main(["-m", str(folder), "--image", str(media / "missing.png")]) == 1
    assert "--image" in capsys.readouterr().err
