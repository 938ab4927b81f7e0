"""Llama-Nemotron-VL-Embed (engine/families/llama_nemotron_vl.py, engine/multimodal/tiles.py) against a reference
composed from transformers' SiglipVisionModel and LlamaModel (bidirectional) on a tiny random checkpoint in the
published key layout (tests/engine/families/nemotron_vl_fixture.py), fp32 on the CPU."""
from __future__ import annotations

import io
import json
from dataclasses import replace

import mlx.core as mx
import numpy as np
import pytest
from PIL import Image

from engine.loading import formats, registry
from engine.errors import UnsupportedCheckpoint
from engine.families import llama_nemotron_vl as family
from engine.multimodal.tiles import TilingProcessor, candidate_grids, choose_grid
from tests.engine.families import nemotron_vl_fixture as fx
from tests.engine.helpers import cosine

MIN_COSINE = 0.9999


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    return fx.built(tmp_path_factory.mktemp("nemotron_vl") / "m")


@pytest.fixture(scope="module")
def loaded(built):
    return formats.load(formats.open_checkpoint(built[0]), kind=registry.EMBEDDER)


@pytest.fixture(scope="module")
def tiler(built):
    folder = built[0]
    config = json.loads((folder / "config.json").read_text())
    return TilingProcessor.from_checkpoint(folder, config, fx.TILE)


def decoded(data: bytes):
    image = Image.open(io.BytesIO(data))
    image.load()
    return image


def test_tiles_equal_internvl_dynamic_preprocess(tiler):
    for name, data in fx.images().items():
        image = decoded(data)
        ours, theirs = tiler(image), fx.reference_tiles(data)
        assert ours.shape == theirs.shape, name
        np.testing.assert_allclose(ours, theirs, atol=1e-6, rtol=0, err_msg=name)
        assert tiler.tile_count(*image.size) == len(ours), name


def test_grid_choice_follows_the_seed():
    grids = candidate_grids(1, 6)
    # a 2:1 landscape page at 512 px tiles: 3 x 2 (60% of the area kept, aspect 1.5) plus the thumbnail = 7 tiles
    assert choose_grid(2048, 1024, 512, grids) == (3, 2)
    # a small image keeps its aspect with few tiles: any grid already keeps 60% of its area, so the smallest wins
    assert choose_grid(300, 300, 512, grids) == (1, 1)
    assert choose_grid(1024, 512, 512, grids) == (2, 1)
    processor = TilingProcessor(tile=512, min_tiles=1, max_tiles=6, use_thumbnail=True, dynamic=True,
                                mean=(0.5,) * 3, std=(0.5,) * 3)
    assert processor.tile_count(2048, 1024) == 7 and processor.tile_count(300, 300) == 1
    assert processor.most_tiles == 7


def test_model_reads_the_published_layout(loaded):
    model = loaded.model
    assert loaded.family == "llama_nemotron_vl" and loaded.hidden_size == 64
    assert model.config.tokens_per_tile == fx.TOKENS_PER_TILE and model.config.vision.image_size == fx.TILE
    assert "head" not in model.vision_model.vision_model  # SigLIP's pooling head is dropped at load


def _pooled(hidden: mx.array, lengths: list[int]) -> list[np.ndarray]:
    """Mean over each row's real tokens, L2-normalized (the engine's pooling, written out)."""
    rows = np.array(hidden.astype(mx.float32), dtype=np.float64)
    vectors = [row[:n].mean(axis=0) for row, n in zip(rows, lengths, strict=True)]
    return [v / np.linalg.norm(v) for v in vectors]


def embed_texts(model, rows: list[list[int]]) -> list[np.ndarray]:
    """One right-padded text pass."""
    width = max(len(r) for r in rows)
    ids = mx.array([r + [0] * (width - len(r)) for r in rows])
    mask = mx.array([[1] * len(r) + [0] * (width - len(r)) for r in rows])
    return _pooled(model(ids, mask), [len(r) for r in rows])


def embed_image_input(model, tok, tiler, text: str, data: bytes) -> tuple[list[int], np.ndarray]:
    """One image input (its own pass): the expanded ids and the pooled vector."""
    tiles = tiler(decoded(data))
    ids = tok("passage: " + family.image_block(len(tiles) * model.config.tokens_per_tile) + text).input_ids
    hidden = model.embed_with_images(mx.array([ids]), [{"pixel_values": mx.array(tiles)}])
    return ids, _pooled(hidden, [len(ids)])[0]


def test_text_and_image_inputs_match_the_reference(built, loaded, tiler):
    _, ref, tok = built
    model = loaded.model
    texts = ["query: what does the chart say about 2023 revenue", "passage: Revenue grew 12% in 2023.", "hello"]
    for ours, text in zip(embed_texts(model, [tok(t).input_ids for t in texts]), texts, strict=True):
        theirs = fx.reference_embedding(ref, tok, text)
        assert cosine(ours, theirs) >= MIN_COSINE
        np.testing.assert_allclose(ours, theirs, atol=1e-4)
    pics = fx.images()
    for text, name in (("", "landscape"), ("a caption", "portrait"), ("", "tiny"), ("", "square_rgba")):
        ids, ours = embed_image_input(model, tok, tiler, text, pics[name])
        assert ids == tok(fx.reference_prompt(len(tiler(decoded(pics[name]))), text)).input_ids
        theirs = fx.reference_embedding(ref, tok, text, pics[name])
        assert cosine(ours, theirs) >= MIN_COSINE, name
        np.testing.assert_allclose(ours, theirs, atol=1e-4)


def test_images_change_the_vector(built, loaded, tiler):
    # the features really land in the sequence: two different images under one prompt embed apart
    _, _, tok = built
    first, second = (embed_image_input(loaded.model, tok, tiler, "", fx.images()[name])[1]
                     for name in ("square_rgba", "palette"))
    assert cosine(first, second) < 0.999


def test_context_count_must_match_the_tiles(built, loaded, tiler):
    _, _, tok = built
    model = loaded.model
    tiles = tiler(decoded(fx.images()["landscape"]))
    ids = tok("passage: " + family.image_block(3)).input_ids
    with pytest.raises(ValueError, match="image tokens for"):
        model.embed_with_images(mx.array([ids]), [{"pixel_values": mx.array(tiles)}])


@pytest.mark.parametrize("edit, message", [
    ({"select_layer": -2}, "select_layer"),
    ({"ps_version": "v1"}, "pixel shuffle"),
    ({"vision_config": {"model_type": "intern_vit_6b"}}, "vision tower"),
    ({"llm_config": {"architectures": ["Qwen2ForCausalLM"]}}, "language model"),
    ({"force_image_size": 448}, "force_image_size"),
])
def test_unsupported_configs_are_refused_by_name(built, edit, message):
    config = json.loads((built[0] / "config.json").read_text())
    for key, value in edit.items():
        config[key] = {**config[key], **value} if isinstance(value, dict) else value
    with pytest.raises(UnsupportedCheckpoint, match=message):
        family.ModelArgs.from_dict(config)


def test_detected_as_an_embedder_and_named_in_errors(built):
    ckpt = formats.open_checkpoint(built[0])
    assert registry.kind_of(ckpt) == registry.EMBEDDER
    assert registry.default_pooling(ckpt).value == "mean"
    wrong = replace(ckpt, config={**ckpt.config, "architectures": ["LlamaNemotronVLForCausalLM"]})
    with pytest.raises(UnsupportedCheckpoint, match="supported: LlamaNemotronVLModel"):
        registry.kind_of(wrong)
    with pytest.raises(UnsupportedCheckpoint, match="llama_nemotron_vl"):
        registry.kind_of(replace(ckpt, config={"model_type": "internvl_chat"}))


@pytest.mark.parametrize("min_tiles, max_tiles, thumbnail", [(1, 12, True), (2, 4, False), (1, 1, True)])
def test_tiles_follow_the_settings(min_tiles, max_tiles, thumbnail):
    # (1, 1): one tile, never a thumbnail, which is also what dynamic_image_size off makes
    processor = TilingProcessor(tile=fx.TILE, min_tiles=min_tiles, max_tiles=max_tiles, use_thumbnail=thumbnail,
                                dynamic=True, mean=(0.5,) * 3, std=(0.5,) * 3)
    fixed = TilingProcessor(tile=fx.TILE, min_tiles=1, max_tiles=6, use_thumbnail=True, dynamic=False,
                            mean=(0.5,) * 3, std=(0.5,) * 3)
    for name, data in fx.images().items():
        expected = fx.reference_tiles(data, min_num=min_tiles, max_num=max_tiles, use_thumbnail=thumbnail)
        np.testing.assert_allclose(processor(decoded(data)), expected, atol=1e-6, rtol=0, err_msg=name)
        np.testing.assert_allclose(fixed(decoded(data)), fx.reference_tiles(data, max_num=1), atol=1e-6, rtol=0)


def test_builder_refuses_a_processor_config_that_disagrees_with_the_model(built, tmp_path):
    import shutil

    from engine.multimodal.builders.llama_nemotron_vl import input_builder

    folder = tmp_path / "m"
    shutil.copytree(built[0], folder)
    path = folder / "processor_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "num_image_token": 256}))
    ckpt = formats.open_checkpoint(folder)
    with pytest.raises(UnsupportedCheckpoint, match="num_image_token 256"):
        input_builder(ckpt, ckpt.format.open_tokenizer(ckpt))
    path.write_text(json.dumps({**json.loads(path.read_text()), "num_image_token": 4, "norm_type": "clip"}))
    with pytest.raises(UnsupportedCheckpoint, match="norm_type 'clip'"):
        input_builder(ckpt, ckpt.format.open_tokenizer(ckpt))
