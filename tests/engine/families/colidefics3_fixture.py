"""A tiny random ColIdefics3 checkpoint (colpali-engine's modeling file on a tiny Idefics3 config) and its
reference: colpali-engine's ColIdefics3 forward, with transformers' Idefics3Processor / Idefics3ImageProcessorPil
making the inputs as colpali's ColIdefics3Processor does (its module imports torchvision through the package, so
the facts are used: a page gets the fixed visual prompt, and a query is what colpali-engine 0.3.5 - 0.3.10's
ColIdefics3Processor.process_queries made when vidore's ColSmol checkpoints were trained, written out below).

The vision tower takes 32-pixel tiles of 8-pixel patches (16 patches, 4 image tokens after the 2x pixel
shuffle); the processor resizes the longest edge to 64 pixels, so an image is at most 2 x 2 tiles + the global one.
"""
from __future__ import annotations

import importlib.util
import io
import json
from pathlib import Path

import numpy as np

from tests.engine.helpers import byte_level_bpe, perturb_vectors, torch

TILE, PATCH, LONGEST_EDGE = 32, 8, 64
TOKENS_PER_TILE = (TILE // PATCH) ** 2 // 4
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<end_of_utterance>", "<image>", "<fake_token_around_image>",
           "<global-img>"] + [f"<row_{r}_col_{c}>" for r in range(1, 7) for c in range(1, 7)]
CORPUS = ["What was the total revenue in 2023?", "User: Describe the image.", "Assistant: a chart of sales",
          "the quarterly report shows growth", "a photo of a cat on a sofa", "where is the signature?"] * 20
# colpali-engine 0.3.8, colpali_engine/models/idefics3/colidefics3/processing_colidefics3.py:
#   query_prefix = "Query: "; query_augmentation_token = "<end_of_utterance>"
#   process_queries: suffix = self.query_augmentation_token * 10
#                    query = self.query_prefix + query + suffix + "\n"; self.tokenizer(text=texts_query, ...)
QUERY_PREFIX, QUERY_AUGMENTATION = "Query: ", "<end_of_utterance>" * 10


def query_text(text: str, prefix: str = QUERY_PREFIX, augmentation: str = QUERY_AUGMENTATION) -> str:
    """colpali-engine 0.3.8's process_queries text for one query."""
    return prefix + text + augmentation + "\n"
VISUAL_PROMPT = "<|im_start|>User:<image>Describe the image.<end_of_utterance>\nAssistant:"


def colidefics3_class():
    """colpali-engine's ColIdefics3, its modeling file loaded by path (the package __init__ needs torchvision)."""
    spec = importlib.util.find_spec("colpali_engine")
    path = Path(spec.submodule_search_locations[0]) / "models/idefics3/colidefics3/modeling_colidefics3.py"
    module_spec = importlib.util.spec_from_file_location("colpali_modeling_colidefics3", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module.ColIdefics3


def build_tokenizer():
    from transformers import PreTrainedTokenizerFast

    tok = byte_level_bpe(CORPUS, SPECIAL, 300)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>",
                                   additional_special_tokens=SPECIAL[1:])


def make_checkpoint(folder: Path, seed: int = 0) -> Path:
    from transformers import Idefics3Config, Idefics3ImageProcessorPil, Idefics3Processor

    t = torch()
    tokenizer = build_tokenizer()
    image_token_id = tokenizer.convert_tokens_to_ids("<image>")
    config = Idefics3Config(
        text_config={"model_type": "llama", "vocab_size": len(tokenizer), "hidden_size": 48,
                     "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
                     "num_key_value_heads": 2, "max_position_embeddings": 512, "rms_norm_eps": 1e-5,
                     "pad_token_id": tokenizer.pad_token_id, "tie_word_embeddings": False},
        vision_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
                       "num_attention_heads": 4, "image_size": TILE, "patch_size": PATCH},
        scale_factor=2, image_token_id=image_token_id, pad_token_id=tokenizer.pad_token_id)
    config.architectures = ["ColIdefics3"]
    t.manual_seed(seed)
    model = colidefics3_class()(config).eval()
    perturb_vectors(model, seed)
    model.save_pretrained(folder)
    image_processor = Idefics3ImageProcessorPil(size={"longest_edge": LONGEST_EDGE},
                                               max_image_size={"longest_edge": TILE})
    Idefics3Processor(image_processor, tokenizer, image_seq_len=TOKENS_PER_TILE).save_pretrained(folder)
    config_path = folder / "config.json"
    saved = json.loads(config_path.read_text())
    assert saved["architectures"] == ["ColIdefics3"], saved["architectures"]
    return folder


def reference_processor(folder: Path):
    from transformers import Idefics3ImageProcessorPil, Idefics3Processor, PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast.from_pretrained(folder)
    return Idefics3Processor(Idefics3ImageProcessorPil.from_pretrained(folder), tokenizer,
                             image_seq_len=TOKENS_PER_TILE)


def reference_model(folder: Path):
    t = torch()
    return colidefics3_class().from_pretrained(folder, dtype=t.float32).eval()


def open_image(data: bytes):
    from PIL import Image

    return Image.open(io.BytesIO(data)).convert("RGB")


def query_ids(processor, text: str) -> list[int]:
    """colpali-engine 0.3.8's process_queries ids for one query: its text through the tokenizer alone."""
    return processor.tokenizer(text=[query_text(text)])["input_ids"][0]


def reference_rows(model, processor, text: str, images: list[bytes]) -> np.ndarray:
    """colpali's forward on one processed input (no padding rows to trim): its token vectors [n, 128]."""
    t = torch()
    if images:
        batch = processor(text=[text], images=[[open_image(d) for d in images]], return_tensors="pt")
    else:  # a query: process_queries tokenizes with the tokenizer alone
        batch = processor.tokenizer(text=[text], return_tensors="pt")
    with t.inference_mode():
        return model(**batch).float().numpy()[0]


def reference_queries(model, processor, texts: list[str]) -> list[np.ndarray]:
    """colpali's process_queries + forward, one query at a time."""
    return [reference_rows(model, processor, query_text(text), []) for text in texts]


def reference_images(model, processor, images: list[bytes]) -> list[np.ndarray]:
    """colpali's process_images + forward, one page at a time."""
    return [reference_rows(model, processor, VISUAL_PROMPT, [data]) for data in images]


def maxsim(query: np.ndarray, document: np.ndarray) -> float:
    """colpali's score_multi_vector for one pair: the sum over query rows of the best dot product."""
    t = torch()
    return float(t.einsum("nd,md->nm", t.tensor(query), t.tensor(document)).max(dim=1)[0].sum())
