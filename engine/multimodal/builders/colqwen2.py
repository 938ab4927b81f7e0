"""ColQwen2 and ColQwen2.5's prompts and image processor (engine/multimodal/inputs.py's builder for engine/families/colqwen2.py).

Prompts, as colpali-engine's ColQwen2_Processor and ColQwen2_5_Processor made them when the published checkpoints
were trained (the same for both): a query (an input of text only) is `Query: ` + its text + ten <|endoftext|>
augmentation tokens; a page is
`<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>Describe the image.<|im_end|><|endoftext|>`, the
turn closed by <|endoftext|> (nothing is generated after it). An input holding images and text renders its own
parts, in order, in place of "Describe the image.". Each <|image_pad|> becomes one token per merged patch block
of its image before the text is tokenized as a whole, as Qwen2-VL's processor does.

The query format, three readings and the evidence (github.com/illuin-tech/colpali, CHANGELOG.md and the history
of colpali_engine/models/qwen2/colqwen2/processing_colqwen2.py and colpali_engine/utils/processing_utils.py):
- colpali-engine 0.3.0 - 0.3.12 (2024-09-10 .. 2025-07-16): `Query: ` + text + ten augmentation tokens. Added with
  Qwen2-VL support (16c8bb3, 2024-09-27, `"Query: " + query + "<pad>" * 10`); 0.3.4 (40d5632, 2024-11-06) named
  it `query_prefix = "Query: "` and made the augmentation token <|endoftext|> ("previous models were trained with
  <|endoftext|> so this is simply a non-breaking inference upgrade patch", CHANGELOG 0.3.4); ColQwen2.5's own
  processor (d86b10e, 2025-02-19) the same; 0.3.11 (d29e228, 2025-06-30) moved `query_prefix = "Query: "` to
  BaseVisualRetrieverProcessor. The published checkpoints come from these releases: vidore/colqwen2-v0.1 was
  uploaded 2024-09-26 and colqwen2-v1.0 2024-11-03 (each with a git_hash.txt of the training commit),
  colqwen2.5-v0.1 / v0.2 in 2025-01 .. 02; training built its queries with process_queries (the
  VisualRetrieverCollator of 0.3.1 .. 0.3.10 calls it).
- colpali-engine 0.3.13 (174055b "Vbert (#339)", 2025-10-27) and later (0.3.18): the base class's query_prefix
  became "" for ModernVBERT, with no CHANGELOG entry and no ColQwen retraining: text + ten <|endoftext|>.
- transformers' ColQwen2Processor (models/colqwen2, 5.x): query_prefix "Query: " (or the checkpoint's
  processor_config.json `query_prefix`), the tokenizer's pad token ten times, then "\n": modular_colqwen2.py
  derives it from ColPaliProcessor, whose PaliGemma queries end in "\n" (colpali-engine's ColPali processor adds
  it; its ColQwen2 processor never did).
We follow the training releases: `Query: ` + text + ten <|endoftext|>, no "\n". A checkpoint that names its own
`query_prefix` or `query_augmentation_token` (processor_config.json, as transformers' ColQwen2Processor saves it,
or preprocessor_config.json) gets its own.

Images: colpali-engine converts every page to RGB first (transparency dropped, not composited), then Qwen2-VL's
image processor (engine/multimodal/qwen_images.py) with the checkpoint's pixel bounds.
"""
from __future__ import annotations

import numpy as np

from engine.checkpoint import Checkpoint
from engine.families.colqwen2 import ModelArgs
from engine.multimodal.qwen_images import QwenImageProcessor
from engine.text.tokenizer import TextTokenizer
from engine.multimodal.inputs import PreparedImage, RetrieverInputs, check_prompt_tokens, query_format

IMAGE_TOKEN, VISION_START, VISION_END = "<|image_pad|>", "<|vision_start|>", "<|vision_end|>"
QUERY_PREFIX, AUGMENTATION_TOKEN, N_AUGMENTATION = "Query: ", "<|endoftext|>", 10
QUERY_SUFFIX = AUGMENTATION_TOKEN * N_AUGMENTATION
DOCUMENT_PREFIX, DOCUMENT_TEXT, DOCUMENT_SUFFIX = "<|im_start|>user\n", "Describe the image.", "<|im_end|><|endoftext|>"
DOCUMENT_PROMPT = DOCUMENT_PREFIX + VISION_START + IMAGE_TOKEN + VISION_END + DOCUMENT_TEXT + DOCUMENT_SUFFIX


class ColQwenInputs(RetrieverInputs):
    query_prefix, query_suffix = QUERY_PREFIX, QUERY_SUFFIX
    document_prefix, document_text, document_suffix = DOCUMENT_PREFIX, DOCUMENT_TEXT, DOCUMENT_SUFFIX
    image_token = IMAGE_TOKEN

    def __init__(self, processor: QwenImageProcessor, tokenizer: TextTokenizer, image_token_id: int,
                 query_prefix: str = QUERY_PREFIX, augmentation_token: str = AUGMENTATION_TOKEN):
        super().__init__(tokenizer, image_token_id)
        self.processor = processor
        self.query_prefix, self.query_suffix = query_prefix, augmentation_token * N_AUGMENTATION

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
    prefix, augmentation = query_format(checkpoint, QUERY_PREFIX, AUGMENTATION_TOKEN)
    check_prompt_tokens(checkpoint.path, tokenizer, (IMAGE_TOKEN, VISION_START, VISION_END, "<|im_start|>", "<|im_end|>",
                                              "<|endoftext|>", augmentation), IMAGE_TOKEN, args.image_token_id)
    return ColQwenInputs(processor, tokenizer, args.image_token_id, prefix, augmentation)

