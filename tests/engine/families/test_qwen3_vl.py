"""Qwen3-VL model math against transformers' Qwen3VLModel on a tiny random checkpoint: the vision tower and its
DeepStack features, the decoder's hidden states on text-only rows and on rows with images (M-RoPE positions,
features scattered into <|image_pad|> runs, DeepStack added after the first layers), and the key layouts."""
from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from engine.loading import weights
from engine.errors import UnsupportedCheckpoint
from engine.families import mrope, qwen3_vl
from tests.engine.families.qwen3_vl_fixture import MERGE, make_checkpoint, random_patches, reference_hidden
from tests.engine.helpers import cosine, torch

MIN_COSINE = 0.99999
GRIDS = [(1, 4, 6), (1, 10, 8), (1, 6, 4), (1, 2, 2)]  # 10 x 8 patches: the 8 x 8 position table upsampled


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("qwen3_vl") / "model")


def load_ours(folder, cls=qwen3_vl.Model):
    import json

    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    model = cls(qwen3_vl.ModelArgs.from_dict(config))
    weights.materialize(model, model.sanitize(mx.load(str(folder / "model.safetensors"))), None, mx.float32,
                        "qwen3_vl test")
    return model


@pytest.fixture(scope="module")
def ours(checkpoint):
    return load_ours(checkpoint[0])


def rows_with_images(config) -> tuple[list[list[int]], list[list[tuple[int, int, int]]]]:
    """Four rows: text only, two images between text, one image, an image first; ids avoid the specials."""
    rng = np.random.default_rng(7)

    def text(n):
        return rng.integers(20, config.text_config.vocab_size, size=n).tolist()

    def image(grid):
        n = grid[0] * grid[1] * grid[2] // MERGE ** 2
        return [config.vision_start_token_id] + [config.image_token_id] * n + [config.vision_end_token_id]

    rows = [text(17), text(5) + image(GRIDS[0]) + text(3) + image(GRIDS[1]) + text(4),
            text(3) + image(GRIDS[2]) + text(7), image(GRIDS[3]) + text(2)]
    return rows, [[], GRIDS[:2], GRIDS[2:3], GRIDS[3:]]


def patches_of(grids, first_seed=0):
    return [random_patches(g, first_seed + i) for i, g in enumerate(grids)]


def padded(rows, left=False):
    width = max(map(len, rows))
    ids = np.zeros((len(rows), width), np.int32)
    mask = np.zeros_like(ids)
    for b, row in enumerate(rows):
        span = slice(width - len(row), width) if left else slice(0, len(row))
        ids[b, span], mask[b, span] = row, 1
    return ids, mask


def assert_rows_match(got, ref):
    assert got.shape == ref.shape
    worst = min(cosine(a, b) for a, b in zip(got, ref, strict=True))
    assert worst >= MIN_COSINE, worst
    np.testing.assert_allclose(got, ref, atol=1e-4 * max(1.0, float(np.abs(ref).max())), rtol=1e-4)


def test_vision_tower_and_deepstack_features_match(checkpoint, ours):
    _, model = checkpoint
    t = torch()
    patches = np.concatenate(patches_of(GRIDS))
    with t.inference_mode():
        ref = model.model.get_image_features(t.from_numpy(patches), t.tensor(GRIDS))
    merged, stacked = ours.model.visual(mx.array(patches), GRIDS)
    assert_rows_match(np.array(merged), t.cat(ref.pooler_output).double().numpy())
    assert len(stacked) == len(ref.deepstack_features) == 2
    for got, want in zip(stacked, ref.deepstack_features, strict=True):
        assert_rows_match(np.array(got), t.cat(want).double().numpy())


@pytest.mark.parametrize("left", [False, True], ids=["right-padded", "left-padded"])
def test_hidden_states_match_on_text_and_image_rows(checkpoint, ours, left):
    """One padded batch of mixed rows (text only, two images, one image) against each row alone."""
    _, model = checkpoint
    rows, grids_per_row = rows_with_images(model.config)
    grids = [g for row in grids_per_row for g in row]
    patches = patches_of(grids)
    ids, mask = padded(rows, left)
    hidden = np.array(ours.forward(mx.array(ids), mx.array(mask), mx.array(np.concatenate(patches)), grids))
    start = 0
    for b, (row, row_grids) in enumerate(zip(rows, grids_per_row, strict=True)):
        own = patches[start:start + len(row_grids)]
        start += len(row_grids)
        ref = reference_hidden(model, row, np.concatenate(own) if own else None, row_grids)
        got = hidden[b][mask[b] != 0]
        assert_rows_match(got, ref)


def test_text_only_call_matches(checkpoint, ours):
    """The engine's text path (ids and mask only) equals the reference without images, an image token id
    included (plain text without pixel values)."""
    _, model = checkpoint
    rows = rows_with_images(model.config)[0][:1] + [np.random.default_rng(3).integers(20, 300, 9).tolist()]
    rows[1][4] = model.config.image_token_id
    ids, mask = padded(rows)
    hidden = np.array(ours(mx.array(ids), mx.array(mask)))
    for b, row in enumerate(rows):
        assert_rows_match(hidden[b][: len(row)], reference_hidden(model, row))


def test_rope_index_follows_the_grid_and_resumes_after_it():
    ids = np.array([[5, 6, 9, 9, 9, 9, 9, 9, 7, 0]])
    mask = np.array([[1, 1, 1, 1, 1, 1, 1, 1, 1, 0]])
    pos = mrope.rope_index(ids, mask, [(1, 4, 6)], image_token_id=9, merge=2)
    # 2 x 3 merged grid from position 2; text resumes at 2 + max(2, 3)
    assert pos[:, 0, :2].tolist() == [[0, 1]] * 3
    assert pos[0, 0, 2:8].tolist() == [2] * 6
    assert pos[1, 0, 2:8].tolist() == [2, 2, 2, 3, 3, 3]
    assert pos[2, 0, 2:8].tolist() == [2, 3, 4, 2, 3, 4]
    assert pos[:, 0, 8].tolist() == [5, 5, 5]
    with pytest.raises(ValueError, match="image tokens"):
        mrope.rope_index(ids, mask, [(1, 4, 4)], image_token_id=9, merge=2)
    # without images, the image token id is plain text (as the reference without pixel values)
    text = mrope.rope_index(ids, mask, [], image_token_id=9, merge=2)
    assert text[:, 0, :9].tolist() == [list(range(9))] * 3


def test_every_key_layout_loads_the_same_tensors(checkpoint, ours):
    folder, _ = checkpoint
    canonical = mx.load(str(folder / "model.safetensors"))
    expected = ours.sanitize(canonical)

    def renamed(mapping, patch_filter=None):
        out = {}
        for key, value in canonical.items():
            for old, new in mapping:
                if key.startswith(old):
                    key = new + key[len(old):]
                    break
            if key.endswith("patch_embed.proj.weight") and patch_filter:
                value = patch_filter(value)
            out[key] = value
        return out

    layouts = {
        "bare Qwen3VLModel": renamed([("model.", ""), ("lm_head.", "lm_head.")]),
        "Qwen2-VL era": renamed([("model.visual.", "visual."), ("model.language_model.", "model.")]),
        "mlx-vlm": renamed([("model.visual.", "vision_tower."), ("model.language_model.", "language_model.model."),
                            ("lm_head.", "language_model.lm_head.")], lambda w: w.transpose(0, 2, 3, 4, 1)),
    }
    for name, layout in layouts.items():
        got = ours.sanitize(layout)
        assert sorted(got) == sorted(expected), name
        for key, value in expected.items():
            assert mx.array_equal(got[key], value), (name, key)
    assert "lm_head.weight" not in expected
    with pytest.raises(UnsupportedCheckpoint, match="unexpected weight"):
        ours.sanitize({"vision_model.x": canonical["lm_head.weight"]})


def test_causal_lm_reads_head_rows(checkpoint):
    folder, model = checkpoint
    causal = load_ours(folder, qwen3_vl.CausalLM)
    rows = causal.head_rows([3, 17])
    np.testing.assert_array_equal(np.array(rows), model.lm_head.weight.detach().numpy()[[3, 17]])


def test_embed_with_images_takes_one_input_and_its_images_arrays(checkpoint, ours):
    """The engine's vision-language call (engine/multimodal/inputs.py): ids [1, L] and each image's pixel_values and grid."""
    _, model = checkpoint
    rows, grids_per_row = rows_with_images(model.config)
    row, grids = rows[1], grids_per_row[1]
    patches = patches_of(grids)
    images = [{"pixel_values": mx.array(p), "image_grid_thw": mx.array(np.array(g, np.int32))}
              for p, g in zip(patches, grids, strict=True)]
    hidden = np.array(ours.embed_with_images(mx.array([row]), images))[0]
    assert_rows_match(hidden, reference_hidden(model, row, np.concatenate(patches), grids))
