"""The several-model server's own bodies (llama-server's router mode, docs/llama-server-contract.md §7.5): /models, /props without
?model, and POST /models/load and /models/unload. Pure: no falcon."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from compat.errors import bad_request
from compat.wire.info import render_model_meta
from engine.types import ModelState

if TYPE_CHECKING:
    from compat.routing import ModelView
    from compat.settings import Settings

NO_MODEL = '"model" must name a served model'


def parse_model_request(body: dict[str, Any]) -> str:
    """POST /models/load and /models/unload: {"model": "<id or alias>"}."""
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad_request(NO_MODEL)
    return model


def render_router_models_response(views: list[ModelView], created: int) -> dict[str, Any]:
    """llama's router list, `data` then `object`; each model also says its kind and what it has served."""
    return {"data": [_model(view, created) for view in views], "object": "list"}


def _model(view: ModelView, created: int) -> dict[str, Any]:
    spec, status, usage = view.spec, view.status, view.usage
    state: dict[str, Any] = {"value": status.state.value, "in_use": status.in_use}
    if status.state is ModelState.FAILED:
        state.update(failed=True, error=status.last_error)  # llama's flag, and why
    item: dict[str, Any] = {
        "id": spec.id, "aliases": list(spec.aliases), "tags": list(spec.tags), "object": "model",
        "owned_by": "llamacpp", "created": created, "status": state, "kind": spec.kind,
        "memory_bytes": status.loaded_bytes,  # what it holds resident now, measured at load (0 while not loaded)
    }
    if status.info is not None:
        item["meta"] = render_model_meta(status.info)
    item["stats"] = {
        "requests": usage.requests, "items": usage.items, "tokens": usage.tokens, "errors": usage.errors,
        "queue_seconds": usage.queue_s, "compute_seconds": usage.compute_s, "load_seconds": status.load_s,
        "loaded_bytes": status.loaded_bytes,
        # the last request error, or else the last load failure (a startup load or a refusal by the memory limits)
        "last_error": usage.last_error or status.last_error,
    }
    return item


def render_router_props_response(settings: Settings, version: str) -> dict[str, Any]:
    """GET /props without ?model: llama's router answer (its dummy alias and path keep web UIs working)."""
    return {
        "role": "router",
        "max_instances": settings.models_max,
        "models_autoload": True,
        "model_alias": "mlx-embed-server",
        "model_path": "none",
        "default_generation_settings": {"params": {}, "n_ctx": 0},
        "ui_settings": {},
        "build_info": f"mlx-embed-server-{version}",
        "cors_proxy_enabled": False,
    }
