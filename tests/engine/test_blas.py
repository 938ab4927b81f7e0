"""engine/runtime/blas.py: the BLAS threads of -t are shared over the passes computing in the whole process."""
from __future__ import annotations

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


def test_a_pass_alone_gets_every_thread_and_passes_together_share_them(recorded):
    blas.pass_started()  # one lane, or one engine of the process
    blas.pass_started()  # another lane, or another engine
    blas.pass_started()
    assert recorded == [4, 4, 2, 1]
    for _ in range(3):
        blas.pass_finished()
    blas.pass_started()
    assert recorded[-1] == 4


def test_no_budget_leaves_the_library_alone(monkeypatch):
    calls: list[int] = []
    monkeypatch.setattr(blas, "set_threads", calls.append)
    monkeypatch.setattr(blas, "_computing", 0)
    monkeypatch.setattr(blas, "_budget", 0)
    blas.pass_started()
    blas.pass_finished()
    assert calls == []
