"""ColIdefics3's prompts and image processor (the builder of engine/multimodal/inputs.py for engine/families/idefics3.py).

Prompts: a query (an input of text only) is `Query: ` + its text + ten `<end_of_utterance>` augmentation tokens
(which give a short query enough vectors for MaxSim) + `\n`, as colpali-engine's ColIdefics3Processor made it when
the published checkpoints were trained; a document image is
`<|im_start|>User:<image>Describe the image.<end_of_utterance>\nAssistant:`. An input that holds images and text is
rendered the same way with its own parts, in order, in place of the fixed instruction. The instruction field is
not used by this family.

The query format, three readings and the evidence (github.com/illuin-tech/colpali, CHANGELOG.md and the history
of colpali_engine/models/idefics3/colidefics3/processing_colidefics3.py and colpali_engine/utils/processing_utils.py):
- colpali-engine 0.3.5 - 0.3.10 (2024-12-13 .. 2025-04-18): ColIdefics3Processor's own process_queries,
  `self.query_prefix + query + suffix + "\n"` with query_prefix "Query: " and suffix ten <end_of_utterance>,
  through the tokenizer directly. Added with Idefics3 / SmolVLM support (6d69bdc "Smolvlm (#146)", 2024-11-27,
  released in 0.3.5 as db3d00e); unchanged in 0.3.8 and 0.3.10. The published checkpoints come from these
  releases: #146 added the training config of ColSmolVLM (train_colsmolvlm_model.yaml, vidore/colsmolvlm-v0.1's
  recipe), and colSmol-256M / colSmol-500M
  were announced with SmolVLM-256M / 500M on 2025-01-23 (Hugging Face's blog "SmolVLM Grows Smaller", section
  "Smaller Multimodal Retrieval: ColSmolVLM 256M & 500M"), colpali-engine 0.3.7 (1623918 "Add support for ColSmol
  256M and 500M (#170)", 2025-01-28) only bumping transformers for them; training built its queries with
  process_queries (the VisualRetrieverCollator of 0.3.1 .. 0.3.10 calls it).
- colpali-engine 0.3.11 - 0.3.12 (d29e228 "fix: clean processors (#280)", 2025-06-30): the base class's
  process_queries, `query_prefix + text + suffix` with no "\n" ("Query: " from BaseVisualRetrieverProcessor).
- colpali-engine 0.3.13 (174055b "Vbert (#339)", 2025-10-27) and later (0.3.18): the base class's query_prefix
  became "" for ModernVBERT, with no CHANGELOG entry and no ColSmol retraining: text + ten <end_of_utterance>.
We follow the training releases. A checkpoint that names its own `query_prefix` or `query_augmentation_token`
(processor_config.json, then preprocessor_config.json) gets its own, read as engine/multimodal/builders/colqwen2.py
reads it; the closing "\n" stays.
The document prompt is still 0.3.11+'s visual_prompt_prefix; the training releases made it otherwise (0.3.5 - 0.3.8:
apply_chat_template over a user turn of the text "Describe the image." then the image, stripped; 0.3.9 - 0.3.10:
`<|im_start|>user\n<image>Describe the image.<end_of_utterance>`), which is not yet followed here.

Images, as transformers' Idefics3ImageProcessor does (its PIL backend): RGB (colpali converts first, so any
transparency is dropped, not composited), the longest edge resized to `size.longest_edge`, then both edges up
to multiples of the tile side `max_image_size.longest_edge`; an image larger than one tile is cut into
rows x cols tiles plus the whole image resized to one tile (the global image), every resize in uint8 with the
processor's filter; rescaled and normalized last. Each `<image>` becomes, per tile,
`<fake_token_around_image><row_r_col_c>` + the tile's image tokens, a newline after each row, then a newline
and `<fake_token_around_image><global-img>` + the global image's tokens + `<fake_token_around_image>` (an image
of one tile: that last block alone), the text is tokenized as a whole, as the reference does.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from engine.checkpoint import Checkpoint, read_json_optional
from engine.errors import UnsupportedCheckpoint
from engine.families.idefics3 import ModelArgs
from engine.multimodal.images import InvalidImage, rescale_and_normalize
from engine.text.tokenizer import TextTokenizer
from engine.multimodal.inputs import PreparedImage, RetrieverInputs, check_prompt_tokens, query_format

IMAGE, FAKE, GLOBAL, END = "<image>", "<fake_token_around_image>", "<global-img>", "<end_of_utterance>"
QUERY_PREFIX, AUGMENTATION_TOKEN, N_AUGMENTATION, QUERY_END = "Query: ", END, 10, "\n"
DOCUMENT_PREFIX, DOCUMENT_SUFFIX = "<|im_start|>User:", f"{END}\nAssistant:"
DOCUMENT_TEXT = "Describe the image."
MAX_IMAGE_SIDE = 4096  # the processor's absolute cap after its longest-edge resize
_PROCESSOR_TYPES = {"Idefics3ImageProcessor", "Idefics3ImageProcessorFast", "Idefics3ImageProcessorPil"}
# transformers' Idefics3ImageProcessor defaults, where preprocessor_config.json leaves a key out
_DEFAULTS = {"do_convert_rgb": True, "do_resize": True, "size": {"longest_edge": 4 * 364}, "resample": 1,
             "do_image_splitting": True, "max_image_size": {"longest_edge": 364}, "do_rescale": True,
             "rescale_factor": 1 / 255, "do_normalize": True, "image_mean": [0.5, 0.5, 0.5],
             "image_std": [0.5, 0.5, 0.5]}


@dataclass(frozen=True)
class TiledImage:
    pixels: np.ndarray  # [tiles, C, side, side] float32: the row-major tiles, then the global image
    rows: int  # 0 and 0: the image fit one tile and is its global image alone
    cols: int


@dataclass(frozen=True)
class ImageProcessor:
    """Idefics3ImageProcessor's recipe for one image."""

    longest_edge: int | None  # None: no first resize
    tile: int  # max_image_size.longest_edge: the side of every tile
    split: bool
    resample: int
    rescale_factor: float | None
    normalization: tuple[tuple[float, ...], tuple[float, ...]] | None

    @classmethod
    def from_config(cls, config: dict, where: str) -> ImageProcessor:
        kind = config.get("image_processor_type", "Idefics3ImageProcessor")
        if kind not in _PROCESSOR_TYPES:
            raise UnsupportedCheckpoint(f"{where}: image processor {kind!r} is not supported for Idefics3 "
                                        f"(supported: {', '.join(sorted(_PROCESSOR_TYPES))})")
        merged = {**_DEFAULTS, **config}
        if not merged["do_convert_rgb"]:
            raise UnsupportedCheckpoint(f"{where}: do_convert_rgb false is not supported (colpali converts to RGB)")
        size, tile = merged["size"], merged["max_image_size"]
        if "longest_edge" not in size or set(tile) != {"longest_edge"}:
            raise UnsupportedCheckpoint(f"{where}: size {size} / max_image_size {tile} are not supported "
                                        f"(only longest_edge)")
        return cls(longest_edge=int(size["longest_edge"]) if merged["do_resize"] else None,
                   tile=int(tile["longest_edge"]), split=bool(merged["do_image_splitting"]),
                   resample=int(merged["resample"]),
                   rescale_factor=float(merged["rescale_factor"]) if merged["do_rescale"] else None,
                   normalization=(tuple(map(float, merged["image_mean"])), tuple(map(float, merged["image_std"])))
                   if merged["do_normalize"] else None)

    def __call__(self, image) -> TiledImage:
        image = image.convert("RGB")
        if self.longest_edge is not None:
            image = self._resize(image, *_longest_edge_size(image.height, image.width, self.longest_edge))
        rows = cols = 0
        if self.split:
            image = self._resize(image, *_tile_multiple_size(image.height, image.width, self.tile))
            frames = []
            if image.height > self.tile or image.width > self.tile:
                rows = (image.height - self.tile) // self.tile + 1
                cols = (image.width - self.tile) // self.tile + 1
                frames = [image.crop((c * self.tile, r * self.tile, (c + 1) * self.tile, (r + 1) * self.tile))
                          for r in range(rows) for c in range(cols)]
                image = self._resize(image, self.tile, self.tile)
            frames.append(image)
        else:
            frames = [self._resize(image, self.tile, self.tile)]
        if any(frame.size != (self.tile, self.tile) for frame in frames):
            raise InvalidImage(f"the image ({image.width}x{image.height} after resizing) does not tile into "
                               f"{self.tile}-pixel squares")
        pixels = np.stack([rescale_and_normalize(np.asarray(frame), self.rescale_factor, self.normalization)
                           .transpose(2, 0, 1) for frame in frames])
        return TiledImage(pixels, rows, cols)

    def _resize(self, image, height: int, width: int):
        return image if image.size == (width, height) else image.resize((width, height), resample=self.resample)


def _longest_edge_size(height: int, width: int, longest: int) -> tuple[int, int]:
    """The longest edge to `longest`, the other kept in ratio and rounded up to even; then under the 4k cap."""
    ratio = width / height
    if width >= height:
        width, height = longest, int(longest / ratio)
        height += height % 2
    else:
        height, width = longest, int(longest * ratio)
        width += width % 2
    height, width = max(height, 1), max(width, 1)
    ratio = width / height  # the reference's second step reads the ratio of the first one's result
    if width >= height and width > MAX_IMAGE_SIDE:
        width, height = MAX_IMAGE_SIDE, int(MAX_IMAGE_SIDE / ratio)
    elif height > width and height > MAX_IMAGE_SIDE:
        height, width = MAX_IMAGE_SIDE, int(MAX_IMAGE_SIDE * ratio)
    return max(height, 1), max(width, 1)


def _tile_multiple_size(height: int, width: int, tile: int) -> tuple[int, int]:
    """Both edges up to multiples of the tile side, the shorter one through the aspect ratio first."""
    ratio = width / height
    if width >= height:
        width = math.ceil(width / tile) * tile
        height = math.ceil(int(width / ratio) / tile) * tile
    else:
        height = math.ceil(height / tile) * tile
        width = math.ceil(int(height * ratio) / tile) * tile
    return height, width


def image_prompt(rows: int, cols: int, tokens_per_tile: int) -> str:
    """The text an `<image>` becomes for an image cut into rows x cols tiles (0 x 0: the global image only)."""
    run = IMAGE * tokens_per_tile
    global_block = f"{FAKE}{GLOBAL}{run}{FAKE}"
    if rows == 0 and cols == 0:
        return global_block
    grid = "".join("".join(f"{FAKE}<row_{r + 1}_col_{c + 1}>{run}" for c in range(cols)) + "\n" for r in range(rows))
    return f"{grid}\n{global_block}"


class Idefics3Inputs(RetrieverInputs):
    query_prefix, query_suffix = QUERY_PREFIX, AUGMENTATION_TOKEN * N_AUGMENTATION + QUERY_END
    document_prefix, document_text, document_suffix = DOCUMENT_PREFIX, DOCUMENT_TEXT, DOCUMENT_SUFFIX
    image_token = IMAGE

    def __init__(self, processor: ImageProcessor, tokenizer: TextTokenizer, args: ModelArgs,
                 query_prefix: str = QUERY_PREFIX, augmentation_token: str = AUGMENTATION_TOKEN):
        super().__init__(tokenizer, args.image_token_id)
        self.query_prefix, self.query_suffix = query_prefix, augmentation_token * N_AUGMENTATION + QUERY_END
        self.processor = processor
        self.tokens_per_tile = args.tokens_per_tile

    def image(self, image) -> tuple[PreparedImage, str]:
        tiled = self.processor(image)
        return (PreparedImage({"pixel_values": tiled.pixels}, len(tiled.pixels) * self.tokens_per_tile),
                image_prompt(tiled.rows, tiled.cols, self.tokens_per_tile))


def input_builder(checkpoint: Checkpoint, tokenizer: TextTokenizer) -> Idefics3Inputs:
    args = ModelArgs.from_dict(checkpoint.config)
    config, path = _image_processor_config(checkpoint)
    processor = ImageProcessor.from_config(config, str(path))
    if processor.tile != args.vision.image_size:
        raise UnsupportedCheckpoint(f"{path}: tiles of {processor.tile} pixels (max_image_size) for a vision tower "
                                    f"of {args.vision.image_size}: they must be equal")
    declared = _declared_image_seq_len(checkpoint)
    if declared is not None and declared != args.tokens_per_tile:
        raise UnsupportedCheckpoint(f"{checkpoint.path}: image_seq_len {declared} in processor_config.json, but "
                                    f"the model makes {args.tokens_per_tile} tokens per tile")
    prefix, augmentation = query_format(checkpoint, QUERY_PREFIX, AUGMENTATION_TOKEN)
    check_prompt_tokens(checkpoint.path, tokenizer, (IMAGE, FAKE, GLOBAL, END, augmentation), IMAGE,
                        args.image_token_id)
    return Idefics3Inputs(processor, tokenizer, args, prefix, augmentation)


def _image_processor_config(checkpoint: Checkpoint) -> tuple[dict, Path]:
    """preprocessor_config.json (published checkpoints), else the `image_processor` section of
    processor_config.json (where recent transformers save it), else the defaults."""
    path = checkpoint.path / "preprocessor_config.json"
    if path.is_file():
        return read_json_optional(path), path
    path = checkpoint.path / "processor_config.json"
    if path.is_file():
        return read_json_optional(path).get("image_processor") or {}, path
    return {}, checkpoint.path / "preprocessor_config.json"


def _declared_image_seq_len(checkpoint: Checkpoint) -> int | None:
    value = read_json_optional(checkpoint.path / "processor_config.json").get("image_seq_len")
    return int(value) if value is not None else None
