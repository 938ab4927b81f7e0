"""The HTTP listener: waitress, told our limits, answering its own errors in our envelope, and drained on
SIGTERM/SIGINT instead of dropped.

waitress reads a request completely before the app sees it, so the payload limit is waitress's body limit: a
Content-Length over it is refused before the body is read, a chunked body as soon as it passes it, and the 413
(like waitress's other protocol errors) goes out as `{"error": {...}}`. Each request's arrival time is stamped
into its environ, which is how a drain tells the requests it owes an answer from the ones that came after.
"""
from __future__ import annotations

import logging
import os
import resource
import signal
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import orjson
import waitress
from waitress import wasyncore
from waitress.channel import HTTPChannel
from waitress.parser import HTTPRequestParser
from waitress.task import ErrorTask, WSGITask

from compat.errors import JSON_CONTENT_TYPE, TransportError, type_for_status
from compat.lifecycle import ARRIVED_KEY, Lifecycle
from compat.middleware import payload_too_large_message

if TYPE_CHECKING:
    from compat.settings import Settings

log = logging.getLogger("mlx_embed_server")

def http_threads(settings: Settings) -> int:
    """llama-server's default: max(n_parallel + 4, cores - 1), with n_parallel auto = 4."""
    if settings.threads_http > 0:
        return settings.threads_http
    n_parallel = 4 if settings.parallel < 0 else settings.parallel
    return max(n_parallel + 4, (os.cpu_count() or 1) - 1)


LOOP_TICK_S = 0.25  # how often the serving loop looks at the drain state
FLUSH_GRACE_S = 5.0  # after the last admitted request, how long answers still being written may take


class _StampedParser(HTTPRequestParser):
    def __init__(self, adj: Any) -> None:
        super().__init__(adj)
        self.arrived = time.monotonic()  # made when the request's first bytes arrive


class _Task(WSGITask):
    def get_environment(self) -> dict[str, Any]:
        environ = super().get_environment()
        environ[ARRIVED_KEY] = getattr(self.request, "arrived", None)
        return environ

    def build_response_header(self) -> bytes:
        if self.channel.lifecycle.draining:
            self.set_close_on_finish()  # keep-alive clients reconnect, to another replica
        return super().build_response_header()


def _error_task(payload_limit: int) -> type[ErrorTask]:
    class EnvelopeErrorTask(ErrorTask):
        """waitress's protocol errors (413 body too large, 400 malformed, 431 headers too large) as JSON."""

        def execute(self) -> None:
            error = self.request.error
            if error.code == 413:
                message = payload_too_large_message(payload_limit)
            else:
                message = f"{error.reason}: {error.body}"
            body = orjson.dumps(TransportError(error.code, type_for_status(error.code), message).body())
            self.status = f"{error.code} {error.reason}"
            self.response_headers.append(("Content-Type", JSON_CONTENT_TYPE))
            self.set_close_on_finish()
            self.content_length = len(body)
            self.write(body)

    return EnvelopeErrorTask


def create_listener(app: Callable, settings: Settings, threads: int, lifecycle: Lifecycle) -> Any:
    """A waitress server for `app`, bound and listening, with our channel classes."""
    listen = ({"unix_socket": settings.host, "unix_socket_perms": "660"} if settings.host.endswith(".sock")
              else {"host": settings.host, "port": settings.port})
    _allow_open_files(settings.connection_limit)
    server = waitress.create_server(
        app, threads=threads, ident="mlx-embed-server", clear_untrusted_proxy_headers=True,
        channel_timeout=settings.timeout,  # -to: inactivity on a connection, idle keep-alive included
        cleanup_interval=max(1, min(30, settings.timeout // 2)),  # so channel_timeout is enforced near its value
        connection_limit=settings.connection_limit + 2,  # waitress counts its listener and wake-up pipe too
        asyncore_use_poll=True,  # select() cannot watch file descriptors past 1024
        max_request_body_size=settings.payload_limit + 1,  # waitress refuses a body of this size or more
        **listen)
    channel = type("Channel", (HTTPChannel,), {"parser_class": _StampedParser, "task_class": _Task,
                                               "error_task_class": _error_task(settings.payload_limit),
                                               "lifecycle": lifecycle})
    server.channel_class = channel  # the instance's accept() makes every channel from it
    return server


def _allow_open_files(connection_limit: int) -> None:
    """Each connection is a file descriptor: raise the soft limit toward the hard one if the connection limit
    needs it (model files, pipes and the listener need some too)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = connection_limit + 256
    if soft != resource.RLIM_INFINITY and soft < wanted:
        new_soft = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (new_soft, hard))
        if new_soft < wanted:
            log.warning("--connection-limit %d needs about %d open files; the hard limit is %d",
                        connection_limit, wanted, hard)


class GracefulServer:
    """Runs waitress's loop until SIGTERM/SIGINT, then drains: answers owed are finished and written, for at
    most `shutdown_timeout` seconds; a second signal ends the wait."""

    def __init__(self, server: Any, lifecycle: Lifecycle, shutdown_timeout: float):
        self._server = server
        self._lifecycle = lifecycle
        self._shutdown_timeout = shutdown_timeout
        self._signalled = 0

    def install_signal_handlers(self) -> None:
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self._on_signal)

    def _on_signal(self, signum: int, frame: object) -> None:
        # no locks and no I/O here: the serving loop notices within one tick
        self._signalled += 1
        self._lifecycle.begin_drain()

    def serve(self) -> None:
        server = self._server
        try:
            while not self._lifecycle.draining:
                self._tick()
            log.info("shutting down: finishing the requests in flight (at most %g s; /health answers 503)",
                     self._shutdown_timeout)
            self._drain()
        finally:
            server.task_dispatcher.shutdown(cancel_pending=True, timeout=FLUSH_GRACE_S)
            server.close()

    def _tick(self) -> None:
        server = self._server
        server.asyncore.loop(timeout=LOOP_TICK_S, map=server._map, use_poll=True, count=1)

    def _drain(self) -> None:
        deadline = time.monotonic() + self._shutdown_timeout
        while self._owed() and time.monotonic() < deadline and self._signalled < 2:
            self._tick()
        left = self._owed()
        if left:
            log.warning("shutting down with %d request(s) unanswered (--shutdown-timeout %g s%s)", left,
                        self._shutdown_timeout, ", second signal" if self._signalled >= 2 else "")
        # stop listening (new connections are refused, not left in the backlog), then let the answers already
        # produced reach their clients: only this loop writes them out
        wasyncore.dispatcher.close(self._server)
        flush_deadline = time.monotonic() + FLUSH_GRACE_S
        while self._unflushed() and time.monotonic() < flush_deadline and self._signalled < 2:
            self._tick()
        log.info("all answers written; exiting")

    def _channels(self) -> list[HTTPChannel]:
        return [c for c in list(self._server._map.values()) if isinstance(c, HTTPChannel)]

    def _owed(self) -> int:
        """Requests begun before the signal and not yet answered: still arriving, queued for a thread, or
        inside the app. An idle keep-alive connection owes nothing."""
        started = self._lifecycle.drain_started or time.monotonic()
        owed = 0
        for channel in self._channels():
            pending = [*channel.requests, *([channel.request] if channel.request is not None else [])]
            owed += sum(1 for request in pending if getattr(request, "arrived", started) < started)
        return owed

    def _unflushed(self) -> bool:
        return any(channel.total_outbufs_len or channel.requests for channel in self._channels())
