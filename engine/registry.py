"""config.json -> family module -> loaded MLX model. The family file name is the registry."""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from engine.checkpoint import Checkpoint
from engine.errors import UnsupportedCheckpoint
from engine.types import Pooling

# config.json spellings that differ from our file names.
MODEL_TYPE_ALIASES = {"xlm-roberta": "xlm_roberta"}

# Architectures served as embedders, per family file. Anything else is refused by name.
EMBEDDING_ARCHITECTURES = {
    "bert": {"", "BertModel", "BertForMaskedLM", "BertForPreTraining"},
}

# Without 1_Pooling/config.json: what sentence-transformers itself would do with a bare encoder.
FAMILY_DEFAULT_POOLING = {"bert": Pooling.MEAN}

_FTYPES = {mx.float32: "F32", mx.float16: "F16", mx.bfloat16: "BF16"}


@dataclass
class LoadedModel:
    model: nn.Module
    family: str
    n_params: int
    size_bytes: int
    ftype: str
    default_pooling: Pooling


def family_name(checkpoint: Checkpoint) -> str:
    model_type = checkpoint.model_type
    return MODEL_TYPE_ALIASES.get(model_type, model_type)


def _family(name: str, checkpoint: Checkpoint) -> ModuleType:
    if name not in EMBEDDING_ARCHITECTURES:
        raise UnsupportedCheckpoint(
            f"{checkpoint.path}: model_type {checkpoint.model_type!r} ({checkpoint.architecture or 'no architecture'}) "
            f"is not supported (supported: {', '.join(sorted(EMBEDDING_ARCHITECTURES))})")
    return importlib.import_module(f"engine.families.{name}")


def load_embedder(checkpoint: Checkpoint) -> LoadedModel:
    """Build the family's trunk and load the checkpoint's weights into it (strict: every key must match)."""
    name = family_name(checkpoint)
    family = _family(name, checkpoint)
    if checkpoint.architecture not in EMBEDDING_ARCHITECTURES[name]:
        raise UnsupportedCheckpoint(
            f"{checkpoint.path}: architecture {checkpoint.architecture!r} of model_type {checkpoint.model_type!r} "
            f"is not served as an embedding model (supported: "
            f"{', '.join(sorted(a for a in EMBEDDING_ARCHITECTURES[name] if a))})")
    model = family.Model(family.ModelArgs.from_dict(checkpoint.config))
    weights: dict[str, mx.array] = {}
    for file in checkpoint.weight_files():
        weights.update(mx.load(str(file)))
    dtypes = {w.dtype for w in weights.values() if mx.issubdtype(w.dtype, mx.floating)}
    ftype = "F32" if dtypes == {mx.float32} else "/".join(sorted(_FTYPES.get(d, str(d)) for d in dtypes))
    # Half-precision matmuls are slow on CPU and fp32 is what the reference computes: run in fp32.
    weights = {k: (v.astype(mx.float32) if mx.issubdtype(v.dtype, mx.floating) else v)
               for k, v in family.Model.sanitize(weights).items()}
    try:
        model.load_weights(list(weights.items()), strict=True)
    except ValueError as exc:
        raise UnsupportedCheckpoint(f"{checkpoint.path}: weights do not match the {name} family: {exc}") from exc
    mx.eval(model.parameters())
    params = tree_flatten(model.parameters())
    return LoadedModel(
        model=model,
        family=name,
        n_params=sum(p.size for _, p in params),
        size_bytes=sum(p.nbytes for _, p in params),
        ftype=ftype or "F32",
        default_pooling=FAMILY_DEFAULT_POOLING.get(name, Pooling.MEAN),
    )
