"""Checkpoint tensors into a module: MLX-quantized layers, the compute dtype, and what the result amounts to.

MLX-quantized folders (mlx-lm / mlx-community conversions) say `quantization: {group_size, bits}` in
config.json (optionally per layer) and store each quantized layer as a packed `weight` with `scales` and
`biases`. Exactly the layers that have scales are quantized; the rest stay float. Where they run is chosen
once at load, from the device (`keeps_bits`): on a GPU they become MLX's quantized layers (its quantized
kernels are fast there); on a CPU, where MLX has no fast quantized matmul (4-bit MiniLM served at 0.038x its
float folder's throughput, docs/limits-and-batching.md), they are dequantized to the compute dtype into plain
nn.Linear / nn.Embedding weights, unless --keep-quantized trades that speed for their smaller memory.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from engine.errors import UnsupportedCheckpoint

DTYPES = {"float32": mx.float32, "float16": mx.float16, "bfloat16": mx.bfloat16}
_FTYPES = {mx.float32: "F32", mx.float16: "F16", mx.bfloat16: "BF16"}
_QUANTIZED = (nn.QuantizedLinear, nn.QuantizedEmbedding)


@dataclass(frozen=True)
class Quantization:
    group_size: int
    bits: int
    per_layer: dict[str, Any]  # layer path -> {group_size, bits} or False (kept float), as mlx-lm writes it

    def params_for(self, path: str) -> dict[str, int] | None:
        own = self.per_layer.get(path)
        if own is False:
            return None
        own = own if isinstance(own, dict) else {}
        return {"group_size": int(own.get("group_size", self.group_size)), "bits": int(own.get("bits", self.bits))}


def quantization(config: dict[str, Any]) -> Quantization | None:
    """config.json's MLX quantization block, or None for a float checkpoint."""
    block = config.get("quantization") or config.get("quantization_config")
    if not block:
        return None
    if "group_size" not in block or "bits" not in block:
        kind = block.get("quant_method") or block.get("mode") or "unknown"
        raise UnsupportedCheckpoint(f"quantization {kind!r} is not supported (MLX affine quantization with "
                                    "group_size and bits only)")
    if block.get("mode", "affine") != "affine":
        raise UnsupportedCheckpoint(f"MLX quantization mode {block['mode']!r} is not supported (only 'affine')")
    per_layer = {k: v for k, v in block.items() if isinstance(v, (dict, bool))}
    return Quantization(int(block["group_size"]), int(block["bits"]), per_layer)


def on_cpu() -> bool:
    return mx.default_device().type == mx.DeviceType.cpu


def keeps_bits(keep_quantized: bool) -> bool:
    """Whether quantized layers keep their bits (MLX's quantized kernels) or are dequantized at load: kept on
    a GPU, dequantized on a CPU unless keep_quantized (--keep-quantized: memory over speed)."""
    return keep_quantized or not on_cpu()


QUANTIZED_KERNELS = "quantized kernels"


def placement(quantized: bool, kept: bool, dtype: mx.Dtype, module: nn.Module | None = None) -> str:
    """What /props and the startup log say the weights are: 'quantized kernels', 'dequantized to float32 at
    load' (', embeddings kept quantized' when `module`'s lookup tables kept their bits), or just the compute
    dtype for a float checkpoint."""
    name = dtype_name(dtype)
    if not quantized:
        return name
    if kept:
        return QUANTIZED_KERNELS
    lookups = module is not None and any(isinstance(layer, nn.QuantizedEmbedding)
                                         for _, layer in module.named_modules())
    return f"dequantized to {name} at load" + (KEPT_LOOKUPS if lookups else "")


# A GGUF's token table is only looked up (the rows a pass reads, gathered), never multiplied, so it needs no
# fast quantized matmul: in Q4_0 / Q4_1 / Q8_0 it stays an nn.QuantizedEmbedding (engine/loading/gguf/load.py),
# whose lookup dequantizes just those rows from a fraction of the memory. That lookup is three gathers and a
# dequantize, ~0.9 ms for 32 x 17 rows of 384 on this CPU against ~0.1 ms from a float table, so small tables
# are dequantized with the matmuls' weights. MLX-quantized folders dequantize every table on a CPU: kept, the
# 4-bit MiniLM's vocabulary measured 0.91-0.96x the throughput of the folder dequantized whole under 8
# concurrent clients (no cost measurable on one lane, cause not found), and --keep-quantized is their memory
# option. The GGUF MiniLM's kept Q8_0 table under that load: 0.97x and 1.01x its table dequantized, noise.
KEPT_LOOKUPS = ", embeddings kept quantized"
KEPT_LOOKUP_FROM = 1 << 20  # values in a table that keeps its bits (SmolLM2's vocabulary: 28.3M)


def keeps_lookup_bits(layer: nn.Module) -> bool:
    """Whether an embedding layer, before its weights are loaded, may keep a quantized table where the matmuls'
    weights are dequantized: a plain nn.Embedding (a family's own subclass may read its .weight) of at least
    KEPT_LOOKUP_FROM values."""
    return type(layer) is nn.Embedding and layer.weight.size >= KEPT_LOOKUP_FROM


def dtype_name(dtype: mx.Dtype) -> str:
    return next((name for name, d in DTYPES.items() if d == dtype), str(dtype))


def module_dtype(module: nn.Module) -> mx.Dtype:
    """The float dtype a loaded module computes in (its first float parameter's)."""
    return next((v.dtype for _, v in tree_flatten(module.parameters())
                 if mx.issubdtype(v.dtype, mx.floating)), mx.float32)


def compute_dtype(requested: str, weights: dict[str, mx.array]) -> mx.Dtype:
    """The dtype the model computes in. auto: float32 on a CPU (half-precision matmuls are slow there and the
    references compute in float32), the checkpoint's own float dtype on a GPU."""
    if requested != "auto":
        try:
            return DTYPES[requested]
        except KeyError:
            raise UnsupportedCheckpoint(f"dtype {requested!r} is not supported "
                                        f"(auto, {', '.join(DTYPES)})") from None
    if on_cpu():
        return mx.float32
    floats = {w.dtype for w in weights.values() if mx.issubdtype(w.dtype, mx.floating)}
    return floats.pop() if len(floats) == 1 else mx.float32


def ftype(weights: dict[str, mx.array], quant: Quantization | None) -> str:
    """What the checkpoint stores, llama-style: F32, F16, BF16, or MLX_Q4_G64 beside the float dtypes it keeps."""
    floats = {w.dtype for k, w in weights.items()
              if mx.issubdtype(w.dtype, mx.floating) and not k.endswith((".scales", ".biases"))}
    names = sorted(_FTYPES.get(d, str(d)) for d in floats)
    if quant is not None:
        names.insert(0, f"MLX_Q{quant.bits}_G{quant.group_size}")
    return "/".join(names) or "F32"


def materialize(module: nn.Module, weights: dict[str, mx.array], quant: Quantization | None,
                dtype: mx.Dtype, what: str, keep_bits: bool = True) -> None:
    """Load the weights strictly, float tensors cast to dtype. The layers the weights have scales for become
    MLX's quantized layers (keep_bits), or plain layers holding their dequantized weights (not keep_bits)."""
    if quant is not None:
        quantizable = {path for path, layer in module.named_modules()
                       if f"{path}.scales" in weights and hasattr(layer, "to_quantized") and quant.params_for(path)}
        missing = sorted(k.removesuffix(".scales") for k in weights if k.endswith(".scales")
                         and k.removesuffix(".scales") not in quantizable)
        if missing:
            raise UnsupportedCheckpoint(f"{what}: quantized tensors for layers that cannot be quantized: "
                                        f"{', '.join(missing[:5])}")
        if keep_bits:
            nn.quantize(module, class_predicate=lambda path, layer: (
                path in quantizable and (quant.params_for(path) or False)))
        else:
            weights = dequantized(weights, quant, quantizable)
    cast = {k: (v.astype(dtype) if mx.issubdtype(v.dtype, mx.floating) else v) for k, v in weights.items()}
    try:
        module.load_weights(list(cast.items()), strict=True)
    except ValueError as exc:
        raise UnsupportedCheckpoint(f"{what}: weights do not match: {exc}") from exc
    mx.eval(module.parameters())


def dequantized(weights: dict[str, mx.array], quant: Quantization, layers: set[str]) -> dict[str, mx.array]:
    """The weights with each quantized layer's packed weight, scales and biases replaced by its float weight
    (mx.dequantize: the values MLX's quantized kernels compute with)."""
    out = {k: v for k, v in weights.items()
           if not (k.endswith((".scales", ".biases")) and k.rsplit(".", 1)[0] in layers)}
    for path in layers:
        params = quant.params_for(path) or {}
        out[f"{path}.weight"] = mx.dequantize(weights[f"{path}.weight"], weights[f"{path}.scales"],
                                              weights[f"{path}.biases"], **params)
    return out


def size(module: nn.Module) -> tuple[int, int]:
    """(parameters, bytes) of a loaded module: a quantized layer counts the values it encodes, not its
    packed words, scales and biases; bytes are what it really holds."""
    n_params = n_bytes = 0
    for _, layer in module.named_modules():
        own = {k: v for k, v in layer.items() if isinstance(v, mx.array)}
        n_bytes += sum(v.nbytes for v in own.values())
        if isinstance(layer, _QUANTIZED):
            n_params += own["weight"].size * 32 // layer.bits + (own["bias"].size if "bias" in own else 0)
        else:
            n_params += sum(v.size for v in own.values())
    return n_params, n_bytes
