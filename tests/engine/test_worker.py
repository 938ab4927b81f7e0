"""engine/runtime/worker.py with a fake runner: batching, scattering results back, failures, deadlines, the queue bound."""
from __future__ import annotations

import threading
import time
from concurrent.futures import CancelledError, Future, ThreadPoolExecutor

import numpy as np
import pytest

from engine.errors import (
    EngineError,
    ForwardFailed,
    NotLoaded,
    OutOfMemory,
    QueueFull,
    ReplyTimeout,
    TooManyInputs,
)
from engine.runtime.scheduler import BatchLimits
from engine.runtime.worker import Worker, is_out_of_memory

PAD = 7
FAR = 1e12  # a deadline that never passes


class FakeRunner:
    """Echoes each row's real ids (and type ids) back; records what every forward pass looked like."""

    def __init__(self, fail_on: set[int] | None = None, hold_first: bool = False):
        self.calls: list[tuple[np.ndarray, np.ndarray, np.ndarray, list[int]]] = []
        self.fail_on = fail_on or set()
        self.entered = threading.Event()
        self.release = threading.Event()
        if not hold_first:
            self.release.set()

    def __call__(self, ids, mask, type_ids, lengths):
        self.calls.append((ids.copy(), mask.copy(), type_ids.copy(), list(lengths)))
        self.entered.set()
        assert self.release.wait(60)
        if len(self.calls) in self.fail_on:
            raise RuntimeError(f"boom on pass {len(self.calls)}")
        return [np.concatenate([ids[r, :n], [-1], type_ids[r, :n]]).astype(np.int64) for r, n in enumerate(lengths)]


def start(runner, limits=BatchLimits(max_tokens=256, max_rows=4), max_queue=1000) -> Worker:
    """A worker whose load returns the fake runner, PAD and `limits` (as fitted at load)."""
    worker = Worker(lambda: (runner, PAD, limits), max_queue,
                    name="test-engine")
    assert worker.loaded.wait(10)
    return worker


def echo(ids, types=None):
    types = types if types is not None else [0] * len(ids)
    return np.array([*ids, -1, *types])


def _wait_until(predicate, timeout=30.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.002)


def hold(worker, runner):
    """Put one input into a held forward pass: everything submitted afterwards waits together."""
    items = worker.submit([[1, 2, 3]], FAR)
    assert runner.entered.wait(10)
    return items


def test_results_scattered_to_the_right_items_across_concurrent_submitters():
    runner = FakeRunner(hold_first=True)
    limits = BatchLimits(max_tokens=96, max_rows=4)
    worker = start(runner, limits)
    n_threads, per_request = 8, 5
    rng = np.random.default_rng(3)
    requests = [[list(rng.integers(100, 30000, size=rng.integers(1, 40))) for _ in range(per_request)]
                for _ in range(n_threads)]
    barrier = threading.Barrier(n_threads)
    try:
        blocker = hold(worker, runner)

        def submit(k):
            barrier.wait(10)
            return worker.submit(requests[k], FAR)

        with ThreadPoolExecutor(n_threads) as pool:
            submitted = list(pool.map(submit, range(n_threads)))
        assert worker.queued() == n_threads * per_request
        runner.release.set()
        assert blocker[0].future.result(10).value.tolist() == echo([1, 2, 3]).tolist()
        for token_lists, items in zip(requests, submitted, strict=True):
            assert [item.ids for item in items] == token_lists  # input order kept
            for ids, item in zip(token_lists, items, strict=True):
                np.testing.assert_array_equal(item.future.result(10).value, echo(ids))
    finally:
        worker.close()

    # every forward pass respected the limits and was padded correctly
    assert len(runner.calls) >= 1 + -(-n_threads * per_request // limits.max_rows)
    n_rows = 0
    for ids, mask, type_ids, lengths in runner.calls:
        rows, width = ids.shape
        n_rows += rows
        assert rows <= limits.max_rows
        assert width == limits.width(max(lengths))
        if rows > 1:
            assert rows * width <= limits.max_tokens
        for r, n in enumerate(lengths):
            assert mask[r, :n].tolist() == [1] * n and not mask[r, n:].any()
            assert (ids[r, n:] == PAD).all()
            assert not type_ids[r].any()
    assert n_rows == 1 + n_threads * per_request


def test_type_ids_travel_with_their_rows():
    runner = FakeRunner()
    worker = start(runner)
    try:
        items = worker.submit([[5, 6, 7], [8, 9]], FAR, type_lists=[[0, 0, 1], [0, 1]])
        assert items[0].future.result(10).value.tolist() == echo([5, 6, 7], [0, 0, 1]).tolist()
        assert items[1].future.result(10).value.tolist() == echo([8, 9], [0, 1]).tolist()
    finally:
        worker.close()


def test_item_results_carry_timings_and_pass_number():
    runner = FakeRunner(hold_first=True)
    worker = start(runner, BatchLimits(max_tokens=1024, max_rows=64))
    try:
        first = hold(worker, runner)
        items = worker.submit([[1] * 5, [2] * 6, [3] * 4], FAR)
        runner.release.set()
        results = [item.future.result(10) for item in items]
        assert len({r.batch for r in results}) == 1  # queued together, one pass
        assert results[0].batch != first[0].future.result(10).batch
        assert all(r.queue_s >= 0 and r.inference_s >= 0 for r in results)
        assert worker.stats.n_decode_total == 2
        assert worker.stats.prompt_tokens_total == 3 + 15
        assert worker.stats.n_tokens_max == 15
    finally:
        worker.close()


def test_forward_failure_fails_only_that_batch():
    runner = FakeRunner(fail_on={1})
    worker = start(runner)
    try:
        bad = worker.submit([[1, 2], [3]], FAR)
        for item in bad:
            with pytest.raises(ForwardFailed, match="boom on pass 1"):
                item.future.result(10)
        good = worker.submit([[4, 5]], FAR)
        assert good[0].future.result(10).value.tolist() == echo([4, 5]).tolist()
        assert worker.stats.n_decode_total == 1  # the failed pass is not counted
    finally:
        worker.close()


def test_a_batch_that_cannot_be_assembled_fails_alone_and_the_engine_keeps_serving():
    worker = start(FakeRunner())
    try:
        broken = worker.submit([[4, [5, 6]]], FAR)  # no int32 row can hold this input
        with pytest.raises(ForwardFailed, match="the forward pass failed"):
            broken[0].future.result(10)
        good = worker.submit([[4, 5]], FAR)
        assert good[0].future.result(10).value.tolist() == echo([4, 5]).tolist()
    finally:
        worker.close()


class OutOfMemoryRunner(FakeRunner):
    """Raises what MLX raises when memory runs out, for every pass of more than `fits` tokens (rows x width)."""

    def __init__(self, fits: int, error: Exception):
        super().__init__()
        self.fits = fits
        self.error = error

    def __call__(self, ids, mask, type_ids, lengths):
        if ids.size > self.fits:
            self.calls.append((ids.copy(), mask.copy(), type_ids.copy(), list(lengths)))
            raise self.error
        return super().__call__(ids, mask, type_ids, lengths)


@pytest.mark.parametrize("error", [
    MemoryError("std::bad_alloc"),
    RuntimeError("[metal::malloc] Attempting to allocate 68719476736 bytes which is greater than the maximum "
                 "allowed buffer size of 28991029248 bytes."),
])
def test_memory_exhaustion_fails_the_batch_and_lowers_the_caps(error):
    runner = OutOfMemoryRunner(fits=32, error=error)
    runner.release.clear()
    worker = start(runner, BatchLimits(max_tokens=256, max_rows=8))
    try:
        hold(worker, runner)  # the next four inputs wait together and go into one 4 x 16 pass
        batch = worker.submit([[1] * 16, [2] * 16, [3] * 16, [4] * 16], FAR)
        runner.release.set()
        for item in batch:
            with pytest.raises(OutOfMemory, match="ran out of memory.*now capped at 2 rows / 32 tokens"):
                item.future.result(10)
        assert (worker.limits.max_rows, worker.limits.max_tokens) == (2, 32)
        n_calls = len(runner.calls)
        again = worker.submit([[1] * 16, [2] * 16, [3] * 16, [4] * 16], FAR)  # the same inputs now pass
        assert [item.future.result(10).value.tolist() for item in again] == [
            echo([k] * 16).tolist() for k in (1, 2, 3, 4)]
        assert all(c[0].shape[0] <= 2 and c[0].size <= 32 for c in runner.calls[n_calls:])
    finally:
        worker.close()


def test_only_memory_errors_count_as_memory_exhaustion():
    assert is_out_of_memory(MemoryError())
    assert is_out_of_memory(RuntimeError("[METAL] Command buffer execution failed: Insufficient Memory"))
    assert not is_out_of_memory(RuntimeError("boom"))
    assert not is_out_of_memory(ValueError("out of memory"))


def test_more_inputs_than_the_queue_can_ever_hold_is_refused_for_good():
    worker = start(FakeRunner(), max_queue=3)
    try:
        with pytest.raises(TooManyInputs, match="4 inputs; the engine queue holds at most 3") as caught:
            worker.submit([[1], [2], [3], [4]], FAR)
        assert (caught.value.n_inputs, caught.value.limit) == (4, 3)
        assert worker.queued() == 0
        assert worker.submit([[1], [2], [3]], FAR)[2].future.result(10).value.tolist() == echo([3]).tolist()
    finally:
        worker.close()


def test_expired_inputs_get_reply_timeout_and_never_run():
    runner = FakeRunner(hold_first=True)
    worker = start(runner)
    try:
        hold(worker, runner)
        late = worker.submit([[42, 43]], time.monotonic() + 0.01)
        alive = worker.submit([[44]], FAR)
        time.sleep(0.05)
        runner.release.set()
        with pytest.raises(ReplyTimeout):
            late[0].future.result(10)
        assert alive[0].future.result(10).value.tolist() == echo([44]).tolist()
        seen = [row[:n].tolist() for ids, _, _, lengths in runner.calls for row, n in zip(ids, lengths, strict=True)]
        assert [42, 43] not in seen
    finally:
        worker.close()


def test_cancelled_inputs_are_skipped():
    runner = FakeRunner(hold_first=True)
    worker = start(runner)
    try:
        hold(worker, runner)
        gone = worker.submit([[50, 51]], FAR)
        kept = worker.submit([[52]], FAR)
        assert gone[0].future.cancel()
        runner.release.set()
        assert kept[0].future.result(10).value.tolist() == echo([52]).tolist()
        _wait_until(lambda: worker.queued() == 0)
        seen = [row[:n].tolist() for ids, _, _, lengths in runner.calls for row, n in zip(ids, lengths, strict=True)]
        assert [50, 51] not in seen
    finally:
        worker.close()


def test_queue_bound_is_all_or_nothing():
    runner = FakeRunner(hold_first=True)
    worker = start(runner, max_queue=3)
    try:
        hold(worker, runner)  # running, no longer waiting
        two = worker.submit([[1], [2]], FAR)
        with pytest.raises(QueueFull):
            worker.submit([[3], [4]], FAR)
        assert worker.queued() == 2
        one = worker.submit([[5]], FAR)
        with pytest.raises(QueueFull):
            worker.submit([[6]], FAR)
        runner.release.set()
        for item in two + one:
            item.future.result(10)
        assert worker.submit([[7], [8], [9]], FAR)[2].future.result(10).value.tolist() == echo([9]).tolist()
    finally:
        worker.close()


def test_submit_before_the_load_finishes():
    gate = threading.Event()
    runner = FakeRunner()

    def load():
        assert gate.wait(10)
        return runner, PAD, BatchLimits(256, 4)

    worker = Worker(load, 100)
    try:
        assert not worker.loaded.is_set()
        with pytest.raises(NotLoaded):
            worker.submit([[1]], FAR)
        gate.set()
        assert worker.loaded.wait(10)
        assert worker.load_error is None
        assert worker.submit([[1]], FAR)[0].future.result(10).value.tolist() == echo([1]).tolist()
    finally:
        gate.set()
        worker.close()


def test_load_failure_is_reported():
    def load():
        raise FileNotFoundError("no weights here")

    worker = Worker(load, 100)
    assert worker.loaded.wait(10)
    assert isinstance(worker.load_error, FileNotFoundError)
    with pytest.raises(NotLoaded):
        worker.submit([[1]], FAR)
    worker._thread.join(10)
    assert not worker._thread.is_alive()


def test_close_cancels_waiting_inputs_and_stops_the_thread():
    runner = FakeRunner(hold_first=True)
    worker = start(runner)
    running = hold(worker, runner)
    waiting = worker.submit([[1], [2]], FAR)
    worker.close()
    for item in waiting:
        with pytest.raises(CancelledError):
            item.future.result(10)
    runner.release.set()
    assert running[0].future.result(10).value.tolist() == echo([1, 2, 3]).tolist()  # the pass in flight ends
    worker._thread.join(10)
    assert not worker._thread.is_alive()


class CancelledRightAfterTheCheck(Future):
    """Replays one interleaving deterministically: the requester's Engine._serve gives up (future.cancel(),
    on the request thread, without the worker's lock) just after the engine thread asked cancelled()."""

    def cancelled(self):
        was = super().cancelled()
        if not was:
            self.cancel()
        return was


def test_expiry_racing_a_requester_cancel_does_not_kill_the_engine_thread():
    runner = FakeRunner(hold_first=True)
    worker = start(runner)
    try:
        hold(worker, runner)
        expired = worker.submit([[42]], time.monotonic() - 1)[0]
        expired.future = CancelledRightAfterTheCheck()
        runner.release.set()
        later = worker.submit([[43]], FAR)[0]
        assert later.future.result(2).value.tolist() == echo([43]).tolist()
        assert worker._thread.is_alive()
    finally:
        worker.close()


def test_submit_after_close_is_refused():
    worker = start(FakeRunner())
    worker.close()
    worker._thread.join(10)
    with pytest.raises(EngineError):
        worker.submit([[1]], FAR)


class MeetingRunner(FakeRunner):
    """Each pass waits until `n` passes are inside the runner at once (or times out): proof of concurrency."""

    def __init__(self, n: int):
        super().__init__()
        self.inside = 0
        self.most_inside = 0
        self.lock = threading.Condition()
        self.n = n

    def __call__(self, ids, mask, type_ids, lengths):
        with self.lock:
            self.inside += 1
            self.most_inside = max(self.most_inside, self.inside)
            self.lock.notify_all()
            self.lock.wait_for(lambda: self.most_inside >= self.n, timeout=5)  # only until they have met
        try:
            return super().__call__(ids, mask, type_ids, lengths)
        finally:
            with self.lock:
                self.inside -= 1


@pytest.fixture
def t_threads(monkeypatch):
    """-t as the process's lanes see it (engine/runtime/blas.py), without touching the BLAS library."""
    from engine.runtime import blas

    monkeypatch.setattr(blas, "set_threads", lambda n: None)
    monkeypatch.setattr(blas, "_computing", 0)
    return lambda n: monkeypatch.setattr(blas, "_budget", n)


def test_two_lanes_compute_two_passes_at_once_and_split_one_request(t_threads):
    t_threads(2)
    runner = MeetingRunner(2)
    worker = Worker(lambda: (runner, PAD, BatchLimits(max_tokens=256, max_rows=64)), 1000, name="test-lanes",
                    lanes=2)
    try:
        assert worker.loaded.wait(10)
        token_lists = [[k] * (3 + k % 5) for k in range(1, 41)]  # one request: 40 inputs, 200 tokens in all
        items = worker.submit(token_lists, FAR)
        for ids, item in zip(token_lists, items, strict=True):
            np.testing.assert_array_equal(item.future.result(10).value, echo(ids))
        assert runner.most_inside == 2  # both lanes computed at the same time
        # the request was shared out between the lanes rather than filling one pass of the 256-token budget
        assert len(runner.calls) >= 2
        assert max(sum(lengths) for *_, lengths in runner.calls) <= 100
        assert worker.stats.n_decode_total == len(runner.calls)
        assert worker.stats.prompt_tokens_total == sum(map(len, token_lists))
    finally:
        worker.close()
        worker.join(10)


@pytest.mark.parametrize("threads, cpus, plan", [(2, 8, (2, 2)), (1, 8, (1, 1)), (-1, 2, (2, 2)), (-1, 16, (2, 16)),
                                                 (-1, 1, (1, 1)), (6, 2, (2, 6))])
def test_threads_plan_bounds_lanes_and_blas_threads_by_t(threads, cpus, plan):
    from engine.runtime.threads import plan as threads_plan

    assert threads_plan(threads, cpus) == plan


class CountingRunner(FakeRunner):
    """Counts the passes computing at once over every engine that shares it."""

    def __init__(self):
        super().__init__()
        self.lock = threading.Lock()
        self.inside = 0
        self.most_inside = 0

    def __call__(self, ids, mask, type_ids, lengths):
        with self.lock:
            self.inside += 1
            self.most_inside = max(self.most_inside, self.inside)
        try:
            time.sleep(0.02)
            return super().__call__(ids, mask, type_ids, lengths)
        finally:
            with self.lock:
                self.inside -= 1


@pytest.mark.parametrize("t, lanes", [(2, 2), (1, 1)])
def test_t_bounds_the_passes_of_every_engine_together(t_threads, t, lanes):
    """Three models, each planned with its own lanes, computing at once: -t bounds them all together, as the
    process-wide BLAS setting does (one lane with -t 1 also keeps its two stages without waiting on itself)."""
    t_threads(t)
    runner = CountingRunner()
    limits = BatchLimits(max_tokens=8, max_rows=1)  # one input per pass: many passes
    workers = [Worker(lambda: (runner, PAD, limits), 1000, name=f"model-{k}", lanes=lanes) for k in range(3)]
    try:
        for worker in workers:
            assert worker.loaded.wait(10)
        token_lists = [[k + 1] * 3 for k in range(8)]
        items = [worker.submit(token_lists, FAR) for worker in workers]
        for submitted in items:
            for ids, item in zip(token_lists, submitted, strict=True):
                np.testing.assert_array_equal(item.future.result(30).value, echo(ids))
        assert 1 <= runner.most_inside <= t
    finally:
        for worker in workers:
            worker.close()
            worker.join(10)


class TaskRunner(FakeRunner):
    """Records the task each pass was called with (a task-adapter family's runner takes `task=`)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.tasks: list[int | None] = []

    def __call__(self, ids, mask, type_ids, lengths, task=None):
        self.tasks.append(task)
        return super().__call__(ids, mask, type_ids, lengths)


def test_requests_of_different_tasks_wait_together_but_run_in_passes_of_one_task():
    runner = TaskRunner(hold_first=True)
    worker = start(runner)
    try:
        first = hold(worker, runner)
        queued = {task: worker.submit([[3, 4], [5, 6]], FAR, task=task) for task in (2, None, 0)}
        runner.release.set()
        for items in [first, *queued.values()]:
            for item in items:
                item.future.result(timeout=30)
        assert runner.tasks[0] is None and sorted(runner.tasks[1:], key=str) == [0, 2, None]
        for (ids, *_), task in zip(runner.calls[1:], runner.tasks[1:]):
            assert len(ids) == 2  # each task's two inputs shared their pass, and nothing else did
    finally:
        worker.close()
