"""Requests in flight and the graceful drain (SIGTERM/SIGINT).

A drain admits every request that had started arriving before the signal (its first bytes; the listener stamps
that time into the WSGI environ) and lets it finish. Requests that arrive afterwards, and /health, answer 503
so a load balancer moves traffic to another replica; once no admitted request is left (or --shutdown-timeout
has passed) the server closes. The in-flight count is also what /metrics reports to an autoscaler.
"""
from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any

import falcon

from compat import stages
from compat.errors import UNAVAILABLE, TransportError
from compat.middleware import PUBLIC_PATHS, normalize_prefix, strip_prefix

if TYPE_CHECKING:
    from compat.settings import Settings

ARRIVED_KEY = "mlx_embed.arrived"  # environ: time.monotonic() when the request's first bytes arrived
SHUTTING_DOWN = "Server is shutting down"
OBSERVABLE = frozenset({"/metrics"})  # still answered while draining: the drain itself is watched there


class Lifecycle:
    """Counts the requests inside the app and knows whether (and since when) the server drains."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._in_flight = 0
        self.drain_started: float | None = None  # time.monotonic(); None while serving normally

    @property
    def draining(self) -> bool:
        return self.drain_started is not None

    def begin_drain(self) -> bool:
        """Start draining (a plain assignment: safe in a signal handler). False if already draining."""
        if self.drain_started is not None:
            return False
        self.drain_started = time.monotonic()
        return True

    def admits(self, arrived: float | None) -> bool:
        """Whether a request is served: always while serving; while draining, if it began arriving before."""
        started = self.drain_started
        return started is None or (arrived is not None and arrived < started)

    def entered(self) -> None:
        with self._lock:
            self._in_flight += 1

    def left(self) -> None:
        with self._lock:
            self._in_flight -= 1

    @property
    def in_flight(self) -> int:
        """Requests being handled by the app right now."""
        return self._in_flight


class LifecycleMiddleware:
    """First in the chain: counts every request; while draining, answers 503 to /health and to newcomers
    (but /metrics)."""

    def __init__(self, lifecycle: Lifecycle, settings: Settings):
        self._lifecycle = lifecycle
        self._prefix = normalize_prefix(settings.api_prefix)

    def process_request(self, req: falcon.Request, resp: falcon.Response) -> None:
        stages.begin(req, req.env.get(ARRIVED_KEY))
        lifecycle = self._lifecycle
        lifecycle.entered()
        req.context.counted = True
        if not lifecycle.draining:
            return
        # (the listener closes the connection after each answer while draining)
        path = strip_prefix(req.path, self._prefix)
        if path in PUBLIC_PATHS or (not lifecycle.admits(req.env.get(ARRIVED_KEY)) and path not in OBSERVABLE):
            raise TransportError(503, UNAVAILABLE, SHUTTING_DOWN)

    def process_response(self, req: falcon.Request, resp: falcon.Response, resource: Any,
                         req_succeeded: bool) -> None:
        if req.context.get("counted"):
            self._lifecycle.left()
