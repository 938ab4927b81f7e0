"""Ministral 3 decoder (Ministral3Model / Ministral3ForCausalLM), and Nemotron-3-Embed, which runs it bidirectionally.

The Llama blocks (engine/families/llama.py) with two things of Ministral 3's own: YaRN rotary frequencies
(base.rope_settings), and the Llama 4 attention scaling: after the rotation, each query is multiplied by
1 + beta * ln(1 + floor(pos / original_max_position_embeddings)) (rope_parameters' llama_4_scaling_beta and
original_max_position_embeddings), pos counting the row's real tokens from 0, as one prefill from an empty cache
does. A sliding_window slides every layer (transformers' Ministral3Model; the published embedders have none):
q - k < window causally, |q - k| <= window bidirectionally, as transformers builds those masks.

nvidia/Nemotron-3-Embed-1B (and its mlx-community conversions) says `is_causal: false`: keys are every real token
of the row and nothing else (padding only), and it mean-pools (registry). Its embeddings are tied, so there is no
LM head to drop; a causal export's head is dropped. Rows arrive right-padded.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import mlx.core as mx

from engine.families import llama
from engine.families.llama import FULL, SLIDING


@dataclass
class ModelArgs(llama.ModelArgs):
    rms_norm_eps: float = 1e-5
    max_position_embeddings: int = 262_144
    attn_scale_beta: float | None = field(init=False, default=None)
    attn_scale_window: int | None = field(init=False, default=None)

    default_rope_theta = 1_000_000.0

    def __post_init__(self):
        super().__post_init__()
        beta, window = self.rope.get("llama_4_scaling_beta"), self.rope.get("original_max_position_embeddings")
        if beta and window:
            self.attn_scale_beta, self.attn_scale_window = float(beta), int(window)

    def _layer_types(self) -> list[str]:
        return [SLIDING if self.sliding_window else FULL] * self.num_hidden_layers

    def window(self, layer_type: str) -> int | None:
        """Causal: q - k < sliding_window; bidirectional: |q - k| <= sliding_window, as transformers' masks read it."""
        window = super().window(layer_type)
        return window + 1 if window and not self.causal else window


class Ministral3Model(llama.DecoderModel):
    def position_tables(self, positions: mx.array, kind: str, attention_mask: mx.array) -> tuple:
        """The rotary embedding and each position's query scale [B, 1, L, 1] (None when the config has none)."""
        (rope,) = super().position_tables(positions, kind, attention_mask)
        args = self.args
        if args.attn_scale_beta is None:
            return rope, None
        blocks = mx.floor(positions.astype(mx.float32) / args.attn_scale_window)
        return rope, (1 + args.attn_scale_beta * mx.log(1 + blocks))[:, None, :, None]


class Model(llama.Model):
    backbone = Ministral3Model

    def sanitize(self, weights: dict[str, mx.array]) -> dict[str, mx.array]:
        """A Mistral3 wrapper's `language_model.` prefix dropped, then the Llama layout (bare keys get `model.`)."""
        return llama.backbone_weights({k.removeprefix("language_model."): v for k, v in weights.items()},
                                      keep_head=False)
