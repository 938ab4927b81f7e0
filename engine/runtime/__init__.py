"""Runtime: serving a loaded model.

Owns the Engine facade (`engine.py`: state, submit, collect; the embed, rerank and MaxSim entry points), the
load that makes a checkpoint servable (`loader.py`), fitting inputs to its limits (`fitting.py`), the worker
lanes that are the only threads touching MLX at serve time, the pure batching policy (`scheduler.py`), the
shapes prepared and fitted to memory at startup, the length limits, the thread plan and the process-wide BLAS
and allocator setup, and residency (several models: lazy load, LRU, pinning, idle unload). May import every
other engine group; nothing below it imports it (only `engine.offline` and the `engine` facade do). `blas` and
`malloc` import no MLX: the package is imported before MLX is first loaded.
"""
