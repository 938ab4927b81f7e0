"""Compute: what runs on a batch after (and around) a family's forward pass.

Owns the pipelines that turn a family's hidden states into what a request asked for (pooled vectors,
per-token rows, cross-encoder and yes/no scores), pooling, normalization (`embd_normalize`, `dimensions`),
MaxSim and the compact codes of finished vectors (`quantize.py`: int8 / uint8 / binary / ubinary). Pipelines receive a built model object; they never import a family. May import `engine.types`,
`engine.errors` and `engine.multimodal.inputs` (the prepared-input record).
"""
