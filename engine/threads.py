"""Engine threads that are parked for reuse instead of ending.

MLX (0.32, Linux CPU) can abort the whole process at exit ("terminate called without an active
exception") once a thread that ran compiled kernels has ended. A thread that stays alive, idle, never
triggers it. So an engine thread whose model is unloaded waits here for the next engine to need one:
there are never more threads than engines alive at once.
"""
from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)

_lock = threading.Lock()
_idle: list[_EngineThread] = []


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
