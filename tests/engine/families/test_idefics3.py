"""ColIdefics3 (engine/families/idefics3.py, engine/multimodal/builders/idefics3.py) against colpali-engine's ColIdefics3 on a
tiny random checkpoint: the same ids and pixel values as transformers' Idefics3 processor, the same token vectors
on mixed text and image batches (images several to an input, text between them), the same MaxSim scores."""
from __future__ import annotations

import numpy as np
import pytest

from engine import ImageInput
from engine.errors import InvalidInput, UnsupportedCheckpoint
from tests.engine.families import colidefics3_fixture as fx
from tests.engine.families.test_siglip import png_images
from tests.engine.helpers import cosine, start_engine

QUERIES = ["What was the total revenue in 2023?", "a cat", "where is the signature on the last page?"]
IMAGES = png_images(4, seed=3) + [png_images(1, seed=4)[0]]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return fx.make_checkpoint(tmp_path_factory.mktemp("colidefics3") / "model")


@pytest.fixture(scope="module")
def reference(folder):
    return fx.reference_model(folder), fx.reference_processor(folder)


@pytest.fixture(scope="module")
def engine(folder):
    eng = start_engine(folder)
    yield eng
    eng.close()


def reference_rows(reference, text: str, images: list[bytes]) -> np.ndarray:
    return fx.reference_rows(*reference, text, images)


def assert_rows_match(ours: np.ndarray, theirs: np.ndarray) -> None:
    assert ours.shape == theirs.shape
    assert min(cosine(a, b) for a, b in zip(ours, theirs)) >= 0.9999
    np.testing.assert_allclose(ours, theirs, atol=1e-5, rtol=0)  # the cosine alone misses a wrong image position
    np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)


def test_ids_and_pixels_are_the_reference_processors(folder, engine, reference):
    _, processor = reference
    builder = engine._model.builder
    for data in IMAGES:
        prepared = builder.build([fx.open_image(data)])
        theirs = processor(text=[fx.VISUAL_PROMPT], images=[[fx.open_image(data)]], return_tensors="np")
        assert prepared.ids == theirs["input_ids"][0].tolist()
        (image,) = prepared.images
        np.testing.assert_array_equal(image.arrays["pixel_values"], theirs["pixel_values"][0])
        assert image.n_tokens == len(image.arrays["pixel_values"]) * fx.TOKENS_PER_TILE
    query = builder.build([QUERIES[0]])
    assert query.ids == fx.query_ids(processor, QUERIES[0]) and not query.images
    assert processor.tokenizer.decode(query.ids).startswith("Query: " + QUERIES[0])  # the training releases' prefix


def test_a_checkpoints_own_query_prefix_and_augmentation_token_are_honoured(folder, reference, tmp_path):
    """processor_config.json's query_prefix / query_augmentation_token (read as for ColQwen2); the "\n" stays."""
    import json

    _, processor = reference
    for item in folder.iterdir():
        if item.name != "processor_config.json":
            (tmp_path / item.name).symlink_to(item)
    config = json.loads((folder / "processor_config.json").read_text())
    (tmp_path / "processor_config.json").write_text(
        json.dumps({**config, "query_prefix": "Question: ", "query_augmentation_token": "<|endoftext|>"}))
    eng = start_engine(tmp_path)
    try:
        theirs = processor.tokenizer(text=[fx.query_text(QUERIES[0], "Question: ", "<|endoftext|>" * 10)])
        assert eng._model.builder.build([QUERIES[0]]).ids == theirs["input_ids"][0]
    finally:
        eng.close()
    (tmp_path / "processor_config.json").write_text(json.dumps({**config, "query_prefix": ""}))  # empty: default
    eng = start_engine(tmp_path)
    try:
        assert eng._model.builder.build([QUERIES[0]]).ids == fx.query_ids(processor, QUERIES[0])
    finally:
        eng.close()
    (tmp_path / "processor_config.json").write_text(json.dumps({**config, "query_augmentation_token": 7}))
    with pytest.raises(UnsupportedCheckpoint, match="query_augmentation_token must be a string"):
        start_engine(tmp_path)


def test_mixed_text_and_image_batches_match_colpali(engine, reference):
    prompts = [[QUERIES[0]], ImageInput.image(IMAGES[0]), [QUERIES[1]], ImageInput.image(IMAGES[1]),
               ImageInput((IMAGES[2], IMAGES[3])), ImageInput(("Look at ", IMAGES[4], " and this: ", IMAGES[0])),
               [QUERIES[2]], ImageInput.image(IMAGES[2])]
    result = engine.embed_prompts(prompts)
    expected = [
        reference_rows(reference, fx.query_text(QUERIES[0]), []),
        reference_rows(reference, fx.VISUAL_PROMPT, [IMAGES[0]]),
        reference_rows(reference, fx.query_text(QUERIES[1]), []),
        reference_rows(reference, fx.VISUAL_PROMPT, [IMAGES[1]]),
        reference_rows(reference, "<|im_start|>User:<image><image>Describe the image.<end_of_utterance>\nAssistant:",
                       [IMAGES[2], IMAGES[3]]),
        reference_rows(reference, "<|im_start|>User:Look at <image> and this: <image><end_of_utterance>\nAssistant:",
                       [IMAGES[4], IMAGES[0]]),
        reference_rows(reference, fx.query_text(QUERIES[2]), []),
        reference_rows(reference, fx.VISUAL_PROMPT, [IMAGES[2]]),
    ]
    for ours, theirs in zip(result.vectors, expected, strict=True):
        assert_rows_match(ours, theirs)
    assert result.n_tokens == [len(rows) for rows in expected]  # image tokens counted, padding trimmed


def test_maxsim_scores_match_colpali(engine, reference):
    from engine.compute.maxsim import maxsim_scores

    queries = engine.embed_prompts([[q] for q in QUERIES]).vectors
    pages = engine.embed_prompts([ImageInput.image(d) for d in IMAGES[:3]]).vectors
    ref_queries = fx.reference_queries(*reference, QUERIES)
    ref_pages = fx.reference_images(*reference, IMAGES[:3])
    for query, ref_query in zip(queries, ref_queries, strict=True):
        ours = maxsim_scores(query, pages)
        theirs = [fx.maxsim(ref_query, page) for page in ref_pages]
        np.testing.assert_allclose(ours, theirs, atol=1e-4)


def test_limits_and_refusals(folder, engine):
    too_long = start_engine(folder, max_seq=40)
    try:
        with pytest.raises(InvalidInput, match=r"input \(70 tokens\) exceeds the max_seq limit of 40"):
            too_long.embed_prompts([ImageInput.image(IMAGES[0])])  # 70 tokens; an image is never cut
        assert len(too_long.embed_prompts([[QUERIES[0] * 3]], truncate=True).vectors[0]) == 40
    finally:
        too_long.close()
    with pytest.raises(InvalidInput, match="builds its own query and document prompts"):
        engine.embed_prompts([[QUERIES[0]]], instruction="Find the page")
    with pytest.raises(InvalidInput, match="the image token <image>"):
        engine.embed_prompts([["a <image> here"]])
    with pytest.raises(InvalidInput, match="input 1: not an image"):
        engine.embed_prompts([[QUERIES[0]], ImageInput((b"not an image",))])
    with pytest.raises(UnsupportedCheckpoint, match="multi-vector"):
        start_engine(folder, pooling=__import__("engine").Pooling.MEAN)


def test_encoder_and_mlx_embed_give_rows_and_the_maxsim_matrix(folder, engine, reference, tmp_path, capsys):
    import orjson

    from compat.cli import embed_main
    from engine import Encoder

    page = tmp_path / "page.png"
    page.write_bytes(IMAGES[0])
    expected = [fx.reference_queries(*reference, [QUERIES[1]])[0], fx.reference_images(*reference, [IMAGES[0]])[0]]
    with Encoder(folder) as encoder:
        found = encoder.embed_token_vectors([QUERIES[1]], [IMAGES[0]])
        with pytest.raises(InvalidInput, match="multi-vector"):
            encoder.embed([QUERIES[1]])
    for ours, theirs in zip(found.rows, expected, strict=True):
        assert_rows_match(ours, theirs)
    assert found.n_tokens == [len(rows) for rows in expected]
    assert embed_main(["-m", str(folder), "-p", QUERIES[1], "--image", str(page), "--json"]) == 0
    answer = orjson.loads(capsys.readouterr().out)
    assert answer["shapes"] == [list(rows.shape) for rows in expected] and answer["similarity_kind"] == "maxsim"
    matrix = [[fx.maxsim(q, d) for d in expected] for q in expected]
    np.testing.assert_allclose(answer["similarity"], matrix, atol=1e-4)
    assert embed_main(["-m", str(folder), "-p", QUERIES[1], "--image", str(page)]) == 0
    text = capsys.readouterr().out
    assert text.startswith(f"embedding 0 ({len(expected[0])} tokens, {len(expected[0])} rows of 128 values):\n")
    assert "MaxSim similarity matrix" in text
    # the family's refusal, as on the server's routes (not silently ignored)
    assert embed_main(["-m", str(folder), "-p", QUERIES[1], "--instruction", "Find the page"]) == 1
    assert "builds its own query and document prompts" in capsys.readouterr().err


def test_a_1_dense_folder_replaces_the_projection_as_sentence_transformers_loads_it(folder, tmp_path, reference):
    import shutil

    from safetensors.numpy import save_file

    from tests.engine.helpers import torch

    copy = tmp_path / "with-dense"
    shutil.copytree(folder, copy)
    rng = np.random.default_rng(5)
    model, processor = reference
    weight = rng.standard_normal(model.linear.weight.shape).astype(np.float32) * 0.1
    bias = rng.standard_normal(model.linear.bias.shape).astype(np.float32) * 0.1
    (copy / "1_Dense").mkdir()
    save_file({"linear.weight": weight, "linear.bias": bias}, str(copy / "1_Dense" / "model.safetensors"))
    (copy / "1_Dense" / "config.json").write_text('{"in_features": 48, "out_features": 128, "bias": true, '
                                                  '"activation_function": "torch.nn.modules.linear.Identity"}')
    t = torch()
    original = (model.linear.weight.detach().clone(), model.linear.bias.detach().clone())
    try:
        with t.no_grad():
            model.linear.weight.copy_(t.tensor(weight))
            model.linear.bias.copy_(t.tensor(bias))
        expected = fx.reference_queries(model, processor, [QUERIES[0]])[0]
    finally:
        with t.no_grad():
            model.linear.weight.copy_(original[0])
            model.linear.bias.copy_(original[1])
    eng = start_engine(copy)
    try:
        assert_rows_match(eng.embed_prompts([[QUERIES[0]]]).vectors[0], expected)
    finally:
        eng.close()


def test_an_unreadable_processor_config_is_a_clear_refusal(tmp_path):
    from types import SimpleNamespace

    from engine.multimodal.builders import idefics3 as builder

    (tmp_path / "processor_config.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(UnsupportedCheckpoint, match="processor_config.json: invalid JSON"):
        builder._declared_image_seq_len(SimpleNamespace(path=tmp_path))
