"""llama.cpp's rank head (llama-graph.cpp build_pooling, case RANK), for reranker GGUFs.

The file keeps only what llama.cpp computes: one pooled token, then `cls` (dense + tanh) when present, then
`cls.output`. BERT conversions drop the checkpoint's pooler and serve every token type as 0, so their scores
are llama-server's, not the original checkpoint's. Qwen3 rerankers store the yes/no rows in `cls.output`
and llama.cpp takes softmax(...)[0] = P(yes).
"""
from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

from engine.compute.pooling import pool
from engine.types import Pooling


_HEAD_KEYS = {"cls.weight": "cls.weight", "cls.bias": "cls.bias",
              "cls.output.weight": "cls_output.weight", "cls.output.bias": "cls_output.bias"}


class RankHead(nn.Module):
    def __init__(self, trunk: nn.Module, hidden: int, n_out: int, present: set[str], pooling: Pooling,
                 softmax: bool):
        """present: the head tensors the file has (our names: cls.weight, cls_output.bias, ...)."""
        super().__init__()
        self.trunk = trunk
        if "cls.weight" in present:
            self.cls = nn.Linear(hidden, hidden, bias="cls.bias" in present)
        self.cls_output = nn.Linear(hidden, n_out, bias="cls_output.bias" in present)
        self._pooling = pooling
        self.scores_are_probabilities = softmax

    def __call__(self, input_ids: mx.array, attention_mask: mx.array,
                 token_type_ids: mx.array | None = None) -> mx.array:
        hidden = self.trunk(input_ids, attention_mask, mx.zeros_like(input_ids))
        x = pool(hidden, attention_mask, self._pooling)
        if "cls" in self:
            x = mx.tanh(self.cls(x))
        scores = self.cls_output(x)
        return mx.softmax(scores, axis=-1) if self.scores_are_probabilities else scores

    @staticmethod
    def key(name: str) -> str | None:
        """GGUF head tensor -> our parameter name."""
        return _HEAD_KEYS.get(name)
