"""Several checkpoints in one process: which are loaded, and for how long.

Each checkpoint is served by its own Engine (its own engine thread), created on first use or when asked.
Requests hold a Lease on the Engine they resolved; a leased engine is pinned and never unloaded, so a
request always finishes on the engine it started with. At most `max_loaded` engines are resident (loading
or loaded): beyond that the least recently used one that no lease pins is unloaded, and when every resident
engine is pinned the cap is exceeded until a lease is released. Engines nobody used for `idle_unload_s`
are unloaded by a background timer. Configured references that resolve to the same folder with the same
options share one engine.

A memory budget (`memory_bytes`) bounds the same way what the resident engines hold: each engine counts the
bytes its weights hold as loaded (ModelInfo.resident_bytes, measured when its load ends; before that, the size
of its weight files on disk), and least recently used unpinned engines are unloaded while the sum is over the
budget. A model whose measured size alone is over the budget is refused (ModelTooLarge), now and on every later
request. A free-memory floor (`memory_floor`) is checked when a load starts, against the system's available
memory (/proc/meminfo MemAvailable): idle engines are unloaded to keep at least that much free after the load,
and the load is refused (NotEnoughMemory) when even that cannot, and checked again when the load ends.

The lock guards bookkeeping only: it is never held while a model loads, a forward pass runs or an engine
shuts down (Engine() and Engine.close() return at once; the work happens on the engines' threads).
"""
from __future__ import annotations

import logging
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path

from engine.errors import CheckpointNotFound, LoadFailed, ModelTooLarge, NotEnoughMemory, NotLoaded
from engine.loading import hub
from engine.runtime.engine import Engine
from engine.types import EngineOptions, ModelState, ResidencyStatus

log = logging.getLogger(__name__)

# Engine(options) and anything with its interface: wait_loaded, is_loaded, info, load_s, stats, close.
EngineFactory = Callable[[EngineOptions], Engine]

# Engine.stats() keys that only grow; the others are gauges of the moment.
_COUNTERS = ("prompt_tokens_total", "prompt_seconds_total", "n_decode_total")

_WEIGHT_FILES = ("*.safetensors", "*.gguf")  # what a model's size on disk is counted from before its first load


def available_memory() -> int | None:
    """The system memory available to a new allocation without swapping (Linux MemAvailable), in bytes; None where
    the system does not say (no /proc/meminfo)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024  # the kernel writes kB
    except (OSError, ValueError, IndexError):
        return None
    return None


def files_size(key: EngineOptions) -> int:
    """The bytes of a checkpoint's weight files (a .gguf file, or a folder's safetensors and gguf files): what it
    is counted as before its first load measures it. 0 when unknown (a repository not downloaded yet)."""
    if not key.model_path:
        return 0
    path = Path(key.model_path)
    try:
        if path.is_file():
            return path.stat().st_size
        if path.is_dir():
            return sum(f.stat().st_size for pattern in _WEIGHT_FILES for f in path.rglob(pattern) if f.is_file())
    except OSError:
        return 0
    return 0


def shared_key(options: EngineOptions) -> EngineOptions:
    """Options naming the checkpoint by its resolved folder, so that `./m`, `m/` and a repository cached at
    that folder share one loaded copy. May read the disk (the Hugging Face cache), never the network."""
    if options.model_path:
        folder = os.path.realpath(os.path.expanduser(options.model_path))
        return replace(options, model_path=folder, hf_repo=None, offline=False)
    if options.hf_repo:
        try:
            folder = str(hub.resolve(None, options.hf_repo, offline=True, hf_file=options.hf_file).resolve())
        except CheckpointNotFound:  # not downloaded yet: the repository name is the identity
            return options
        return replace(options, model_path=folder, hf_repo=None, hf_file=None, offline=False)
    return options


@dataclass(eq=False)
class _Slot:
    """One loaded-or-loadable copy of a checkpoint."""

    key: EngineOptions
    refs: int = 0  # configured references to this copy; 0: unload (and forget) once nobody uses it
    engine: Engine | None = None  # resident: loading or loaded
    users: int = 0  # leases held now
    last_used: float = 0.0
    unload_when_idle: bool = False  # unload() was asked while leases were held
    failed: bool = False
    last_error: str | None = None
    load_s: float | None = None  # of the last successful load, kept after unloading
    size: int = 0  # bytes it holds loaded: measured at its last load, or its weight files' size before one
    measured: bool = False  # size was measured at a load (kept after unloading: the next load is that size)
    checked: Engine | None = None  # the engine whose finished load was measured against the budget

    @property
    def label(self) -> str:
        return self.key.model_path or self.key.hf_repo or "?"


class Lease:
    """One request's hold on an engine: it stays loaded, and serves this request, until release()."""

    def __init__(self, residency: Residency, slot: _Slot, engine: Engine):
        self.engine = engine
        self._residency = residency
        self._slot = slot
        self._released = False

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._residency._release(self._slot)

    def __enter__(self) -> Engine:
        return self.engine

    def __exit__(self, *exc: object) -> None:
        self.release()


class Residency:
    def __init__(self, max_loaded: int = 0, idle_unload_s: float | None = None, *,
                 memory_bytes: int = 0, memory_floor: int = 0,
                 engine_factory: EngineFactory = Engine, clock: Callable[[], float] = time.monotonic,
                 tick_s: float = 1.0, available: Callable[[], int | None] = available_memory):
        """max_loaded: 0 = no cap. idle_unload_s: None = never. memory_bytes: the budget of what resident engines
        hold, 0 = none. memory_floor: system memory kept free, 0 = none. clock, tick_s and available (the free
        memory reading) exist for tests."""
        self._max_loaded = max_loaded
        self._idle_unload_s = idle_unload_s
        self._memory_bytes = max(0, memory_bytes)
        self._memory_floor = max(0, memory_floor)
        self._available = available
        if self._memory_floor and available() is None:
            raise ValueError("--models-memory-floor needs the system's available memory, which this system does not "
                             "report (no MemAvailable in /proc/meminfo)")
        self._factory = engine_factory
        self._clock = clock
        self._lock = threading.Lock()
        self._slots: dict[EngineOptions, _Slot] = {}
        self._keys: dict[EngineOptions, EngineOptions] = {}  # configured options -> their shared key
        self._retired = dict.fromkeys(_COUNTERS, 0.0) | {"n_tokens_max": 0.0}  # of engines already closed
        self._stopped = threading.Event()
        if idle_unload_s is not None:
            threading.Thread(target=self._tick, args=(tick_s,), name="idle-unload", daemon=True).start()

    # -- configuration ----------------------------------------------------------------------------------------
    def configure(self, wanted: Iterable[EngineOptions]) -> None:
        """The checkpoints that may be served from now on. Ones no longer wanted unload once nobody uses them;
        requests still holding them finish first."""
        keys = {options: shared_key(options) for options in wanted}  # outside the lock: reads the disk
        counts = Counter(keys.values())
        sizes = {key: files_size(key) for key in counts}
        with self._lock:
            self._keys = keys
            for key, slot in self._slots.items():
                slot.refs = counts.get(key, 0)
            for key, refs in counts.items():
                if key not in self._slots:
                    self._slots[key] = _Slot(key, refs=refs, last_used=self._clock(), size=sizes[key])
            closing = [engine for slot in list(self._slots.values()) if slot.refs == 0 and slot.users == 0
                       for engine in self._detach(slot, "no longer configured")]
        self._close(closing)

    # -- requests ---------------------------------------------------------------------------------------------
    def acquire(self, options: EngineOptions, timeout_s: float | None = None) -> Lease:
        """A lease on the engine for `options`, loaded (waiting for its load if need be).

        Raises NotLoaded when the load outlasts `timeout_s`, LoadFailed when it fails. Options not configured
        (a request that resolved its model just before a reload) get a copy that unloads once released.
        """
        with self._lock:
            slot, closing, _, refused = self._started(options)
            if refused is None:
                slot.users += 1
                slot.last_used = self._clock()
                engine = slot.engine
                closing += self._over_cap()
        self._close(closing)
        if refused is not None:
            raise refused
        lease = Lease(self, slot, engine)
        try:
            engine.wait_loaded(timeout_s)
        except BaseException as exc:
            with self._lock:
                # refused by the memory budget when its load ended (and closed): that is the answer
                refusal = slot.last_error if slot.engine is not engine and slot.failed else None
                closing = [] if refusal or isinstance(exc, NotLoaded) else self._fail(slot, engine, exc)
            self._close(closing)
            lease.release()
            if refusal:
                raise ModelTooLarge(refusal) from exc
            if isinstance(exc, NotLoaded):
                raise
            raise LoadFailed(f"{slot.label} failed to load: {exc}") from exc
        with self._lock:  # the load ended: its measured size is checked before the engine serves anything
            closing, refused = self._measure(slot, engine)
        self._close(closing)
        if refused is not None:
            lease.release()
            raise refused
        return lease

    def _release(self, slot: _Slot) -> None:
        with self._lock:
            slot.users -= 1
            slot.last_used = self._clock()
            closing = []
            if slot.users == 0 and (slot.refs == 0 or slot.unload_when_idle):
                closing += self._detach(slot, "asked to" if slot.unload_when_idle else "no longer configured")
            closing += self._over_cap()  # a cap exceeded while everything was pinned is enforced now
        self._close(closing)

    # -- explicit load and unload -----------------------------------------------------------------------------
    def load(self, options: EngineOptions) -> None:
        """Start loading (again, after a failure) unless already resident; returns at once."""
        with self._lock:
            slot, closing, started, refused = self._started(options)
            if started:
                slot.last_used = self._clock()
                closing += self._over_cap()
        self._close(closing)
        if refused is not None:
            raise refused

    def unload(self, options: EngineOptions) -> None:
        """Unload now, or when the last lease is released."""
        key = self._key(options)
        with self._lock:
            slot = self._slots.get(key)
            if slot is None or slot.engine is None:
                return
            if slot.users:
                slot.unload_when_idle = True
                return
            closing = self._detach(slot, "asked to")
        self._close(closing)

    def unload_idle(self) -> None:
        """Unload the loaded engines nobody has used for idle_unload_s (the timer calls this every tick)."""
        if self._idle_unload_s is None:
            return
        now = self._clock()
        with self._lock:
            idle = [slot for slot in self._slots.values()
                    if slot.engine is not None and slot.users == 0 and slot.engine.is_loaded
                    and now - slot.last_used >= self._idle_unload_s]
            closing = [engine for slot in idle for engine in self._detach(slot, "idle")]
        self._close(closing)

    # -- reporting --------------------------------------------------------------------------------------------
    def status(self, options: EngineOptions) -> ResidencyStatus:
        key = self._key(options)
        with self._lock:
            slot = self._slots.get(key)
            if slot is None:
                return ResidencyStatus(ModelState.UNLOADED)
            closing = self._settle(slot)
            engine = slot.engine
            if engine is None:
                state = ModelState.FAILED if slot.failed else ModelState.UNLOADED
            else:
                state = ModelState.LOADED if engine.is_loaded else ModelState.LOADING
            if state is ModelState.LOADED:
                slot.last_error = None
            status = ResidencyStatus(
                state=state, in_use=slot.users, last_error=slot.last_error,
                load_s=engine.load_s if state is ModelState.LOADED else slot.load_s,
                info=engine.info if state is ModelState.LOADED else None)
        self._close(closing)
        return status

    def stats(self) -> dict[str, float]:
        """Engine.stats() summed over every engine, the unloaded ones' counters included (they only grow)."""
        with self._lock:
            engines = [slot.engine for slot in self._slots.values() if slot.engine is not None]
            totals = dict(self._retired)
        totals.update(requests_processing=0.0, requests_deferred=0.0)
        for engine in engines:
            stats = engine.stats()
            for name in (*_COUNTERS, "requests_processing", "requests_deferred"):
                totals[name] += stats[name]
            totals["n_tokens_max"] = max(totals["n_tokens_max"], stats["n_tokens_max"])
        return totals

    def close(self) -> None:
        """Stop the timer and unload everything (server shutdown)."""
        self._stopped.set()
        with self._lock:
            closing = [engine for slot in list(self._slots.values()) for engine in self._detach(slot, "shutdown")]
        self._close(closing)

    # -- internals (under the lock unless said otherwise) -----------------------------------------------------
    def _slot(self, key: EngineOptions) -> _Slot:
        slot = self._slots.get(key)
        if slot is None:  # not configured: kept while used, then forgotten
            slot = self._slots[key] = _Slot(key, size=files_size(key))
        return slot

    def _key(self, options: EngineOptions) -> EngineOptions:
        known = self._keys.get(options)  # a plain dict read; configure() replaces the dict whole
        return known if known is not None else shared_key(options)

    def _started(self, options: EngineOptions) -> tuple[_Slot, list[Engine], bool, LoadFailed | None]:
        """The slot for `options` with an engine (started now unless resident or loading), the engines to close
        (a failed load's, ones unloaded to make room), whether it was started now, and why the memory limits
        refuse to start it (then it has no engine)."""
        slot = self._slot(self._key(options))
        closing = self._settle(slot)
        started = slot.engine is None
        if started:
            room, refused = self._admit(slot)
            closing += room
            if refused is not None:
                if slot.refs == 0:
                    self._slots.pop(slot.key, None)
                return slot, closing, False, refused
            self._start(slot)
        return slot, closing, started, None

    def _start(self, slot: _Slot) -> None:
        log.info("loading %s", slot.label)
        slot.engine = engine = self._factory(slot.key)  # returns at once: the load runs on the engine's own thread
        slot.failed = False
        slot.unload_when_idle = False
        if self._memory_bytes or self._memory_floor:  # measure the load when it ends, whether or not a request waits
            threading.Thread(target=self._watch, args=(slot, engine), name="load-measure", daemon=True).start()

    def _watch(self, slot: _Slot, engine: Engine) -> None:
        """(Own thread.) Measure a load against the memory limits once it ends."""
        try:
            engine.wait_loaded(None)
        except BaseException:  # a failed load is recorded by whoever waits for it, or by status()
            return
        with self._lock:
            closing, _ = self._measure(slot, engine)
        self._close(closing)

    def _admit(self, slot: _Slot) -> tuple[list[Engine], LoadFailed | None]:
        """Before a load starts: a model measured over the budget is refused, and the free-memory floor makes
        room by unloading idle engines (or refuses when even all of them would not make enough)."""
        if self._memory_bytes and slot.measured and slot.size > self._memory_bytes:
            return [], ModelTooLarge(self._too_large(slot))
        if not self._memory_floor:
            return [], None
        available = self._available()
        if available is None:
            return [], None
        short = self._memory_floor + slot.size - available
        idle = self._idle_besides(slot)
        if short > sum(other.size for other in idle):
            error = NotEnoughMemory(
                f"{slot.label} (about {slot.size} bytes) does not fit above the free-memory floor of "
                f"{self._memory_floor} bytes (--models-memory-floor): {available} bytes are available and "
                f"unloading every idle model would free {sum(other.size for other in idle)} more")
            slot.last_error = str(error)
            return [], error
        return self._free(idle, short), None

    def _idle_besides(self, slot: _Slot) -> list[_Slot]:
        """The resident slots no lease pins, other than `slot`, least recently used first."""
        return sorted((other for other in self._slots.values()
                       if other.engine is not None and other.users == 0 and other is not slot),
                      key=lambda other: other.last_used)

    def _free(self, idle: list[_Slot], short: int) -> list[Engine]:
        """Unload the first of `idle` until `short` bytes more are free (the floor)."""
        closing: list[Engine] = []
        for other in idle:
            if short <= 0:
                break
            closing += self._detach(other, "to keep the free-memory floor")
            short -= other.size
        return closing

    def _measure(self, slot: _Slot, engine: Engine) -> tuple[list[Engine], LoadFailed | None]:
        """A load has ended: its size is what its weights hold (ModelInfo.resident_bytes); over the budget alone it
        is refused and unloaded, else other engines are unloaded to bring the resident ones back within the
        limits. Once per engine; a request whose engine was refused meanwhile gets the refusal."""
        if slot.engine is not engine:  # refused (or unloaded at shutdown) while this request waited for it
            error = ModelTooLarge if slot.failed else LoadFailed
            return [], error(slot.last_error or f"{slot.label} was unloaded while it loaded")
        if slot.checked is engine:
            return [], None
        slot.checked = engine
        info = engine.info
        slot.size, slot.measured = (info.resident_bytes or info.size_bytes), True
        if self._memory_bytes and slot.size > self._memory_bytes:
            message = self._too_large(slot)
            log.error("%s", message)
            slot.engine, slot.failed, slot.last_error = None, True, message
            if slot.refs == 0 and slot.users == 0:
                self._slots.pop(slot.key, None)
            return [engine], ModelTooLarge(message)
        closing = self._over_cap()
        if self._memory_floor and (available := self._available()) is not None:
            closing += self._free(self._idle_besides(slot), self._memory_floor - available)
        return closing, None

    def _too_large(self, slot: _Slot) -> str:
        return (f"{slot.label} holds {slot.size} bytes resident (measured at load), more than the whole memory "
                f"budget of {self._memory_bytes} bytes (--models-memory): it cannot be served; raise the budget or "
                f"serve a smaller or quantized copy")

    def _settle(self, slot: _Slot) -> list[Engine]:
        """Notice a load that failed while nobody waited for it (a startup or explicit load)."""
        engine = slot.engine
        if engine is None:
            return []
        if engine.is_loaded:
            if slot.checked is not engine and (self._memory_bytes or self._memory_floor):
                return self._measure(slot, engine)[0]
            return []
        try:
            engine.wait_loaded(0)
        except NotLoaded:  # still loading
            return []
        except BaseException as exc:
            return self._fail(slot, engine, exc)
        return []

    def _fail(self, slot: _Slot, engine: Engine, exc: BaseException) -> list[Engine]:
        if slot.engine is not engine:  # another waiter already recorded it
            return []
        log.error("%s failed to load: %s", slot.label, exc)
        slot.failed = True
        slot.last_error = str(exc)
        slot.engine = None
        return [engine]

    def _over_cap(self) -> list[Engine]:
        """Unload least recently used unpinned engines while more than max_loaded are resident or what they hold
        adds up to more than the memory budget."""
        resident = [slot for slot in self._slots.values() if slot.engine is not None]
        count, total = len(resident), sum(slot.size for slot in resident)

        def over() -> bool:
            return bool(self._max_loaded and count > self._max_loaded) or bool(
                self._memory_bytes and total > self._memory_bytes)

        closing: list[Engine] = []
        for slot in sorted((slot for slot in resident if slot.users == 0), key=lambda slot: slot.last_used):
            if not over():
                break
            closing += self._detach(slot, "least recently used")
            count, total = count - 1, total - slot.size
        if over():
            log.info("%d models loaded holding %d bytes, over the cap of %s models / %s bytes until the ones in use "
                     "are released", count, total, self._max_loaded or "no", self._memory_bytes or "no")
        return closing

    def _detach(self, slot: _Slot, why: str) -> list[Engine]:
        """Take the slot's engine away for closing (outside the lock); forget an unconfigured slot."""
        engine, slot.engine = slot.engine, None
        slot.unload_when_idle = False
        slot.checked = None
        if slot.refs == 0:
            self._slots.pop(slot.key, None)
        if engine is None:
            return []
        log.info("unloading %s (%s)", slot.label, why)
        if engine.is_loaded:
            slot.load_s = engine.load_s
            slot.last_error = None
            stats = engine.stats()
            for name in _COUNTERS:
                self._retired[name] += stats[name]
            self._retired["n_tokens_max"] = max(self._retired["n_tokens_max"], stats["n_tokens_max"])
        return [engine]

    @staticmethod
    def _close(engines: list[Engine]) -> None:
        for engine in engines:  # outside the lock; returns at once, the memory is freed on a helper thread
            engine.close()

    def _tick(self, tick_s: float) -> None:
        while not self._stopped.wait(tick_s):
            try:
                self.unload_idle()
            except Exception:  # the timer must outlive one bad tick
                log.exception("idle unload failed")
