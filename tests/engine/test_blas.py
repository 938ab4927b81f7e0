"""engine/blas.py: the passes computing are counted over the whole process, and -t bounds the streams they get."""
from __future__ import annotations

import pytest

from engine import blas


@pytest.fixture
def budget():
    saved = blas._budget, blas._streams
    yield lambda threads: (blas.set_budget(threads), setattr(blas, "_streams", 0))
    blas._budget, blas._streams = saved
    blas.set_threads(blas._budget)


def test_a_pass_alone_gets_two_streams_and_one_beside_it_gets_one(budget):
    budget(2)
    first = blas.pass_started(2)
    second = blas.pass_started(2)  # from another lane or another engine of the process
    assert (first, second) == (2, 1)
    blas.pass_finished(first)
    blas.pass_finished(second)
    assert blas.pass_started(2) == 2


def test_one_thread_never_spreads(budget):
    budget(1)
    assert blas.pass_started(2) == 1


def test_a_model_that_cannot_spread_asks_for_one_stream(budget):
    budget(4)
    assert blas.pass_started(1) == 1
    assert blas.pass_started(2) == 1  # something computes already
