"""A tiny random Llama-Nemotron-VL-Embed checkpoint and its reference, composed from transformers' modules.

The model's own code is remote code (not in transformers), so the reference is built here from what seed 001
describes: transformers' SiglipVisionModel (its last_hidden_state is the post-layernorm output, select_layer -1),
InternVL's pixel shuffle written in torch, the mlp1 Sequential (LayerNorm, Linear, GELU, Linear) and
transformers' LlamaModel run bidirectionally (config.is_causal = False). The checkpoint is saved in the
published export's key layout (`vision_model.vision_model.*` with the SigLIP head, `mlp1.{0,1,3}.*`,
`language_model.{embed_tokens,layers,norm}.*`) with config.json's vision_config / llm_config nested as the
published config.json has them, plus processor_config.json and the sentence-transformers files.
"""
from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np

from tests.engine.families.qwen3_fixture import build_tokenizer
from tests.engine.helpers import perturb_vectors, torch

TILE, PATCH = 32, 8  # 4x4 patches per tile -> 2x2 tokens after the pixel shuffle
TOKENS_PER_TILE = 4
MAX_TILES = 6
SPECIALS = ["<img>", "</img>", "<IMG_CONTEXT>"]


def tokenizer():
    tok = build_tokenizer()
    tok.add_tokens(SPECIALS, special_tokens=True)
    return tok


def pixel_shuffle(x, scale: float = 0.5):
    """InternVL's pixel_shuffle (v2) on [N, W, H, C], transcribed in torch."""
    n, w, h, c = x.shape
    x = x.view(n, w, int(h * scale), int(c / scale)).permute(0, 2, 1, 3).contiguous()
    x = x.view(n, int(h * scale), int(w * scale), int(c / (scale * scale)))
    return x.permute(0, 2, 1, 3).contiguous()


def build_reference(seed: int = 0):
    """(torch module with .vision_model/.mlp1/.language_model, its config.json dict, tokenizer)."""
    t = torch()
    from transformers import LlamaConfig, LlamaModel, SiglipVisionConfig, SiglipVisionModel

    tok = tokenizer()
    t.manual_seed(seed)
    vision = SiglipVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                image_size=TILE, patch_size=PATCH)
    llm = LlamaConfig(vocab_size=len(tok), hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=16, intermediate_size=96, max_position_embeddings=512,
                      rms_norm_eps=1e-5, pad_token_id=tok.pad_token_id, initializer_range=0.1,
                      rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                       "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                       "original_max_position_embeddings": 16})
    ref = t.nn.Module()
    ref.vision_model = SiglipVisionModel(vision)
    width = vision.hidden_size * 4
    ref.mlp1 = t.nn.Sequential(t.nn.LayerNorm(width), t.nn.Linear(width, llm.hidden_size), t.nn.GELU(),
                               t.nn.Linear(llm.hidden_size, llm.hidden_size))
    ref.language_model = LlamaModel(llm)
    ref.language_model.config.is_causal = False  # LlamaBidirectionalModel: no causal mask
    perturb_vectors(ref, seed)
    ref.eval()
    config = {
        "architectures": ["LlamaNemotronVLModel"], "model_type": "llama_nemotron_vl",
        "vision_config": vision.to_dict(),
        "llm_config": {**llm.to_dict(), "model_type": "llama_bidirec", "architectures": ["LlamaBidirectionalModel"],
                       "pooling": "avg"},
        "downsample_ratio": 0.5, "force_image_size": TILE, "select_layer": -1,
        "template": "bidirectional-llama-retriever", "dynamic_image_size": True, "use_thumbnail": True,
        "min_dynamic_patch": 1, "max_dynamic_patch": 12, "max_input_tiles": MAX_TILES,
        "img_context_token_id": tok.convert_tokens_to_ids("<IMG_CONTEXT>"), "pooling": "avg",
        "q_max_length": 512, "p_max_length": 4096, "query_prefix": "query:", "passage_prefix": "passage:",
    }
    return ref, config, tok


def published_key(key: str) -> str:
    """transformers 5 flattens SiglipVisionModel (`embeddings.*` at its root); the published export was written
    by the nested one, whose tower sits under `vision_model.vision_model.`."""
    if key.startswith("vision_model.") and not key.startswith("vision_model.vision_model."):
        return "vision_model." + key
    return key


def built(folder: Path) -> tuple[Path, object, object]:
    """(folder, torch reference module, tokenizer): what the model and server tests share."""
    folder, ref = make_checkpoint(folder)
    return folder, ref, tokenizer()


def make_checkpoint(folder: Path, seed: int = 0):
    """Write the checkpoint; returns (folder, torch reference module)."""
    from safetensors.torch import save_file

    ref, config, tok = build_reference(seed)
    folder.mkdir(parents=True, exist_ok=True)
    save_file({published_key(k): v.contiguous() for k, v in ref.state_dict().items()}, str(folder / "model.safetensors"))
    tok.save_pretrained(str(folder))
    files = {
        "config.json": config,
        "processor_config.json": {"processor_class": "LlamaNemotronVLProcessor", "image_size": TILE,
                                  "max_input_tiles": MAX_TILES, "use_thumbnail": True, "dynamic_image_size": True,
                                  "norm_type": "siglip", "num_image_token": TOKENS_PER_TILE,
                                  "q_max_length": 512, "p_max_length": 4096},
        "modules.json": [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
                         {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}],
        "1_Pooling/config.json": {"word_embedding_dimension": 64, "pooling_mode_mean_tokens": True},
    }
    for rel, content in files.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_text(json.dumps(content), encoding="utf-8")
    return folder, ref


# -- the reference processor: InternVL's dynamic_preprocess, transcribed with PIL crops ---------------------

def reference_tiles(data: bytes, tile: int = TILE, min_num: int = 1, max_num: int = MAX_TILES,
                    use_thumbnail: bool = True) -> np.ndarray:
    """InternVL's dynamic_preprocess as written there (set of ratios, area-aware score, PIL resize and crop
    boxes, thumbnail when split), then rescale and SigLIP normalization -> float32 [T, 3, tile, tile]."""
    from PIL import Image

    image = Image.open(io.BytesIO(data))
    image = image.convert("RGB") if image.mode != "RGB" else image
    width, height = image.size
    aspect_ratio = width / height
    target_ratios = sorted({(i, j) for n in range(min_num, max_num + 1) for i in range(1, n + 1)
                            for j in range(1, n + 1) if min_num <= i * j <= max_num}, key=lambda x: x[0] * x[1])
    best_factor, best_ratio = float("-inf"), (1, 1)
    for ratio in target_ratios:
        target_aspect = ratio[0] / ratio[1]
        area_ratio = ratio[0] * ratio[1] * tile * tile / (width * height)
        factor = min(area_ratio, 0.6) * min(target_aspect / aspect_ratio, aspect_ratio / target_aspect)
        if factor > best_factor:
            best_factor, best_ratio = factor, ratio
    target_width, target_height = tile * best_ratio[0], tile * best_ratio[1]
    blocks = best_ratio[0] * best_ratio[1]
    resized = image.resize((target_width, target_height), Image.BICUBIC)
    columns = target_width // tile
    tiles = [resized.crop(((i % columns) * tile, (i // columns) * tile,
                           (i % columns + 1) * tile, (i // columns + 1) * tile)) for i in range(blocks)]
    if use_thumbnail and blocks != 1:
        tiles.append(image.resize((tile, tile), Image.BICUBIC))
    arrays = np.stack([np.asarray(t, dtype=np.float32).transpose(2, 0, 1) / 255.0 for t in tiles])
    return ((arrays - 0.5) / 0.5).astype(np.float32)


def reference_prompt(n_tiles: int, text: str = "") -> str:
    """The document form the reference processor builds for an image (plus optional text) after its prefix."""
    return "passage: <img>" + "<IMG_CONTEXT>" * (TOKENS_PER_TILE * n_tiles) + "</img> " + text


def reference_embedding(ref, tok, text: str, image: bytes | None = None) -> np.ndarray:
    """One input through the composed reference, unpadded: mean of the final hidden states, L2-normalized."""
    t = torch()
    if image is not None:
        tiles = reference_tiles(image)
        text = reference_prompt(len(tiles), text)
    ids = t.tensor([tok(text).input_ids])
    with t.inference_mode():
        embeds = ref.language_model.embed_tokens(ids)
        if image is not None:
            patches = ref.vision_model(pixel_values=t.from_numpy(tiles)).last_hidden_state
            n, count, c = patches.shape
            side = int(count ** 0.5)
            shuffled = pixel_shuffle(patches.reshape(n, side, side, c))
            features = ref.mlp1(shuffled.reshape(n, -1, shuffled.shape[-1])).reshape(-1, embeds.shape[-1])
            positions = (ids[0] == tok.convert_tokens_to_ids("<IMG_CONTEXT>")).nonzero().squeeze(1)
            assert positions.numel() == features.shape[0]
            embeds[0, positions] = features
        hidden = ref.language_model(inputs_embeds=embeds, attention_mask=t.ones_like(ids)).last_hidden_state[0]
    vec = hidden.double().mean(0).numpy()
    return vec / np.linalg.norm(vec)


def images() -> dict[str, bytes]:
    """Encoded test pictures: landscape, portrait, tiny, square, very wide; RGB, RGBA, grey and palette modes."""
    from PIL import Image

    rng = np.random.default_rng(7)
    specs = {"landscape": ((48, 100, 3), "RGB"), "portrait": ((90, 40, 3), "RGB"), "tiny": ((10, 14, 3), "RGB"),
             "square_rgba": ((64, 64, 4), "RGBA"), "wide_grey": ((20, 150), "L"), "palette": ((33, 47), "P")}
    out = {}
    for name, (shape, mode) in specs.items():
        buf = io.BytesIO()
        pixels = rng.integers(0, 256, shape, dtype=np.uint8)
        Image.fromarray(pixels, "L" if mode == "P" else mode).convert(mode).save(buf, "PNG")
        out[name] = buf.getvalue()
    return out
