"""/health, /props, /models and /slots bodies (docs/llama-server-contract.md §6), keys in llama-server's order; router mode's own /models
and /props are compat/wire/router.py's. Pure: no falcon."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from compat.wire.inputs import MEDIA_MARKER
from engine.types import ModelInfo, Pooling

if TYPE_CHECKING:
    from compat.settings import Settings

# llama's task_params::to_json(true) with common_params_sampling's defaults (float32 values widened to double,
# as llama prints them), the seed being --seed's. None of them affects embeddings; clients read /props for its shape.
_SAMPLING_DEFAULTS: dict[str, Any] = {
    "seed": 4294967295, "temperature": 0.800000011920929, "dynatemp_range": 0.0, "dynatemp_exponent": 1.0,
    "top_k": 40, "top_p": 0.949999988079071, "min_p": 0.05000000074505806, "top_n_sigma": -1.0,
    "xtc_probability": 0.0, "xtc_threshold": 0.10000000149011612, "typical_p": 1.0, "repeat_last_n": 64,
    "repeat_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0, "dry_multiplier": 0.0,
    "dry_base": 1.75, "dry_allowed_length": 2, "dry_penalty_last_n": -1, "mirostat": 0, "mirostat_tau": 5.0,
    "mirostat_eta": 0.10000000149011612, "adaptive_target": -1.0, "adaptive_decay": 0.8999999761581421,
    "max_tokens": -1, "n_predict": -1, "n_keep": 0, "n_discard": 0, "ignore_eos": False, "stream": True,
    "n_probs": 0, "min_keep": 0, "chat_format": "Content-only", "reasoning_format": "none",
    "reasoning_in_content": False, "generation_prompt": "",
    "samplers": ["penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc", "temperature"],
    "speculative.types": "none", "timings_per_token": False, "post_sampling_probs": False,
    "backend_sampling": False, "lora": [],
}


def render_health_response() -> dict[str, Any]:
    return {"status": "ok"}


def render_props_response(settings: Settings, info: ModelInfo, version: str,
                          model_name: str | None = None) -> dict[str, Any]:
    """model_name: the model's id on a several-model server (else llama's name from the settings)."""
    # chat_template_caps is left out (no chat template), media_marker too unless the model takes images
    return {
        "default_generation_settings": {"params": {**_SAMPLING_DEFAULTS, "seed": settings.seed},
                                        "n_ctx": info.slot_ctx},
        "total_slots": info.n_slots,
        "model_alias": model_name or settings.model_name,
        "model_ftype": info.ftype,
        "model_path": info.path,
        "modalities": {"vision": info.takes_images, "video": False, "audio": False},
        **({"media_marker": MEDIA_MARKER} if info.takes_images else {}),
        "endpoint_slots": settings.slots,
        "endpoint_props": settings.props,
        "endpoint_metrics": settings.metrics,
        "ui": False,
        "chat_template": "",
        "bos_token": info.bos_token,
        "eos_token": info.eos_token,
        "build_info": f"mlx-embed-server-{version}",
        "is_sleeping": False,
        "cors_proxy_enabled": False,
        # ours, after llama's keys: the family serving the model and the shapes fitted at startup
        "family": info.family,
        "weights": info.weights,  # "quantized kernels", "dequantized to float32 at load", or the dtype
        "resident_bytes": info.resident_bytes,
        "kernels": info.kernels,  # "cpu-arithmetic" on a CPU, "fused" (MLX's fused kernels) on a GPU
        "max_seq": info.max_input_tokens,
        "rows": info.batch_rows,
        "batch_tokens": info.batch_tokens,
        "widths": list(info.widths),
        # dynamic-resolution images: the fewest and most tokens one image becomes (--image-min/max-tokens)
        **({"image_tokens": dict(zip(("min", "max"), info.image_token_bounds))} if info.image_token_bounds else {}),
        **request_capabilities(info, prompt_texts=True),
    }


def render_models_response(settings: Settings, info: ModelInfo, created: int) -> dict[str, Any]:
    """The single-model /models: Ollama's `models` list first, then the OpenAI list (§6.3); `created` is the time
    of this request."""
    name = settings.model_name
    # the engine refuses to load an embedder in rank mode and a reranker outside it, so this names the model
    capabilities = ["rerank"] if settings.pooling is Pooling.RANK else ["embedding"]
    if info.is_classifier:  # loaded in either mode: its label scores (/predict, /classify)
        capabilities = ["classify"]
    return {
        "models": [{
            "name": name, "model": name, "modified_at": "", "size": "", "digest": "", "type": "model",
            "description": "", "tags": [""],
            # llama adds "multimodal" when the model takes images (an --mmproj there)
            "capabilities": capabilities + (["multimodal"] if info.takes_images else []), "parameters": "",
            "details": {"parent_model": "", "format": info.file_format, "family": info.family or info.model_type,
                        "families": [info.family or info.model_type], "parameter_size": "",
                        "quantization_level": ""},
        }],
        "object": "list",
        "data": [{
            "id": name,
            "aliases": list(settings.alias) or [name],  # llama inserts the model name when no --alias is given
            "tags": list(settings.tags),
            "object": "model",
            "created": created,
            "owned_by": "llamacpp",
            "meta": render_model_meta(info),
        }],
    }


def render_model_meta(info: ModelInfo) -> dict[str, Any]:
    """/v1/models `meta` of a loaded model."""
    return {"vocab_type": int(info.vocab_type), "n_vocab": info.n_vocab, "n_ctx": info.slot_ctx,
            "n_ctx_train": info.n_ctx_train, "n_embd": info.n_embd, "n_params": info.n_params,
            "size": info.size_bytes, "ftype": info.ftype, "weights": info.weights,
            "resident_bytes": info.resident_bytes, **request_capabilities(info, prompt_texts=False)}


def request_capabilities(info: ModelInfo, *, prompt_texts: bool) -> dict[str, Any]:
    """What a request may ask of this model (ours): an embedding model's prompts (names, or
    name -> text), the default one, the instruction template, whether texts go through its chat template, the
    `dimensions` range (Matryoshka; null for a multi-vector model, which refuses it), what an input may be
    (input_modalities: "text", "image") and whether the model answers one vector per token (multi_vector: a
    late-interaction model, which /maxsim scores); a sparse (SPLADE) encoder adds sparse: true and its
    max_active_dims; a model with task adapters adds its tasks and default_task. A reranker has only input_modalities: what its query and documents may be; a sequence
    classifier adds its labels and whether they are scored independently (multi_label: each label's sigmoid)
    rather than by softmax."""
    if info.is_classifier:  # its labels, and how they are scored (docs/routes.md, "Sequence classification")
        return {"input_modalities": list(info.modalities), "labels": list(info.labels),
                "multi_label": info.multi_label}
    if info.is_reranker:
        return {"input_modalities": list(info.modalities)}
    return {"prompts": dict(info.prompts) if prompt_texts else [name for name, _ in info.prompts],
            "default_prompt_name": info.default_prompt_name,
            "instruction_template": info.instruction_template,
            "chat_template_inputs": info.chat_template_inputs,
            "dimensions": None if info.multi_vector else {"min": 1, "max": info.n_embd},
            "input_modalities": list(info.modalities),
            "multi_vector": info.multi_vector,
            # a sparse (SPLADE) encoder: /embed_sparse answers it; n_embd is its vocabulary
            **({"sparse": True, "max_active_dims": info.max_active_dims} if info.is_sparse else {}),
            # task adapters (jina-embeddings-v3): what `task` may name (with each one's instruction in /props),
            # and what a request naming none runs with (null: the adapters off)
            **({"tasks": dict(info.tasks) if prompt_texts else [name for name, _ in info.tasks],
                "default_task": info.default_task} if info.tasks else {})}


def render_slots_response(info: ModelInfo, n_processing: int) -> list[dict[str, Any]]:
    """Idle-slot objects; requests inside the engine are shown as the first `n_processing` slots busy."""
    return [{"id": i, "n_ctx": info.slot_ctx, "speculative": False, "is_processing": i < n_processing}
            for i in range(info.n_slots)]
