"""engine/runtime/residency.py: lazy loads, the LRU cap with pinning, idle unloads, shared copies, reconfiguration.

Most tests use fake engines whose loads the test controls; the last ones load the real MiniLM to show that
unloading gives its memory back.
"""
from __future__ import annotations

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import mlx.core as mx
import pytest

from engine import EngineOptions, ModelState, Residency
from engine.errors import CheckpointNotFound, LoadFailed, ModelTooLarge, NotEnoughMemory, NotLoaded
from engine.types import ModelInfo, Pooling, VocabType


class FakeEngine:
    """Engine's interface as Residency uses it. Its load ends when `gate` opens (at once by default)."""

    def __init__(self, options: EngineOptions, gate: threading.Event, error: Exception | None):
        self.options = options
        self._gate = gate
        self._error = error
        self.closed = threading.Event()
        self.holders = 0  # requests that the test says are using this engine right now
        self.closed_while_held = False
        self.load_s = 0.25
        self.info = ModelInfo(path=options.model_path or "", model_type="bert", architecture="BertModel",
                              vocab_type=VocabType.WPM, n_vocab=10, n_embd=4, n_ctx_train=16, n_params=1,
                              size_bytes=1000, ftype="F32", pooling=Pooling.MEAN, max_input_tokens=16,
                              truncate_tokens=16, slot_ctx=16, n_slots=1)
        self.decodes = 0

    @property
    def is_loaded(self) -> bool:
        return self._gate.is_set() and self._error is None and not self.closed.is_set()

    def wait_loaded(self, timeout: float | None = None) -> ModelInfo:
        if not self._gate.wait(timeout):
            raise NotLoaded("the model is still loading")
        if self._error is not None:
            raise self._error
        return self.info

    def stats(self) -> dict[str, float]:
        return {"prompt_tokens_total": 10 * self.decodes, "prompt_seconds_total": 0.5 * self.decodes,
                "n_decode_total": self.decodes, "n_tokens_max": 10, "requests_processing": self.holders,
                "requests_deferred": 0}

    def close(self, wait: bool = False) -> None:
        self.closed_while_held |= self.holders > 0
        self.closed.set()


class Factory:
    """Makes FakeEngines; a test can hold a folder's loads (gate) or make them fail."""

    def __init__(self) -> None:
        self.made: list[FakeEngine] = []
        self.gates: dict[str, threading.Event] = {}
        self.errors: dict[str, Exception] = {}
        self.sizes: dict[str, int] = {}  # resident bytes by folder name (default: the info's size_bytes, 1000)
        self._lock = threading.Lock()

    def __call__(self, options: EngineOptions) -> FakeEngine:
        gate = self.gates.get(os.path.basename(options.model_path or ""))
        if gate is None:
            gate = threading.Event()
            gate.set()
        engine = FakeEngine(options, gate, self.errors.get(os.path.basename(options.model_path or "")))
        size = self.sizes.get(os.path.basename(options.model_path or ""))
        if size is not None:  # what its weights hold once loaded (measured at load)
            engine.info = replace(engine.info, resident_bytes=size)
        with self._lock:
            self.made.append(engine)
        return engine

    def of(self, name: str) -> list[FakeEngine]:
        return [e for e in self.made if os.path.basename(e.options.model_path or "") == name]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def models(tmp_path) -> dict[str, EngineOptions]:
    """Options for folders a, b, c, d (the fake factory never reads them; the shared key resolves them)."""
    out = {}
    for name in "abcd":
        (tmp_path / name).mkdir()
        out[name] = EngineOptions(model_path=str(tmp_path / name))
    return out


def make(factory: Factory, *, max_loaded: int = 0, idle_unload_s: float | None = None,
         clock: Clock | None = None, **memory) -> Residency:
    return Residency(max_loaded, idle_unload_s, engine_factory=factory, clock=clock or Clock(), tick_s=3600, **memory)


def use(residency: Residency, options: EngineOptions) -> FakeEngine:
    with residency.acquire(options) as engine:
        engine.decodes += 1
        return engine


def states(residency: Residency, models: dict[str, EngineOptions]) -> dict[str, str]:
    return {name: residency.status(options).state.value for name, options in models.items()}


# -- lazy loading -----------------------------------------------------------------------------------------------
def test_models_load_on_first_use_only(models):
    factory = Factory()
    residency = make(factory)
    residency.configure(models.values())
    assert factory.made == [] and set(states(residency, models).values()) == {"unloaded"}
    engine = use(residency, models["a"])
    assert factory.made == [engine] and not engine.closed.is_set()
    assert states(residency, models) == {"a": "loaded", "b": "unloaded", "c": "unloaded", "d": "unloaded"}
    assert use(residency, models["a"]) is engine  # loaded once, then reused
    status = residency.status(models["a"])
    assert status.load_s == 0.25 and status.loaded_bytes == 1000 and status.info is engine.info


def test_a_request_waits_for_the_load_and_other_models_are_not_blocked(models):
    factory = Factory()
    factory.gates["a"] = threading.Event()
    residency = make(factory)
    residency.configure(models.values())
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(use, residency, models["a"])
        deadline = time.monotonic() + 10
        while residency.status(models["a"]).state is not ModelState.LOADING:
            assert time.monotonic() < deadline
            time.sleep(0.001)
        assert use(residency, models["b"]).is_loaded  # served while a is still loading
        assert not waiting.done()
        factory.gates["a"].set()
        assert waiting.result(10).is_loaded
    assert states(residency, models)["a"] == "loaded"


def test_a_load_that_outlasts_the_timeout_is_not_loaded_and_keeps_loading(models):
    factory = Factory()
    factory.gates["a"] = threading.Event()
    residency = make(factory)
    residency.configure([models["a"]])
    with pytest.raises(NotLoaded):
        residency.acquire(models["a"], timeout_s=0.01)
    assert residency.status(models["a"]).state is ModelState.LOADING and residency.status(models["a"]).in_use == 0
    factory.gates["a"].set()
    assert use(residency, models["a"]) is factory.made[0]


def test_a_failed_load_is_reported_then_retried(models):
    factory = Factory()
    factory.errors["a"] = CheckpointNotFound("a: not a Hugging Face model folder")
    residency = make(factory)
    residency.configure([models["a"]])
    with pytest.raises(LoadFailed, match="not a Hugging Face model folder"):
        residency.acquire(models["a"])
    status = residency.status(models["a"])
    assert status.state is ModelState.FAILED and "not a Hugging Face model folder" in status.last_error
    assert status.in_use == 0 and factory.made[0].closed.is_set()
    del factory.errors["a"]
    engine = use(residency, models["a"])  # the next request retries
    assert engine is factory.made[1] and residency.status(models["a"]).state is ModelState.LOADED
    assert residency.status(models["a"]).last_error is None


def test_a_startup_load_that_fails_shows_as_failed_without_a_request(models):
    factory = Factory()
    factory.errors["a"] = ValueError("broken weights")
    residency = make(factory)
    residency.configure([models["a"]])
    residency.load(models["a"])
    status = residency.status(models["a"])
    assert status.state is ModelState.FAILED and status.last_error == "broken weights"


# -- the cap ----------------------------------------------------------------------------------------------------
def test_the_least_recently_used_model_is_unloaded_first(models):
    factory = Factory()
    clock = Clock()
    residency = make(factory, max_loaded=2, clock=clock)
    residency.configure(models.values())
    for name in "abc":  # a, then b, then c: a is the least recently used when c arrives
        clock.now += 1
        use(residency, models[name])
    assert states(residency, models) == {"a": "unloaded", "b": "loaded", "c": "loaded", "d": "unloaded"}
    assert factory.of("a")[0].closed.is_set()
    clock.now += 1
    use(residency, models["b"])  # b is now more recent than c
    clock.now += 1
    use(residency, models["d"])
    assert states(residency, models) == {"a": "unloaded", "b": "loaded", "c": "unloaded", "d": "loaded"}


def test_a_model_in_use_is_never_evicted_and_the_cap_holds_once_released(models):
    factory = Factory()
    clock = Clock()
    residency = make(factory, max_loaded=1, clock=clock)
    residency.configure(models.values())
    held_a = residency.acquire(models["a"])
    clock.now += 1
    held_b = residency.acquire(models["b"])  # the cap is exceeded: a is in use
    assert states(residency, models)["a"] == "loaded" and states(residency, models)["b"] == "loaded"
    assert not held_a.engine.closed.is_set()
    clock.now += 1
    held_b.release()  # b is the only one nobody uses: it goes, a stays for its request
    assert states(residency, models)["a"] == "loaded" and states(residency, models)["b"] == "unloaded"
    clock.now += 1
    held_a.release()
    assert [name for name, state in states(residency, models).items() if state == "loaded"] == ["a"]
    assert not any(engine.closed_while_held for engine in factory.made)


def test_overlapping_requests_under_a_cap_of_one(models):
    """Many threads alternate between two models: no engine is ever closed while a request uses it, and
    afterwards exactly one is loaded."""
    factory = Factory()
    residency = make(factory, max_loaded=1, clock=time.monotonic)
    residency.configure([models["a"], models["b"]])
    lock = threading.Lock()

    def request(i: int) -> None:
        with residency.acquire(models["ab"[i % 2]]) as engine:
            with lock:
                engine.holders += 1
            time.sleep(0.002 * (i % 3))
            assert engine.is_loaded  # not unloaded under our feet
            with lock:
                engine.holders -= 1

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(request, range(200)))
    assert not any(engine.closed_while_held for engine in factory.made)
    loaded = [engine for engine in factory.made if not engine.closed.is_set()]
    assert len(loaded) == 1
    assert sorted(states(residency, {k: models[k] for k in "ab"}).values()) == ["loaded", "unloaded"]


def test_an_explicit_unload_of_a_model_in_use_waits_for_its_request(models):
    factory = Factory()
    residency = make(factory)
    residency.configure([models["a"]])
    lease = residency.acquire(models["a"])
    residency.unload(models["a"])
    assert residency.status(models["a"]).state is ModelState.LOADED and not lease.engine.closed.is_set()
    lease.release()
    assert residency.status(models["a"]).state is ModelState.UNLOADED and lease.engine.closed.is_set()


# -- the memory budget -----------------------------------------------------------------------------------------
def resident(factory: Factory) -> list[str]:
    return sorted(os.path.basename(e.options.model_path) for e in factory.made if not e.closed.is_set())


def test_the_memory_budget_unloads_the_least_recently_used_until_the_rest_fit(models):
    factory = Factory()
    factory.sizes = {"a": 1000, "b": 1000, "c": 1500}
    clock = Clock()
    residency = make(factory, memory_bytes=2500, clock=clock)
    residency.configure(models.values())
    for name in "ab":
        use(residency, models[name])
        clock.now += 1
    assert resident(factory) == ["a", "b"]  # 2000 bytes: within 2500
    use(residency, models["c"])  # measured at 1500: a (least recently used) goes; b and c hold 2500, within
    assert resident(factory) == ["b", "c"]
    assert residency.status(models["c"]).loaded_bytes == 1500  # the resident bytes, not the file size (info 1000)


def test_a_model_is_counted_at_its_files_size_before_its_first_load(models, tmp_path):
    """The room is made before the load starts, from the weight files on disk, so two never sit in memory."""
    factory = Factory()
    (tmp_path / "b" / "model.safetensors").write_bytes(b"\0" * 1500)
    factory.sizes = {"a": 1000, "b": 1500}
    factory.gates["b"] = gate = threading.Event()
    residency = make(factory, memory_bytes=2000)
    residency.configure(models.values())
    use(residency, models["a"])
    residency.load(models["b"])  # still loading: a is already unloaded
    assert resident(factory) == ["b"]
    gate.set()


@pytest.mark.parametrize("release_first", ["a", "b"])
def test_two_first_use_requests_under_a_budget_of_one_model_both_succeed_and_one_stays(models, release_first):
    """Seed 003's race: each request resolved its model (and holds a lease) before it used it. Neither engine is
    taken away from its request, neither request fails, and once both are released one model is resident."""
    factory = Factory()
    factory.sizes = {"a": 1000, "b": 1000}
    factory.gates = {"a": threading.Event(), "b": threading.Event()}
    residency = make(factory, memory_bytes=1500, clock=time.monotonic)
    residency.configure([models["a"], models["b"]])
    leases: dict[str, object] = {}
    errors: list[BaseException] = []

    def first_use(name: str) -> None:
        try:
            leases[name] = residency.acquire(models[name])
        except BaseException as exc:  # noqa: BLE001 - the test reports it
            errors.append(exc)

    threads = [threading.Thread(target=first_use, args=(name,)) for name in "ab"]
    for thread in threads:
        thread.start()
    while len(factory.made) < 2:  # both loads started: both models resolved before either finished
        time.sleep(0.001)
    for gate in factory.gates.values():
        gate.set()
    for thread in threads:
        thread.join(10)
    assert errors == [] and set(leases) == {"a", "b"}
    for lease in leases.values():  # now each request uses the engine it resolved
        assert lease.engine.is_loaded
    other = "b" if release_first == "a" else "a"
    leases[release_first].release()
    assert not leases[other].engine.closed.is_set()
    leases[other].release()
    assert len(resident(factory)) == 1
    assert not any(engine.closed_while_held for engine in factory.made)


def test_many_requests_over_a_budget_of_one_model_never_leave_two_resident(models):
    factory = Factory()
    factory.sizes = {"a": 1000, "b": 1000, "c": 1000}
    residency = make(factory, memory_bytes=1000, clock=time.monotonic)
    residency.configure([models[name] for name in "abc"])
    lock = threading.Lock()

    def request(i: int) -> None:
        with residency.acquire(models["abc"[i % 3]]) as engine:
            with lock:
                engine.holders += 1
            time.sleep(0.001 * (i % 2))
            assert engine.is_loaded
            with lock:
                engine.holders -= 1

    with ThreadPoolExecutor(6) as pool:
        list(pool.map(request, range(150)))
    assert not any(engine.closed_while_held for engine in factory.made)
    assert len(resident(factory)) == 1


def test_a_model_alone_over_the_budget_is_refused_with_both_numbers(models):
    factory = Factory()
    factory.sizes = {"a": 4000}
    residency = make(factory, memory_bytes=3000)
    residency.configure([models["a"], models["b"]])
    with pytest.raises(ModelTooLarge) as refused:
        residency.acquire(models["a"])
    assert "4000 bytes" in str(refused.value) and "3000 bytes" in str(refused.value)
    assert factory.made[0].closed.is_set()
    status = residency.status(models["a"])
    assert status.state is ModelState.FAILED and status.last_error == str(refused.value)
    with pytest.raises(ModelTooLarge):  # refused again from its measured size, without loading it again
        residency.acquire(models["a"])
    assert len(factory.made) == 1
    use(residency, models["b"])  # the others are served as before


def test_an_explicit_load_over_the_budget_is_measured_and_refused_without_a_request(models):
    factory = Factory()
    factory.sizes = {"a": 4000}
    residency = make(factory, memory_bytes=3000)
    residency.configure([models["a"]])
    residency.load(models["a"])
    assert factory.made[0].closed.wait(5)  # the load's own watcher measured it
    assert residency.status(models["a"]).state is ModelState.FAILED


def test_the_free_memory_floor_unloads_idle_models_and_refuses_what_cannot_fit(models, tmp_path):
    factory = Factory()
    for name in "bc":
        (tmp_path / name / "model.safetensors").write_bytes(b"\0" * 1000)
    factory.sizes = {"a": 1000, "b": 1000, "c": 1000}
    available = [10_000]
    clock = Clock()
    residency = make(factory, memory_floor=5000, available=lambda: available[0], clock=clock)
    residency.configure(models.values())
    use(residency, models["a"])
    clock.now += 1
    available[0] = 5200  # b needs its 1000 bytes (its files) above the floor of 5000: a goes first
    use(residency, models["b"])
    assert resident(factory) == ["b"]
    lease = residency.acquire(models["b"])
    with pytest.raises(NotEnoughMemory) as refused:  # b is in use: nothing idle to unload
        residency.acquire(models["c"])
    assert "5000 bytes" in str(refused.value) and "5200 bytes are available" in str(refused.value)
    lease.release()
    assert resident(factory) == ["b"]


# -- idle unloads -----------------------------------------------------------------------------------------------
def test_models_idle_longer_than_the_timeout_are_unloaded(models):
    factory = Factory()
    clock = Clock()
    residency = make(factory, idle_unload_s=10, clock=clock)
    residency.configure(models.values())
    use(residency, models["a"])
    clock.now += 6
    use(residency, models["b"])
    clock.now += 5  # a idle 11 s, b idle 5 s
    residency.unload_idle()
    assert states(residency, models)["a"] == "unloaded" and states(residency, models)["b"] == "loaded"
    lease = residency.acquire(models["c"])
    clock.now += 100  # c is in use: idle time does not count while a request holds it
    residency.unload_idle()
    assert states(residency, models) == {"a": "unloaded", "b": "unloaded", "c": "loaded", "d": "unloaded"}
    lease.release()
    clock.now += 10
    residency.unload_idle()
    assert states(residency, models)["c"] == "unloaded"


def test_the_timer_thread_unloads_idle_models(models):
    factory = Factory()
    residency = Residency(0, 0.05, engine_factory=factory, tick_s=0.02)
    residency.configure([models["a"]])
    engine = use(residency, models["a"])
    assert engine.closed.wait(5)
    assert residency.status(models["a"]).state is ModelState.UNLOADED
    residency.close()


# -- shared copies and reconfiguration --------------------------------------------------------------------------
def test_references_to_the_same_folder_share_one_engine(models, tmp_path):
    factory = Factory()
    residency = make(factory)
    a = models["a"]
    same = [a, replace(a, model_path=a.model_path + "/"), replace(a, model_path=str(tmp_path / "." / "a")),
            replace(a, offline=True)]
    (tmp_path / "link").symlink_to(tmp_path / "a")
    same.append(replace(a, model_path=str(tmp_path / "link")))
    other = replace(a, pooling=Pooling.CLS)  # different engine options: its own copy
    residency.configure([*same, other])
    engines = {id(use(residency, options)) for options in same}
    assert len(engines) == 1 and len(factory.made) == 1
    use(residency, other)
    assert len(factory.made) == 2
    residency.unload(same[2])  # one copy: unloading any reference unloads it for all
    assert all(residency.status(options).state is ModelState.UNLOADED for options in same)


def test_reconfiguring_lets_requests_in_flight_finish_on_their_engine(models):
    factory = Factory()
    residency = make(factory)
    residency.configure([models["a"], models["b"]])
    use(residency, models["b"])
    lease = residency.acquire(models["a"])
    changed = replace(models["a"], pooling=Pooling.CLS)
    residency.configure([changed])  # a changed, b removed
    assert factory.of("b")[0].closed.is_set()  # idle: unloaded at once
    assert not lease.engine.closed.is_set()  # in flight: kept for its request
    assert residency.status(models["a"]).state is ModelState.LOADED
    new = use(residency, changed)
    assert new is not lease.engine and new.options.pooling is Pooling.CLS
    lease.release()
    assert lease.engine.closed.is_set() and residency.status(models["a"]).state is ModelState.UNLOADED


def test_a_request_that_resolved_a_removed_model_is_still_served(models):
    factory = Factory()
    residency = make(factory)
    residency.configure([models["b"]])
    engine = use(residency, models["a"])  # not configured (removed by a reload a moment ago)
    assert engine.options.model_path.endswith("a") and engine.closed.is_set()  # unloaded once released
    assert residency.status(models["a"]).state is ModelState.UNLOADED


def test_stats_sum_engines_and_keep_the_counts_of_unloaded_ones(models):
    factory = Factory()
    residency = make(factory)
    residency.configure(models.values())
    use(residency, models["a"])
    use(residency, models["a"])
    use(residency, models["b"])
    assert residency.stats()["n_decode_total"] == 3 and residency.stats()["prompt_tokens_total"] == 30
    residency.unload(models["a"])
    stats = residency.stats()
    assert stats["n_decode_total"] == 3 and stats["prompt_seconds_total"] == 1.5 and stats["n_tokens_max"] == 10


# -- real memory ------------------------------------------------------------------------------------------------
def test_unloading_a_real_model_gives_its_memory_back(minilm_path):
    residency = Residency(1, None)
    minilm = EngineOptions(model_path=str(minilm_path), threads=2)
    residency.configure([minilm])
    mx.clear_cache()
    before = mx.get_active_memory()
    with residency.acquire(minilm, timeout_s=120) as engine:
        vectors = engine.embed([engine.encode_prompt(["memory"])]).vectors
        size = engine.info.size_bytes
    assert vectors[0].shape == (384,)
    assert mx.get_active_memory() - before > 0.9 * size  # the weights are resident
    residency.unload(minilm)
    assert engine.released.wait(30)
    assert mx.get_active_memory() - before < 0.05 * size
    assert mx.get_cache_memory() < 0.05 * size
    residency.close()


def test_a_floor_where_the_system_does_not_report_its_free_memory_is_refused_up_front():
    with pytest.raises(ValueError, match="--models-memory-floor"):
        Residency(0, None, memory_floor=1, engine_factory=Factory(), available=lambda: None)
    assert Residency(0, None, memory_floor=1, engine_factory=Factory(), available=lambda: 10).status(
        EngineOptions(model_path="/nowhere")).state is ModelState.UNLOADED
