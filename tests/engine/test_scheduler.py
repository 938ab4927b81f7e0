"""engine/runtime/scheduler.py: which waiting inputs make up the next forward pass."""
from __future__ import annotations

import random
from dataclasses import dataclass

import pytest

from engine.runtime.scheduler import ALONE, TEXTS, BatchLimits, next_batch, warm_widths


@dataclass
class W:
    n_tokens: int
    seq: int
    group: int = 0
    task: int | None = None


def waiting(*lengths: int, oldest: int = 0) -> list[W]:
    """Inputs with these lengths; `oldest` is the index of the earliest arrival, the rest follow in order."""
    seqs = list(range(1, len(lengths) + 1))
    seqs[oldest] = 0
    return [W(n, s) for n, s in zip(lengths, seqs, strict=True)]


def lengths_of(items, picked):
    return sorted(items[i].n_tokens for i in picked)


@pytest.mark.parametrize("n", [1, 7, 17, 100, 300, 512])
def test_a_pass_runs_at_its_longest_inputs_exact_length(n):
    assert BatchLimits(4096, 8, max_seq=512).width(n) == n
    assert BatchLimits(4096, 8, max_seq=512, fixed_width=64).width(n) == 64  # a fixed-width family


def test_warm_widths_are_two_narrow_ones_whatever_the_window():
    assert warm_widths(512) == warm_widths(131072) == [16, 64]
    assert warm_widths(300) == [16, 64]
    assert warm_widths(40) == [16, 40]
    assert warm_widths(8) == [8]
    assert warm_widths(512, fixed_width=64) == [64]


def test_nothing_waiting():
    assert next_batch([], BatchLimits(1024, 8)) == []


def test_oldest_always_included_even_when_it_is_an_outlier():
    items = waiting(5, 6, 7, 900, 8, oldest=3)
    picked = next_batch(items, BatchLimits(max_tokens=1000, max_rows=8))
    assert picked == [3]  # 900 -> width 1024: too wide to share with anyone under a 1000-token budget


def test_input_longer_than_the_budget_runs_alone():
    items = waiting(3000, 10, 10)
    assert next_batch(items, BatchLimits(max_tokens=2048, max_rows=8)) == [0]


def test_everything_fits():
    items = waiting(10, 12, 30, 5)
    assert sorted(next_batch(items, BatchLimits(max_tokens=8192, max_rows=64))) == [0, 1, 2, 3]


def test_row_cap():
    items = waiting(*([16] * 10), oldest=6)
    picked = next_batch(items, BatchLimits(max_tokens=10_000, max_rows=4))
    assert len(picked) == 4 and 6 in picked
    assert next_batch(items, BatchLimits(max_tokens=10_000, max_rows=1)) == [6]


def test_token_budget_counts_rows_times_the_longest_length():
    items = waiting(*([16] * 10))
    picked = next_batch(items, BatchLimits(max_tokens=64, max_rows=64))
    assert len(picked) == 4  # 4 x 16 = 64; a fifth row would make 80
    items = waiting(17, 17, 17, 30, 30)
    assert lengths_of(items, next_batch(items, BatchLimits(max_tokens=60, max_rows=64))) == [17, 17, 17]
    items = waiting(17, 30, 17)  # the oldest is 17: with 30 in it, two rows are already 60 > 55
    assert lengths_of(items, next_batch(items, BatchLimits(max_tokens=55, max_rows=64))) == [17, 17]


def test_nearest_lengths_are_preferred():
    items = waiting(50, 10, 48, 52, 200, 45, 90)
    picked = next_batch(items, BatchLimits(max_tokens=10_000, max_rows=3))
    assert lengths_of(items, picked) == [48, 50, 52]  # distances 2 and 2, before 45 (5), 90, 10, 200
    picked = next_batch(items, BatchLimits(max_tokens=10_000, max_rows=4))
    assert lengths_of(items, picked) == [45, 48, 50, 52]  # then 45 (5) before 90 (40)


def test_a_wider_neighbour_over_budget_does_not_block_shorter_ones():
    # oldest 60 (width 64); the next longer, 120 (width 120), would make 2 x 120 = 240 > 200; shorter ones fit
    items = waiting(60, 120, 40, 30)
    picked = next_batch(items, BatchLimits(max_tokens=200, max_rows=8))
    assert lengths_of(items, picked) == [30, 40, 60]  # 3 x 64 = 192 <= 200


def test_oldest_is_by_arrival_not_by_position():
    items = [W(100, 5), W(8, 3), W(400, 1), W(8, 2)]
    assert next_batch(items, BatchLimits(max_tokens=400, max_rows=8)) == [2]


@pytest.mark.parametrize("seed", range(200))
def test_invariants_on_random_queues(seed):
    rng = random.Random(seed)
    n = rng.randint(1, 40)
    seqs = rng.sample(range(1000), n)
    max_seq = rng.choice([None, 100, 300, 768])
    top = max_seq or 700
    items = [W(rng.choice([rng.randint(1, 16), rng.randint(1, min(top, 128)), rng.randint(1, top)]), s) for s in seqs]
    limits = BatchLimits(max_tokens=rng.choice([64, 256, 1024, 4096]), max_rows=rng.choice([1, 2, 4, 16, 64]),
                         max_seq=max_seq)
    picked = next_batch(items, limits)

    oldest = min(range(n), key=lambda i: items[i].seq)
    assert oldest in picked
    assert len(set(picked)) == len(picked)
    assert 1 <= len(picked) <= limits.max_rows
    width = max(limits.width(items[i].n_tokens) for i in picked)
    if len(picked) > 1:
        assert len(picked) * width <= limits.max_tokens

    # nearest lengths first: the batch is a contiguous run of the inputs in length order...
    order = sorted(range(n), key=lambda i: (items[i].n_tokens, items[i].seq))
    positions = sorted(order.index(i) for i in picked)
    assert positions == list(range(positions[0], positions[-1] + 1))
    # ...and it is maximal: below the row cap, neither neighbour of the run fits the budget
    if len(picked) < limits.max_rows:
        for pos in (positions[0] - 1, positions[-1] + 1):
            if 0 <= pos < n:
                grown = max(width, limits.width(items[order[pos]].n_tokens))
                assert (len(picked) + 1) * grown > limits.max_tokens


def test_images_and_texts_never_share_a_pass_and_images_are_not_padded():
    items = [W(10, 1), W(196, 0, group=1), W(12, 2), W(196, 3, group=1), W(196, 4, group=1)]
    limits = BatchLimits(max_tokens=400, max_rows=8)
    picked = next_batch(items, limits)  # the oldest is an image: two images fit 400 tokens
    assert sorted(picked) == [1, 3]
    assert sorted(next_batch([items[i] for i in (0, 2, 4)], limits)) == [0, 1]


def test_fixed_width_rows_use_one_width():
    limits = BatchLimits(max_tokens=256, max_rows=8, max_seq=64, fixed_width=64)
    assert [limits.width(n) for n in (1, 9, 64)] == [64, 64, 64]
    assert warm_widths(64, fixed_width=64) == [64]
    assert len(next_batch(waiting(*[5] * 10), limits)) == 4


def test_a_vision_language_input_holding_images_runs_alone_and_texts_batch_around_it():
    items = [W(40, 0, ALONE), W(10, 1, TEXTS), W(12, 2, TEXTS), W(30, 3, ALONE)]
    limits = BatchLimits(4096, 8, max_seq=512)
    assert next_batch(items, limits) == [0]
    rest = items[1:]
    assert sorted(next_batch(rest, limits)) == [0, 1]  # the texts share a pass; the other image input waits
    assert next_batch(rest[2:], limits) == [0]


def test_inputs_of_different_tasks_never_share_a_pass():
    """A task-adapter family's pass runs one adapter: the oldest input's task decides, the others wait."""
    items = [W(10, 0, task=1), W(10, 1, task=None), W(11, 2, task=1), W(10, 3, task=0), W(12, 4, task=1)]
    picked = next_batch(items, BatchLimits(4096, 8))
    assert sorted(picked) == [0, 2, 4]
    rest = [item for i, item in enumerate(items) if i not in picked]
    assert [w.task for w in (rest[i] for i in next_batch(rest, BatchLimits(4096, 8)))] == [None]
