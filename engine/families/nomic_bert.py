"""NomicBERT encoder (nomic-embed-text-v1 / v1.5, CodeRankEmbed, nomic-embed-text-v2-moe: NomicBertModel,
NomicBertForPreTraining).

A post-norm BERT without a position table: rotary positions on each whole head and a fused Wqkv projection.
The MLP is gated (fc11 * act(fc12); activation_function swiglu / geglu, biases off: v1 / v1.5) or plain
(fc2(act(fc1)); gelu, with biases: v2-moe), and qkv_proj_bias puts biases on Wqkv and out_proj (v2-moe).

Mixture of experts (v2-moe, moe_every_n_layers): the layers i with i % moe_every_n_layers == 1 replace the MLP
with `num_experts` plain experts. As nomic's reference (contrastors' NomicMoELayer) computes it: the router
(`router.layer`, bias-free) gives a softmax over all experts in float32, each token takes its moe_top_k best,
their weights not renormalized (unless moe_normalize_expert_weights); expert e is act(x @ w1[e].T) @ w2[e]
with w1 and w2 stored [num_experts * n_inner, n_embd] (`experts.mlp.w1` / `w2`), and one shared
`experts.bias` is added after the weighted sum. Each token is routed on its own, so padding never moves a
real token.

The hub's config.json uses GPT-2 names (n_embd, n_layer, rotary_emb_fraction, qkv_proj_bias, ...);
transformers >= 5 writes its own (hidden_size, rope_parameters, ...) over the same weight keys of the gated,
bias-free variant. Both are read. Attribute names follow the keys.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from engine.errors import UnsupportedCheckpoint
from engine.families.base import (BaseModelArgs, LayerNorm, Trunk, activation, attention, padding_mask,
                                  split_heads, trunk_weights)

# activation_function -> the gate's activation (base.activation names): fc2(fc11(x) * act(fc12(x))).
_GATES = {"swiglu": "silu", "geglu": "gelu"}
# activation_function -> a plain MLP's (and the experts') activation: fc2(act(fc1(x))); gelu is the erf form.
_PLAIN = {"gelu": "gelu", "gelu_new": "gelu_new", "gelu_fast": "gelu_new", "gelu_approx": "gelu_new"}
# transformers' NomicBertConfig names -> the hub's; its MLP is always gated (GemmaMLP) and has no biases.
_TRANSFORMERS_NAMES = {"hidden_size": "n_embd", "num_attention_heads": "n_head", "num_hidden_layers": "n_layer",
                       "intermediate_size": "n_inner", "layer_norm_eps": "layer_norm_epsilon",
                       "max_position_embeddings": "n_positions"}
_TRANSFORMERS_GATES = {"silu": "swiglu", "gelu": "geglu"}


@dataclass
class ModelArgs(BaseModelArgs):
    vocab_size: int
    n_embd: int
    n_head: int
    n_layer: int
    n_inner: int | None = None
    n_positions: int = 2048
    layer_norm_epsilon: float = 1e-12
    type_vocab_size: int = 2
    pad_vocab_size_multiple: int = 1
    activation_function: str = "gelu_new"  # GPT2Config's default (refused); the embedders say swiglu
    rotary_emb_fraction: float = 0.0
    rotary_emb_base: float = 10_000.0
    rotary_emb_interleaved: bool = False
    rotary_emb_scale_base: float | None = None
    rotary_scaling_factor: float | None = None
    qkv_proj_bias: bool = True
    mlp_fc1_bias: bool = True
    mlp_fc2_bias: bool = True
    prenorm: bool = False
    parallel_block: bool = False
    causal: bool = False
    use_rms_norm: bool = False
    moe_every_n_layers: int = 0
    num_experts: int = 0
    moe_top_k: int = 1
    moe_normalize_expert_weights: bool = False
    num_shared_experts: int = 0
    expert_choice_router: bool = False
    num_heads_kv: int | None = None

    @classmethod
    def from_dict(cls, params: dict[str, Any]) -> "ModelArgs":
        if "n_embd" not in params and "hidden_size" in params:
            params = _from_transformers(params)
        return super().from_dict(params)

    def __post_init__(self):
        refused = {"prenorm": self.prenorm, "parallel_block": self.parallel_block, "causal": self.causal,
                   "use_rms_norm": self.use_rms_norm, "rotary_emb_scale_base": self.rotary_emb_scale_base,
                   "rotary_scaling_factor (dynamic NTK, batch-dependent)": self.rotary_scaling_factor,
                   "num_shared_experts": self.num_shared_experts, "expert_choice_router": self.expert_choice_router}
        on = [name for name, value in refused.items() if value]
        if on:
            raise UnsupportedCheckpoint(f"NomicBERT options {', '.join(on)} are not supported (the published text "
                                        f"embedders are post-norm, token-choice routed and use plain rotary "
                                        f"positions)")
        if self.activation_function not in {**_GATES, **_PLAIN}:
            raise UnsupportedCheckpoint(f"NomicBERT activation_function {self.activation_function!r} is not "
                                        f"supported (supported: {', '.join([*_GATES, *_PLAIN])})")
        if self.moe_every_n_layers and (self.activation_function in _GATES or self.num_experts < 1
                                        or not 1 <= self.moe_top_k <= self.num_experts):
            raise UnsupportedCheckpoint(f"NomicBERT mixture of experts needs plain experts (activation_function "
                                        f"{self.activation_function!r}) and 1 <= moe_top_k ({self.moe_top_k}) <= "
                                        f"num_experts ({self.num_experts})")
        if self.num_heads_kv not in (None, self.n_head) or self.n_embd % self.n_head:
            raise UnsupportedCheckpoint(f"NomicBERT needs n_embd ({self.n_embd}) split evenly into n_head "
                                        f"({self.n_head}) query/key/value heads")
        if self.rotary_emb_fraction != 1.0 or self.rotary_emb_interleaved:
            raise UnsupportedCheckpoint(
                f"NomicBERT rotary_emb_fraction {self.rotary_emb_fraction} / rotary_emb_interleaved "
                f"{self.rotary_emb_interleaved} are not supported (only rotary positions on whole heads, halves "
                f"rotated, as the published text embedders use)")
        multiple = max(self.pad_vocab_size_multiple, 1)
        self.vocab_size += -self.vocab_size % multiple  # the embedding table is stored padded
        if self.n_inner is None:
            self.n_inner = 4 * self.n_embd

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    def is_moe(self, layer: int) -> bool:
        return self.moe_every_n_layers > 0 and layer % self.moe_every_n_layers == 1



def _from_transformers(params: dict[str, Any]) -> dict[str, Any]:
    """transformers' NomicBertConfig (same weights) in the hub's names."""
    out = {_TRANSFORMERS_NAMES.get(k, k): v for k, v in params.items()}
    rope = params.get("rope_parameters") or {}
    if rope.get("rope_type", "default") != "default":
        raise UnsupportedCheckpoint(f"NomicBERT rope_type {rope['rope_type']!r} is not supported (only 'default')")
    n_embd, n_head = params["hidden_size"], params["num_attention_heads"]
    if params.get("head_dim") not in (None, n_embd // n_head):
        raise UnsupportedCheckpoint(f"NomicBERT head_dim {params['head_dim']} is not hidden_size / heads")
    act = params.get("hidden_act", "silu")
    out.update(activation_function=_TRANSFORMERS_GATES.get(act, act), rotary_emb_fraction=1.0,
               rotary_emb_base=float(rope.get("rope_theta", 1000.0)), qkv_proj_bias=False, mlp_fc1_bias=False,
               mlp_fc2_bias=False)
    return out


class NomicBertEmbeddings(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.word_embeddings = nn.Embedding(args.vocab_size, args.n_embd)
        if args.type_vocab_size > 0:
            self.token_type_embeddings = nn.Embedding(args.type_vocab_size, args.n_embd)

    def __call__(self, input_ids: mx.array, token_type_ids: mx.array) -> mx.array:
        x = self.word_embeddings(input_ids)
        if "token_type_embeddings" in self:
            x = x + self.token_type_embeddings(token_type_ids)
        return x


class NomicBertAttention(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.n_heads = args.n_head
        self.head_dim = args.head_dim
        self.base = float(args.rotary_emb_base)
        self.Wqkv = nn.Linear(args.n_embd, 3 * args.n_embd, bias=args.qkv_proj_bias)
        self.out_proj = nn.Linear(args.n_embd, args.n_embd, bias=args.qkv_proj_bias)

    def __call__(self, x: mx.array, mask: mx.array) -> mx.array:
        q, k, v = (split_heads(t, self.n_heads) for t in mx.split(self.Wqkv(x), 3, axis=-1))
        # Positions 0..L-1 on every row: rows are right-padded, so real tokens sit where the reference puts them.
        q, k = (mx.fast.rope(t, self.head_dim, traditional=False, base=self.base, scale=1.0, offset=0)
                for t in (q, k))
        return self.out_proj(attention(q, k, v, mask))


class NomicBertGatedMLP(nn.Module):
    """fc11 is the value, fc12 the gate (transformers maps them to up_proj and gate_proj)."""

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.fc11 = nn.Linear(args.n_embd, args.n_inner, bias=args.mlp_fc1_bias)
        self.fc12 = nn.Linear(args.n_embd, args.n_inner, bias=args.mlp_fc1_bias)
        self.fc2 = nn.Linear(args.n_inner, args.n_embd, bias=args.mlp_fc2_bias)
        self.act = activation(_GATES[args.activation_function])

    def __call__(self, x: mx.array) -> mx.array:
        return self.fc2(self.fc11(x) * self.act(self.fc12(x)))


class NomicBertMLP(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.fc1 = nn.Linear(args.n_embd, args.n_inner, bias=args.mlp_fc1_bias)
        self.fc2 = nn.Linear(args.n_inner, args.n_embd, bias=args.mlp_fc2_bias)
        self.act = activation(_PLAIN[args.activation_function])

    def __call__(self, x: mx.array) -> mx.array:
        return self.fc2(self.act(self.fc1(x)))


class NomicRouter(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.layer = nn.Linear(args.n_embd, args.num_experts, bias=False)


class NomicExpertMLP(nn.Module):
    """Every expert's two matrices, stacked on the expert axis: w1 and w2 [num_experts * n_inner, n_embd]."""

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.w1 = mx.zeros((args.num_experts * args.n_inner, args.n_embd))
        self.w2 = mx.zeros((args.num_experts * args.n_inner, args.n_embd))


class NomicExperts(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.mlp = NomicExpertMLP(args)
        self.bias = mx.zeros((args.n_embd,))


class NomicMoELayer(nn.Module):
    """Token-choice top-k routing over plain experts (see the module docstring)."""

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.n_experts, self.top_k, self.n_inner = args.num_experts, args.moe_top_k, args.n_inner
        self.normalize = args.moe_normalize_expert_weights
        self.act = activation(_PLAIN[args.activation_function])
        self.router = NomicRouter(args)
        self.experts = NomicExperts(args)

    def __call__(self, x: mx.array) -> mx.array:
        shape = x.shape
        tokens = x.reshape(-1, shape[-1])
        probs = mx.softmax(self.router.layer(tokens).astype(mx.float32), axis=-1)
        chosen = mx.argpartition(-probs, kth=self.top_k - 1, axis=-1)[:, :self.top_k]  # [T, k]
        gates = mx.take_along_axis(probs, chosen, axis=-1)
        if self.normalize:
            gates = gates / mx.sum(gates, axis=-1, keepdims=True)
        w1 = self.experts.mlp.w1.reshape(self.n_experts, self.n_inner, -1)  # [E, F, D]
        w2 = self.experts.mlp.w2.reshape(self.n_experts, self.n_inner, -1)
        # each token through its k experts only: [T, 1, 1, D] x [E, D, F] -> [T, k, 1, F] -> [T, k, 1, D]
        h = self.act(mx.gather_mm(tokens[:, None, None, :], w1.swapaxes(-1, -2), rhs_indices=chosen))
        out = mx.gather_mm(h, w2, rhs_indices=chosen)[:, :, 0]
        out = mx.sum(out * gates[..., None].astype(out.dtype), axis=1) + self.experts.bias
        return out.reshape(shape)


class NomicBertBlock(nn.Module):
    """Post-norm: norm1(x + attn(x)), then norm2(h + mlp(h))."""

    def __init__(self, args: ModelArgs, moe: bool = False):
        super().__init__()
        self.attn = NomicBertAttention(args)
        self.mlp = (NomicMoELayer(args) if moe else NomicBertGatedMLP(args) if args.activation_function in _GATES
                    else NomicBertMLP(args))
        self.norm1 = LayerNorm(args.n_embd, eps=args.layer_norm_epsilon)
        self.norm2 = LayerNorm(args.n_embd, eps=args.layer_norm_epsilon)

    def __call__(self, x: mx.array, mask: mx.array) -> mx.array:
        h = self.norm1(x + self.attn(x, mask))
        return self.norm2(h + self.mlp(h))


class NomicBertEncoder(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.layers = [NomicBertBlock(args, args.is_moe(i)) for i in range(args.n_layer)]

    def __call__(self, x: mx.array, mask: mx.array) -> mx.array:
        for layer in self.layers:
            x = layer(x, mask)
        return x


class Model(Trunk):
    """The trunk: token ids -> final hidden states [B, L, D]."""

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args = args
        self.embeddings = NomicBertEmbeddings(args)
        self.emb_ln = LayerNorm(args.n_embd, eps=args.layer_norm_epsilon)
        self.encoder = NomicBertEncoder(args)

    @property
    def hidden_size(self) -> int:
        return self.args.n_embd

    @property
    def n_positions(self) -> int:
        return self.args.n_positions

    def __call__(self, input_ids: mx.array, attention_mask: mx.array,
                 token_type_ids: mx.array | None = None) -> mx.array:
        if token_type_ids is None:
            token_type_ids = mx.zeros_like(input_ids)
        x = self.emb_ln(self.embeddings(input_ids, token_type_ids))
        return self.encoder(x, padding_mask(attention_mask))

    @staticmethod
    def sanitize(weights: dict[str, mx.array]) -> dict[str, mx.array]:
        """Trunk keys only: NomicBertForPreTraining's `bert.` prefix dropped, its MLM head and any pooler left out."""
        return trunk_weights(weights, ("bert.",), ("embeddings.", "emb_ln.", "encoder."))
