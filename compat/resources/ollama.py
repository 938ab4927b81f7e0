"""Ollama's routes (compat/wire/ollama.py has the bodies): POST /api/embed and /api/embeddings through the same
lease, engine call and usage records as /v1/embeddings; GET /api/tags, POST /api/show, GET /api/ps from the served
models; GET /api/version. Errors raised here answer in Ollama's shape, `{"error": "<message>"}`.

keep_alive: 0 unloads the model once the request is done on a several-model server (its other requests in flight
finish first); a one-model server keeps its model. A duration is accepted: how long an idle model stays loaded
is the server's --sleep-idle-seconds, for every model alike.
"""
from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import falcon

from compat.catalog import EMBEDDING
from compat.errors import ApiError, api_error_from_engine, check_client_batch
from compat.resources.embeddings import embed_request_prompts
from compat.routing import ModelRouter, Models, Served
from compat.wire.inputs import parse_json_object
from compat.wire.ollama import (
    OLLAMA_API_VERSION,
    TOO_LONG,
    Listed,
    check_finite,
    legacy_raw,
    nanoseconds,
    not_found,
    parse_embed_request,
    parse_legacy_request,
    parse_show_request,
    render_embed_response,
    render_legacy_response,
    render_ps_response,
    render_show_response,
    render_tags_response,
    resolve_name,
)
from engine.errors import EngineError, InputTooLong
from engine.types import EmbedResult, ModelInfo, ModelState

if TYPE_CHECKING:
    from compat.settings import Settings

Responder = Callable[[Any, falcon.Request, falcon.Response], None]


def ollama_errors(responder: Responder) -> Responder:
    """Every error of the responder in Ollama's shape, with the status our table gives it."""

    @functools.wraps(responder)
    def wrapped(self: Any, req: falcon.Request, resp: falcon.Response) -> None:
        try:
            responder(self, req, resp)
        except (ApiError, EngineError) as exc:
            error = exc if isinstance(exc, ApiError) else api_error_from_engine(exc)
            resp.status = error.status
            resp.set_headers(error.headers)
            resp.media = {"error": error.message}

    return wrapped


def _served_names(models: Models) -> list[str]:
    return [name for view in models.describe() for name in view.spec.names]


def resolver(models: Models, name: str) -> Callable[[], str | None]:
    """The lease's `model`: an Ollama name mapped to a served id or alias (several models; 404 when it names
    none), none for the route's default; a one-model server answers to any name."""

    def requested() -> str | None:
        if not models.router_mode or not name:
            return None
        found = resolve_name(name, _served_names(models))
        if found is None:
            raise not_found(name)
        return found

    return requested


def _unload_after(models: Models, served: Served, keep_alive_s: float | None) -> None:
    if keep_alive_s == 0 and isinstance(models, ModelRouter):
        try:
            models.unload(served.name)
        except ApiError:
            pass  # unloaded meanwhile by another request


class OllamaEmbedResource:
    """POST /api/embed (`legacy` False) and POST /api/embeddings (`legacy` True)."""

    def __init__(self, models: Models, *, legacy: bool):
        self._models = models
        self._legacy = legacy

    @ollama_errors
    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        started = time.monotonic()
        body = parse_json_object(req.bounded_stream.read())
        name = body.get("model") if isinstance(body.get("model"), str) else ""
        with self._models.lease(EMBEDDING, resolver(self._models, name)) as served:
            loaded = time.monotonic()
            resp.media = self._legacy_answer(served, body) if self._legacy else \
                self._embed_answer(served, body, started, loaded)
        if served.timings is not None:
            req.context.timings = served.timings

    def _embed_answer(self, served: Served, body: dict[str, Any], started: float, loaded: float) -> dict[str, Any]:
        request = parse_embed_request(body, served.engine.info.n_embd)
        result = None
        if request.texts:
            check_client_batch(len(request.texts), served.settings.max_client_batch_size, "inputs")
            result = self._embed(served, request.texts, request.truncate, 2, request.dimensions,
                                 request.truncation_direction, request.late_chunking, request.task)
        _unload_after(self._models, served, request.keep_alive_s)
        return render_embed_response(request.model, result, nanoseconds(time.monotonic() - started),
                                     nanoseconds(loaded - started))

    def _legacy_answer(self, served: Served, body: dict[str, Any]) -> dict[str, Any]:
        request = parse_legacy_request(body)
        result = None
        if request.prompt:
            normalize = -1 if legacy_raw(served.engine.info) else 2
            result = self._embed(served, [request.prompt], None, normalize, None, task=request.task)
        _unload_after(self._models, served, request.keep_alive_s)
        return render_legacy_response(result)

    @staticmethod
    def _embed(served: Served, texts: list[str], truncate: bool | None, normalize: int,
               dimensions: int | None, truncation_direction: str = "right",
               late_chunking: bool = False, task: str | None = None) -> EmbedResult:
        try:
            result = embed_request_prompts(served, [[text] for text in texts], truncate, None, None, normalize,
                                           dimensions, truncation_direction, late_chunking, task)
        except InputTooLong:
            if truncate is False:
                raise ApiError(400, "invalid_request_error", TOO_LONG) from None
            raise
        served.record(result)
        check_finite(result.vectors)
        return result


def _disk_size(path: str) -> int:
    target = Path(path).expanduser()
    if target.is_file():
        return target.stat().st_size
    if not target.is_dir():
        return 0
    return sum(entry.stat().st_size for entry in target.rglob("*") if entry.is_file())


def _modified(path: str, default: datetime) -> datetime:
    try:
        return datetime.fromtimestamp(os.stat(Path(path).expanduser()).st_mtime, tz=timezone.utc)
    except OSError:
        return default


def _listed(model_id: str, path: str, info: ModelInfo | None, started: datetime) -> Listed:
    size = info.size_bytes if info is not None else _disk_size(path)
    return Listed(model_id=model_id, path=path, info=info, modified=_modified(path, started), size=size)


class _Listing:
    def __init__(self, models: Models):
        self._models = models
        self._started = datetime.now(timezone.utc)

    def _all(self, loaded_only: bool) -> list[Listed]:
        if not self._models.router_mode:
            with self._models.lease(None, lambda: None, count=False) as served:
                info = served.engine.info
                return [_listed(served.name, info.path, info, self._started)]
        return [_listed(view.spec.id, view.spec.options.model_path or view.spec.source,
                        view.status.info, self._started)
                for view in self._models.describe()
                if view.spec.kind == EMBEDDING and (not loaded_only or view.status.state is ModelState.LOADED)]


class OllamaTagsResource(_Listing):
    """GET /api/tags: the embedding models this server serves (loaded or not)."""

    @ollama_errors
    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        resp.media = render_tags_response(self._all(loaded_only=False))


class OllamaPsResource(_Listing):
    """GET /api/ps: the embedding models loaded now."""

    def __init__(self, models: Models, settings: Settings):
        super().__init__(models)
        self._idle_s = settings.sleep_idle_seconds if models.router_mode and settings.sleep_idle_seconds > 0 else None

    @ollama_errors
    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        resp.media = render_ps_response(self._all(loaded_only=True), self._idle_s, datetime.now(timezone.utc))


class OllamaShowResource(_Listing):
    """POST /api/show: one model's details, loading it if need be (as /props?model= does)."""

    @ollama_errors
    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        name = parse_show_request(parse_json_object(req.bounded_stream.read()))
        with self._models.lease(EMBEDDING, resolver(self._models, name), count=False) as served:
            info = served.engine.info
            path = info.path
        resp.media = render_show_response(_listed(served.name, path, info, self._started))


class OllamaVersionResource:
    """GET /api/version: the Ollama API version these routes follow."""

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        resp.media = {"version": OLLAMA_API_VERSION}

    on_head = on_get


def ollama_routes(models: Models, settings: Settings) -> dict[str, object]:
    """Ollama's routes for the app's route table."""
    return {"/api/embed": OllamaEmbedResource(models, legacy=False),
            "/api/embeddings": OllamaEmbedResource(models, legacy=True),
            "/api/tags": OllamaTagsResource(models),
            "/api/show": OllamaShowResource(models),
            "/api/ps": OllamaPsResource(models, settings),
            "/api/version": OllamaVersionResource()}
