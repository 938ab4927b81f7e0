"""ColQwen2.5 against colpali-engine's ColQwen2_5 (and transformers' ColQwen2ForRetrieval for the vlm.* layout) on
tiny random checkpoints: mixed text and image batches, per-token vectors and MaxSim scores."""
from __future__ import annotations

import ast
import io
import json
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

from engine.errors import InvalidInput, UnsupportedCheckpoint
from engine.families import colqwen2_5
from engine.images_qwen import QwenImageProcessor
from tests.engine.families import colqwen2_5_fixture as fixture

QUERIES = ["What was the total revenue in 2023?", "A woman playing with her dog on a beach"]
# (width, height, mode): odd sizes giving partial windows, one page with transparency
PAGES = [(200, 150, "RGB"), (90, 260, "RGBA")]


def page(width: int, height: int, mode: str, seed: int) -> bytes:
    from PIL import Image

    rng = np.random.default_rng(seed)
    image = Image.fromarray(rng.integers(0, 256, (height, width, 4), dtype=np.uint8), "RGBA").convert(mode)
    buf = io.BytesIO()
    image.save(buf, "PNG")
    return buf.getvalue()


def load_ours(folder: Path) -> colqwen2_5.Model:
    model = colqwen2_5.Model(colqwen2_5.ModelArgs.from_dict(json.loads((folder / "config.json").read_text())))
    model.load_weights(list(model.sanitize(mx.load(str(folder / "model.safetensors"))).items()), strict=True)
    return model


@pytest.fixture(scope="module")
def colpali(tmp_path_factory):
    import transformers

    folder = tmp_path_factory.mktemp("colqwen2_5")
    reference = fixture.make_checkpoint(folder)
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    return folder, reference, tokenizer, load_ours(folder)


def expand(ids: list[int], model: colqwen2_5.Model, image) -> list[int]:
    """The prompt's one <|image_pad|> grown to the image's token count."""
    at = ids.index(model.image_token_id)
    return ids[:at] + [model.image_token_id] * model.image_token_count(image.grid_thw) + ids[at + 1:]


def our_inputs(folder: Path, tokenizer, model: colqwen2_5.Model):
    """Queries and pages as the family prompts them: ids per item, and each item's images."""
    processor = QwenImageProcessor.from_checkpoint(folder, 14, 2, 2, drop_alpha_first=True)
    items = [(tokenizer(colqwen2_5.QUERY_PREFIX + q + colqwen2_5.QUERY_SUFFIX)["input_ids"], []) for q in QUERIES]
    for i, (width, height, mode) in enumerate(PAGES):
        image = processor(page(width, height, mode, seed=i), max_pixels=10**7)
        items.append((expand(tokenizer(colqwen2_5.DOCUMENT_PROMPT)["input_ids"], model, image), [image]))
    return items


def reference_vectors(folder: Path, reference, tokenizer, image_token_id: int) -> list[np.ndarray]:
    """Each item alone through the torch model, inputs built as colpali-engine's processor builds them (the
    page converted to RGB, then Qwen2-VL's image processor; the prompt's <|image_pad|> repeated per merged patch)."""
    import torch
    import transformers
    from PIL import Image

    image_processor = transformers.Qwen2VLImageProcessorPil.from_pretrained(folder)
    prompts = fixture.colpali_prompts()
    out = []
    with torch.no_grad():
        for query in QUERIES:
            ids = torch.tensor([tokenizer(query + prompts["query_augmentation_token"] * 10)["input_ids"]])
            out.append(reference(input_ids=ids, attention_mask=torch.ones_like(ids))[0].numpy())
        for i, (width, height, mode) in enumerate(PAGES):
            pixels = image_processor([Image.open(io.BytesIO(page(width, height, mode, seed=i))).convert("RGB")],
                                     return_tensors="pt")
            text = prompts["visual_prompt_prefix"].replace(
                "<|image_pad|>", "<|image_pad|>" * (int(pixels["image_grid_thw"].prod()) // 4))
            ids = torch.tensor([tokenizer(text)["input_ids"]])
            out.append(reference(input_ids=ids, attention_mask=torch.ones_like(ids),
                                 mm_token_type_ids=(ids == image_token_id).int(),
                                 pixel_values=pixels["pixel_values"][None],
                                 image_grid_thw=pixels["image_grid_thw"])[0].numpy())
    return out


def run_padded(model: colqwen2_5.Model, items, rows: list[int]) -> list[np.ndarray]:
    """The chosen items in one right-padded batch -> each one's real-token vectors."""
    width = max(len(items[r][0]) for r in rows)
    ids = np.zeros((len(rows), width), dtype=np.int32)
    mask = np.zeros_like(ids)
    for b, r in enumerate(rows):
        ids[b, :len(items[r][0])], mask[b, :len(items[r][0])] = items[r][0], 1
    images = [image for r in rows for image in items[r][1]]
    patches = mx.array(np.concatenate([image.pixel_values for image in images])) if images else None
    out = np.array(model.forward(mx.array(ids), mx.array(mask), patches, [image.grid_thw for image in images]))
    assert np.all(out[mask == 0] == 0)  # padding rows zeroed
    return [out[b, :len(items[r][0])] for b, r in enumerate(rows)]


def maxsim(query: np.ndarray, doc: np.ndarray) -> float:
    return float((query @ doc.T).max(axis=1).sum())


def assert_rows_match(ours: np.ndarray, theirs: np.ndarray) -> None:
    assert ours.shape == theirs.shape
    cosine = (ours * theirs).sum(-1) / np.linalg.norm(ours, axis=-1) / np.linalg.norm(theirs, axis=-1)
    assert cosine.min() >= 0.9999, cosine.min()


def test_prompts_are_colpali_engines():
    prompts = fixture.colpali_prompts()
    assert colqwen2_5.DOCUMENT_PROMPT == prompts["visual_prompt_prefix"]
    assert colqwen2_5.QUERY_PREFIX == prompts.get("query_prefix", "")
    assert colqwen2_5.QUERY_SUFFIX == prompts["query_augmentation_token"] * 10


def test_mixed_batches_match_colpali_engine(colpali):
    folder, reference, tokenizer, model = colpali
    items = our_inputs(folder, tokenizer, model)
    expected = reference_vectors(folder, reference, tokenizer, model.args.image_token_id)
    # a text row, an image row and a text row together; the second page alone (images may share a batch
    # with text rows: each row gets its own positions)
    got = run_padded(model, items, [0, 2, 1]) + run_padded(model, items, [3])
    got = [got[0], got[2], got[1], got[3]]
    for ours, theirs in zip(got, expected, strict=True):
        assert_rows_match(ours, theirs)
        np.testing.assert_allclose(np.linalg.norm(ours, axis=-1), 1.0, atol=1e-5)
    for q in range(len(QUERIES)):
        for d in range(len(QUERIES), len(items)):
            assert abs(maxsim(got[q], got[d]) - maxsim(expected[q], expected[d])) < 1e-4
    assert got[2].shape[0] == len(items[2][0]) and items[2][1][0].n_tokens == 35  # 10 x 14 patches / 4


def test_text_only_batch_is_batch_invariant(colpali):
    folder, _, tokenizer, model = colpali
    items = our_inputs(folder, tokenizer, model)[:2]
    together = run_padded(model, items, [0, 1])
    for i in range(2):
        np.testing.assert_allclose(together[i], run_padded(model, items, [i])[0], atol=1e-5)


def test_mlx_and_transformers5_layouts_load_the_same_weights(colpali):
    """An MLX conversion (vision_tower.*, channels-last Conv3d filter) and transformers 5's own save
    (language_model.*) sanitize to the same parameters as the colpali layout."""
    folder, _, _, model = colpali
    raw = mx.load(str(folder / "model.safetensors"))
    expected = model.sanitize(raw)
    mlx_layout = {(k.replace("visual.", "vision_tower.", 1) if k.startswith("visual.") else k):
                  (v.transpose(0, 2, 3, 4, 1) if k.endswith("patch_embed.proj.weight") else v) for k, v in raw.items()}
    hf5_layout = {("language_model." + k.removeprefix("model.")) if k.startswith("model.") else k: v
                  for k, v in raw.items()}
    for layout in (mlx_layout, hf5_layout):
        got = model.sanitize(layout)
        assert got.keys() == expected.keys()
        for key in got:
            np.testing.assert_array_equal(np.array(got[key]), np.array(expected[key]))


def test_transformers_retrieval_export(tmp_path):
    """vlm.* / embedding_proj_layer.*: the same vectors as ColQwen2ForRetrieval given colpali-engine's M-RoPE
    positions (transformers' forward itself never passes the image grid to the VLM, so left alone it would
    give an image sequential positions)."""
    import torch
    import transformers
    from PIL import Image

    reference = fixture.make_transformers_export(tmp_path)
    model = load_ours(tmp_path)
    tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path)
    processor = QwenImageProcessor.from_checkpoint(tmp_path, 14, 2, 2, drop_alpha_first=True)
    data = page(120, 100, "RGB", seed=5)
    image = processor(data, max_pixels=10**7)
    doc = expand(tokenizer(colqwen2_5.DOCUMENT_PROMPT)["input_ids"], model, image)
    query = tokenizer(QUERIES[0] + colqwen2_5.QUERY_SUFFIX)["input_ids"]
    ours = run_padded(model, [(query, []), (doc, [image])], [0, 1])
    pixels = transformers.Qwen2VLImageProcessorPil.from_pretrained(tmp_path)([Image.open(io.BytesIO(data))],
                                                                             return_tensors="pt")
    with torch.no_grad():
        q = torch.tensor([query])
        theirs_query = reference(input_ids=q, attention_mask=torch.ones_like(q)).embeddings[0].numpy()
        d = torch.tensor([doc])
        positions, _ = reference.vlm.get_rope_index(d, mm_token_type_ids=(d == model.args.image_token_id).int(),
                                                    image_grid_thw=pixels["image_grid_thw"])
        theirs_doc = reference(input_ids=d, attention_mask=torch.ones_like(d), position_ids=positions,
                               pixel_values=pixels["pixel_values"][None],
                               image_grid_thw=pixels["image_grid_thw"]).embeddings[0].numpy()
    assert_rows_match(ours[0], theirs_query)
    assert_rows_match(ours[1], theirs_doc)


def test_unsupported_configs_and_bad_placeholders(colpali):
    folder, _, tokenizer, model = colpali
    with pytest.raises(UnsupportedCheckpoint, match="'qwen2_vl' are not supported"):
        colqwen2_5.ModelArgs.from_dict({"model_type": "colqwen2", "vlm_config": {"model_type": "qwen2_vl"}})
    items = our_inputs(folder, tokenizer, model)
    ids, images = items[2]
    short = ids.copy()
    short.remove(model.image_token_id)  # one placeholder fewer than the image's tokens
    with pytest.raises(InvalidInput, match="a run of 34 image tokens for an image of 35 tokens"):
        model.forward(mx.array([short]), mx.ones((1, len(short)), dtype=mx.int32),
                      mx.array(images[0].pixel_values), [images[0].grid_thw])
