"""Engine threads that are parked for reuse instead of ending.

MLX (0.32, Linux CPU) can abort the whole process at exit ("terminate called without an active
exception") once a thread that ran compiled kernels has ended. A thread that stays alive, idle, never
triggers it. So an engine thread whose model is unloaded waits here for the next engine to need one:
there are never more threads than engines alive at once.
"""
from __future__ import annotations

import logging
import os
import queue
import threading
from collections.abc import Callable

import mlx.core as mx

log = logging.getLogger(__name__)

_lock = threading.Lock()
_idle: list[_EngineThread] = []
_streams = threading.local()

# Passes computing at once (engine/runtime/worker.py lanes). Two keep both cores of the 2-core reference machine busy on
# every op; on more cores, the extra threads go to BLAS.
MAX_LANES = 2


def plan(threads: int, cpu_count: int | None = None) -> tuple[int, int]:
    """-t/--threads -> (lanes, BLAS threads the lanes share); threads <= 0 means every core."""
    total = threads if threads > 0 else (cpu_count or os.cpu_count() or 1)
    return max(1, min(MAX_LANES, total)), total


def own_stream() -> mx.Stream:
    """This thread's own stream on the default device (MLX streams belong to the thread that made them); one per
    thread for its whole life, since engine threads are reused."""
    stream = getattr(_streams, "stream", None)
    if stream is None:
        stream = _streams.stream = mx.new_stream(mx.default_device())
    return stream


class Task:
    """What `start` hands back: join/is_alive follow the task, not the (reused) thread."""

    def __init__(self, name: str):
        self.name = name
        self._done = threading.Event()

    def join(self, timeout: float | None = None) -> None:
        self._done.wait(timeout)

    def is_alive(self) -> bool:
        return not self._done.is_set()


class _EngineThread:
    def __init__(self) -> None:
        self._tasks: queue.SimpleQueue[tuple[Callable[[], None], Task]] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._loop, name="engine", daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while True:
            run, task = self._tasks.get()
            self.thread.name = task.name
            try:
                run()
            except BaseException:  # a task's own errors are its business; the thread must survive them
                log.exception("engine task %s failed", task.name)
            finally:
                self.thread.name = "engine (idle)"
                with _lock:
                    _idle.append(self)
                task._done.set()


def start(run: Callable[[], None], name: str) -> Task:
    """Run `run` on an idle engine thread, or on a new one."""
    with _lock:
        worker = _idle.pop() if _idle else None
    worker = worker or _EngineThread()
    task = Task(name)
    worker._tasks.put((run, task))
    return task
