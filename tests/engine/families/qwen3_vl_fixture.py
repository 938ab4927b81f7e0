"""A tiny random Qwen3VLForConditionalGeneration (3 decoder layers of width 64, a 3-block vision tower of width
32 with DeepStack after blocks 0 and 2) with the small BPE tokenizer carrying Qwen3-VL's vision markers.

Every 1-D parameter is perturbed so a dropped norm or bias shows. The learned position table is 8 x 8, so
images larger than 128 px on a side exercise the upsampling of the position grid.
"""
from __future__ import annotations

import io
from pathlib import Path

import numpy as np

from tests.engine.families.qwen3_fixture import build_tokenizer
from tests.engine.helpers import perturb_vectors, torch

VISION_SPECIALS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
PATCH, MERGE, TEMPORAL = 16, 2, 2
PATCH_DIM = 3 * TEMPORAL * PATCH * PATCH
IMAGE_PAD = "<|image_pad|>"
DEFAULT_INSTRUCTION = "Represent the user's input."


def tokenizer():
    return build_tokenizer(VISION_SPECIALS)


def make_checkpoint(folder: Path, seed: int = 0, tie: bool = False, text: dict | None = None,
                    vision: dict | None = None):
    """Save a random checkpoint with its tokenizer; returns (folder, the torch model in eval mode)."""
    t = torch()
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

    tok = tokenizer()
    ids = {name: tok.convert_tokens_to_ids(name) for name in VISION_SPECIALS}
    text_config = dict(vocab_size=len(tok), hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
                       num_key_value_heads=2, head_dim=16, intermediate_size=96, max_position_embeddings=2048,
                       rms_norm_eps=1e-6, pad_token_id=tok.pad_token_id, initializer_range=0.1,
                       rope_parameters=dict(rope_type="default", rope_theta=1_000_000.0, mrope_section=[2, 3, 3],
                                            mrope_interleaved=True))
    vision_config = dict(depth=3, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=PATCH,
                         spatial_merge_size=MERGE, temporal_patch_size=TEMPORAL, out_hidden_size=64,
                         num_position_embeddings=64, deepstack_visual_indexes=[0, 2], initializer_range=0.1)
    text_config.update(text or {})
    vision_config.update(vision or {})
    config = Qwen3VLConfig(text_config=text_config, vision_config=vision_config, tie_word_embeddings=tie,
                           image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
                           vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"])
    t.manual_seed(seed)
    model = Qwen3VLForConditionalGeneration(config)
    perturb_vectors(model, seed)
    model.eval()
    model.save_pretrained(str(folder))
    tok.save_pretrained(str(folder))
    return folder, model


def random_patches(grid: tuple[int, int, int], seed: int) -> np.ndarray:
    """Flattened patches for a grid, as the image processor lays them out (values ~ normalized pixels)."""
    t, h, w = grid
    return np.random.default_rng(seed).normal(size=(t * h * w, PATCH_DIM)).astype(np.float32)


def reference_hidden(model, ids: list[int], patches: np.ndarray | None = None,
                     grids: list[tuple[int, int, int]] = ()) -> np.ndarray:
    """transformers' Qwen3VLModel last_hidden_state [n, D] for one unpadded row with its images."""
    t = torch()
    image_id = model.config.image_token_id
    inputs = {"input_ids": t.tensor([ids]), "attention_mask": t.ones(1, len(ids), dtype=t.long)}
    if grids:
        inputs.update(pixel_values=t.from_numpy(patches), image_grid_thw=t.tensor(grids),
                      mm_token_type_ids=(inputs["input_ids"] == image_id).int())
    with t.inference_mode():
        out = model.model(**inputs)
    return out.last_hidden_state[0].double().numpy()


# A chat template with Qwen3-VL's layout (system and user messages, content given as a string or as typed items;
# one <|image_pad|> between vision markers per image item; the assistant header on add_generation_prompt).
CHAT_TEMPLATE = """{%- macro render(content) -%}
{%- if content is string -%}{{ content }}{%- else -%}
{%- for item in content -%}
{%- if item.type == 'image' or 'image' in item or 'image_url' in item -%}<|vision_start|><|image_pad|><|vision_end|>
{%- elif item.type == 'video' or 'video' in item -%}<|vision_start|><|video_pad|><|vision_end|>
{%- elif 'text' in item -%}{{ item.text }}{%- endif -%}
{%- endfor -%}{%- endif -%}
{%- endmacro -%}
{%- for message in messages -%}
<|im_start|>{{ message.role }}
{{ render(message.content) }}<|im_end|>
{% endfor -%}
{%- if add_generation_prompt -%}<|im_start|>assistant
{% endif -%}"""
# Qwen3-VL's processor settings, with pixel bounds small enough for a test: 4 to 40 image tokens.
PREPROCESSOR = {"image_processor_type": "Qwen2VLImageProcessorFast", "patch_size": PATCH, "merge_size": MERGE,
                "temporal_patch_size": TEMPORAL, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
                "size": {"shortest_edge": 4 * 32 * 32, "longest_edge": 40 * 32 * 32}}
QUERY_PROMPT = "Retrieve images or text relevant to the user's query"
SENTENCE_TRANSFORMERS = {
    "modules.json": [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
                     {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
                     {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}],
    "1_Pooling/config.json": {"word_embedding_dimension": 64, "pooling_mode_lasttoken": True,
                              "pooling_mode_mean_tokens": False, "pooling_mode_cls_token": False},
    "config_sentence_transformers.json": {"prompts": {"query": QUERY_PROMPT}, "default_prompt_name": None},
}


def make_embedding_checkpoint(folder: Path, seed: int = 0):
    """make_checkpoint laid out as Qwen3-VL-Embedding: its chat template, image processor and pooling files."""
    import json

    folder, model = make_checkpoint(folder, seed)
    (folder / "chat_template.jinja").write_text(CHAT_TEMPLATE, encoding="utf-8")
    (folder / "preprocessor_config.json").write_text(json.dumps(PREPROCESSOR), encoding="utf-8")
    for rel, content in SENTENCE_TRANSFORMERS.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_text(json.dumps(content), encoding="utf-8")
    return folder, model


def png_image(width: int, height: int, seed: int) -> bytes:
    """A random RGB image, PNG-encoded."""
    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels, "RGB").save(out, format="PNG")
    return out.getvalue()


def embedding_reference(folder: Path, model, pixel_bounds: tuple[int, int] | None = None):
    """parts (text and encoded images, in order), instruction -> the reference's normalized vector and the
    length of its token sequence. pixel_bounds: (min_pixels, max_pixels) in place of the checkpoint's."""
    from PIL import Image
    from transformers import AutoTokenizer, Qwen2VLImageProcessorPil

    tok = AutoTokenizer.from_pretrained(str(folder))
    size = {"shortest_edge": pixel_bounds[0], "longest_edge": pixel_bounds[1]} if pixel_bounds else None
    processor = Qwen2VLImageProcessorPil.from_pretrained(str(folder), **({"size": size} if size else {}))

    def vector(parts, instruction: str = DEFAULT_INSTRUCTION) -> tuple[np.ndarray, int]:
        content, images = [], []
        for part in parts:
            if isinstance(part, bytes):
                images.append(Image.open(io.BytesIO(part)))
                content.append({"type": "image"})
            else:
                content.append({"type": "text", "text": part})
        messages = [{"role": "system", "content": [{"type": "text", "text": instruction}]},
                    {"role": "user", "content": content}]
        text = tok.apply_chat_template(messages, chat_template=CHAT_TEMPLATE, add_generation_prompt=True,
                                       tokenize=False)
        patches, grids = None, []
        if images:
            out = processor(images, return_tensors="np")
            patches, grids = out["pixel_values"], [tuple(int(v) for v in g) for g in out["image_grid_thw"]]
            pieces = text.split(IMAGE_PAD)
            assert len(pieces) == len(images) + 1
            text = pieces[0] + "".join(IMAGE_PAD * (t * h * w // MERGE ** 2) + piece
                                       for (t, h, w), piece in zip(grids, pieces[1:], strict=True))
        ids = tok(text).input_ids
        last = reference_hidden(model, ids, patches, grids)[-1]
        return last / np.linalg.norm(last), len(ids)

    return vector
