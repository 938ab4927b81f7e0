"""Llama-Nemotron-VL-Embed (engine/families/llama_nemotron_vl.py, engine/image_tiles.py) against a reference
composed from transformers' SiglipVisionModel and LlamaModel (bidirectional) on a tiny random checkpoint in the
published key layout (tests/engine/families/nemotron_vl_fixture.py), fp32 on the CPU."""
from __future__ import annotations

import io
import json

import mlx.core as mx
import numpy as np
import pytest
from PIL import Image

from engine import checkpoint, registry
from engine.errors import UnsupportedCheckpoint
from engine.families import llama_nemotron_vl as family
from engine.image_tiles import TilingProcessor, candidate_grids, choose_grid
from tests.engine.families import nemotron_vl_fixture as fx
from tests.engine.helpers import cosine

MIN_COSINE = 0.9999


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    folder, ref = fx.make_checkpoint(tmp_path_factory.mktemp("nemotron_vl") / "m")
    return folder, ref, fx.tokenizer()


@pytest.fixture(scope="module")
def loaded(built):
    return registry.load(checkpoint.read(built[0]), kind=registry.EMBEDDER)


@pytest.fixture(scope="module")
def tiler(built):
    folder = built[0]
    config = json.loads((folder / "config.json").read_text())
    return TilingProcessor.from_checkpoint(folder, config, fx.TILE)


def test_tiles_equal_internvl_dynamic_preprocess(tiler):
    for name, data in fx.images().items():
        ours, theirs = tiler(data, max_pixels=1 << 24), fx.reference_tiles(data)
        assert ours.shape == theirs.shape, name
        np.testing.assert_allclose(ours, theirs, atol=1e-6, rtol=0, err_msg=name)
        with Image.open(io.BytesIO(data)) as image:
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
    assert model.tokens_per_tile == fx.TOKENS_PER_TILE and model.image_size == fx.TILE
    assert "head" not in model.vision_model.vision_model  # SigLIP's pooling head is dropped at load


def _embed(model, rows: list[list[int]], tiles: np.ndarray | None) -> list[np.ndarray]:
    """One right-padded pass, mean-pooled over real tokens and normalized (the engine's pooling, written out)."""
    width = max(len(r) for r in rows)
    ids = mx.array([r + [0] * (width - len(r)) for r in rows])
    mask = mx.array([[1] * len(r) + [0] * (width - len(r)) for r in rows])
    if tiles is None:
        hidden = model(ids, mask)
    else:
        hidden = model.hidden_with_images(ids, mask, mx.array(tiles))
    hidden = np.array(hidden.astype(mx.float32), dtype=np.float64)
    out = []
    for row, h in zip(rows, hidden, strict=True):
        vec = h[: len(row)].mean(axis=0)
        out.append(vec / np.linalg.norm(vec))
    return out


def test_mixed_text_and_image_batches_match_the_reference(built, loaded, tiler):
    _, ref, tok = built
    model = loaded.model
    pics = fx.images()
    texts = ["query: what does the chart say about 2023 revenue", "passage: Revenue grew 12% in 2023.", "hello"]
    # one image input per pass, with text rows beside it; the second image comes with text of its own
    passes = [[texts[0], ("", pics["landscape"]), texts[1]], [("a caption", pics["portrait"]), texts[2]],
              [("", pics["tiny"])]]
    for items in passes:
        rows, tiles, expected = [], None, []
        for item in items:
            if isinstance(item, tuple):
                text, data = item
                tiles = tiler(data, max_pixels=1 << 24)
                ids = tok(family.image_prompt(text)).input_ids
                rows.append(family.expand_image_tokens(ids, model.image_token_id, len(tiles) * model.tokens_per_tile))
                # the expansion equals tokenizing the reference processor's full document text
                assert rows[-1] == tok(fx.reference_prompt(len(tiles), text)).input_ids
                expected.append(fx.reference_embedding(ref, tok, text, data))
            else:
                rows.append(tok(item).input_ids)
                expected.append(fx.reference_embedding(ref, tok, item))
        got = _embed(model, rows, tiles)
        for ours, theirs in zip(got, expected, strict=True):
            assert cosine(ours, theirs) >= MIN_COSINE
            np.testing.assert_allclose(ours, theirs, atol=1e-4)


def test_images_change_the_vector(built, loaded, tiler):
    # the features really land in the sequence: two different images under one prompt embed apart
    _, _, tok = built
    model = loaded.model
    vectors = []
    for name in ("square_rgba", "palette"):
        tiles = tiler(fx.images()[name], max_pixels=1 << 24)
        ids = family.expand_image_tokens(tok(family.image_prompt()).input_ids, model.image_token_id,
                                         len(tiles) * model.tokens_per_tile)
        vectors.append(_embed(model, [ids], tiles)[0])
    assert cosine(*vectors) < 0.999


def test_context_count_must_match_the_tiles(built, loaded, tiler):
    _, _, tok = built
    model = loaded.model
    tiles = tiler(fx.images()["landscape"], max_pixels=1 << 24)
    ids = family.expand_image_tokens(tok(family.image_prompt()).input_ids, model.image_token_id, 3)
    with pytest.raises(ValueError, match="image context tokens"):
        model.hidden_with_images(mx.array([ids]), mx.ones((1, len(ids))), mx.array(tiles))


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
