"""jina-embeddings-v3: an XLM-RoBERTa trunk with rotary positions, and its task LoRA adapters.

Two layouts. transformers' JinaEmbeddingsV3Model (model_type jina_embeddings_v3): embeddings (word, token type,
LayerNorm), then post-norm layers of separate q/k/v/o projections and a GELU fc1/fc2 MLP. Jina's remote-code
export (model_type xlm-roberta, architectures XLMRobertaLoRA, the published jinaai/jina-embeddings-v3): the
same computation in flash-attention BERT names (emb_ln, encoder.layers.N.mixer.Wqkv / out_proj, norm1, norm2)
under `roberta.`, which is NomicBERT's layout exactly, so the trunk is engine/families/nomic_bert.py's blocks
(rotary on whole heads, base rotary_emb_base / rope_theta, 20000 by default).

The remote export also carries one LoRA adapter per task (config lora_adaptations: retrieval.query,
retrieval.passage, separation, classification, text-matching) on every Linear and Embedding, as
`<layer>.parametrizations.weight.original` plus `.0.lora_A` / `.0.lora_B` stacked on the task axis: a linear
weight becomes W + (alpha / rank) * lora_B[t] @ lora_A[t] (A [tasks, rank, in], B [tasks, out, rank]), an
embedding table W + (alpha / rank) * lora_A[t] @ lora_B[t] (A [tasks, vocab, rank], B [tasks, rank, dim]), as
Jina's LoRAParametrization computes them. The adapters are kept apart, as stored, and applied per pass: the
model is called with the pass's task index (`task`, an index into lora_adaptations; None: the adapters off,
Jina's encode(task=None)), and computes a linear as x W^T + b + (alpha / rank) (x A[t]^T) B[t]^T and an
embedding as W[ids] + (alpha / rank) A[t][ids] B[t] -- the merged weight's product without merging it, so one
loaded model serves every task (the engine keeps inputs of different tasks out of one pass). The task a request
gets when it names none: `task` in config.json, else sentence-transformers' default_prompt_name when it names a
task, else none (engine/runtime/loader.py). Jina's encode(task=...) also puts the task's instruction
(config.json task_instructions) before each text; engine/text/prompts.py does the same. Pooling (mean) and
Matryoshka truncation (`dimensions`) are the pipeline's.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from engine.errors import UnsupportedCheckpoint
from engine.families import nomic_bert
from engine.families.base import attention, padding_mask, split_heads, without_prefix

DEFAULT_THETA = 20_000.0
_RENAMES = (("embeddings.LayerNorm.", "emb_ln."), ("layers.", "encoder.layers."), (".mixer.", ".attn."),
            (".self_attn.o_proj.", ".attn.out_proj."), (".post_attention_layernorm.", ".norm1."),
            (".post_mlp_layernorm.", ".norm2."))
_LORA = ".parametrizations.weight."


@dataclass
class ModelArgs(nomic_bert.ModelArgs):
    task: str | None = None
    lora_adaptations: list[str] | None = None
    lora_rank: int = 4
    lora_alpha: float = 1.0
    task_instructions: dict[str, str] | None = None

    @classmethod
    def from_dict(cls, params: dict[str, Any]) -> ModelArgs:
        """transformers' or Jina's config.json in NomicBERT's names (the same blocks), plus the task settings."""
        rope = params.get("rope_parameters") or {}
        if rope.get("rope_type", "default") != "default":
            raise UnsupportedCheckpoint(f"jina-embeddings-v3 rope_type {rope['rope_type']!r} is not supported")
        if params.get("position_embedding_type", "rotary") != "rotary":
            raise UnsupportedCheckpoint(f"jina-embeddings-v3 position_embedding_type "
                                        f"{params['position_embedding_type']!r} is not supported (only rotary)")
        hidden, heads = params["hidden_size"], params["num_attention_heads"]
        names = {k: v for k, v in params.items()
                 if k in ("task", "lora_adaptations", "lora_rank", "lora_alpha", "task_instructions")}
        return super().from_dict({
            "vocab_size": params["vocab_size"], "n_embd": hidden, "n_head": heads,
            "n_layer": params["num_hidden_layers"], "n_inner": params.get("intermediate_size", 4 * hidden),
            "n_positions": params.get("max_position_embeddings", 8194),
            "layer_norm_epsilon": params.get("layer_norm_eps", 1e-5),
            "type_vocab_size": params.get("type_vocab_size", 1), "activation_function": params.get("hidden_act", "gelu"),
            "rotary_emb_fraction": 1.0,
            "rotary_emb_base": float(rope.get("rope_theta") or params.get("rotary_emb_base") or DEFAULT_THETA),
            "qkv_proj_bias": True, "mlp_fc1_bias": True, "mlp_fc2_bias": True, **names})

    def __post_init__(self):
        super().__post_init__()
        if self.task is not None and self.task not in (self.lora_adaptations or ()):
            raise UnsupportedCheckpoint(f"jina-embeddings-v3 task {self.task!r} is not one of its adapters "
                                        f"({', '.join(self.lora_adaptations or ()) or 'none'})")


class LoraLinear(nn.Module):
    """A Linear with every task's adapter beside it (weight [out, in], lora_A [tasks, rank, in], lora_B [tasks,
    out, rank]); not an nn.Linear, so no quantization replaces it and drops its adapters."""

    def __init__(self, n_in: int, n_out: int, bias: bool, args: ModelArgs):
        super().__init__()
        tasks = len(args.lora_adaptations or ())
        self.weight = mx.zeros((n_out, n_in))
        if bias:
            self.bias = mx.zeros((n_out,))
        self.lora_A = mx.zeros((tasks, args.lora_rank, n_in))
        self.lora_B = mx.zeros((tasks, n_out, args.lora_rank))
        self.scaling = args.lora_alpha / args.lora_rank

    def __call__(self, x: mx.array, task: int | None = None) -> mx.array:
        y = x @ self.weight.T
        if "bias" in self:
            y = y + self.bias
        if task is None:
            return y
        low = (x @ self.lora_A[task].T) @ self.lora_B[task].T
        return y + (self.scaling * low).astype(y.dtype)


class LoraEmbedding(nn.Module):
    """An Embedding with every task's adapter beside it (weight [vocab, dim], lora_A [tasks, vocab, rank],
    lora_B [tasks, rank, dim])."""

    def __init__(self, n_rows: int, dim: int, args: ModelArgs):
        super().__init__()
        tasks = len(args.lora_adaptations or ())
        self.weight = mx.zeros((n_rows, dim))
        self.lora_A = mx.zeros((tasks, n_rows, args.lora_rank))
        self.lora_B = mx.zeros((tasks, args.lora_rank, dim))
        self.scaling = args.lora_alpha / args.lora_rank

    def __call__(self, ids: mx.array, task: int | None = None) -> mx.array:
        rows = self.weight[ids]
        if task is None:
            return rows
        low = self.lora_A[task][ids] @ self.lora_B[task]
        return rows + (self.scaling * low).astype(rows.dtype)


class Embeddings(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.word_embeddings = LoraEmbedding(args.vocab_size, args.n_embd, args)
        if args.type_vocab_size > 0:
            self.token_type_embeddings = LoraEmbedding(args.type_vocab_size, args.n_embd, args)

    def __call__(self, input_ids: mx.array, token_type_ids: mx.array, task: int | None) -> mx.array:
        x = self.word_embeddings(input_ids, task)
        if "token_type_embeddings" in self:
            x = x + self.token_type_embeddings(token_type_ids, task)
        return x


class Attention(nomic_bert.NomicBertAttention):
    def __init__(self, args: ModelArgs):
        super().__init__(args)
        self.Wqkv = LoraLinear(args.n_embd, 3 * args.n_embd, args.qkv_proj_bias, args)
        self.out_proj = LoraLinear(args.n_embd, args.n_embd, args.qkv_proj_bias, args)

    def __call__(self, x: mx.array, mask: mx.array, task: int | None = None) -> mx.array:
        q, k, v = (split_heads(t, self.n_heads) for t in mx.split(self.Wqkv(x, task), 3, axis=-1))
        q, k = (mx.fast.rope(t, self.head_dim, traditional=False, base=self.base, scale=1.0, offset=0)
                for t in (q, k))
        return self.out_proj(attention(q, k, v, mask), task)


class MLP(nomic_bert.NomicBertMLP):
    def __init__(self, args: ModelArgs):
        super().__init__(args)
        self.fc1 = LoraLinear(args.n_embd, args.n_inner, args.mlp_fc1_bias, args)
        self.fc2 = LoraLinear(args.n_inner, args.n_embd, args.mlp_fc2_bias, args)

    def __call__(self, x: mx.array, task: int | None = None) -> mx.array:
        return self.fc2(self.act(self.fc1(x, task)), task)


class Block(nomic_bert.NomicBertBlock):
    """NomicBERT's post-norm block with the adapters' linears."""

    def __init__(self, args: ModelArgs):
        super().__init__(args)
        self.attn = Attention(args)
        self.mlp = MLP(args)

    def __call__(self, x: mx.array, mask: mx.array, task: int | None = None) -> mx.array:
        h = self.norm1(x + self.attn(x, mask, task))
        return self.norm2(h + self.mlp(h, task))


class Encoder(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.layers = [Block(args) for _ in range(args.n_layer)]


class Model(nomic_bert.Model):
    def __init__(self, args: ModelArgs):
        super().__init__(args)
        if args.lora_adaptations:
            if args.activation_function not in nomic_bert._PLAIN:
                raise UnsupportedCheckpoint(f"jina-embeddings-v3 task adapters need the plain MLP (fc1, fc2), not "
                                            f"{args.activation_function!r}")
            self.embeddings = Embeddings(args)
            self.encoder = Encoder(args)

    @property
    def tasks(self) -> tuple[tuple[str, str], ...]:
        """Each task adapter's name (lora_adaptations, in index order) and the instruction Jina's encode puts
        before a text of that task (task_instructions; "" when it names none)."""
        instructions = self.args.task_instructions or {}
        return tuple((name, instructions.get(name) or "") for name in self.args.lora_adaptations or ())

    @property
    def default_task(self) -> str | None:
        """config.json's `task`: the adapter a request naming none gets (None: the adapters off)."""
        return self.args.task if self.args.lora_adaptations else None

    def __call__(self, input_ids: mx.array, attention_mask: mx.array, token_type_ids: mx.array | None = None,
                 task: int | None = None) -> mx.array:
        if not self.args.lora_adaptations:
            if task is not None:
                raise UnsupportedCheckpoint("this jina-embeddings-v3 checkpoint has no task adapters")
            return super().__call__(input_ids, attention_mask, token_type_ids)
        if token_type_ids is None:
            token_type_ids = mx.zeros_like(input_ids)
        x = self.emb_ln(self.embeddings(input_ids, token_type_ids, task))
        mask = padding_mask(attention_mask)
        for layer in self.encoder.layers:
            x = layer(x, mask, task)
        return x

    def sanitize(self, weights: dict[str, mx.array]) -> dict[str, mx.array]:
        """Either layout -> NomicBERT's keys; Jina's parametrized weights (`<layer>.parametrizations.weight.
        original`, `.0.lora_A`, `.0.lora_B`) -> `<layer>.weight`, `.lora_A`, `.lora_B`."""
        out, qkv = {}, {}
        for key, value in weights.items():
            key = without_prefix(key, ("roberta.",))
            if _LORA in key:
                layer, _, rest = key.partition(_LORA)
                key = f"{layer}.{dict(original='weight').get(rest, rest.removeprefix('0.'))}"
            for old, new in _RENAMES:
                if old in key and not (old == "layers." and not key.startswith("layers.")):
                    key = key.replace(old, new, 1)
            for part in ("q", "k", "v"):
                if f".self_attn.{part}_proj." in key:  # transformers' separate projections -> the fused Wqkv
                    qkv.setdefault(key.replace(f".self_attn.{part}_proj.", ".attn.Wqkv."), {})[part] = value
                    break
            else:
                out[key] = value
        for key, parts in qkv.items():
            out[key] = mx.concatenate([parts["q"], parts["k"], parts["v"]], axis=0)
        return super().sanitize(out)
