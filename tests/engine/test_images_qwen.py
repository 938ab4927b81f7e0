"""The Qwen2-VL image processor against transformers' Qwen2VLImageProcessorPil on the same encoded images."""
from __future__ import annotations

import io
import json

import numpy as np
import pytest

from engine.errors import UnsupportedCheckpoint
from engine.multimodal.images import InvalidImage
from engine.multimodal.qwen_images import QwenImageProcessor

# (name, preprocessor_config.json, the tower's patch_size): a Qwen2.5-VL export (top-level pixel bounds, CLIP
# statistics) and a Qwen3-VL one (transformers 5's size keys, patch 16, mean and std 0.5)
CONFIGS = {
    "qwen2_5_vl": ({"image_processor_type": "Qwen2VLImageProcessor", "min_pixels": 3136, "max_pixels": 28 * 28 * 40,
                    "patch_size": 14, "temporal_patch_size": 2, "merge_size": 2,
                    "image_mean": [0.48145466, 0.4578275, 0.40821073],
                    "image_std": [0.26862954, 0.26130258, 0.27577711],
                    "size": {"min_pixels": 3136, "max_pixels": 12845056}}, 14),
    "qwen3_vl": ({"image_processor_type": "Qwen2VLImageProcessorFast", "patch_size": 16, "temporal_patch_size": 2,
                  "merge_size": 2, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
                  "size": {"shortest_edge": 64 * 64, "longest_edge": 32 * 32 * 50}}, 16),
}
# odd sizes: below min_pixels, above max_pixels, long strips, sides that round both ways
SIZES = [(37, 91), (300, 17), (5, 5), (1000, 700), (61, 250), (29, 29)]
MODES = ["RGB", "RGBA", "L", "LA", "P", "CMYK", "1", "I;16"]


def encode(width: int, height: int, mode: str, seed: int) -> bytes:
    from PIL import Image

    rng = np.random.default_rng(seed)
    rgba = Image.fromarray(rng.integers(0, 256, (height, width, 4), dtype=np.uint8), "RGBA")
    if mode == "P":
        image = rgba.convert("RGB").convert("P", palette=Image.Palette.ADAPTIVE)
        image.info["transparency"] = 3  # one palette entry is transparent
    elif mode == "I;16":
        image = Image.fromarray(rng.integers(0, 65536, (height, width), dtype=np.uint16))
    else:
        image = rgba.convert(mode)
    buf = io.BytesIO()
    image.save(buf, "TIFF" if mode == "CMYK" else "PNG")
    return buf.getvalue()


@pytest.fixture(scope="module", params=list(CONFIGS))
def processors(request, tmp_path_factory):
    """(ours, transformers') built from the same preprocessor_config.json."""
    import transformers

    config, patch_size = CONFIGS[request.param]
    folder = tmp_path_factory.mktemp(request.param)
    (folder / "preprocessor_config.json").write_text(json.dumps(config))
    ours = QwenImageProcessor.from_checkpoint(folder, patch_size=patch_size, temporal_patch_size=2, merge_size=2)
    return ours, transformers.Qwen2VLImageProcessorPil.from_pretrained(folder)


def reference(processor, data: bytes, drop_alpha: bool = False, size: dict | None = None):
    """size: the pixel bounds for this call ({"shortest_edge": min_pixels, "longest_edge": max_pixels})."""
    from PIL import Image

    image = Image.open(io.BytesIO(data))
    if drop_alpha:  # what colpali-engine's ColQwen2.5 processor does before the image processor
        image = image.convert("RGB")
    out = processor([image], return_tensors="np", **({"size": size} if size else {}))
    return out["pixel_values"], tuple(int(x) for x in out["image_grid_thw"][0])


@pytest.mark.parametrize("size", SIZES)
def test_pixels_and_grid_equal_the_reference_on_odd_sizes(processors, size):
    ours, theirs = processors
    data = encode(*size, "RGB", seed=size[0])
    got = ours(data, max_pixels=10**7)
    pixels, grid = reference(theirs, data)
    assert got.grid_thw == grid
    assert got.pixel_values.shape == pixels.shape and got.pixel_values.dtype == np.float32
    np.testing.assert_allclose(got.pixel_values, pixels, atol=1e-6, rtol=0)
    assert got.n_tokens == int(np.prod(grid)) // 4
    assert got.n_tokens * 4 == got.pixel_values.shape[0]


@pytest.mark.parametrize("mode", MODES)
def test_non_rgb_modes_equal_the_reference(processors, mode):
    ours, theirs = processors
    data = encode(45, 33, mode, seed=7)
    got = ours(data, max_pixels=10**7)
    pixels, grid = reference(theirs, data)
    assert got.grid_thw == grid
    np.testing.assert_allclose(got.pixel_values, pixels, atol=1e-6, rtol=0)


def test_dropping_alpha_equals_the_colqwen_processor(processors, tmp_path):
    _, theirs = processors
    ours = processors[0].__class__(**{**processors[0].__dict__, "drop_alpha_first": True})
    for mode in ("RGBA", "P"):
        data = encode(50, 40, mode, seed=3)
        pixels, grid = reference(theirs, data, drop_alpha=True)
        got = ours(data, max_pixels=10**7)
        assert got.grid_thw == grid
        np.testing.assert_allclose(got.pixel_values, pixels, atol=1e-6, rtol=0)


def test_resized_size_equals_smart_resize(processors):
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

    ours, theirs = processors
    rng = np.random.default_rng(0)
    for height, width in rng.integers(1, 3000, (300, 2)):
        if max(height, width) / min(height, width) > 200:
            continue
        assert ours.resized_size(int(height), int(width)) == smart_resize(
            int(height), int(width), factor=ours.factor, min_pixels=theirs.size["shortest_edge"],
            max_pixels=theirs.size["longest_edge"])


def test_limits_and_bad_images_are_refused(processors):
    ours, _ = processors
    with pytest.raises(InvalidImage, match="aspect ratios up to 200:1"):
        ours(encode(402, 2, "RGB", seed=0), max_pixels=10**7)
    with pytest.raises(InvalidImage, match="more than the 100 allowed"):
        ours(encode(20, 20, "RGB", seed=0), max_pixels=100)
    with pytest.raises(InvalidImage, match="not an image"):
        ours(b"GIF89a nonsense", max_pixels=10**7)
    # formats outside the common ones are never opened: Pillow's EPS plugin would run Ghostscript on them
    with pytest.raises(InvalidImage, match="not an image Pillow can decode .*formats taken: PNG, JPEG"):
        ours(b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 10 10\nshowpage\n", max_pixels=10**7)
    from PIL import Image

    for kind in ("JPEG", "WEBP", "GIF", "BMP", "TIFF"):
        out = io.BytesIO()
        Image.new("RGB", (30, 20)).save(out, format=kind)
        assert ours(out.getvalue(), max_pixels=10**7).grid_thw[0] == 1, kind
    # refused from the header alone, its pixels never decompressed: over our bound, and over Pillow's own
    with pytest.raises(InvalidImage, match=r"1000000 pixels \(1000000x1\), more than the 100 allowed"):
        ours(png_header(1_000_000, 1), max_pixels=100)
    with pytest.raises(InvalidImage, match=r"more pixels than Pillow opens .* at most 100 are allowed"):
        ours(png_header(100_000, 100_000), max_pixels=100)


def png_header(width: int, height: int) -> bytes:
    """The signature, IHDR and a first IDAT chunk of a PNG claiming width x height pixels: enough to open."""
    import struct
    import zlib

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", b"\0" * 4))


def test_checkpoint_bounds_and_geometry(tmp_path):
    def load(config: dict, patch_size: int = 14) -> QwenImageProcessor:
        (tmp_path / "preprocessor_config.json").write_text(json.dumps(config))
        return QwenImageProcessor.from_checkpoint(tmp_path, patch_size=patch_size, temporal_patch_size=2,
                                                  merge_size=2)

    got = load({"min_pixels": 100, "max_pixels": 5000, "size": {"shortest_edge": 1, "longest_edge": 2}})
    assert (got.min_pixels, got.max_pixels) == (100, 5000)
    got = load({"size": {"shortest_edge": 200, "longest_edge": 6000}})
    assert (got.min_pixels, got.max_pixels) == (200, 6000)
    got = load({})
    assert (got.min_pixels, got.max_pixels, got.factor) == (3136, 28 * 28 * 1280, 28)
    with pytest.raises(UnsupportedCheckpoint, match="patch_size is 14, but the vision tower's is 16"):
        load({"patch_size": 14}, patch_size=16)
    with pytest.raises(UnsupportedCheckpoint, match="'SiglipImageProcessor' is not supported"):
        load({"image_processor_type": "SiglipImageProcessor"})


# (--image-min-tokens, --image-max-tokens): both set, only one (the other stays the checkpoint's), a bound that
# meets the image's own size, one token at most
TOKEN_BOUNDS = [(2, 6), (-1, 5), (12, -1), (30, 30), (1, 1), (0, 4)]


@pytest.mark.parametrize("bounds", TOKEN_BOUNDS)
def test_token_bounds_give_the_reference_with_those_pixel_bounds(processors, bounds):
    """llama.cpp's reading: N tokens are N x (patch x merge)^2 pixels; the reference gets those pixel bounds."""
    ours, theirs = processors
    bounded = ours.with_token_bounds(*bounds)
    block = ours.factor ** 2
    size = {"shortest_edge": bounds[0] * block if bounds[0] > 0 else ours.min_pixels,
            "longest_edge": bounds[1] * block if bounds[1] > 0 else ours.max_pixels}
    low, high = bounded.token_bounds
    for width, height in [(37, 91), (300, 17), (5, 5), (1000, 700), (130, 129)]:
        data = encode(width, height, "RGB", seed=width)
        got = bounded(data, max_pixels=10**7)
        pixels, grid = reference(theirs, data, size=size)
        assert got.grid_thw == grid
        np.testing.assert_allclose(got.pixel_values, pixels, atol=1e-6, rtol=0)
        assert got.n_tokens == int(np.prod(grid)) // 4
        if (width, height) == (1000, 700):  # shrunk to the maximum (rounding down)
            assert got.n_tokens <= high
        if (width, height) == (5, 5):  # grown to the minimum (rounding up, which may pass a close maximum)
            assert got.n_tokens >= low


def test_unset_token_bounds_keep_the_checkpoint_and_crossed_ones_are_refused(processors):
    ours, _ = processors
    assert ours.with_token_bounds(-1, 0) == ours
    low, high = ours.token_bounds
    with pytest.raises(UnsupportedCheckpoint, match=rf"--image-min-tokens {high + 1} is above this model's most "
                                                    rf"image tokens, {high} .*set --image-max-tokens too"):
        ours.with_token_bounds(high + 1, -1)
    if low > 1:
        with pytest.raises(UnsupportedCheckpoint, match=rf"--image-max-tokens 1 is below this model's fewest image "
                                                        rf"tokens, {low} .*set --image-min-tokens too"):
            ours.with_token_bounds(-1, 1)
    with pytest.raises(UnsupportedCheckpoint, match="--image-min-tokens 9 is above --image-max-tokens 8"):
        ours.with_token_bounds(9, 8)


def test_the_engine_bounds_dynamic_resolution_processors_only(processors, caplog):
    """A builder holding a Qwen2-VL processor gets the bounded one; any other family's processor (a fixed size,
    a tile grid) is left alone and the log names the options it does not use."""
    from types import SimpleNamespace

    from engine.runtime.loader import bound_image_tokens
    from engine.types import EngineOptions

    ours, _ = processors
    options = EngineOptions(image_min_tokens=2, image_max_tokens=6)
    builder = SimpleNamespace(processor=ours)
    assert bound_image_tokens(builder, options, "qwen3_vl") == (2, 6)
    assert builder.processor == ours.with_token_bounds(2, 6)
    assert bound_image_tokens(SimpleNamespace(processor=ours), EngineOptions(), "qwen3_vl") == ours.token_bounds
    assert not caplog.records
    fixed = SimpleNamespace(processor=object())
    assert bound_image_tokens(fixed, options, "llama_nemotron_vl") is None
    assert bound_image_tokens(fixed, EngineOptions(), "idefics3") is None  # unset: nothing to say
    assert [r.getMessage() for r in caplog.records] == [
        "--image-min-tokens and --image-max-tokens: not used by the llama_nemotron_vl family, whose images have a "
        "fixed size or a tile grid; only dynamic-resolution models (Qwen3-VL, ColQwen2) take image token bounds"]
