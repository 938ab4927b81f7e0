"""The engine's lanes: the only threads that touch MLX. The first loads the model; then every lane serves batches.

Request threads hand them tokenized inputs through a bounded queue, one item per input, and wait on a
future per item. Inputs from concurrent requests share forward passes (engine/runtime/scheduler.py decides which).

A lane is a thread with its own MLX stream. MLX runs the ops of one stream on one thread, and only BLAS
calls spread over more, so with two lanes (each one BLAS thread) two passes compute at once and both cores
work on every op: softmax, GELU, LayerNorm and copies too (measured on 2 cores: 1.2-1.3x the tokens/s of
one lane with two BLAS threads). At most -t lanes of the whole process compute at once, every engine's together, and the
BLAS threads (-t) are shared out over the lanes computing (engine/runtime/blas.py): a lane computing alone gets them
all (a single short request measured ~40% slower with one), lanes computing together split them.
"""
from __future__ import annotations

import atexit
import dataclasses
import itertools
import logging
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field

import mlx.core as mx
import numpy as np

from engine.runtime import blas, malloc, threads
from engine.errors import ForwardFailed, NotLoaded, OutOfMemory, QueueFull, ReplyTimeout, TooManyInputs
from engine.runtime.scheduler import ALONE, IMAGES, TEXTS, BatchLimits, next_batch
from engine.multimodal.inputs import PreparedImage, PreparedInput

log = logging.getLogger(__name__)


# (ids [B, W], mask [B, W], token type ids [B, W], lengths) -> one result per row
Runner = Callable[[np.ndarray, np.ndarray, np.ndarray, list[int]], list[np.ndarray]]  # or a Pipeline (launch + collect)


@dataclass(frozen=True)
class ImageWork:
    """A preprocessed image for a vision tower: pixels [C, H, W] and what it counts as (its patches)."""

    pixels: np.ndarray
    n_tokens: int


@dataclass(frozen=True)
class SegmentedWork:
    """Late chunking: one document's token ids, evaluated alone, and its chunks' rows (engine/runtime/fitting.py
    chunk_segments); its result is one pooled vector per chunk, [S, D]."""

    ids: list[int]
    segments: tuple[tuple[int, ...], ...]


@dataclass
class WorkItem:
    ids: list[int]
    type_ids: list[int] | None
    deadline: float
    n_tokens: int = 0
    seq: int = 0
    enqueued: float = 0.0
    future: Future = field(default_factory=Future)
    pixels: np.ndarray | None = None  # an image for a tower: it shares passes with other images only
    images: tuple[PreparedImage, ...] = ()  # a vision-language input's images (engine/multimodal/inputs.py): it runs alone
    segments: tuple[tuple[int, ...], ...] = ()  # a late-chunked document's chunks (SegmentedWork): it runs alone

    @property
    def group(self) -> int:
        """Inputs of one group can share a forward pass (engine/runtime/scheduler.py)."""
        if self.images or self.segments:
            return ALONE
        return TEXTS if self.pixels is None else IMAGES


@dataclass
class ItemResult:
    value: np.ndarray
    queue_s: float
    inference_s: float  # of the whole forward pass the item was in
    batch: int  # which forward pass (items of one request may share one)


@dataclass
class WorkerStats:
    prompt_tokens_total: int = 0
    prompt_seconds_total: float = 0.0
    n_decode_total: int = 0
    n_tokens_max: int = 0


class Worker:
    def __init__(self, load: Callable[[], tuple[Runner, int, BatchLimits]], max_queue_items: int,
                 name: str = "engine", lanes: int = 1):
        """`load` runs first on the engine thread and returns (runner, pad token id, fitted batch limits);
        `lanes` threads then serve passes concurrently, each on its own MLX stream (engine/runtime/blas.py bounds the
        lanes computing in the whole process by -t and shares its threads out over them)."""
        self._lanes = max(1, lanes)
        self._stats_lock = threading.Lock()  # lanes finish passes concurrently
        self._load = load
        self._limits = BatchLimits(max_tokens=1, max_rows=1)  # replaced by the load's before any batch
        self._max_queue = max_queue_items
        self._cond = threading.Condition()
        self._waiting: list[WorkItem] = []
        self._seq = itertools.count()
        self._closed = False
        self._runner: Runner | None = None
        self._pad_id = 0
        self.loaded = threading.Event()
        self.load_error: BaseException | None = None
        self.stats = WorkerStats()
        self._thread = threads.start(self._main, name)
        _live.add(self)

    # -- request threads -------------------------------------------------------------------------
    def submit(self, token_lists: list[list[int] | ImageWork | PreparedInput | SegmentedWork], deadline: float,
               type_lists: list[list[int]] | None = None) -> list[WorkItem]:
        """Queue every input of one request, or none of them (QueueFull)."""
        if not self.loaded.is_set() or self._runner is None:
            raise NotLoaded("the model is not loaded")
        self.check_count(len(token_lists))
        now = time.monotonic()
        types = type_lists or [None] * len(token_lists)
        items = [_work_item(ids, t, deadline, now) for ids, t in zip(token_lists, types)]
        with self._cond:
            if self._closed:
                raise NotLoaded("the model has been unloaded")
            if len(self._waiting) + len(items) > self._max_queue:
                raise QueueFull(f"the engine queue is full ({len(self._waiting)} of {self._max_queue} inputs "
                                f"waiting, this request has {len(items)})")
            for item in items:
                item.seq = next(self._seq)
            self._waiting.extend(items)
            self._cond.notify()
        return items

    def check_count(self, n_inputs: int) -> None:
        """Refuse for good a request with more inputs than the queue can ever hold (TooManyInputs); callers
        check before tokenizing or decoding anything, so a huge request costs nothing."""
        if n_inputs > self._max_queue:
            raise TooManyInputs(n_inputs, self._max_queue)

    def join(self, timeout: float | None = None) -> None:
        """Wait until the engine thread has stopped serving (after close) and released the model."""
        self._thread.join(timeout)

    @property
    def limits(self) -> BatchLimits:
        """The batch caps in force: the load's, lowered after a pass ran out of memory."""
        return self._limits

    def queued(self) -> int:
        with self._cond:
            return len(self._waiting)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            for item in self._waiting:
                item.future.cancel()
            self._waiting.clear()
            self._cond.notify_all()

    # -- the engine thread -----------------------------------------------------------------------
    def _main(self) -> None:
        try:
            self._serve()
        finally:
            # Engine threads are reused (engine/runtime/threads.py), so drop the model explicitly and hand MLX's
            # buffer cache back; then nothing of this engine stays in memory.
            self._runner = None
            mx.synchronize()
            mx.clear_cache()
            malloc.release()

    def _serve(self) -> None:
        try:
            self._runner, self._pad_id, self._limits = self._load()
        except BaseException as exc:  # reported to whoever waits for the load
            self.load_error = exc
            self.loaded.set()
            return
        self.loaded.set()
        others = [threads.start(self._serve_other_lane, f"{threading.current_thread().name} lane {i}")
                  for i in range(1, self._lanes)]
        try:
            self._serve_lane()
        finally:
            for lane in others:
                lane.join()

    def _serve_other_lane(self) -> None:
        with mx.stream(threads.own_stream()):
            self._serve_lane()

    def _serve_lane(self) -> None:
        """Serve passes until closed. A single lane runs two stages: while one pass computes, the next batch is
        picked, assembled and queued behind it. With several lanes another lane does that instead (a lane that
        held a second batch back would keep it from an idle lane)."""
        two_stages = self._lanes == 1
        in_flight: _Launched | None = None
        computing = False  # holding one of the process's -t compute shares (engine/runtime/blas.py)
        try:
            while (batch := self._take_batch(wait=in_flight is None)) is not None:
                if batch and not computing:
                    blas.compute_started()  # may wait for another engine's lane: this lane holds no pass now
                    computing = True
                launched = self._launch(batch) if batch else None
                if in_flight is not None:
                    self._deliver(in_flight)
                in_flight = launched
                if not two_stages and in_flight is not None:
                    self._deliver(in_flight)
                    in_flight = None
                if in_flight is None and computing:
                    blas.compute_finished()
                    computing = False
            if in_flight is not None:
                self._deliver(in_flight)
        finally:
            if computing:
                blas.compute_finished()

    def _take_batch(self, wait: bool) -> list[WorkItem] | None:
        """The next batch; [] when nothing waits and `wait` is false; None once closed."""
        with self._cond:
            while wait and not self._waiting and not self._closed:
                self._cond.wait()
            if self._closed:
                return None
            now = time.monotonic()
            live = []
            for item in self._waiting:
                if item.future.cancelled():
                    continue
                if item.deadline <= now:
                    try:
                        item.future.set_exception(ReplyTimeout("the request was not served within its deadline"))
                    except InvalidStateError:
                        pass  # its requester gave up at the same moment
                    continue
                live.append(item)
            picked = set(next_batch(live, self._lane_share(live)))
            self._waiting = [item for i, item in enumerate(live) if i not in picked]
            if self._waiting and self._lanes > 1:
                self._cond.notify()  # another lane may take the rest
            return [item for i, item in enumerate(live) if i in picked]

    def _lane_share(self, live: list[WorkItem]) -> BatchLimits:
        """The caps for one lane's next pass: with several lanes, at most an even share of what waits, so one
        request's inputs are split over the lanes instead of filling one pass while the other lane idles."""
        if self._lanes == 1:
            return self._limits
        share = -(-sum(item.n_tokens for item in live) // self._lanes)
        return dataclasses.replace(self._limits, max_tokens=max(1, min(self._limits.max_tokens, share)))

    def _launch(self, batch: list[WorkItem]) -> _Launched | None:
        """Assemble one array per input kind and start the pass without waiting for it."""
        batch = [item for item in batch if item.future.set_running_or_notify_cancel()]
        if not batch:
            return None
        try:
            if batch[0].pixels is not None:  # the scheduler never mixes images and texts
                return self._launch_images(batch)
            if batch[0].images:  # a vision-language input holding images: always alone in its pass
                return self._launch_with_images(batch)
            if batch[0].segments:  # a late-chunked document: alone too
                return self._launch_segments(batch)
            return self._launch_texts(batch)
        except Exception as exc:  # assembling the batch failed: that batch fails, the lane keeps serving
            return _Launched(batch, None, time.monotonic(), max(item.n_tokens for item in batch), exc)

    def _launch_texts(self, batch: list[WorkItem]) -> _Launched:
        width = self._limits.width(max(item.n_tokens for item in batch))
        ids = np.full((len(batch), width), self._pad_id, dtype=np.int32)
        mask = np.zeros((len(batch), width), dtype=np.int32)
        type_ids = np.zeros((len(batch), width), dtype=np.int32)
        for row, item in enumerate(batch):
            ids[row, : item.n_tokens] = item.ids
            mask[row, : item.n_tokens] = 1
            if item.type_ids is not None:
                type_ids[row, : item.n_tokens] = item.type_ids
        started = time.monotonic()
        lengths = [item.n_tokens for item in batch]
        try:
            launch = getattr(self._runner, "launch", None)
            if launch is not None:
                collect = launch(ids, mask, type_ids, lengths)
            else:  # a plain callable runner computes synchronously
                outputs = self._runner(ids, mask, type_ids, lengths)
                collect = lambda: outputs  # noqa: E731
        except Exception as exc:
            return _Launched(batch, None, started, width, exc)
        return _Launched(batch, collect, started, width)

    # A failure in these two is caught by _launch, which fails their batch with the same width.
    def _launch_images(self, batch: list[WorkItem]) -> _Launched:
        started = time.monotonic()
        width = batch[0].n_tokens  # an image's patches: what its row costs in the batch budget
        collect = self._runner.launch_images(np.stack([item.pixels for item in batch]))
        return _Launched(batch, collect, started, width)

    def _launch_with_images(self, batch: list[WorkItem]) -> _Launched:
        (item,) = batch
        started = time.monotonic()
        collect = self._runner.launch_with_images(np.array([item.ids], dtype=np.int32), item.images)
        return _Launched(batch, collect, started, item.n_tokens)

    def _launch_segments(self, batch: list[WorkItem]) -> _Launched:
        (item,) = batch
        started = time.monotonic()
        ids = np.array([item.ids], dtype=np.int32)
        collect = self._runner.launch_segments(ids, np.zeros_like(ids), item.segments)
        return _Launched(batch, collect, started, item.n_tokens)

    def _deliver(self, launched: _Launched) -> None:
        batch = launched.batch
        try:
            if launched.error is not None:
                raise launched.error
            outputs = launched.collect()
        except Exception as exc:  # one bad batch must not take the engine down
            error: Exception
            if is_out_of_memory(exc):
                with self._stats_lock:
                    self._limits = lowered(self._limits, len(batch), launched.width)
                error = OutOfMemory(f"the forward pass ran out of memory ({exc}); batches are now capped at "
                                    f"{self._limits.max_rows} rows / {self._limits.max_tokens} tokens")
                log.warning("%s", error)
            else:
                log.error("forward pass failed for a batch of %d inputs", len(batch), exc_info=exc)
                error = ForwardFailed(f"the forward pass failed: {exc}")
            for item in batch:
                item.future.set_exception(error)
            return
        elapsed = time.monotonic() - launched.started
        n_real = sum(item.n_tokens for item in batch)
        with self._stats_lock:
            self.stats.prompt_tokens_total += n_real
            self.stats.prompt_seconds_total += elapsed
            self.stats.n_decode_total += 1
            self.stats.n_tokens_max = max(self.stats.n_tokens_max, n_real)
            pass_number = self.stats.n_decode_total
        for item, value in zip(batch, outputs):
            item.future.set_result(ItemResult(value, launched.started - item.enqueued, elapsed, pass_number))


def _work_item(work: list[int] | ImageWork | PreparedInput | SegmentedWork, type_ids: list[int] | None,
               deadline: float, now: float) -> WorkItem:
    if isinstance(work, ImageWork):
        return WorkItem(ids=[], type_ids=None, deadline=deadline, n_tokens=work.n_tokens, enqueued=now,
                        pixels=work.pixels)
    if isinstance(work, PreparedInput):  # its ids already hold every image token: that is what it costs
        return WorkItem(ids=work.ids, type_ids=None, deadline=deadline, n_tokens=len(work.ids), enqueued=now,
                        images=work.images)
    if isinstance(work, SegmentedWork):
        return WorkItem(ids=work.ids, type_ids=None, deadline=deadline, n_tokens=len(work.ids), enqueued=now,
                        segments=work.segments)
    return WorkItem(ids=work, type_ids=type_ids, deadline=deadline, n_tokens=len(work), enqueued=now)


# What MLX raises when memory runs out: std::bad_alloc arrives as MemoryError; the Metal allocator and
# command buffers raise RuntimeErrors with these words.
_MEMORY_ERROR_WORDS = ("[metal::malloc]", "insufficient memory", "out of memory", "unable to allocate")


def is_out_of_memory(exc: BaseException) -> bool:
    return isinstance(exc, MemoryError) or (
        isinstance(exc, RuntimeError) and any(word in str(exc).lower() for word in _MEMORY_ERROR_WORDS))


def lowered(limits: BatchLimits, rows: int, width: int) -> BatchLimits:
    """Caps after a batch of rows x width ran out of memory: half of that batch, so it cannot recur."""
    return dataclasses.replace(limits, max_rows=max(1, min(limits.max_rows, rows) // 2),
                               max_tokens=max(width, min(limits.max_tokens, rows * width) // 2))


# Every worker still serving; at interpreter exit they are stopped and waited for, because MLX can abort the
# process if it exits while an engine thread is still running kernels or freeing memory.
_live: weakref.WeakSet[Worker] = weakref.WeakSet()


@atexit.register
def _stop_all_at_exit() -> None:
    workers = list(_live)
    for worker in workers:
        worker.close()
    for worker in workers:
        worker.join(timeout=10)


@dataclass
class _Launched:
    batch: list[WorkItem]
    collect: Callable[[], list[np.ndarray]] | None
    started: float
    width: int  # padded width of the batch's rows
    error: Exception | None = None
