"""Ollama's API bodies: POST /api/embed and /api/embeddings (legacy), GET /api/tags, POST /api/show, GET /api/ps,
GET /api/version. Pure: no falcon. The fields and rules are Ollama's (`api/types.go`, `server/routes.go`,
`llm/llama_server.go`; docs/routes.md, "Ollama's API").

Model names: Ollama's are `name:tag`, `:latest` when no tag is given; a request's name is looked up as sent,
then without a `:latest` tag. Listed models carry `:latest` unless their id has a tag of its own.
Errors are Ollama's `{"error": "<message>"}` with the status the llama-shaped answer would have had (404 for
a model this server does not serve, as Ollama answers).
"""
from __future__ import annotations

import hashlib
import math
import re
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

import numpy as np

from compat.errors import ApiError, bad_request
from compat.wire.inputs import parse_late_chunking, parse_task, parse_truncation_direction, whole
from engine.types import EmbedResult, ModelInfo, VocabType

LATEST = ":latest"
NOT_FOUND_STATUS = 404
BAD_INPUT = "invalid input type"
MODEL_REQUIRED = "model is required"
TOO_LONG = "the input length exceeds the context length"
# the Ollama API version whose shapes these routes follow (clients compare it to gate features)
OLLAMA_API_VERSION = "0.12.0"
FOREVER = datetime(2318, 1, 1, tzinfo=timezone.utc)  # Ollama's expiry for a model kept loaded forever

_GO_DURATION = re.compile(r"([0-9]*\.?[0-9]+)(ns|us|µs|ms|s|m|h)")
_UNIT_S = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}

# llama.cpp converts these families to its "bert" architecture, nomic-bert to "nomic-bert" (legacy_raw below)
_BERT_FAMILIES = frozenset({"bert", "distilbert", "roberta", "camembert", "xlm_roberta"})
_NOMIC_FAMILIES = frozenset({"nomic_bert"})


def not_found(name: str) -> ApiError:
    return ApiError(NOT_FOUND_STATUS, "not_found_error", f"model '{name}' not found")


def ollama_name(model_id: str) -> str:
    """How a served id is listed: `id:latest`, unless the id's last path part has a tag already."""
    return model_id if ":" in model_id.rsplit("/", 1)[-1] else model_id + LATEST


def resolve_name(name: str, served: list[str]) -> str | None:
    """The served id or alias an Ollama name means: as sent, else without `:latest`; None when neither."""
    if name in served:
        return name
    if name.endswith(LATEST) and name[: -len(LATEST)] in served:
        return name[: -len(LATEST)]
    return None


def parse_keep_alive(value: Any) -> float | None:
    """Ollama's keep_alive as seconds: a number of seconds or a Go duration ("5m", "1h30m", "0"); negative is
    forever (None). Missing: Ollama's 5 minutes."""
    if value is None:
        return 300.0
    if isinstance(value, bool):
        raise bad_request(f"keep_alive: unsupported type {type(value).__name__}")
    if isinstance(value, int | float):
        return None if value < 0 else float(value)
    if not isinstance(value, str):
        raise bad_request(f"keep_alive: unsupported type {type(value).__name__}")
    text = value.strip()
    sign = -1.0 if text.startswith("-") else 1.0
    body = text.lstrip("+-")
    if body == "0":
        return 0.0
    parts = _GO_DURATION.findall(body)
    if not body or "".join(n + u for n, u in parts) != body:
        raise bad_request(f'time: invalid duration "{value}"')
    seconds = sign * sum(float(n) * _UNIT_S[u] for n, u in parts)
    return None if seconds < 0 else seconds


@dataclass(frozen=True)
class OllamaEmbedRequest:
    model: str
    texts: list[str]
    truncate: bool
    dimensions: int | None
    keep_alive_s: float | None  # None: forever
    late_chunking: bool = False  # our extensions, as on every embedding route
    truncation_direction: str = "right"
    task: str | None = None  # a task adapter (jina-embeddings-v3)


def _model(body: dict[str, Any]) -> str:
    model = body.get("model", "")
    if not isinstance(model, str):
        raise bad_request("json: cannot unmarshal model into a string")
    return model


def _options(body: dict[str, Any]) -> None:
    options = body.get("options")
    if options is not None and not isinstance(options, dict):
        raise bad_request('"options" must be an object')  # accepted otherwise: runner options (num_ctx, ...)


def parse_embed_request(body: dict[str, Any], width: int) -> OllamaEmbedRequest:
    """POST /api/embed: `input` a string (empty: no input) or a list of strings."""
    raw = body.get("input")
    if isinstance(raw, str):
        texts = [raw] if raw else []
    elif isinstance(raw, list):
        if not all(isinstance(text, str) for text in raw):
            raise bad_request(BAD_INPUT)
        texts = list(raw)
    elif raw is None:
        texts = []
    else:
        raise bad_request(BAD_INPUT)
    truncate = body.get("truncate", True)
    if truncate is None:
        truncate = True
    if not isinstance(truncate, bool):
        raise bad_request('"truncate" must be a boolean')
    dimensions = whole(body.get("dimensions"))
    if dimensions is not None and (not isinstance(dimensions, int) or isinstance(dimensions, bool)):
        raise bad_request('"dimensions" must be an integer')
    _options(body)
    # Ollama: dimensions <= 0 or >= the width keep the whole vector
    kept = dimensions if dimensions is not None and 0 < dimensions < width else None
    return OllamaEmbedRequest(model=_model(body), texts=texts, truncate=truncate, dimensions=kept,
                              keep_alive_s=parse_keep_alive(body.get("keep_alive")),
                              late_chunking=parse_late_chunking(body),
                              truncation_direction=parse_truncation_direction(body), task=parse_task(body))


@dataclass(frozen=True)
class OllamaLegacyRequest:
    model: str
    prompt: str
    keep_alive_s: float | None
    task: str | None = None  # a task adapter (jina-embeddings-v3), as on /api/embed


def parse_legacy_request(body: dict[str, Any]) -> OllamaLegacyRequest:
    """POST /api/embeddings: `prompt` one string (empty: loads the model, no embedding)."""
    prompt = body.get("prompt", "")
    if not isinstance(prompt, str):
        raise bad_request("json: cannot unmarshal prompt into a string")
    _options(body)
    return OllamaLegacyRequest(model=_model(body), prompt=prompt,
                               keep_alive_s=parse_keep_alive(body.get("keep_alive")), task=parse_task(body))


def legacy_raw(info: ModelInfo) -> bool:
    """Whether Ollama's legacy /api/embeddings answers this model's vector unnormalized
    (`legacyEmbeddingsWereRaw`): a BERT-architecture model with a non-WordPiece vocabulary (bge-m3), or a
    WordPiece one without a sentence-transformers Normalize module, and a nomic-bert without one; every other
    model comes back L2-normalized. A checkpoint that does not say (a GGUF file): Ollama's defaults, BERT
    normalized, nomic-bert raw."""
    if info.family in _BERT_FAMILIES:
        if info.vocab_type is not VocabType.WPM:
            return True
        return not (info.normalize_module if info.normalize_module is not None else True)
    if info.family in _NOMIC_FAMILIES:
        return not bool(info.normalize_module)
    return False


def check_finite(vectors: list[np.ndarray]) -> None:
    """Ollama refuses a vector it cannot normalize."""
    for vector in vectors:
        if not np.isfinite(vector).all():
            raise bad_request("embedding contains NaN or Inf values")


def render_embed_response(model: str, result: EmbedResult | None, total_ns: int, load_ns: int) -> dict[str, Any]:
    vectors = [] if result is None else [np.asarray(v, dtype=np.float64) for v in result.vectors]
    answer: dict[str, Any] = {"model": model, "embeddings": vectors}
    if result is not None:  # Ollama's omitempty: an empty input answers model and embeddings alone
        answer.update(total_duration=total_ns, load_duration=load_ns, prompt_eval_count=sum(result.n_tokens))
    return answer


def render_legacy_response(result: EmbedResult | None) -> dict[str, Any]:
    return {"embedding": [] if result is None else np.asarray(result.vectors[0], dtype=np.float64)}


def parameter_size(n_params: int) -> str:
    """Ollama's parameter_size: 22.7M, 7.6B."""
    for limit, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n_params >= limit:
            return f"{n_params / limit:.1f}{suffix}"
    return str(n_params)


def details(info: ModelInfo | None) -> dict[str, Any]:
    """Ollama's ModelDetails from what the loaded model says (empty strings before it is loaded)."""
    if info is None:
        return {"parent_model": "", "format": "", "family": "", "families": None, "parameter_size": "",
                "quantization_level": ""}
    family = info.model_type or info.family
    return {"parent_model": "", "format": info.file_format, "family": family, "families": [family],
            "parameter_size": parameter_size(info.n_params), "quantization_level": info.ftype,
            "context_length": info.max_input_tokens, "embedding_length": info.n_embd}


def digest(model_id: str, path: str) -> str:
    """A stable identifier per served model (Ollama's is its manifest's sha256; ours hashes the id and path)."""
    return hashlib.sha256(f"{model_id}\0{path}".encode()).hexdigest()


def _iso(when: datetime) -> str:
    return when.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")


@dataclass(frozen=True)
class Listed:
    """One served model as the Ollama listing routes show it."""

    model_id: str
    path: str
    info: ModelInfo | None  # while loaded
    modified: datetime
    size: int  # bytes: the loaded weights, else the files on disk (0 when unknown)


def render_tags_response(models: list[Listed]) -> dict[str, Any]:
    return {"models": [{"name": ollama_name(m.model_id), "model": ollama_name(m.model_id),
                        "modified_at": _iso(m.modified), "size": m.size, "digest": digest(m.model_id, m.path),
                        "details": details(m.info), "capabilities": ["embedding"]} for m in models]}


def render_ps_response(models: list[Listed], idle_unload_s: float | None, now: datetime) -> dict[str, Any]:
    """Loaded models; expires_at is when an idle unload would come at the latest (never: Ollama's far future)."""
    expires = _iso(FOREVER if idle_unload_s is None else now + timedelta(seconds=idle_unload_s))
    return {"models": [{"name": ollama_name(m.model_id), "model": ollama_name(m.model_id), "size": m.size,
                        "digest": digest(m.model_id, m.path), "details": details(m.info), "expires_at": expires,
                        "size_vram": m.size, "context_length": m.info.max_input_tokens if m.info else 0}
                       for m in models]}


def parse_show_request(body: dict[str, Any]) -> str:
    """POST /api/show: `model` (or the deprecated `name`); `verbose` and the rest are ignored (no tensor list)."""
    for field in ("model", "name"):
        if not isinstance(body.get(field, ""), str):
            raise bad_request(f"json: cannot unmarshal {field} into a string")
    model = body.get("model") or body.get("name")
    if not model:
        raise bad_request(MODEL_REQUIRED)
    return model


def render_show_response(listed: Listed) -> dict[str, Any]:
    info = listed.info
    arch = (info.model_type or info.family) if info else ""
    model_info: dict[str, Any] = {"general.architecture": arch}
    if info is not None:
        model_info.update({"general.parameter_count": info.n_params, "general.file_type": info.ftype,
                           f"{arch}.context_length": info.n_ctx_train, f"{arch}.embedding_length": info.n_embd,
                           f"{arch}.pooling_type": info.pooling.value})
    return {"modelfile": f"# served by mlx-embed-server\nFROM {listed.path}\n", "parameters": "", "template": "",
            "details": details(info), "model_info": model_info, "capabilities": ["embedding"],
            "modified_at": _iso(listed.modified)}


def nanoseconds(seconds: float) -> int:
    return max(0, int(math.floor(seconds * 1e9)))
