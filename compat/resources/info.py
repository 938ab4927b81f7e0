"""GET /health, /slots and /metrics (docs/llama-server-contract.md §6)."""
from __future__ import annotations

import threading
from typing import TYPE_CHECKING

import falcon

from compat.errors import not_supported
from compat.lifecycle import Lifecycle
from compat.routing import Models
from compat.wire.info import render_health_response, render_slots_response
from compat.wire.metrics import (
    prompt_throughput,
    render_metrics_response,
    render_model_metrics,
    render_server_metrics,
)

if TYPE_CHECKING:
    from compat.settings import Settings

SLOTS_DISABLED = "This server does not support slots endpoint. Start it with `--slots`"
METRICS_DISABLED = "This server does not support metrics endpoint. Start it with `--metrics`"
METRICS_CONTENT_TYPE = "text/plain; version=0.0.4"


class HealthResource:
    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        resp.media = render_health_response()

    on_head = on_get


class SlotsResource:
    """Several models: ?model= picks one, as llama's router routes GET requests (else the first model)."""

    def __init__(self, models: Models, settings: Settings):
        self._models = models
        self._settings = settings

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        if not self._settings.slots:
            raise not_supported(SLOTS_DISABLED)
        with self._models.lease(None, lambda: req.get_param("model") or None, count=False) as served:
            n_processing = int(served.engine.stats()["requests_processing"])
            resp.media = render_slots_response(served.engine.info, n_processing)

    on_head = on_get


class MetricsResource:
    """Keeps the previous scrape's counters: llama's prompt_tokens_seconds covers the time since then.

    Several models: llama's totals summed over them, then each model's own metrics."""

    def __init__(self, models: Models, settings: Settings, started_unix: int, lifecycle: Lifecycle):
        self._models = models
        self._settings = settings
        self._started_unix = started_unix
        self._lifecycle = lifecycle
        self._previous: dict[str, float] | None = None
        self._lock = threading.Lock()  # one instance serves every waitress thread

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        if not self._settings.metrics:
            raise not_supported(METRICS_DISABLED)
        with self._lock:
            stats = dict(self._models.stats())  # a snapshot: the next scrape measures from here
            throughput = prompt_throughput(stats, self._previous)
            self._previous = stats
        views = self._models.describe()
        resp.content_type = METRICS_CONTENT_TYPE
        resp.set_header("Process-Start-Time-Unix", str(self._started_unix))
        resp.text = (render_metrics_response(stats, throughput)
                     + render_server_metrics(self._lifecycle.in_flight - 1, self._lifecycle.draining)  # not this one
                     + (render_model_metrics(views) if views else ""))

    on_head = on_get
