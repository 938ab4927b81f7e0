"""EuroBERT (EuroBertModel / EuroBertForMaskedLM, model_type eurobert): a Llama stack read as an encoder.

transformers' EuroBertModel is Llama's decoder layers (RMSNorm, rotary positions, grouped-query attention,
SwiGLU MLP, a final norm) with a padding-only mask: every real token sees every other one. So the family is
llama's blocks with the causal mask off; the masked-LM head (`lm_head`) is never loaded. Rows arrive
right-padded; positions count real tokens. Pooling (mean by default, as sentence-transformers on a bare
encoder) is applied outside.
"""
from __future__ import annotations

from dataclasses import dataclass

from engine.families import llama
from engine.families.llama import Model  # noqa: F401  (the embedder entry point)


@dataclass
class ModelArgs(llama.ModelArgs):
    rms_norm_eps: float = 1e-5
    max_position_embeddings: int = 8192

    def __post_init__(self):
        super().__post_init__()
        self.causal = False  # an encoder: transformers builds EuroBERT's mask with create_bidirectional_mask
