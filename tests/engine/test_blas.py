"""engine/runtime/blas.py: at most -t lanes of the whole process compute at once, sharing the BLAS threads of -t."""
from __future__ import annotations

import threading

import pytest

from engine.runtime import blas


@pytest.fixture
def recorded(monkeypatch):
    """The thread counts set, in order, from a budget of 4 threads and nothing computing."""
    calls: list[int] = []
    monkeypatch.setattr(blas, "set_threads", calls.append)
    monkeypatch.setattr(blas, "_computing", 0)
    monkeypatch.setattr(blas, "_budget", 0)
    blas.set_budget(4)
    return calls


def test_a_lane_alone_gets_every_thread_and_lanes_together_share_them(recorded):
    blas.compute_started()  # one lane, or one engine of the process
    blas.compute_started()  # another lane, or another engine
    blas.compute_started()
    assert recorded == [4, 4, 2, 1]
    for _ in range(3):
        blas.compute_finished()
    blas.compute_started()
    assert recorded[-1] == 4
    blas.compute_finished()


def test_a_lane_beyond_t_waits_for_a_share(recorded):
    for _ in range(4):
        blas.compute_started()
    fifth = threading.Thread(target=blas.compute_started)
    fifth.start()
    fifth.join(0.2)
    assert fifth.is_alive()  # -t 4: a fifth lane computing would make 5 threads busy
    blas.compute_finished()
    fifth.join(5)
    assert not fifth.is_alive() and blas._computing == 4
    for _ in range(4):
        blas.compute_finished()


def test_no_budget_leaves_the_library_alone(monkeypatch):
    calls: list[int] = []
    monkeypatch.setattr(blas, "set_threads", calls.append)
    monkeypatch.setattr(blas, "_computing", 0)
    monkeypatch.setattr(blas, "_budget", 0)
    blas.compute_started()
    blas.compute_finished()
    assert calls == []
