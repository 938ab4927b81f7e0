"""SigLIP's text tower against transformers (SiglipModel.get_text_features, SiglipTextModel) on tiny random
checkpoints: fixed 64-token rows padded with the pad token, no mask, last position then the head."""
from __future__ import annotations

import numpy as np
import pytest

from engine import Pooling
from engine.errors import InputTooLong, UnsupportedCheckpoint
from tests.engine.families.siglip_fixture import TEXT_WIDTH, make_checkpoint
from tests.engine.helpers import cosine, start_engine, torch

TEXTS = ["a photo of a cat", "A PHOTO of a Cat!!", "two cats sleeping on a red sofa", "dog",
         "the giant panda is a bear species endemic to china", "quarterly revenue grew twelve percent"]
LONG = "the quick brown fox jumps over the lazy dog " * 12  # well over 64 tokens


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("siglip")
    return {"SiglipModel": make_checkpoint(root / "full"), "SiglipTextModel": make_checkpoint(root / "text", text_only=True)}


def reference(folder, texts: list[str], truncation: bool = False) -> tuple[list[list[int]], np.ndarray]:
    """The processor's padded rows and transformers' text embeddings for them (no attention mask, as trained)."""
    import transformers

    t = torch()
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    rows = tok(texts, padding="max_length", max_length=TEXT_WIDTH, truncation=truncation).input_ids
    architecture = transformers.AutoConfig.from_pretrained(folder).architectures[0]
    model = getattr(transformers, architecture).from_pretrained(folder, dtype=t.float32).eval()
    with t.inference_mode():
        if architecture == "SiglipModel":
            out = model.get_text_features(input_ids=t.tensor(rows))
        else:
            out = model(input_ids=t.tensor(rows))
    return rows, out.pooler_output.float().numpy()


@pytest.mark.parametrize("architecture", ["SiglipModel", "SiglipTextModel"])
def test_text_tower_matches_transformers_and_is_batch_invariant(folders, architecture):
    folder = folders[architecture]
    rows, expected = reference(folder, TEXTS)
    eng = start_engine(folder)
    try:
        info = eng.info
        assert (info.model_type, info.pooling, info.max_input_tokens, info.widths) == (
            "siglip" if architecture == "SiglipModel" else "siglip_text_model", Pooling.LAST, TEXT_WIDTH, (TEXT_WIDTH,))
        assert info.n_embd == 32
        token_lists = [eng.encode_prompt([text]) for text in TEXTS]
        # the processor's rows are our tokens followed by pad (</s>, id 1) up to 64
        assert [ids + [1] * (TEXT_WIDTH - len(ids)) for ids in token_lists] == rows
        together = eng.embed(token_lists).vectors
        alone = [eng.embed([ids]).vectors[0] for ids in token_lists]
    finally:
        eng.close()
    for ours, theirs, single in zip(together, expected, alone, strict=True):
        assert cosine(ours, theirs) >= 0.99999
        np.testing.assert_allclose(ours, single, atol=1e-5)
    # punctuation and case are normalized away by the checkpoint's tokenizer: the same vector
    np.testing.assert_allclose(together[0], together[1], atol=1e-6)
    assert cosine(together[0], together[2]) < 0.999  # different texts stay apart


def test_the_per_input_limit_is_64_tokens_and_truncation_keeps_the_closing_token(folders):
    folder = folders["SiglipModel"]
    rows, expected = reference(folder, [LONG], truncation=True)
    eng = start_engine(folder)
    try:
        ids = eng.encode_prompt([LONG])
        assert len(ids) > TEXT_WIDTH
        with pytest.raises(InputTooLong):
            eng.embed([ids], truncate=False)
        result = eng.embed([ids], truncate=True)
    finally:
        eng.close()
    assert result.n_tokens == [TEXT_WIDTH] and rows[0][-1] == 1
    assert cosine(result.vectors[0], expected[0]) >= 0.99999


def test_a_pooling_other_than_the_heads_is_refused(folders):
    with pytest.raises(UnsupportedCheckpoint, match="pools through its own head"):
        start_engine(folders["SiglipTextModel"], pooling=Pooling.MEAN)


def png_images(n: int, seed: int = 0) -> list[bytes]:
    """Random pictures of assorted sizes and modes (RGB, RGBA, grey), PNG-encoded."""
    import io

    from PIL import Image

    rng = np.random.default_rng(seed)
    shapes = [((40, 56, 3), "RGB"), ((32, 32, 4), "RGBA"), ((70, 30), "L"), ((16, 24, 3), "RGB")]
    out = []
    for i in range(n):
        shape, mode = shapes[i % len(shapes)]
        buf = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, shape, dtype=np.uint8), mode).save(buf, "PNG")
        out.append(buf.getvalue())
    return out


def image_reference(folder, images: list[bytes]) -> np.ndarray:
    """transformers' SiglipImageProcessor + SiglipModel.get_image_features on the same encoded images."""
    import io

    import transformers
    from PIL import Image

    t = torch()
    processor = transformers.SiglipImageProcessorPil.from_pretrained(folder)
    pixels = processor([Image.open(io.BytesIO(data)) for data in images], return_tensors="pt")["pixel_values"]
    model = transformers.SiglipModel.from_pretrained(folder, dtype=t.float32).eval()
    with t.inference_mode():
        return model.get_image_features(pixel_values=pixels).pooler_output.float().numpy()


def test_vision_tower_matches_transformers_in_mixed_batches(folders):
    from engine import ImageInput

    folder = folders["SiglipModel"]
    images = png_images(5)
    expected_images = image_reference(folder, images)
    _, expected_texts = reference(folder, TEXTS[:3])
    eng = start_engine(folder)
    try:
        assert eng.info.modalities == ("text", "image") and eng.info.image_tokens == 16
        token_lists = [eng.encode_prompt([text]) for text in TEXTS[:3]]
        mixed = [ImageInput.image(images[0]), token_lists[0], ImageInput.image(images[1]), ImageInput.image(images[2]), token_lists[1],
                 ImageInput.image(images[3]), token_lists[2], ImageInput.image(images[4])]
        result = eng.embed(mixed)
        alone = eng.embed([ImageInput.image(images[2])]).vectors[0]
    finally:
        eng.close()
    got_images = [v for v, item in zip(result.vectors, mixed) if isinstance(item, ImageInput)]
    got_texts = [v for v, item in zip(result.vectors, mixed) if not isinstance(item, ImageInput)]
    for ours, theirs in zip(got_images, expected_images, strict=True):
        assert cosine(ours, theirs) >= 0.9999
    for ours, theirs in zip(got_texts, expected_texts, strict=True):
        assert cosine(ours, theirs) >= 0.99999
    np.testing.assert_allclose(got_images[2], alone, atol=1e-5)
    assert result.n_tokens[0] == 16  # an image counts its patches


def test_bad_images_and_images_for_text_only_models_name_the_input(folders):
    from engine import ImageInput
    from engine.errors import InvalidInput
    from engine.multimodal.images import InvalidImage

    eng = start_engine(folders["SiglipModel"], image_max_pixels=1000)
    try:
        with pytest.raises(InvalidImage, match="input 1: not an image"):
            eng.embed([eng.encode_prompt(["a cat"]), ImageInput.image(b"not an image")])
        with pytest.raises(InvalidImage, match=r"input 0: the image has 2240 pixels.*1000 allowed"):
            eng.embed([ImageInput.image(png_images(1)[0])])
        with pytest.raises(InvalidInput, match="input 0: this model embeds either a text or one image"):
            eng.embed([ImageInput((png_images(4)[3], "a caption"))])
    finally:
        eng.close()
    text_only = start_engine(folders["SiglipTextModel"])
    try:
        assert text_only.info.modalities == ("text",)
        with pytest.raises(InvalidInput, match="input 0 is an image, but this model"):
            text_only.embed([ImageInput.image(png_images(1)[0])])
    finally:
        text_only.close()


SPIECE_TEXTS = ["A photo of a Cat!!", "two  cats, sleeping on a red-sofa.", "  leading and trailing  ", "Hello world",
                "Caf\u00e9 na\u00efve \u2014 r\u00e9sum\u00e9", "\u6771\u4eac \uff12\uff10\uff12\uff14 \uff01", "a\tb\nc",
                "!!!", "zzz qqq"]


def test_a_spiece_model_tokenizes_as_siglip_tokenizer(tmp_path):
    """google/siglip-* folders ship spiece.model only: our tokenizer gives SiglipTokenizer's ids and vectors."""
    from tests.engine.families.siglip_fixture import make_spiece_checkpoint

    folder = make_spiece_checkpoint(tmp_path / "spiece")
    assert not (folder / "tokenizer.json").exists()
    rows, expected = reference(folder, SPIECE_TEXTS)
    eng = start_engine(folder)
    try:
        token_lists = [eng.encode_prompt([text]) for text in SPIECE_TEXTS]
        vectors = eng.embed(token_lists).vectors
    finally:
        eng.close()
    assert [ids + [1] * (TEXT_WIDTH - len(ids)) for ids in token_lists] == rows
    for ours, theirs in zip(vectors, expected, strict=True):
        assert cosine(ours, theirs) >= 0.99999


def test_an_unreadable_spiece_model_is_a_clear_load_error(tmp_path):
    from engine.text.sentencepiece import read_model

    (tmp_path / "spiece.model").write_bytes(b"\x0a\xff\xff\xff\xff\x0f")  # a length past the end of the file
    with pytest.raises(UnsupportedCheckpoint, match="not a SentencePiece model this server can read"):
        read_model(tmp_path / "spiece.model")
