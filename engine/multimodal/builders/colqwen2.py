"""ColQwen2 and ColQwen2.5's prompts and image processor (engine/multimodal/inputs.py's builder for engine/families/colqwen2.py).

Prompts, as colpali-engine's ColQwen2_Processor and ColQwen2_5_Processor make them (the same): a query (an input
of text only) is its text followed by ten <|endoftext|> augmentation tokens; a page is
`<|im_start|>user\\n<|vision_start|><|image_pad|><|vision_end|>Describe the image.<|im_end|><|endoftext|>`, the
turn closed by <|endoftext|> (nothing is generated after it). An input holding images and text renders its own
parts, in order, in place of "Describe the image.". Each <|image_pad|> becomes one token per merged patch block
of its image before the text is tokenized as a whole, as Qwen2-VL's processor does.

Images: colpali-engine converts every page to RGB first (transparency dropped, not composited), then Qwen2-VL's
image processor (engine/multimodal/qwen_images.py) with the checkpoint's pixel bounds.
"""
from __future__ import annotations

import numpy as np

from engine.checkpoint import Checkpoint
from engine.families.colqwen2 import ModelArgs
from engine.multimodal.qwen_images import QwenImageProcessor
from engine.text.tokenizer import TextTokenizer
from engine.multimodal.inputs import PreparedImage, RetrieverInputs, check_prompt_tokens

IMAGE_TOKEN, VISION_START, VISION_END = "<|image_pad|>", "<|vision_start|>", "<|vision_end|>"
QUERY_PREFIX, QUERY_SUFFIX = "", "<|endoftext|>" * 10
DOCUMENT_PREFIX, DOCUMENT_TEXT, DOCUMENT_SUFFIX = "<|im_start|>user\n", "Describe the image.", "<|im_end|><|endoftext|>"
DOCUMENT_PROMPT = DOCUMENT_PREFIX + VISION_START + IMAGE_TOKEN + VISION_END + DOCUMENT_TEXT + DOCUMENT_SUFFIX


class ColQwenInputs(RetrieverInputs):
    query_prefix, query_suffix = QUERY_PREFIX, QUERY_SUFFIX
    document_prefix, document_text, document_suffix = DOCUMENT_PREFIX, DOCUMENT_TEXT, DOCUMENT_SUFFIX
    image_token = IMAGE_TOKEN

    def __init__(self, processor: QwenImageProcessor, tokenizer: TextTokenizer, image_token_id: int):
        super().__init__(tokenizer, image_token_id)
        self.processor = processor

    def image(self, image) -> tuple[PreparedImage, str]:
        processed = self.processor.process(image)
        arrays = {"pixel_values": processed.pixel_values,
                  "image_grid_thw": np.array(processed.grid_thw, dtype=np.int32)}
        return (PreparedImage(arrays, processed.n_tokens),
                VISION_START + IMAGE_TOKEN * processed.n_tokens + VISION_END)


def input_builder(checkpoint: Checkpoint, tokenizer: TextTokenizer) -> ColQwenInputs:
    args = ModelArgs.from_dict(checkpoint.config)
    vision = args.vision
    processor = QwenImageProcessor.from_checkpoint(checkpoint.path, vision.patch_size, vision.temporal_patch_size,
                                                   vision.spatial_merge_size, drop_alpha_first=True)
    check_prompt_tokens(checkpoint.path, tokenizer, (IMAGE_TOKEN, VISION_START, VISION_END, "<|im_start|>", "<|im_end|>",
                                              "<|endoftext|>"), IMAGE_TOKEN, args.image_token_id)
    return ColQwenInputs(processor, tokenizer, args.image_token_id)
