"""Every error a client can see, in llama-server's envelopes, and the ONE engine-error table.

Handler errors are `{"error":{"code","message","type"}}`; errors raised before routing (401, 404, 503 while
loading) use llama's middleware key order `{"error":{"message","type","code"}}` (docs/llama-server-contract.md §1.3, §1.4).
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import falcon

from engine.errors import (
    EmptyInput,
    EngineError,
    ForwardFailed,
    InputTooLong,
    InvalidInput,
    InvalidTokens,
    LoadFailed,
    NotEnoughMemory,
    NotLoaded,
    OutOfMemory,
    QueueFull,
    ReplyTimeout,
    TooManyInputs,
    UnsupportedCheckpoint,
)

log = logging.getLogger(__name__)

JSON_CONTENT_TYPE = "application/json; charset=utf-8"  # llama-server's, on every JSON answer

INVALID_REQUEST = "invalid_request_error"
AUTHENTICATION = "authentication_error"
NOT_FOUND = "not_found_error"
SERVER = "server_error"
NOT_SUPPORTED = "not_supported_error"
UNAVAILABLE = "unavailable_error"
EXCEED_CONTEXT = "exceed_context_size_error"
TIMEOUT = "timeout_error"

RETRY_AFTER_S = 1  # sent with every 503: overload and loading pass; a client backs off this long and retries

# llama's enum -> status, used to type falcon's own HTTPErrors (docs/llama-server-contract.md §1.4)
_TYPE_BY_STATUS = {400: INVALID_REQUEST, 401: AUTHENTICATION, 403: "permission_error", 404: NOT_FOUND,
                   500: SERVER, 501: NOT_SUPPORTED, 503: UNAVAILABLE, 504: TIMEOUT}  # other 4xx: INVALID_REQUEST


class ApiError(Exception):
    """An error answer in the handler envelope; `extra` fields follow `type` (e.g. n_prompt_tokens, n_ctx)."""

    def __init__(self, status: int, type: str, message: str, extra: dict[str, Any] | None = None):
        super().__init__(message)
        self.status = status
        self.type = type
        self.message = message
        self.extra = extra or {}

    @property
    def headers(self) -> dict[str, str]:
        # a 503 is transient by definition here (overload, loading, draining): say when to come back
        return {"Retry-After": str(RETRY_AFTER_S)} if self.status == 503 else {}

    def body(self) -> dict[str, Any]:
        return {"error": {"code": self.status, "message": self.message, "type": self.type, **self.extra}}


class TransportError(ApiError):
    """An answer given before routing (httplib middleware in llama-server): key order message, type, code."""

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "code": self.status}}


def bad_request(message: str) -> ApiError:
    return ApiError(400, INVALID_REQUEST, message)


def not_supported(message: str) -> ApiError:
    """A route or feature this server (as configured) does not serve: llama's 501."""
    return ApiError(501, NOT_SUPPORTED, message)


def too_large(message: str) -> ApiError:
    """A request bigger than the server accepts, however long the client waits: 413."""
    return ApiError(413, INVALID_REQUEST, message)


def check_client_batch(n_items: int, limit: int, what: str) -> None:
    """--max-client-batch-size (TEI's): a request with more inputs than that is refused for good."""
    if n_items > limit:
        raise too_large(f"this request has {n_items} {what}; the server accepts at most {limit} per request "
                        f"(--max-client-batch-size)")


def not_found() -> TransportError:
    return TransportError(404, NOT_FOUND, "File Not Found")


def _input_too_long(exc: InputTooLong) -> ApiError:
    n = exc.n_tokens
    if exc.limit_kind == "context":
        return ApiError(400, EXCEED_CONTEXT,
                        f"input ({n} tokens) is larger than the max context size ({exc.limit} tokens). skipping",
                        {"n_prompt_tokens": n, "n_ctx": exc.limit})
    if exc.limit_kind == "positions":
        return bad_request(f"input ({n} tokens) is too large to process. "
                           f"the model accepts at most {exc.limit} tokens")
    if exc.limit_kind == "max_seq":
        return bad_request(f"input ({n} tokens) is too large to process. "
                           f"the server accepts at most {exc.limit} tokens per input (--max-seq)")
    # llama answers 500 here; the wording stays (clients grep "too large"), the status is 400 (§13)
    return bad_request(f"input ({n} tokens) is too large to process. "
                       f"increase the physical batch size (current batch size: {exc.limit})")


# THE table: engine error -> client answer. The most specific class in the exception's MRO wins.
ENGINE_ERRORS: dict[type[EngineError], Callable[[Any], ApiError]] = {
    EmptyInput: lambda e: bad_request("Input content cannot be empty"),
    InvalidTokens: lambda e: bad_request("Prompt contains invalid tokens"),
    InputTooLong: _input_too_long,
    InvalidInput: lambda e: bad_request(str(e)),
    QueueFull: lambda e: ApiError(503, UNAVAILABLE, str(e) or "Too many inputs queued; retry later"),
    TooManyInputs: lambda e: too_large(str(e)),
    ReplyTimeout: lambda e: ApiError(504, TIMEOUT, str(e) or "The request was not served in time"),
    NotLoaded: lambda e: ApiError(503, UNAVAILABLE, "Loading model"),
    NotEnoughMemory: lambda e: ApiError(503, UNAVAILABLE, str(e)),  # idle models may free the room later
    LoadFailed: lambda e: ApiError(500, SERVER, str(e)),  # the next request retries the load
    UnsupportedCheckpoint: lambda e: not_supported(str(e)),
    ForwardFailed: lambda e: ApiError(500, SERVER, str(e) or "The forward pass failed"),
    OutOfMemory: lambda e: ApiError(500, SERVER, str(e)),
    EngineError: lambda e: ApiError(500, SERVER, str(e) or type(e).__name__),
}


def api_error_from_engine(exc: EngineError) -> ApiError:
    # EngineError itself is in the table, so every engine error finds an entry
    to_api_error = next(ENGINE_ERRORS[cls] for cls in type(exc).__mro__ if cls in ENGINE_ERRORS)
    return to_api_error(exc)


def _send(resp: falcon.Response, error: ApiError) -> None:
    resp.status = error.status
    resp.content_type = JSON_CONTENT_TYPE  # a responder may have set another before failing
    resp.set_headers(error.headers)
    resp.media = error.body()


def handle_api_error(req: falcon.Request, resp: falcon.Response, ex: ApiError, params: dict) -> None:
    _send(resp, ex)


def handle_engine_error(req: falcon.Request, resp: falcon.Response, ex: EngineError, params: dict) -> None:
    error = api_error_from_engine(ex)
    if error.status >= 500:
        log.warning("%s %s: %s: %s", req.method, req.path, type(ex).__name__, ex)
    _send(resp, error)


def handle_http_error(req: falcon.Request, resp: falcon.Response, ex: falcon.HTTPError, params: dict) -> None:
    # httplib has no 405 and rewrites every 404 body; falcon's route-not-found and wrong-method land here
    if ex.status_code in (404, 405):
        _send(resp, not_found())
        return
    status = ex.status_code
    _send(resp, ApiError(status, type_for_status(status), ex.description or ex.title or str(status)))


def handle_unexpected(req: falcon.Request, resp: falcon.Response, ex: Exception, params: dict) -> None:
    # The traceback goes to the log only; the client gets a stable message and the server keeps serving.
    log.error("unhandled error on %s %s", req.method, req.path, exc_info=ex)
    _send(resp, ApiError(500, SERVER, "Internal server error; see the server log"))


def type_for_status(status: int) -> str:
    """llama's error type for a status that has no more specific one."""
    return _TYPE_BY_STATUS.get(status, INVALID_REQUEST if status < 500 else SERVER)
