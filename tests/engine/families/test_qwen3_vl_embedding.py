"""Qwen3-VL-Embedding through the engine against the reference recipe on a tiny random checkpoint: the prompt
rendered by the checkpoint's chat template (instruction as the system message), images through transformers'
Qwen2VLImageProcessorPil with the checkpoint's pixel bounds and their <|image_pad|> expanded to the processor's
token count, transformers' Qwen3VLModel, the last token's hidden state."""
from __future__ import annotations

import numpy as np
import pytest

from engine.types import ImageInput
from tests.engine.families.qwen3_vl_fixture import (
    IMAGE_PAD,
    QUERY_PROMPT,
    embedding_reference,
    make_embedding_checkpoint,
    png_image,
)
from tests.engine.helpers import cosine, start_engine

MIN_COSINE = 0.9999


# 4, 18 and 40 image tokens (the last one shrunk to the checkpoint's max_pixels)
IMAGES = [png_image(50, 70, 1), png_image(200, 90, 2), png_image(330, 260, 3)]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return make_embedding_checkpoint(tmp_path_factory.mktemp("qwen3-vl-embedding") / "model")


@pytest.fixture(scope="module")
def engine(checkpoint):
    eng = start_engine(checkpoint[0])
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def reference(checkpoint):
    return embedding_reference(*checkpoint)


MIXED = [["A woman playing with her dog on a beach"], (IMAGES[0],), (IMAGES[1], "a chart of revenue"),
         ["Quarterly revenue report for a software company"], ("Look: ", IMAGES[2], " and after it ", IMAGES[0])]


def as_input(parts):
    return ImageInput(tuple(parts)) if any(isinstance(p, bytes) for p in parts) else list(parts)


def test_mixed_text_and_image_batch_matches_the_reference(engine, reference):
    result = engine.embed_prompts([as_input(parts) for parts in MIXED])
    for parts, got, n_tokens in zip(MIXED, result.vectors, result.n_tokens, strict=True):
        expected, n_ids = reference(list(parts))
        assert cosine(got, expected) >= MIN_COSINE, parts
        assert n_tokens == n_ids  # usage counts every expanded image token


def test_instruction_and_prompt_name_become_the_system_message(engine, reference):
    parts = (IMAGES[1], "revenue")
    got = engine.embed_prompts([as_input(parts)], instruction="Find the chart  ").vectors[0]
    assert cosine(got, reference(list(parts), "Find the chart.")[0]) >= MIN_COSINE  # trimmed, full stop added
    got = engine.embed_prompts([["revenue?"]], prompt_name="query").vectors[0]
    assert cosine(got, reference(["revenue?"], QUERY_PROMPT + ".")[0]) >= MIN_COSINE
    kept = engine.embed_prompts([["revenue?"]], instruction="Does it end well?").vectors[0]
    assert cosine(kept, reference(["revenue?"], "Does it end well?")[0]) >= MIN_COSINE


def test_a_vector_does_not_depend_on_its_batch(engine):
    together = engine.embed_prompts([as_input(parts) for parts in MIXED]).vectors
    for parts, vector in zip(MIXED, together, strict=True):
        alone = engine.embed_prompts([as_input(parts)]).vectors[0]
        np.testing.assert_allclose(vector, alone, atol=1e-5, rtol=0)


def test_the_image_pad_token_in_text_is_refused(engine):
    from engine.errors import InvalidInput

    with pytest.raises(InvalidInput, match="^input 1: the text holds .*, which only an image"):
        engine.embed_prompts([["fine"], [f"sneaky {IMAGE_PAD}"]])
    with pytest.raises(InvalidInput, match="^input 0: the text holds"):
        engine.embed_prompts([ImageInput((IMAGES[0], f"sneaky {IMAGE_PAD}"))])


def test_an_over_long_input_holding_images_is_refused_even_when_truncating(engine):
    from engine.errors import InputTooLong, InvalidInput

    long_text = "word " * (engine.info.max_input_tokens + 10)
    with pytest.raises(InvalidInput, match="input 1 .* is never truncated: send less text or smaller images"):
        engine.embed_prompts([["short"], ImageInput((IMAGES[0], long_text))], truncate=True)
    with pytest.raises(InputTooLong):
        engine.embed_prompts([ImageInput((IMAGES[0], long_text))], truncate=False)
    assert engine.embed_prompts([[long_text]], truncate=True).n_tokens == [engine.info.truncate_tokens]


def test_images_are_decoded_and_preprocessed_off_the_engine_thread(engine, monkeypatch):
    import threading

    import engine.multimodal.images as images_module
    import engine.compute.pipeline as pipeline_module

    threads: dict[str, set[str]] = {"decode": set(), "build": set(), "model": set()}

    def spy(kind, function):
        def recorded(*args, **kwargs):
            threads[kind].add(threading.current_thread().name)
            return function(*args, **kwargs)
        return recorded

    builder = type(engine._model.builder)
    monkeypatch.setattr("engine.runtime.engine.decode", spy("decode", images_module.decode))
    monkeypatch.setattr(builder, "build", spy("build", builder.build))
    monkeypatch.setattr(pipeline_module, "to_device", spy("model", pipeline_module.to_device))
    engine.embed_prompts([as_input((IMAGES[0], "a caption")), ["text"]])
    assert threads["decode"] and threads["build"] and threads["model"]
    assert threads["model"].isdisjoint(threads["decode"] | threads["build"]), threads


def test_detection_and_what_the_engine_reports(engine, tmp_path):
    import json

    from engine import Pooling
    from engine.loading import formats, registry
    from engine.errors import UnsupportedCheckpoint

    info = engine.info
    assert (info.model_type, info.pooling, info.modalities) == ("qwen3_vl", Pooling.LAST, ("text", "image"))
    assert info.vision_language and not info.multi_vector
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen3_vl", "architectures": ["Qwen3VLFoo"]}))
    with pytest.raises(UnsupportedCheckpoint, match="Qwen3VLForConditionalGeneration, Qwen3VLForEmbedding"):
        registry.kind_of(formats.open_checkpoint(tmp_path))


def test_offline_encoder_builds_prompts_as_the_server_does(checkpoint, reference):
    """mlx-embed / Encoder: texts, images and corpus rows all go through the chat template; a bad row is
    reported alone."""
    from engine.offline import Encoder

    folder, _ = checkpoint
    with Encoder(str(folder), threads=2) as encoder:
        text = encoder.embed(["revenue?"], instruction="Find it").vectors[0]
        image = encoder.embed_images([IMAGES[0]]).vectors[0]
        rows = encoder.encode_rows(["revenue?", "", f"bad {IMAGE_PAD}", "chart"], batch_size=4)
    assert cosine(text, reference(["revenue?"], "Find it.")[0]) >= MIN_COSINE
    assert cosine(image, reference([IMAGES[0]])[0]) >= MIN_COSINE
    assert rows.errors[0] is None and rows.errors[3] is None
    assert rows.errors[1] == "empty text" and "only an image" in rows.errors[2]
    for i, text in ((0, "revenue?"), (3, "chart")):
        expected, n_ids = reference([text])
        assert cosine(rows.vectors[i], expected) >= MIN_COSINE and rows.n_tokens[i] == n_ids


def test_a_processor_chat_template_json_is_read(checkpoint, reference, tmp_path):
    """Qwen-VL exports of the processor era ship the template as chat_template.json."""
    import json
    import shutil

    from tests.engine.families.qwen3_vl_fixture import CHAT_TEMPLATE

    folder = shutil.copytree(checkpoint[0], tmp_path / "model")
    (folder / "chat_template.jinja").unlink()
    (folder / "chat_template.json").write_text(json.dumps({"chat_template": CHAT_TEMPLATE}), encoding="utf-8")
    eng = start_engine(folder)
    try:
        got = eng.embed_prompts([as_input((IMAGES[0], "a caption"))]).vectors[0]
    finally:
        eng.close()
    assert cosine(got, reference([IMAGES[0], "a caption"])[0]) >= MIN_COSINE
