"""Qwen3-VL-Embedding's prompts and images (the builder of engine/multimodal/inputs.py for engine/families/qwen3_vl.py).

Every input, text or image, goes through the checkpoint's own chat template, as the reference embedder does: a
system message holding the instruction, a user message holding the input's parts in order (text items and
image items), then the assistant header (add_generation_prompt), whose last token is where the embedding is
read. The template writes one <|image_pad|> per image between the vision markers; the builder grows it to the
image's token count (one per merged 2 x 2 block of patches), as Qwen3VLProcessor does before tokenizing.

Images go through the Qwen2-VL processor (engine/multimodal/qwen_images.py) with the pixel bounds of the checkpoint's
preprocessor_config.json. The instruction is the request's, else the checkpoint's default prompt, else
"Represent the user's input."; it is trimmed and gets a full stop when it does not end in punctuation, as the
reference wrapper does.
"""
from __future__ import annotations

import json
import unicodedata
from collections.abc import Sequence

import numpy as np
from jinja2 import TemplateError

from engine.text.chat_inputs import chat_template, compile_template, template_variables
from engine.checkpoint import Checkpoint
from engine.errors import InvalidInput, UnsupportedCheckpoint
from engine.families.qwen3_vl import ModelArgs
from engine.multimodal.qwen_images import QwenImageProcessor
from engine.text.tokenizer import TextTokenizer
from engine.multimodal.inputs import InputBuilder, PreparedImage, PreparedInput

DEFAULT_INSTRUCTION = "Represent the user's input."
IMAGE_PAD = "<|image_pad|>"


def system_instruction(instruction: str | None) -> str:
    """The system message's text: trimmed, ending in punctuation."""
    text = (instruction or "").strip() or DEFAULT_INSTRUCTION
    return text if unicodedata.category(text[-1]).startswith("P") else text + "."


def processor_chat_template(checkpoint: Checkpoint) -> str | None:
    """The template the reference's processor applies: chat_template.jinja, else the older processor file
    chat_template.json, else the tokenizer's."""
    path = checkpoint.path / "chat_template.json"
    if not (checkpoint.path / "chat_template.jinja").is_file() and path.is_file():
        try:
            template = json.loads(path.read_text(encoding="utf-8")).get("chat_template")
        except (ValueError, AttributeError) as exc:
            raise UnsupportedCheckpoint(f"{path}: not a JSON object with a chat_template string ({exc})") from None
        if isinstance(template, str) and template:
            return template
    return chat_template(checkpoint)


class Qwen3VLInputs(InputBuilder):
    takes_instruction = True

    def __init__(self, checkpoint: Checkpoint, tokenizer: TextTokenizer, processor: QwenImageProcessor,
                 image_token_id: int):
        source = processor_chat_template(checkpoint)
        if source is None:
            raise UnsupportedCheckpoint(f"{checkpoint.path}: Qwen3-VL inputs are rendered with the checkpoint's "
                                        "chat template (chat_template.jinja, chat_template.json or "
                                        "tokenizer_config.json), and it has none")
        self.template = compile_template(checkpoint, source)
        self.variables = {**template_variables(checkpoint), "add_generation_prompt": True}
        self.tokenizer = tokenizer
        self.processor = processor
        self.image_token_id = image_token_id

    def render(self, content: list[dict], instruction: str | None) -> str:
        messages = [{"role": "system", "content": [{"type": "text", "text": system_instruction(instruction)}]},
                    {"role": "user", "content": content}]
        try:
            return self.template.render(messages=messages, **self.variables)
        except TemplateError as exc:
            raise InvalidInput(f"the model's chat template refused the input: {exc}") from exc

    def build(self, parts: Sequence, instruction: str | None = None) -> PreparedInput:
        content, images = content_items(self.processor, parts)
        ids = self.tokenizer.encode(self.render(content, instruction), add_special=False)
        return PreparedInput(expand_image_pads(ids, images, self.image_token_id), tuple(images))


def content_items(processor: QwenImageProcessor, parts: Sequence) -> tuple[list[dict], list[PreparedImage]]:
    """Text pieces and decoded images, in order -> a template's content items and the processed images."""
    content, images = [], []
    for part in parts:
        if isinstance(part, str):
            content.append({"type": "text", "text": part})
            continue
        image = processor.process(part)
        images.append(PreparedImage({"pixel_values": image.pixel_values,
                                     "image_grid_thw": np.array(image.grid_thw, dtype=np.int32)}, image.n_tokens))
        content.append({"type": "image"})
    return content, images


def expand_image_pads(ids: list[int], images: Sequence[PreparedImage], image_token_id: int) -> list[int]:
    """Each image's single <|image_pad|> -> the run of image tokens its features fill (a pad the text itself
    spells is refused)."""
    slots = [i for i, token in enumerate(ids) if token == image_token_id]
    if len(slots) != len(images):
        raise InvalidInput(f"the text holds {IMAGE_PAD}, which only an image may stand for")
    expanded, start = [], 0
    for slot, image in zip(slots, images):
        expanded += ids[start:slot] + [image_token_id] * image.n_tokens
        start = slot + 1
    return expanded + ids[start:]


def image_processor(checkpoint: Checkpoint, tokenizer: TextTokenizer) -> tuple[QwenImageProcessor, int]:
    """The checkpoint's Qwen2-VL processor and its image token id (checked to be <|image_pad|>, one token)."""
    args = ModelArgs.from_dict(checkpoint.config)
    vision = args.vision
    processor = QwenImageProcessor.from_checkpoint(checkpoint.path, vision.patch_size, vision.temporal_patch_size,
                                                   vision.spatial_merge_size)
    if tokenizer.encode(IMAGE_PAD, add_special=False) != [args.image_token_id]:
        raise UnsupportedCheckpoint(f"{checkpoint.path}: {IMAGE_PAD} is not one token, image_token_id "
                                    f"{args.image_token_id}, in this tokenizer")
    return processor, args.image_token_id


def input_builder(checkpoint: Checkpoint, tokenizer: TextTokenizer) -> Qwen3VLInputs:
    builder = Qwen3VLInputs(checkpoint, tokenizer, *image_processor(checkpoint, tokenizer))
    if builder.render([{"type": "image"}], None).count(IMAGE_PAD) != 1:
        raise UnsupportedCheckpoint(f"{checkpoint.path}: the chat template does not write one {IMAGE_PAD} per "
                                    "image item")
    return builder
