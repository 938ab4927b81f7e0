"""Length arithmetic: llama-server's per-slot context and the per-input limit. Pure integers."""
from __future__ import annotations

from engine.errors import InputTooLong

# No checkpoint is asked for more tokens per input than this. Attention memory is linear in the length
# (engine/families/kernels.py), so what binds below it is the model's positions, -ub / -c, and the memory the
# startup fitting finds (engine/runtime/shapes.py).
HARD_CAP = 131072


def _pad256(n: int) -> int:
    return (n + 255) // 256 * 256


def slots(ctx_size: int, parallel: int, n_ctx_train: int) -> tuple[int, int]:
    """(per-slot context, slot count) as llama-server derives them from -c and -np.

    -np -1 means 4 slots sharing one unified context; an explicit -np splits -c between the slots.
    """
    n_slots = 4 if parallel < 0 else parallel
    n_ctx = _pad256(ctx_size if ctx_size > 0 else n_ctx_train)
    per_seq = n_ctx if parallel < 0 else _pad256(n_ctx // n_slots)
    return min(per_seq, n_ctx_train), n_slots


def input_limit(n_positions: int, ubatch_tokens: int, slot_ctx: int | None) -> int:
    """The longest input accepted: min(position capacity, -ub, per-slot context when -c is given)."""
    limit = min(n_positions, ubatch_tokens, HARD_CAP)
    return min(limit, slot_ctx) if slot_ctx else limit


def check(n_tokens: int, n_positions: int, ubatch_tokens: int, slot_ctx: int | None,
          max_seq: int | None = None) -> None:
    """Raise InputTooLong naming the binding limit, in llama-server's order (physical batch first)."""
    if n_tokens > ubatch_tokens:
        raise InputTooLong(n_tokens, ubatch_tokens, "ubatch")
    if slot_ctx and n_tokens > slot_ctx:
        raise InputTooLong(n_tokens, slot_ctx, "context")
    if n_tokens > min(n_positions, HARD_CAP):
        raise InputTooLong(n_tokens, min(n_positions, HARD_CAP), "positions")
    if max_seq and n_tokens > max_seq:
        raise InputTooLong(n_tokens, max_seq, "max_seq")


def truncation_length(checkpoint_max: int | None, n_positions: int, max_input: int) -> int:
    """Where truncation cuts: the checkpoint's own max length, never beyond what the server accepts."""
    own = min(checkpoint_max, n_positions) if checkpoint_max else n_positions
    return min(own, max_input)
