"""Image bytes -> the pixel array a vision tower takes, exactly as the checkpoint's image processor makes it.

Runs on the request thread (never the engine thread). Decoding is bounded: the header is read first and an
image with more pixels than allowed is refused before its pixels are decompressed.
"""
from __future__ import annotations

import io
import json
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from engine.errors import InvalidInput, UnsupportedCheckpoint

# The processors whose fixed-size recipe (convert to RGB, resize to height x width, rescale, normalize) this
# module reproduces; their defaults where preprocessor_config.json leaves a key out.
_FIXED_SIZE_PROCESSORS = {"SiglipImageProcessor", "SiglipImageProcessorFast", "SiglipImageProcessorPil"}
_DEFAULTS = {"do_resize": True, "do_rescale": True, "do_normalize": True, "do_convert_rgb": True,
             "resample": 3, "rescale_factor": 1 / 255, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]}


# The formats an image may be in: the common web and camera ones (Pillow's JPEG opener also reads a camera's
# multi-picture JPEG). Pillow would otherwise try every plugin it has, EPS among them, whose load() runs
# Ghostscript on the client's bytes.
FORMATS = ("PNG", "JPEG", "WEBP", "GIF", "BMP", "TIFF", "PPM", "TGA")


class InvalidImage(InvalidInput):
    """Bytes that are not an image we can decode, or an image over the limits."""


@dataclass(frozen=True)
class ImageProcessor:
    height: int
    width: int
    resample: int  # PIL's filter number (3 = bicubic)
    do_resize: bool
    do_rescale: bool
    rescale_factor: float
    do_normalize: bool
    mean: tuple[float, ...]
    std: tuple[float, ...]
    do_convert_rgb: bool

    @classmethod
    def from_checkpoint(cls, folder: Path, image_size: int) -> ImageProcessor:
        """preprocessor_config.json's recipe, or the family's default one (a square of the tower's size)."""
        path, config = read_processor_config(folder, _FIXED_SIZE_PROCESSORS, "SiglipImageProcessor")
        merged = {**_DEFAULTS, **config}
        size = merged.get("size") or {"height": image_size, "width": image_size}
        if set(size) != {"height", "width"}:
            raise UnsupportedCheckpoint(f"{path}: image size {size} is not supported (only height and width)")
        if (size["height"], size["width"]) != (image_size, image_size):
            raise UnsupportedCheckpoint(f"{path}: the processor makes {size['height']}x{size['width']} images; "
                                        f"the vision tower takes {image_size}x{image_size}")
        return cls(height=int(size["height"]), width=int(size["width"]), resample=int(merged["resample"]),
                   do_resize=bool(merged["do_resize"]), do_rescale=bool(merged["do_rescale"]),
                   rescale_factor=float(merged["rescale_factor"]), do_normalize=bool(merged["do_normalize"]),
                   mean=tuple(float(m) for m in merged["image_mean"]), std=tuple(float(s) for s in merged["image_std"]),
                   do_convert_rgb=bool(merged["do_convert_rgb"]))

    def __call__(self, data: bytes, max_pixels: int) -> np.ndarray:
        """Encoded image -> float32 [3, height, width]."""
        image = decode(data, max_pixels)
        if self.do_convert_rgb or image.mode != "RGB":
            image = to_rgb(image)
        if self.do_resize:
            image = image.resize((self.width, self.height), resample=self.resample)
        elif image.size != (self.width, self.height):
            raise InvalidImage(f"the image is {image.width}x{image.height}; this model takes "
                               f"{self.width}x{self.height} and its processor does not resize")
        pixels = rescale_and_normalize(np.asarray(image), self.rescale_factor if self.do_rescale else None,
                                       (self.mean, self.std) if self.do_normalize else None)
        return np.ascontiguousarray(pixels.transpose(2, 0, 1))


def read_processor_config(folder: Path, supported: set[str], default_kind: str) -> tuple[Path, dict]:
    """preprocessor_config.json ({} when absent), refused unless its image_processor_type is one we reproduce."""
    path = folder / "preprocessor_config.json"
    config = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    kind = config.get("image_processor_type", default_kind)
    if kind not in supported:
        raise UnsupportedCheckpoint(f"{path}: image processor {kind!r} is not supported "
                                    f"(supported: {', '.join(sorted(supported))})")
    return path, config


def rescale_and_normalize(pixels: np.ndarray, rescale_factor: float | None,
                          mean_std: tuple[tuple[float, ...], tuple[float, ...]] | None) -> np.ndarray:
    """uint8 [H, W, C] -> float32, each step optional, rounded in the reference processors' order."""
    if rescale_factor is not None:  # in float64, then float32
        pixels = (pixels.astype(np.float64) * rescale_factor).astype(np.float32)
    pixels = pixels.astype(np.float32)
    if mean_std is not None:
        pixels = (pixels - np.array(mean_std[0], np.float32)) / np.array(mean_std[1], np.float32)
    return pixels


def decode(data: bytes, max_pixels: int):
    """Open an encoded image, refusing it by its header when it has more than max_pixels pixels."""
    from PIL import Image  # lazy: text-only servers never pay for Pillow's import

    # our bound applies instead of Pillow's warning (emitted at open, from 89 M pixels); a process-wide filter,
    # since warnings.catch_warnings is not thread-safe and request threads decode concurrently
    warnings.filterwarnings("ignore", category=Image.DecompressionBombWarning)
    try:
        image = Image.open(io.BytesIO(data), formats=FORMATS)
    except Image.DecompressionBombError:  # Pillow's own bound (twice Image.MAX_IMAGE_PIXELS), checked at open
        raise InvalidImage(f"the image has more pixels than Pillow opens ({2 * Image.MAX_IMAGE_PIXELS}); at most "
                           f"{max_pixels} are allowed (--image-max-pixels)") from None
    except Exception as exc:  # Pillow raises several unrelated types for undecodable bytes
        raise InvalidImage(f"not an image Pillow can decode ({type(exc).__name__}; formats taken: "
                           f"{', '.join(FORMATS)})") from None
    pixels = image.width * image.height
    if pixels > max_pixels:
        raise InvalidImage(f"the image has {pixels} pixels ({image.width}x{image.height}), more than the "
                           f"{max_pixels} allowed (--image-max-pixels)")
    if pixels == 0:
        raise InvalidImage("the image has no pixels")
    try:
        image.load()
    except Exception as exc:
        raise InvalidImage(f"the image data is damaged ({type(exc).__name__}: {exc})") from None
    return image


def to_rgb(image):
    """RGB, compositing any transparency onto white (what the reference processor does)."""
    from PIL import Image

    if "A" in image.getbands() or image.info.get("transparency") is not None:
        rgba = image.convert("RGBA")
        return Image.alpha_composite(Image.new("RGBA", rgba.size, (255, 255, 255, 255)), rgba).convert("RGB")
    return image.convert("RGB")
