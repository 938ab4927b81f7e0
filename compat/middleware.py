"""llama-server's pre-routing chain (docs/llama-server-contract.md §1.3), in its order: CORS, OPTIONS preflight, loading check,
API key, then --api-prefix just before routing. Plus TEI-style timing headers on the way out."""
from __future__ import annotations

import hmac
import time
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import falcon

from compat import stages
from compat.errors import AUTHENTICATION, INVALID_REQUEST, UNAVAILABLE, TransportError, not_found

if TYPE_CHECKING:
    from compat.settings import Settings

PUBLIC_PATHS = frozenset({"/health", "/v1/health"})
_LOCAL_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})


def normalize_prefix(prefix: str) -> str:
    """`api/`, `/api/` and `/api` all mean `/api`; "" means no prefix."""
    prefix = prefix.strip("/")
    return f"/{prefix}" if prefix else ""


def strip_prefix(path: str, prefix: str) -> str | None:
    """The route path under `prefix`, or None when the path lies outside it."""
    if not prefix:
        return path
    if path == prefix or path.startswith(prefix + "/"):
        return path[len(prefix):] or "/"
    return None


class CorsMiddleware:
    """Allow-Origin on every answer; OPTIONS is answered here, before any auth or state check."""

    def __init__(self, settings: Settings):
        self._origins = settings.cors_origins
        self._listed = [o.strip() for o in settings.cors_origins.split(",") if o.strip()]
        self._credentials = settings.cors_credentials
        self._preflight = {
            "Access-Control-Allow-Credentials": "true" if settings.cors_credentials else "false",
            "Access-Control-Allow-Methods": settings.cors_methods,
            "Access-Control-Allow-Headers": settings.cors_headers,
        }

    def _allow_origin(self, origin: str | None) -> str | None:
        if self._origins == "*":
            return origin if origin and self._credentials else "*"
        if self._origins == "localhost":
            try:
                host = urlsplit(origin or "").hostname
            except ValueError:  # a malformed Origin is simply not local
                host = None
            return origin if host in _LOCAL_HOSTS else None
        if origin in self._listed:
            return origin  # one of several allowed origins: a browser accepts only its own in the header
        return self._listed[0] if len(self._listed) == 1 else None  # llama sends a single configured origin

    def process_request(self, req: falcon.Request, resp: falcon.Response) -> None:
        allowed = self._allow_origin(req.get_header("Origin"))
        if allowed is not None:
            resp.set_header("Access-Control-Allow-Origin", allowed)
            if allowed != "*":
                resp.append_header("Vary", "Origin")
            if self._credentials:
                resp.set_header("Access-Control-Allow-Credentials", "true")
        if req.method == "OPTIONS":
            resp.set_headers(self._preflight)
            resp.content_type = falcon.MEDIA_HTML
            resp.data = b""
            resp.complete = True  # skips the rest of the chain, routing and responders


class LoadingMiddleware:
    """Every path answers 503 until the model is loaded (/health included, as in llama-server)."""

    def __init__(self, engine: Any):
        self._engine = engine

    def process_request(self, req: falcon.Request, resp: falcon.Response) -> None:
        if not self._engine.is_loaded:
            raise TransportError(503, UNAVAILABLE, "Loading model")


class ApiKeyMiddleware:
    """Runs before routing, so an unknown path without a key is 401, not 404."""

    def __init__(self, settings: Settings):
        self._keys = [key.encode("utf-8") for key in settings.api_key]
        self._prefix = normalize_prefix(settings.api_prefix)

    def process_request(self, req: falcon.Request, resp: falcon.Response) -> None:
        if not self._keys or strip_prefix(req.path, self._prefix) in PUBLIC_PATHS:
            return
        sent = req.get_header("Authorization") or req.get_header("X-Api-Key") or ""
        sent = sent.removeprefix("Bearer ")
        raw = sent.encode("latin-1", "replace")  # WSGI decodes header bytes as latin-1; this restores them
        # compare against every key so the time taken does not reveal which one nearly matched
        if not any([hmac.compare_digest(raw, key) for key in self._keys]):
            raise TransportError(401, AUTHENTICATION, "Invalid API Key")


class PayloadLimitMiddleware:
    """--payload-limit from the Content-Length, before anything reads the body."""

    def __init__(self, settings: Settings):
        self._limit = settings.payload_limit

    def process_request(self, req: falcon.Request, resp: falcon.Response) -> None:
        if (req.content_length or 0) > self._limit:
            raise TransportError(413, INVALID_REQUEST, payload_too_large_message(self._limit))


def payload_too_large_message(limit: int) -> str:
    return f"the request body is larger than the server accepts ({limit} bytes, --payload-limit)"


class ApiPrefixMiddleware:
    """--api-prefix: routes are served only under the prefix; falcon routes the path without it."""

    def __init__(self, settings: Settings):
        self._prefix = normalize_prefix(settings.api_prefix)

    def process_request(self, req: falcon.Request, resp: falcon.Response) -> None:
        if not self._prefix:
            return
        path = strip_prefix(req.path, self._prefix)
        if path is None:
            raise not_found()
        req.path = path


class TimingMiddleware:
    """x-tokenization-time, x-queue-time, x-inference-time and x-total-time (ms, as TEI) when the route
    recorded `req.context.timings`."""

    def process_request(self, req: falcon.Request, resp: falcon.Response) -> None:
        req.context.started = time.perf_counter()

    def process_response(self, req: falcon.Request, resp: falcon.Response, resource: Any,
                         req_succeeded: bool) -> None:
        timings = req.context.get("timings")
        stages.finish(req, resp, timings)
        if timings is None:
            return
        total_s = time.perf_counter() - req.context.started
        for header, seconds in (("x-tokenization-time", timings.tokenize_s), ("x-queue-time", timings.queue_s),
                                ("x-inference-time", timings.inference_s), ("x-total-time", total_s)):
            resp.set_header(header, str(int(seconds * 1000)))
