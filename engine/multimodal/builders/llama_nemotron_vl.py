"""Llama-Nemotron-VL-Embed's prompts and images (the builder of engine/multimodal/inputs.py for engine/families/llama_nemotron_vl.py).

Prompts, as the checkpoint's own processor makes them (seed 001): text is embedded verbatim, its `query: ` /
`passage: ` prefix being the caller's (as for the text-only sibling llama-nemotron-embed-1b-v2). An input holding
an image is a document, which the family frames itself: the passage prefix (processor_config.json
`passage_prefix`, "passage:"), a space, then the input's parts in order, the image as
`<img>` + `<IMG_CONTEXT>` x (256 * tiles) + `</img> ` and text verbatim; an image alone is therefore
`passage: <img>{<IMG_CONTEXT> x 256 * tiles}</img> ` and an image followed by text `... </img> {text}`, what the
reference processor writes for an image document with that text. One image per input, as the reference takes.
The tokenizer adds its own special tokens (Llama 3's <|begin_of_text|>). The instruction field is not used.

Images: engine/multimodal/tiles.py (InternVL dynamic tiling, 512 px tiles and a thumbnail, SigLIP normalization).
"""
from __future__ import annotations

from collections.abc import Sequence

from engine.checkpoint import Checkpoint, read_json_optional
from engine.errors import UnsupportedCheckpoint
from engine.families.llama_nemotron_vl import IMAGE_CONTEXT, IMAGE_END, IMAGE_START, ModelArgs, image_block
from engine.multimodal.tiles import TilingProcessor
from engine.multimodal.images import InvalidImage
from engine.text.tokenizer import TextTokenizer
from engine.multimodal.inputs import InputBuilder, PreparedImage, PreparedInput, check_prompt_tokens, encode_prompt


class NemotronVLInputs(InputBuilder):
    takes_instruction = False

    def __init__(self, tiler: TilingProcessor, tokenizer: TextTokenizer, args: ModelArgs, passage_prefix: str):
        self.tiler = tiler
        self.tokenizer = tokenizer
        self.tokens_per_tile = args.tokens_per_tile
        self.image_token_id = args.image_token_id
        self.passage_prefix = passage_prefix

    def build(self, parts: Sequence, instruction: str | None = None) -> PreparedInput:
        n_images = sum(1 for part in parts if not isinstance(part, str))
        if n_images == 0:
            return PreparedInput(self._ids("".join(parts), 0))
        if n_images > 1:
            raise InvalidImage(f"this model takes one image per input ({n_images} given): send each image as "
                               f"an input of its own")
        pieces, images = [f"{self.passage_prefix} "] if self.passage_prefix else [], []
        for part in parts:
            if isinstance(part, str):
                pieces.append(part)
                continue
            tiles = self.tiler(part)
            images.append(PreparedImage({"pixel_values": tiles}, len(tiles) * self.tokens_per_tile))
            pieces.append(image_block(images[-1].n_tokens))
        return PreparedInput(self._ids("".join(pieces), images[0].n_tokens), tuple(images))

    def _ids(self, text: str, n_image_tokens: int) -> list[int]:
        return encode_prompt(self.tokenizer, text, IMAGE_CONTEXT, self.image_token_id, n_image_tokens)


def input_builder(checkpoint: Checkpoint, tokenizer: TextTokenizer) -> NemotronVLInputs:
    args = ModelArgs.from_dict(checkpoint.config)
    tiler = TilingProcessor.from_checkpoint(checkpoint.path, checkpoint.config, args.vision.image_size)
    path = checkpoint.path / "processor_config.json"
    processor = read_json_optional(path)
    declared = processor.get("num_image_token")
    if declared is not None and declared != args.tokens_per_tile:
        raise UnsupportedCheckpoint(f"{path}: num_image_token {declared}, but the model makes "
                                    f"{args.tokens_per_tile} tokens per tile")
    check_prompt_tokens(checkpoint.path, tokenizer, (IMAGE_START, IMAGE_END, IMAGE_CONTEXT), IMAGE_CONTEXT,
                        args.image_token_id)
    prefix = str(processor.get("passage_prefix", checkpoint.config.get("passage_prefix", "passage:")))
    return NemotronVLInputs(tiler, tokenizer, args, prefix)
