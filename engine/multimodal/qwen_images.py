"""Image bytes -> the flattened patches and grid a Qwen2-VL-style vision tower takes (Qwen2.5-VL, Qwen3-VL).

The recipe is transformers' Qwen2VLImageProcessor: resize to a size whose sides are multiples of
patch_size * merge_size and whose area lies within [min_pixels, max_pixels] (keeping the aspect ratio), rescale,
normalize, repeat the still image temporal_patch_size times (the tower's patch embedding is a 3-D convolution over
frames), and flatten into one row per patch, ordered so that each merge_size x merge_size block of patches is
contiguous (the tower's patch merger concatenates such blocks). Runs on the request thread.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from engine.errors import UnsupportedCheckpoint
from engine.multimodal.images import InvalidImage, decode, read_processor_config, rescale_and_normalize, to_rgb

_PROCESSORS = {"Qwen2VLImageProcessor", "Qwen2VLImageProcessorFast", "Qwen2VLImageProcessorPil"}
# transformers' class defaults for keys preprocessor_config.json leaves out (OpenAI CLIP's mean and std)
_DEFAULTS = {"do_resize": True, "do_rescale": True, "do_normalize": True, "do_convert_rgb": True, "resample": 3,
             "rescale_factor": 1 / 255, "image_mean": [0.48145466, 0.4578275, 0.40821073],
             "image_std": [0.26862954, 0.26130258, 0.27577711], "min_pixels": 56 * 56, "max_pixels": 28 * 28 * 1280}
_MAX_ASPECT_RATIO = 200  # the reference refuses longer strips


@dataclass(frozen=True)
class QwenImage:
    """One processed image: pixel_values [n_patches, C * T * P * P] and its (t, h, w) patch grid."""
    pixel_values: np.ndarray
    grid_thw: tuple[int, int, int]
    merge_size: int

    @property
    def n_tokens(self) -> int:
        """The decoder positions this image takes: one per merged merge_size x merge_size block."""
        t, h, w = self.grid_thw
        return t * h * w // self.merge_size ** 2


@dataclass(frozen=True)
class QwenImageProcessor:
    patch_size: int
    temporal_patch_size: int
    merge_size: int
    min_pixels: int
    max_pixels: int
    resample: int  # PIL's filter number (3 = bicubic)
    do_resize: bool
    rescale_factor: float | None  # None: no rescaling
    mean_std: tuple[tuple[float, ...], tuple[float, ...]] | None  # None: no normalization
    convert_rgb: bool  # the processor's RGB conversion: transparency composited onto white
    drop_alpha_first: bool  # a plain PIL convert('RGB') before it (colpali-engine's ColQwen2.5 processor does)

    @classmethod
    def from_checkpoint(cls, folder: Path, patch_size: int, temporal_patch_size: int, merge_size: int,
                        drop_alpha_first: bool = False) -> QwenImageProcessor:
        """preprocessor_config.json's recipe, checked against the vision tower's patch geometry (given).

        Pixel bounds: top-level min_pixels / max_pixels win over size's shortest_edge / longest_edge (transformers 5
        spells them so; older exports put min_pixels / max_pixels inside size), as in transformers.
        """
        path, config = read_processor_config(folder, _PROCESSORS, "Qwen2VLImageProcessor")
        tower = {"patch_size": patch_size, "temporal_patch_size": temporal_patch_size, "merge_size": merge_size}
        for key, value in tower.items():
            if config.get(key, value) != value:
                raise UnsupportedCheckpoint(f"{path}: {key} is {config[key]}, but the vision tower's is {value}")
        merged = {**_DEFAULTS, **config}
        size = config.get("size") or {}
        bounds = {}
        for key, size_keys in (("min_pixels", ("shortest_edge", "min_pixels")),
                               ("max_pixels", ("longest_edge", "max_pixels"))):
            found = [config[key]] if config.get(key) is not None else [size[k] for k in size_keys if size.get(k)]
            bounds[key] = int(found[0]) if found else _DEFAULTS[key]
        if not 0 < bounds["min_pixels"] <= bounds["max_pixels"]:
            raise UnsupportedCheckpoint(f"{path}: pixel bounds {bounds} are not 0 < min_pixels <= max_pixels")
        return cls(patch_size=patch_size, temporal_patch_size=temporal_patch_size, merge_size=merge_size,
                   min_pixels=bounds["min_pixels"], max_pixels=bounds["max_pixels"], resample=int(merged["resample"]),
                   do_resize=bool(merged["do_resize"]),
                   rescale_factor=float(merged["rescale_factor"]) if merged["do_rescale"] else None,
                   mean_std=(tuple(float(m) for m in merged["image_mean"]),
                             tuple(float(s) for s in merged["image_std"])) if merged["do_normalize"] else None,
                   convert_rgb=bool(merged["do_convert_rgb"]), drop_alpha_first=drop_alpha_first)

    @property
    def factor(self) -> int:
        """Both resized sides are multiples of this: one merged block of patches."""
        return self.patch_size * self.merge_size

    @property
    def token_bounds(self) -> tuple[int, int]:
        """The fewest and most image tokens the pixel bounds allow (one token per factor x factor block)."""
        block = self.factor ** 2
        return -(-self.min_pixels // block), self.max_pixels // block

    def with_token_bounds(self, min_tokens: int, max_tokens: int) -> QwenImageProcessor:
        """This processor with its pixel bounds set from token bounds, as llama.cpp's --image-min-tokens /
        --image-max-tokens set them: tokens x factor^2 pixels; a bound <= 0 keeps the checkpoint's."""
        block = self.factor ** 2
        min_pixels = min_tokens * block if min_tokens > 0 else self.min_pixels
        max_pixels = max_tokens * block if max_tokens > 0 else self.max_pixels
        if min_pixels > max_pixels:  # llama.cpp refuses such bounds too
            low, high = self.token_bounds
            if max_tokens <= 0:
                problem = (f"--image-min-tokens {min_tokens} is above this model's most image tokens, {high} "
                           f"(max_pixels {self.max_pixels} of its preprocessor_config.json); set --image-max-tokens too")
            elif min_tokens <= 0:
                problem = (f"--image-max-tokens {max_tokens} is below this model's fewest image tokens, {low} "
                           f"(min_pixels {self.min_pixels} of its preprocessor_config.json); set --image-min-tokens too")
            else:
                problem = f"--image-min-tokens {min_tokens} is above --image-max-tokens {max_tokens}"
            raise UnsupportedCheckpoint(problem)
        return dataclasses.replace(self, min_pixels=min_pixels, max_pixels=max_pixels)

    def resized_size(self, height: int, width: int) -> tuple[int, int]:
        """The (height, width) an image is resized to: multiples of factor, area within the pixel bounds."""
        ratio = max(height, width) / min(height, width)
        if ratio > _MAX_ASPECT_RATIO:
            raise InvalidImage(f"the image is {width}x{height}; this model takes aspect ratios up to "
                               f"{_MAX_ASPECT_RATIO}:1")
        factor = self.factor
        new_h, new_w = round(height / factor) * factor, round(width / factor) * factor
        if new_h * new_w > self.max_pixels:
            shrink = math.sqrt(height * width / self.max_pixels)
            new_h = max(factor, math.floor(height / shrink / factor) * factor)
            new_w = max(factor, math.floor(width / shrink / factor) * factor)
        elif new_h * new_w < self.min_pixels:
            grow = math.sqrt(self.min_pixels / (height * width))
            new_h, new_w = math.ceil(height * grow / factor) * factor, math.ceil(width * grow / factor) * factor
        return new_h, new_w

    def __call__(self, data: bytes, max_pixels: int) -> QwenImage:
        """Encoded image (at most max_pixels before resizing) -> its patches and grid."""
        return self.process(decode(data, max_pixels))

    def process(self, image) -> QwenImage:
        """A decoded PIL image -> its patches and grid."""
        if self.drop_alpha_first:  # keeps a palette image's transparent colour, which to_rgb then whitens
            image = image.convert("RGB")
        if self.convert_rgb or image.mode != "RGB":
            image = to_rgb(image)
        if self.do_resize:
            height, width = self.resized_size(image.height, image.width)
            image = image.resize((width, height), resample=self.resample)
        elif image.height % self.factor or image.width % self.factor:
            raise InvalidImage(f"the image is {image.width}x{image.height}; this model's processor does not "
                               f"resize and takes sides that are multiples of {self.factor}")
        pixels = rescale_and_normalize(np.asarray(image), self.rescale_factor, self.mean_std)
        return self.patchify(pixels)

    def patchify(self, pixels: np.ndarray) -> QwenImage:
        """float32 [H, W, C] -> rows of (C, T, P, P) patches, each merge block's patches consecutive."""
        height, width, channels = pixels.shape
        p, m, t = self.patch_size, self.merge_size, self.temporal_patch_size
        grid_h, grid_w = height // p, width // p
        blocks = pixels.reshape(grid_h // m, m, p, grid_w // m, m, p, channels)
        blocks = blocks.transpose(0, 3, 1, 4, 6, 2, 5)  # (block row, block col, row in block, col in block, C, P, P)
        frames = np.broadcast_to(blocks[:, :, :, :, :, None], (*blocks.shape[:5], t, p, p))
        rows = np.ascontiguousarray(frames.reshape(grid_h * grid_w, channels * t * p * p), dtype=np.float32)
        return QwenImage(pixel_values=rows, grid_thw=(1, grid_h, grid_w), merge_size=m)
