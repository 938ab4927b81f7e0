"""A tiny random Qwen3VLForConditionalGeneration (3 decoder layers of width 64, a 3-block vision tower of width
32 with DeepStack after blocks 0 and 2) with the small BPE tokenizer carrying Qwen3-VL's vision markers.

Every 1-D parameter is perturbed so a dropped norm or bias shows. The learned position table is 8 x 8, so
images larger than 128 px on a side exercise the upsampling of the position grid.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from tests.engine.families.qwen3_fixture import build_tokenizer
from tests.engine.helpers import perturb_vectors, torch

VISION_SPECIALS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
PATCH, MERGE, TEMPORAL = 16, 2, 2
PATCH_DIM = 3 * TEMPORAL * PATCH * PATCH


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
