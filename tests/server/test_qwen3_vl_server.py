"""Qwen3-VL-Embedding served with `-m DIR --embedding`: llama's multimodal_data prompts and OpenAI content parts
carry the same image to the same vector, the reference's; /props and /v1/models say the model takes images."""
from __future__ import annotations

import numpy as np
import pytest

from tests.engine.families.qwen3_vl_fixture import embedding_reference, make_embedding_checkpoint, png_image
from tests.engine.helpers import cosine
from tests.server.harness import ServerProcess, b64, clean_env, image_part

IMAGES = [png_image(120, 80, 11), png_image(64, 96, 12)]
CAPTION = "A woman playing with her dog on a beach"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return make_embedding_checkpoint(tmp_path_factory.mktemp("qwen3-vl-server") / "model")


@pytest.fixture(scope="module")
def server(checkpoint):
    with ServerProcess("-m", str(checkpoint[0]), "--embedding", "-t", "2") as srv:
        yield srv


def test_multimodal_data_and_content_parts_give_the_reference_vector(server, checkpoint):
    reference = embedding_reference(*checkpoint)
    llama = server.post("/embeddings", json={"content": [
        {"prompt_string": f"<__media__>{CAPTION}", "multimodal_data": [b64(IMAGES[0])]},
        {"prompt_string": "<__media__>", "multimodal_data": [b64(IMAGES[1])]},
        {"prompt_string": CAPTION}]})
    assert llama.status_code == 200, llama.text
    oai = server.post("/v1/embeddings", json={"input": [
        [image_part(IMAGES[0]), {"type": "text", "text": CAPTION}], image_part(IMAGES[1]), CAPTION]})
    assert oai.status_code == 200, oai.text
    llama_vectors = [np.array(item["embedding"][0]) for item in llama.json()]
    oai_vectors = [np.array(item["embedding"]) for item in oai.json()["data"]]
    expected = [reference([IMAGES[0], CAPTION]), reference([IMAGES[1]]), reference([CAPTION])]
    for a, b, (vector, n_ids) in zip(llama_vectors, oai_vectors, expected, strict=True):
        np.testing.assert_allclose(a, b, atol=1e-6, rtol=0)  # the same input, either spelling: one vector
        assert cosine(b, vector) >= 0.9999
    assert oai.json()["usage"]["prompt_tokens"] == sum(n_ids for _, n_ids in expected)


def test_instruction_on_the_request_is_the_system_message(server, checkpoint):
    reference = embedding_reference(*checkpoint)
    body = server.post("/v1/embeddings", json={"input": [[image_part(IMAGES[1]), {"type": "text", "text": "x"}]],
                                                "instruction": "Find the matching photo"}).json()
    assert cosine(body["data"][0]["embedding"], reference([IMAGES[1], "x"], "Find the matching photo.")[0]) >= 0.9999


def test_props_and_models_say_the_model_takes_images(server):
    props = server.get("/props").json()
    assert props["modalities"] == {"vision": True, "video": False, "audio": False}
    assert props["input_modalities"] == ["text", "image"]
    listing = server.get("/v1/models").json()
    assert "multimodal" in listing["models"][0]["capabilities"]
    assert listing["data"][0]["meta"]["input_modalities"] == ["text", "image"]


BIG_IMAGE = png_image(400, 300, 13)  # 108 tokens at its own size: over the checkpoint's 40


def test_image_token_bounds_resize_images_as_the_reference_with_those_pixel_bounds(server, checkpoint):
    """--image-min-tokens 12 grows the 8-token image, --image-max-tokens 20 shrinks the big one (the checkpoint
    allows 4 to 40): the vectors and usage are the reference processor's with 12 x 32^2 to 20 x 32^2 pixels."""
    bounded = ServerProcess("-m", str(checkpoint[0]), "--embedding", "-t", "2", "--image-min-tokens", "12",
                            env=clean_env(LLAMA_ARG_IMAGE_MAX_TOKENS="20")).start()
    try:
        inputs = [[image_part(IMAGES[0]), {"type": "text", "text": CAPTION}], image_part(BIG_IMAGE)]
        parts = [[IMAGES[0], CAPTION], [BIG_IMAGE]]
        usage = {}
        for name, srv, bounds in (("default", server, None), ("bounded", bounded, (12 * 32 * 32, 20 * 32 * 32))):
            body = srv.post("/v1/embeddings", json={"input": inputs}).json()
            expected = [embedding_reference(*checkpoint, pixel_bounds=bounds)(p) for p in parts]
            for item, (vector, _) in zip(body["data"], expected, strict=True):
                assert cosine(item["embedding"], vector) >= 0.9999
            assert body["usage"]["prompt_tokens"] == sum(n_ids for _, n_ids in expected)
            usage[name] = body["usage"]["prompt_tokens"]
        # 120x80: 2 x 4 blocks, grown to 3 x 5; 400x300: 5 x 7 under the checkpoint's 40, 3 x 5 under 20
        assert usage["bounded"] - usage["default"] == (15 - 8) + (15 - 35)
        assert bounded.get("/props").json()["image_tokens"] == {"min": 12, "max": 20}
        assert server.get("/props").json()["image_tokens"] == {"min": 4, "max": 40}
    finally:
        bounded.stop()


def test_image_min_tokens_above_the_checkpoints_max_stops_the_start(checkpoint):
    srv = ServerProcess("-m", str(checkpoint[0]), "--embedding", "--image-min-tokens", "41").start(wait=False)
    try:
        assert srv.proc.wait(60) != 0
        assert ("--image-min-tokens 41 is above this model's most image tokens, 40 (max_pixels 40960 of its "
                "preprocessor_config.json); set --image-max-tokens too") in srv.output()
    finally:
        srv.stop()


def test_mlx_embed_takes_images_and_an_instruction(checkpoint, tmp_path, capsys):
    import orjson

    from compat.cli import embed_main

    reference = embedding_reference(*checkpoint)
    (tmp_path / "pic.png").write_bytes(IMAGES[0])
    assert embed_main(["-m", str(checkpoint[0]), "-p", CAPTION, "--image", str(tmp_path / "pic.png"),
                       "--instruction", "Match photos and captions", "--json"]) == 0
    body = orjson.loads(capsys.readouterr().out)
    text_vector, image_vector = body["embeddings"]
    expected_text, n_text = reference([CAPTION], "Match photos and captions.")
    expected_image, n_image = reference([IMAGES[0]], "Match photos and captions.")
    assert cosine(text_vector, expected_text) >= 0.9999 and cosine(image_vector, expected_image) >= 0.9999
    assert body["prompt_tokens"] == n_text + n_image


def test_mlx_embed_takes_the_image_token_bounds(checkpoint, tmp_path, capsys):
    import orjson

    from compat.cli import embed_main

    reference = embedding_reference(*checkpoint, pixel_bounds=(12 * 32 * 32, 20 * 32 * 32))
    (tmp_path / "big.png").write_bytes(BIG_IMAGE)
    assert embed_main(["-m", str(checkpoint[0]), "--image", str(tmp_path / "big.png"), "--image-min-tokens", "12",
                       "--image-max-tokens", "20", "--json"]) == 0
    body = orjson.loads(capsys.readouterr().out)
    expected, n_ids = reference([BIG_IMAGE])
    assert cosine(body["embeddings"][0], expected) >= 0.9999 and body["prompt_tokens"] == n_ids
    assert embed_main(["-m", str(checkpoint[0]), "-p", "x", "--image-min-tokens", "9", "--image-max-tokens", "8"]) == 1
    assert "error: invalid value for --image-max-tokens: 8 is below --image-min-tokens (9)" in capsys.readouterr().err
