"""engine/runtime/limits.py: llama-server's slot arithmetic and the per-input limit."""
from __future__ import annotations

import pytest

from engine.runtime import limits
from engine.errors import InputTooLong


@pytest.mark.parametrize("ctx, parallel, n_train, expected", [
    (512, 2, 512, (256, 2)),  # -c 512 -np 2: 256 per slot (llama's own test expectation)
    (1024, 4, 512, (256, 4)),
    (512, -1, 512, (512, 4)),  # -np -1: 4 slots sharing one unified context
    (0, -1, 512, (512, 4)),  # -c 0: the model's own context
    (0, 2, 512, (256, 2)),
    (300, 1, 512, (512, 1)),  # -c is padded up to a multiple of 256
    (512, 4, 512, (256, 4)),  # 128 per slot, padded up to 256
    (2048, 1, 512, (512, 1)),  # never beyond the trained positions
    (4096, -1, 512, (512, 4)),
    (0, -1, 8192, (8192, 4)),
    (0, 3, 1000, (512, 3)),  # pad256(1000) = 1024; 1024 // 3 = 341 -> 512
])
def test_slots(ctx, parallel, n_train, expected):
    assert limits.slots(ctx, parallel, n_train) == expected


@pytest.mark.parametrize("n_positions, ubatch, slot_ctx, expected", [
    (512, 512, None, 512),
    (512, 32, None, 32),
    (512, 1024, None, 512),
    (512, 512, 256, 256),
    (512, 128, 256, 128),
    (32768, 32768, None, 32768),  # Qwen3-Embedding's positions
    (1 << 20, 1 << 20, None, limits.HARD_CAP),
])
def test_input_limit(n_positions, ubatch, slot_ctx, expected):
    assert limits.input_limit(n_positions, ubatch, slot_ctx) == expected


def _kind(n, n_positions, ubatch, slot_ctx):
    with pytest.raises(InputTooLong) as caught:
        limits.check(n, n_positions, ubatch, slot_ctx)
    return caught.value.limit_kind, caught.value.limit, caught.value.n_tokens


def test_check_names_the_binding_limit_in_llama_order():
    assert _kind(33, 512, 32, None) == ("ubatch", 32, 33)
    assert _kind(600, 512, 512, 256) == ("ubatch", 512, 600)  # the physical batch is checked first
    assert _kind(257, 512, 512, 256) == ("context", 256, 257)
    assert _kind(513, 512, 1024, None) == ("positions", 512, 513)
    assert _kind(40000, 32768, 65536, None) == ("positions", 32768, 40000)
    assert _kind(limits.HARD_CAP + 1, 1 << 20, 1 << 20, None) == ("positions", limits.HARD_CAP, limits.HARD_CAP + 1)


def test_check_accepts_what_input_limit_allows():
    for n_positions, ubatch, slot_ctx in [(512, 512, None), (512, 32, None), (512, 512, 256), (512, 1024, None)]:
        top = limits.input_limit(n_positions, ubatch, slot_ctx)
        limits.check(top, n_positions, ubatch, slot_ctx)  # no exception
        with pytest.raises(InputTooLong):
            limits.check(top + 1, n_positions, ubatch, slot_ctx)


def test_input_too_long_message():
    err = InputTooLong(600, 512, "ubatch")
    assert "600" in str(err) and "512" in str(err) and "ubatch" in str(err)


@pytest.mark.parametrize("own, n_positions, max_input, expected", [
    (256, 512, 512, 256),  # MiniLM: sentence_bert_config's max_seq_length
    (None, 512, 512, 512),
    (1024, 512, 512, 512),
    (256, 512, 32, 32),  # never beyond what the server accepts
    (128, 512, 256, 128),
])
def test_truncation_length(own, n_positions, max_input, expected):
    assert limits.truncation_length(own, n_positions, max_input) == expected
