"""InternVL-style dynamic tiling: image bytes -> the square tiles Llama-Nemotron-VL-Embed's vision tower reads.

The rules (seed 001, "Llama-Nemotron-VL-Embed"; the checkpoint's own processor is remote code, not in
transformers, and the test transcribes InternVL's `dynamic_preprocess` to check this module against):

1. The image is converted to RGB with a plain Pillow `convert("RGB")` (transparency is dropped, not composited
   onto white: the reference processor does no compositing).
2. Grid choice. The candidates are every (columns, rows) with min_tiles <= columns * rows <= max_tiles, ordered
   by tile count (ties keep the order of the reference's set). Each scores
       min(grid_area / image_area, 0.6) * min(grid_aspect / image_aspect, image_aspect / grid_aspect)
   where grid_area = columns * rows * tile^2: an aspect match weighted by how much of the image's area the grid
   keeps, with any grid keeping 60% or more counted alike. The first candidate with the strictly highest
   score wins, so the smallest grid that keeps enough area is preferred.
3. The image is resized (bicubic) to (columns * tile) x (rows * tile) and cut into tiles row by row.
4. When that made more than one tile and use_thumbnail is set, the whole image resized (bicubic) to one tile
   is appended: a landscape page reaches max_tiles + 1 tiles.
5. With dynamic_image_size off, the image is one tile: resized to tile x tile.
6. Pixels are rescaled by 1/255 and normalized with the checkpoint's norm_type: "siglip" (mean = std = 0.5,
   the published checkpoint's) or "imagenet".

Settings: the tile side is the tower's image_size (config.json force_image_size); min_tiles is config.json's
min_dynamic_patch (default 1); max_tiles, use_thumbnail, dynamic_image_size and norm_type come from
processor_config.json (what the reference processor reads), else from config.json (max_input_tiles,
use_thumbnail, dynamic_image_size), else the published defaults (6, true, true, "siglip").
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from engine.errors import UnsupportedCheckpoint
from engine.multimodal.images import rescale_and_normalize

AREA_CAP = 0.6  # a grid keeping this share of the image's area counts as keeping all of it
NORMALIZATIONS = {"siglip": ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5)),
                  "imagenet": ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))}
_BICUBIC = 3  # PIL.Image.Resampling.BICUBIC


def candidate_grids(min_tiles: int, max_tiles: int) -> list[tuple[int, int]]:
    """(columns, rows) grids with min_tiles..max_tiles tiles, fewest tiles first.

    Built as the reference builds it (a set of tuples, then a stable sort by tile count), so two grids of one
    size that score exactly alike are tried in the same order."""
    grids = {(cols, rows) for n in range(min_tiles, max_tiles + 1)
             for cols in range(1, n + 1) for rows in range(1, n + 1) if min_tiles <= cols * rows <= max_tiles}
    return sorted(grids, key=lambda grid: grid[0] * grid[1])


def choose_grid(width: int, height: int, tile: int, grids: list[tuple[int, int]]) -> tuple[int, int]:
    """The (columns, rows) grid for a width x height image (rule 2 of the module docstring)."""
    aspect = width / height
    best, best_score = (1, 1), float("-inf")
    for cols, rows in grids:
        grid_aspect = cols / rows
        kept_area = min(cols * rows * tile * tile / (width * height), AREA_CAP)
        score = kept_area * min(grid_aspect / aspect, aspect / grid_aspect)
        if score > best_score:
            best, best_score = (cols, rows), score
    return best


@dataclass(frozen=True)
class TilingProcessor:
    tile: int
    min_tiles: int
    max_tiles: int
    use_thumbnail: bool
    dynamic: bool
    mean: tuple[float, float, float]
    std: tuple[float, float, float]

    @classmethod
    def from_checkpoint(cls, folder: Path, config: dict[str, Any], tile: int) -> TilingProcessor:
        path = folder / "processor_config.json"
        processor = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}

        def setting(processor_key: str, config_key: str, default):
            return processor.get(processor_key, config.get(config_key, default))

        if processor.get("image_size", tile) != tile:
            raise UnsupportedCheckpoint(f"{path}: tiles of {processor['image_size']} px, but the vision tower "
                                        f"takes {tile} px")
        norm = processor.get("norm_type", "siglip")
        if norm not in NORMALIZATIONS:
            raise UnsupportedCheckpoint(f"{path}: norm_type {norm!r} is not supported "
                                        f"(supported: {', '.join(NORMALIZATIONS)})")
        min_tiles = int(config.get("min_dynamic_patch", 1))
        max_tiles = int(setting("max_input_tiles", "max_input_tiles", 6))
        if not 1 <= min_tiles <= max_tiles:
            raise UnsupportedCheckpoint(f"{folder}: tile bounds {min_tiles}..{max_tiles} are not a range")
        mean, std = NORMALIZATIONS[norm]
        return cls(tile=tile, min_tiles=min_tiles, max_tiles=max_tiles,
                   use_thumbnail=bool(setting("use_thumbnail", "use_thumbnail", True)),
                   dynamic=bool(setting("dynamic_image_size", "dynamic_image_size", True)), mean=mean, std=std)

    @property
    def most_tiles(self) -> int:
        """The most tiles one image can make (its grid plus the thumbnail)."""
        if not self.dynamic:
            return 1
        return self.max_tiles + (1 if self.use_thumbnail and self.max_tiles > 1 else 0)

    def grid(self, width: int, height: int) -> tuple[int, int]:
        """(columns, rows) of the tiles a width x height image is cut into."""
        if not self.dynamic:
            return 1, 1
        return choose_grid(width, height, self.tile, candidate_grids(self.min_tiles, self.max_tiles))

    def tile_count(self, width: int, height: int) -> int:
        cols, rows = self.grid(width, height)
        return cols * rows + (1 if self.use_thumbnail and cols * rows > 1 else 0)

    def __call__(self, image) -> np.ndarray:
        """A decoded PIL image -> float32 tiles [T, 3, tile, tile], the grid row by row, then the thumbnail if any."""
        if image.mode != "RGB":
            image = image.convert("RGB")
        cols, rows = self.grid(image.width, image.height)
        side, norm = self.tile, (self.mean, self.std)
        canvas = rescale_and_normalize(np.asarray(image.resize((cols * side, rows * side), resample=_BICUBIC)),
                                       1 / 255, norm)
        # [rows*S, cols*S, 3] -> [rows, cols, 3, S, S]: tile (r, c) is canvas[r*S:(r+1)*S, c*S:(c+1)*S]
        tiles = canvas.reshape(rows, side, cols, side, 3).transpose(0, 2, 4, 1, 3).reshape(rows * cols, 3, side, side)
        if self.use_thumbnail and rows * cols > 1:
            thumbnail = rescale_and_normalize(np.asarray(image.resize((side, side), resample=_BICUBIC)), 1 / 255, norm)
            tiles = np.concatenate([tiles, thumbnail.transpose(2, 0, 1)[None]], axis=0)
        return np.ascontiguousarray(tiles)
