"""Qwen2 decoder (Qwen2ForCausalLM / Qwen2Model): the Llama blocks with biased q/k/v projections (o_proj has
none) and Qwen's sliding-window rule, served as an embedder like engine/families/llama.py.
"""
from __future__ import annotations

from dataclasses import dataclass

from engine.families import llama
from engine.families.llama import FULL, SLIDING, Model  # noqa: F401  (Model is this family's entry point)


@dataclass
class ModelArgs(llama.ModelArgs):
    use_sliding_window: bool = False
    max_window_layers: int = 28

    def __post_init__(self):
        if not self.use_sliding_window:
            self.sliding_window = None  # Qwen's configs carry a window they only use with use_sliding_window
        super().__post_init__()
        self.qkv_bias, self.o_bias = True, False

    def _layer_types(self) -> list[str]:
        """Qwen slides (with use_sliding_window) from layer max_window_layers on."""
        if self.layer_types is not None:
            return list(self.layer_types)
        return [SLIDING if self.sliding_window and i >= self.max_window_layers else FULL
                for i in range(self.num_hidden_layers)]
