"""Tiny random ColQwen2.5 / ColQwen2 checkpoints (colpali-engine's ColQwen2_5 on a Qwen2.5-VL config, ColQwen2 on a
Qwen2-VL one) with a byte-level BPE tokenizer carrying Qwen2-VL's special tokens and a Qwen2-VL image processor,
saved in the published colpali layout (model.* decoder, visual.*, custom_text_proj.*).

colpali-engine's package __init__ imports processors that need torchvision (unusable here), so its modeling
file is loaded by path; it imports only torch and transformers.
"""
from __future__ import annotations

import ast
import importlib.util
import json
from pathlib import Path

from tests.engine.helpers import byte_level_bpe, perturb_vectors

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>",
            "<|video_pad|>"]
CORPUS = [
    "user Describe the image. What was the total revenue in 2023? Quarterly revenue grew twelve percent.",
    "A woman playing with her dog on a beach. The giant panda is a bear species endemic to China.",
    "Gravity is a force that attracts two bodies. Machine learning is a field of study.",
] * 20
# window_size 56 = 2 merged blocks of 2x2 patches of 14 pixels: images of a few blocks have several windows
VISION = {"qwen2_5_vl": dict(depth=3, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64,
                             patch_size=14, spatial_merge_size=2, temporal_patch_size=2, window_size=56,
                             fullatt_block_indexes=[1]),
          "qwen2_vl": dict(depth=2, embed_dim=32, hidden_size=64, mlp_ratio=2, num_heads=2, patch_size=14,
                           spatial_merge_size=2, temporal_patch_size=2)}
# colpali-engine's model class and file for each base
COLPALI = {"qwen2_5_vl": ("ColQwen2_5", "models/qwen2_5/colqwen2_5/modeling_colqwen2_5.py"),
           "qwen2_vl": ("ColQwen2", "models/qwen2/colqwen2/modeling_colqwen2.py")}
TEXT = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            max_position_embeddings=4096, rope_parameters={"rope_type": "default", "mrope_section": [2, 3, 3],
                                                            "rope_theta": 100.0})
MIN_PIXELS, MAX_PIXELS = 56 * 56, 28 * 28 * 40  # at most 40 image tokens


def colpali_module(name: str, relative: str):
    """A colpali-engine module loaded from its file (not through the package)."""
    import transformers

    path = Path(transformers.__file__).parents[1] / "colpali_engine" / relative
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build_tokenizer():
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_object=byte_level_bpe(CORPUS, SPECIALS, 500), eos_token="<|im_end|>",
                                   pad_token="<|endoftext|>", extra_special_tokens={"image_token": "<|image_pad|>"})


def vl_config(tokenizer, base: str):
    import transformers

    ids = {name: tokenizer.convert_tokens_to_ids(tok) for name, tok in (
        ("image_token_id", "<|image_pad|>"), ("video_token_id", "<|video_pad|>"),
        ("vision_start_token_id", "<|vision_start|>"), ("vision_end_token_id", "<|vision_end|>"))}
    config_class = {"qwen2_5_vl": transformers.Qwen2_5_VLConfig, "qwen2_vl": transformers.Qwen2VLConfig}[base]
    return config_class(text_config=dict(TEXT, vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id,
                                         bos_token_id=None, eos_token_id=tokenizer.eos_token_id),
                        vision_config=VISION[base], **ids)


def save_processor(folder: Path, tokenizer) -> None:
    import transformers

    tokenizer.save_pretrained(folder)
    transformers.Qwen2VLImageProcessorPil(min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS).save_pretrained(folder)


def make_checkpoint(folder: Path, seed: int = 0, base: str = "qwen2_5_vl"):
    """Save the checkpoint as vidore/colqwen2.5-base (vidore/colqwen2-base) lays it out; returns the torch
    reference model."""
    import torch
    from safetensors.torch import load_file, save_file

    tokenizer = build_tokenizer()
    name, relative = COLPALI[base]
    torch.manual_seed(seed)
    model = getattr(colpali_module(f"colpali_modeling_{base}", relative), name)(vl_config(tokenizer, base)).eval()
    perturb_vectors(model, seed)
    model.save_pretrained(folder)
    tensors = load_file(folder / "model.safetensors")
    save_file({("model." + k.removeprefix("language_model.")) if k.startswith("language_model.") else k: v
               for k, v in tensors.items()}, folder / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == [name] and config["model_type"] == base
    save_processor(folder, tokenizer)
    return model


def make_transformers_export(folder: Path, seed: int = 1, base: str = "qwen2_5_vl"):
    """transformers' ColQwen2ForRetrieval over a qwen2_5_vl or qwen2_vl model (vlm.*, embedding_proj_layer.*)."""
    import torch
    import transformers

    tokenizer = build_tokenizer()
    torch.manual_seed(seed)
    config = transformers.ColQwen2Config(vlm_config=vl_config(tokenizer, base).to_dict(), embedding_dim=128)
    model = transformers.ColQwen2ForRetrieval(config).eval()
    perturb_vectors(model, seed)
    model.save_pretrained(folder)
    save_processor(folder, tokenizer)
    return model


def colpali_prompts(base: str = "qwen2_5_vl") -> dict[str, str]:
    """The string class attributes of colpali-engine's ColQwen2_5_Processor (ColQwen2_Processor) and of its base
    class (read from the source: importing it needs torchvision)."""
    import transformers

    root = Path(transformers.__file__).parents[1] / "colpali_engine"
    found = {}
    for relative, cls in (("utils/processing_utils.py", "BaseVisualRetrieverProcessor"),
                          {"qwen2_5_vl": ("models/qwen2_5/colqwen2_5/processing_colqwen2_5.py", "ColQwen2_5_Processor"),
                           "qwen2_vl": ("models/qwen2/colqwen2/processing_colqwen2.py", "ColQwen2Processor")}[base]):
        tree = ast.parse((root / relative).read_text())
        body = next(node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == cls).body
        for node in body:
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
                value = ast.literal_eval(node.value)
                if isinstance(value, str):
                    found[node.target.id] = value
    return found
