"""How a request finds the engine that serves it.

SingleModel is llama-server's single-model behaviour: one engine, and a request's `model` is only echoed
(clients send names like "text-embedding-3-small"). ModelRouter serves several models: `model` (an id or an
alias) picks one, no `model` picks the route's default (the first model of its kind), an unknown name is 400
listing the served ids, a model of the other kind is 400. Either way a request works inside `lease(...)`,
which holds its engine for the whole request: an unload or a reload never takes it away mid-request.
"""
from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import Protocol

from compat.catalog import EMBEDDING, RERANK, Catalog, Kind, ModelSpec, read_catalog
from compat.errors import bad_request, not_supported
from compat.settings import Settings, SettingsError
from engine import Engine, Residency
from engine.errors import LoadFailed, NotLoaded, ReplyTimeout
from engine.types import EmbedResult, ModelState, Pooling, RerankResult, ResidencyStatus, Timings

log = logging.getLogger(__name__)

EMBEDDINGS_DISABLED = "This server does not support embeddings. Start it with `--embeddings`"
RERANK_DISABLED = "This server does not support reranking. Start it with `--reranking`"
_NONE_OF_KIND = {EMBEDDING: "no embedding model is configured; add one (--embedding-model or a preset section)",
                 RERANK: "no reranking model is configured; add one (--reranker-model or a preset section with "
                         "reranking = true)"}
_KIND_WORDS = {EMBEDDING: "an embedding model", RERANK: "a reranker"}
_ROUTE_NEEDS = {EMBEDDING: "the embedding routes need an embedding model",
                RERANK: "the rerank routes need a reranker"}

NOTHING_TO_RELOAD = ("this server serves the one model given with -m: there is no model configuration to reload "
                     "(start it with --models-preset or --models-dir for that)")

RequestedModel = Callable[[], str | None]  # the request's `model`, read only when routing needs it


@dataclass
class Usage:
    """What one model has served since the server started (request errors included)."""

    requests: int = 0
    items: int = 0  # inputs embedded or documents scored
    tokens: int = 0
    errors: int = 0
    queue_s: float = 0.0
    compute_s: float = 0.0
    last_error: str | None = None


class UsageCounter:
    """A model's Usage, updated by many request threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._usage = Usage()

    def started(self) -> None:
        with self._lock:
            self._usage.requests += 1

    def served(self, result: EmbedResult | RerankResult) -> None:
        with self._lock:
            self._usage.items += len(result.n_tokens)
            self._usage.tokens += sum(result.n_tokens)
            self._usage.queue_s += result.timings.queue_s
            self._usage.compute_s += result.timings.inference_s

    def failed(self, error: Exception) -> None:
        with self._lock:
            self._usage.errors += 1
            self._usage.last_error = str(error)

    def snapshot(self) -> Usage:
        with self._lock:
            return dataclasses.replace(self._usage)


@dataclass
class Served:
    """What one request works with: its engine, that model's settings, and the name its answer carries."""

    engine: Engine
    settings: Settings
    name: str
    deadline: float  # time.monotonic() by which the request must be answered (-to/--timeout after it arrived)
    usage: UsageCounter | None = None  # counted (several-model server, inference routes)
    timings: Timings | None = None  # of the engine call recorded, for the timing headers

    @property
    def remaining_s(self) -> float:
        """What is left of the request's deadline, for the engine (waiting for a lazy load used some)."""
        return max(0.0, self.deadline - time.monotonic())

    def record(self, result: EmbedResult | RerankResult) -> None:
        """The engine served this request: count it for the model and keep its timings."""
        self.timings = result.timings
        if self.usage is not None:
            self.usage.served(result)


@dataclass(frozen=True)
class ModelView:
    """One configured model as /models and /metrics show it."""

    spec: ModelSpec
    status: ResidencyStatus
    usage: Usage


class SingleModel:
    """One engine for everything, exactly as llama-server without a router."""

    router_mode = False

    def __init__(self, engine: Engine, settings: Settings):
        self._engine = engine
        self._settings = settings

    @contextmanager
    def lease(self, kind: Kind | None, requested: RequestedModel, *, count: bool = True) -> Iterator[Served]:
        """`requested` is never read: the model is only echoed. 501 for a route the flags did not enable."""
        if kind == EMBEDDING and not self._settings.embedding:
            raise not_supported(EMBEDDINGS_DISABLED)
        # llama serves rerank only with --embedding AND a CLI pooling of rank (§4.1); --reranking sets both
        if kind == RERANK and not (self._settings.embedding and self._settings.pooling is Pooling.RANK):
            raise not_supported(RERANK_DISABLED)
        yield Served(self._engine, self._settings, self._settings.model_name,
                     time.monotonic() + self._settings.timeout)

    def stats(self) -> dict[str, float]:
        return self._engine.stats()

    def describe(self) -> list[ModelView]:
        return []  # the single-model /metrics and /models stay llama-server's

    def reload(self) -> None:
        raise not_supported(NOTHING_TO_RELOAD)


class ModelRouter:
    """Several models behind one server, loaded and unloaded by a Residency."""

    router_mode = True

    def __init__(self, settings: Settings, residency: Residency, catalog: Catalog):
        self._settings = settings
        self._residency = residency
        self._lock = threading.Lock()  # one reload at a time
        self._usage: dict[str, UsageCounter] = {}  # by model id, kept across reloads (a re-added id goes on)
        self._usage_lock = threading.Lock()
        self._install(catalog)

    # -- requests ---------------------------------------------------------------------------------------------
    @contextmanager
    def lease(self, kind: Kind | None, requested: RequestedModel, *, count: bool = True) -> Iterator[Served]:
        """The engine of the requested model (kind None: any kind), loaded; waits for a lazy load.

        count: the request is one of the model's requests (the inference routes), errors included.
        """
        spec = self.pick(kind, requested())
        usage = self._counter(spec.id) if count else None
        if usage is not None:
            usage.started()
        timeout = self._settings.timeout
        deadline = time.monotonic() + timeout
        try:
            try:
                lease = self._residency.acquire(spec.options, timeout_s=timeout)
            except NotLoaded as exc:  # the load outlasted the request's deadline
                raise ReplyTimeout(f"model '{spec.id}' did not finish loading within {timeout:g} s") from exc
            with lease as engine:
                yield Served(engine, spec.settings, spec.id, deadline, usage)
        except Exception as exc:
            if usage is not None:
                usage.failed(exc)
            raise

    def pick(self, kind: Kind | None, requested: str | None) -> ModelSpec:
        catalog = self._catalog
        if requested is None:
            spec = catalog.first(kind)
            if spec is None:
                raise not_supported(_NONE_OF_KIND[kind])  # kind None: a catalog is never empty
            return spec
        spec = self.named(requested)
        if kind is not None and spec.kind != kind:
            raise bad_request(f"model '{requested}' is {_KIND_WORDS[spec.kind]}: {_ROUTE_NEEDS[kind]} "
                              f"({', '.join(s.id for s in catalog.models if s.kind == kind) or 'none configured'})")
        return spec

    def named(self, name: str) -> ModelSpec:
        spec = self._catalog.find(name)
        if spec is None:
            raise bad_request(f"model '{name}' not found; this server serves: {', '.join(self._catalog.ids)}")
        return spec

    # -- model management -------------------------------------------------------------------------------------
    def load(self, name: str) -> None:
        """POST /models/load: start loading; llama refuses a model already running."""
        spec = self.named(name)
        if self._residency.status(spec.options).state in (ModelState.LOADING, ModelState.LOADED):
            raise bad_request("model is already running")
        self._residency.load(spec.options)

    def unload(self, name: str) -> None:
        """POST /models/unload: unload now, or once its requests in flight finish."""
        spec = self.named(name)
        if self._residency.status(spec.options).state not in (ModelState.LOADING, ModelState.LOADED):
            raise bad_request("model is not running")
        self._residency.unload(spec.options)

    def reload(self) -> None:
        """Re-read the configuration (SIGHUP, POST /models?reload=1). New models appear, removed ones stop being
        routable and unload once idle, changed ones get a new engine; requests in flight finish on the engine
        they leased. A wrong configuration raises SettingsError and the old one stays."""
        with self._lock:
            catalog = read_catalog(self._settings)
            if catalog is None:
                raise SettingsError("the configuration now names no models; keeping the previous ones")
            self._install(catalog)
        log.info("reloaded the configuration: serving %s", ", ".join(catalog.ids))

    def _counter(self, model_id: str) -> UsageCounter:
        with self._usage_lock:
            return self._usage.setdefault(model_id, UsageCounter())

    def _install(self, catalog: Catalog) -> None:
        self._catalog = catalog
        self._residency.configure(spec.options for spec in catalog.models)
        for spec in catalog.models:
            if spec.load_on_startup:
                try:
                    self._residency.load(spec.options)
                except LoadFailed as exc:  # refused by the memory limits: /models shows why, requests retry
                    log.error("%s: not loaded at startup: %s", spec.id, exc)

    # -- reporting --------------------------------------------------------------------------------------------
    def stats(self) -> dict[str, float]:
        """llama's totals, summed over every model (unloaded ones included)."""
        return self._residency.stats()

    def describe(self) -> list[ModelView]:
        return [ModelView(spec, self._residency.status(spec.options), self._counter(spec.id).snapshot())
                for spec in self._catalog.models]


class Models(Protocol):
    """What every route is built on, whether the server runs one model (SingleModel) or several (ModelRouter)."""

    router_mode: bool  # several models: /models and /props give llama's router-mode answers

    def lease(self, kind: Kind | None, requested: RequestedModel, *,
              count: bool = True) -> AbstractContextManager[Served]: ...

    def stats(self) -> dict[str, float]: ...

    def describe(self) -> list[ModelView]: ...

    def reload(self) -> None: ...
