"""Errors named for what happened. HTTP status codes live in compat/errors.py only."""
from __future__ import annotations


class EngineError(Exception):
    """Base of everything the engine raises on purpose."""


class UnsupportedCheckpoint(EngineError):
    """The checkpoint's family, head or layout is not one we serve."""


class CheckpointNotFound(EngineError):
    """The -m folder or -hf repo could not be found or downloaded."""


class InvalidInput(EngineError):
    """A client sent something the engine cannot use (bad token ids, bad prompt parts)."""


class EmptyInput(InvalidInput):
    """An input tokenized to no tokens at all."""


class InvalidTokens(InvalidInput):
    """A token id outside [0, n_vocab)."""


class SparseOnly(InvalidInput):
    """A request a sparse (SPLADE) encoder does not answer: a normalized dense vector of it (TEI refuses
    `normalize` for SPLADE models), or its per-token rows."""


class NotSparse(InvalidInput):
    """Sparse vectors asked of a model that gives dense ones."""


class InputTooLong(InvalidInput):
    """An input exceeds the per-input limit and truncation is off.

    limit_kind is 'ubatch' (llama's physical batch), 'positions' (the model's position table),
    'context' (the per-slot context from -c) or 'max_seq' (--max-seq, or what fits in memory).
    """

    def __init__(self, n_tokens: int, limit: int, limit_kind: str):
        self.n_tokens = n_tokens
        self.limit = limit
        self.limit_kind = limit_kind
        super().__init__(f"input ({n_tokens} tokens) exceeds the {limit_kind} limit of {limit} tokens")


class NotLoaded(EngineError):
    """The model is still loading (or failed to)."""


class LoadFailed(EngineError):
    """A model could not be loaded (several-model server); the next request or explicit load retries."""


class ModelTooLarge(LoadFailed):
    """A model alone holds more than the whole memory budget (--models-memory): it is never served."""


class NotEnoughMemory(LoadFailed):
    """Loading a model now would leave less system memory free than the floor (--models-memory-floor), even
    with every idle model unloaded; a later request may find the room."""


class QueueFull(EngineError):
    """The engine's bounded queue cannot take the request's inputs now."""


class TooManyInputs(EngineError):
    """A request has more inputs than the engine queue can ever hold: retrying cannot help."""

    def __init__(self, n_inputs: int, limit: int):
        self.n_inputs = n_inputs
        self.limit = limit
        super().__init__(f"this request has {n_inputs} inputs; the engine queue holds at most {limit} "
                         f"(--max-queue-items)")


class OutOfMemory(EngineError):
    """A forward pass ran out of memory; the engine lowered its batch caps and keeps serving."""


class ReplyTimeout(EngineError):
    """The request was not served within its deadline."""


class ForwardFailed(EngineError):
    """The forward pass raised; the batch's requests fail, the engine keeps serving."""
