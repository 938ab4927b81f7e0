"""What a checkpoint applies after pooling: sentence-transformers' Dense modules (2_Dense, 3_Dense, …).

Two layouts carry them. The sentence-transformers folders list them in modules.json, each folder with a
config.json (widths, bias, activation) and `linear.weight` / `linear.bias`. MLX conversions fold them into the
main weights as `dense.0.*`, `dense.1.*` (with `.scales` / `.biases` when quantized) and keep no config: their
activation is the identity, which is what EmbeddingGemma, the one family converted that way, uses.
"""
from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn

from engine.errors import UnsupportedCheckpoint

# sentence-transformers writes the activation as the torch class path
_ACTIVATIONS: dict[str, Callable[[mx.array], mx.array]] = {
    "torch.nn.modules.linear.Identity": lambda x: x,
    "torch.nn.modules.activation.Tanh": mx.tanh,
}
_FOLDED_KEY = re.compile(r"^dense\.(\d+)\.")


class Projection(nn.Module):
    """Linear layers (with their activations) applied in order to the pooled vector [B, D_in] -> [B, D_out]."""

    def __init__(self, shapes: list[tuple[int, int, bool]], activations: tuple[str, ...]):
        super().__init__()
        self.dense = [nn.Linear(d_in, d_out, bias=bias) for d_in, d_out, bias in shapes]
        self.activations = tuple(_ACTIVATIONS[name] for name in activations)
        self.out_dims = shapes[-1][1]

    def __call__(self, x: mx.array) -> mx.array:
        first = self.dense[0]
        x = x.astype(first.scales.dtype if "scales" in first else first.weight.dtype)  # the compute dtype
        for layer, act in zip(self.dense, self.activations):
            x = act(layer(x))
        return x


def split_projection(weights: dict[str, mx.array], dense_folders: tuple[Path, ...], hidden_size: int,
                     bits: int | None = None) -> tuple[Projection | None, dict[str, mx.array], dict[str, mx.array]]:
    """(projection, its weights under `dense.N.`, the main weights without them).

    Folded `dense.N.*` keys in the main weights win; otherwise the modules.json Dense folders are read.
    The widths must chain from the backbone's hidden size, so a swapped pair is a load error. bits: the
    checkpoint's quantization, to read a quantized layer's input width off its packed weight.
    """
    folded = {k: v for k, v in weights.items() if _FOLDED_KEY.match(k)}
    rest = {k: v for k, v in weights.items() if k not in folded}
    if folded:
        count = len({_FOLDED_KEY.match(k).group(1) for k in folded})
        if dense_folders and len(dense_folders) != count:
            raise UnsupportedCheckpoint(f"the weights fold {count} Dense layers but modules.json lists "
                                        f"{len(dense_folders)}")
        activations = tuple(_folder_activation(f) for f in dense_folders) or ("torch.nn.modules.linear.Identity",) * count
        proj_weights = folded
    elif dense_folders:
        proj_weights = {}
        for i, folder in enumerate(dense_folders):
            proj_weights.update({f"dense.{i}.{k.removeprefix('linear.')}": v for k, v in _folder_weights(folder).items()})
        activations = tuple(_folder_activation(f) for f in dense_folders)
        count = len(dense_folders)
    else:
        return None, {}, rest
    shapes = []
    width = hidden_size
    for i in range(count):
        weight = proj_weights.get(f"dense.{i}.weight")
        if weight is None:
            raise UnsupportedCheckpoint(f"Dense layer {i} has no weight")
        d_out = weight.shape[0]
        d_in = weight.shape[1] * 32 // bits if bits and f"dense.{i}.scales" in proj_weights else weight.shape[1]
        if d_in != width:
            raise UnsupportedCheckpoint(f"Dense layer {i} takes {d_in} inputs but receives {width} "
                                        f"({'the hidden size' if i == 0 else f'layer {i - 1} output'}): the "
                                        "Dense widths do not chain")
        shapes.append((d_in, d_out, f"dense.{i}.bias" in proj_weights))
        width = d_out
    return Projection(shapes, activations), proj_weights, rest


def replace_own_projection(weights: dict[str, mx.array], dense_folders: tuple[Path, ...],
                           prefix: str) -> dict[str, mx.array]:
    """A multi-vector family applies its projection itself (`prefix`: its module, e.g. "linear."); a Dense folder
    saved beside the checkpoint holds the trained projection (vidore's ColSmol ships it in 1_Dense) and replaces
    the main weights' one, as sentence-transformers loads it. One Identity-activated Dense at most."""
    if not dense_folders:
        return weights
    if len(dense_folders) > 1:
        raise UnsupportedCheckpoint(f"{len(dense_folders)} Dense modules for a multi-vector model; its one "
                                    f"projection ({prefix.rstrip('.')}) takes at most one")
    (folder,) = dense_folders
    if _folder_activation(folder) != "torch.nn.modules.linear.Identity":
        raise UnsupportedCheckpoint(f"{folder}: a multi-vector model's projection has no activation")
    if _folder_config(folder).get("use_residual"):  # pylate's Dense can add its input back
        raise UnsupportedCheckpoint(f"{folder}: a Dense module with use_residual is not supported")
    dense = {f"{prefix}{k.removeprefix('linear.')}": v for k, v in _folder_weights(folder).items()}
    return {**weights, **dense}


def _folder_config(folder: Path) -> dict:
    path = folder / "config.json"
    if not path.is_file():
        raise UnsupportedCheckpoint(f"{folder}: a Dense module without config.json")
    return json.loads(path.read_text(encoding="utf-8"))


def _folder_activation(folder: Path) -> str:
    name = str(_folder_config(folder).get("activation_function", "torch.nn.modules.linear.Identity"))
    if name not in _ACTIVATIONS:
        raise UnsupportedCheckpoint(f"{folder}: Dense activation {name!r} is not supported "
                                    f"(supported: {', '.join(sorted(_ACTIVATIONS))})")
    return name


def _folder_weights(folder: Path) -> dict[str, mx.array]:
    path = folder / "model.safetensors"
    if not path.is_file():
        raise UnsupportedCheckpoint(f"{folder}: a Dense module without model.safetensors (only safetensors "
                                    "weights are supported)")
    _folder_config(folder)
    return mx.load(str(path))
