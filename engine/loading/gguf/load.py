"""Load a GGUF Checkpoint into its family's module: tensor names mapped to checkpoint keys, dequantized,
then the family's own sanitize() and a strict load, as for safetensors."""
from __future__ import annotations

import importlib
import logging
import os
from concurrent.futures import ThreadPoolExecutor

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten

from engine.checkpoint import Checkpoint
from engine.errors import UnsupportedCheckpoint
from engine.families.base import Trunk
from engine.loading.gguf import lora, quants
from engine.loading.gguf.arch import for_architecture
from engine.loading.heads import Projection
from engine.loading.weights import Quantization, compute_dtype, keeps_lookup_bits, materialize
from engine.loading.gguf.head import RankHead
from engine.loading.gguf.reader import GGUFFile
from engine.types import Pooling

log = logging.getLogger(__name__)

# llama_ftype_name for general.file_type (the names /props and /v1/models report)
FTYPE_NAMES = {0: "all F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K - Medium",
               11: "Q3_K - Small", 12: "Q3_K - Medium", 13: "Q3_K - Large", 14: "Q4_K - Small",
               15: "Q4_K - Medium", 16: "Q5_K - Small", 17: "Q5_K - Medium", 18: "Q6_K", 32: "BF16"}


def is_reranker(gguf: GGUFFile) -> bool:
    """A file with llama.cpp's classifier output (or the architecture's own classifier tensor, jina-bert-v2's
    `cls`): served with --reranking."""
    if "cls.output.weight" in gguf.tensors:
        return True
    mapping = for_architecture(gguf.architecture, "GGUF file")
    return getattr(mapping, "RANK_TENSOR", None) in gguf.tensors


def ftype(gguf: GGUFFile) -> str:
    value = gguf.metadata.get("general.file_type")
    if value is None:
        return "(guessed) unknown"
    return FTYPE_NAMES.get(int(value), f"file_type {value}")


def is_quantized(gguf: GGUFFile) -> bool:
    """Whether any tensor of the file is in a block format (dequantized at load)."""
    return any(t.type_name not in ("F32", "F16", "BF16") for t in gguf.tensors.values())


def tensor(gguf: GGUFFile, name: str) -> mx.array:
    """One tensor as an MLX float array (block formats dequantized to float32)."""
    values = gguf.array(name)
    if gguf.tensors[name].type_name == "BF16":
        return mx.array(np.ascontiguousarray(values)).view(mx.bfloat16)
    return mx.array(values)


_CHUNK = 8192  # blocks per dequantizing task: its temporaries stay in the cache


def tensors(gguf: GGUFFile, names: list[str]) -> dict[str, mx.array]:
    """The named tensors as MLX float arrays, as tensor() gives them. A block-format tensor is dequantized
    straight into the memory of the MLX array that keeps it (no copy after), by a pool of threads (numpy
    releases the GIL) while this thread allocates the next array: SmolLM2-135M Q4_1 took 1.5 s of a 3.4 s
    startup through tensor() (benchmarks/README.md, "Startup, stage by stage")."""
    out: dict[str, mx.array] = {}
    if mx.default_device() != mx.cpu:  # the numpy view of an array's memory is a CPU's
        return {name: tensor(gguf, name) for name in names}
    workers = max(1, min(4, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1))
    with ThreadPoolExecutor(workers, thread_name_prefix="gguf-dequantize") as pool:
        pending = []
        for name in names:
            n_blocks = gguf.blocks(name)
            if not n_blocks:
                out[name] = tensor(gguf, name)
                continue
            array = mx.zeros(gguf.tensors[name].shape, mx.float32)
            mx.eval(array)
            try:  # frombuffer never copies: the writes reach `array`
                rows = np.frombuffer(memoryview(array), dtype=np.float32).reshape(n_blocks, -1)
            except (BufferError, TypeError, ValueError):
                rows = None
            if rows is None or not rows.flags.writeable:
                out[name] = tensor(gguf, name)
                continue
            pending += [pool.submit(gguf.dequantize_into, name, rows[i: i + _CHUNK], i, i + _CHUNK)
                        for i in range(0, n_blocks, _CHUNK)]
            out[name] = array
        for task in pending:
            task.result()
    return out


def build(checkpoint: Checkpoint, gguf: GGUFFile, dtype: str = "auto") -> tuple[nn.Module, Trunk, str, Projection | None]:
    """(model, trunk, family name, Dense projection or None) for the file `gguf` read as `checkpoint`; the model
    is the trunk itself, or the rank head around it. dtype: the compute dtype (--dtype; auto: float32 on a CPU),
    block formats dequantized to it."""
    mapping = for_architecture(gguf.architecture, str(checkpoint.path))
    family = importlib.import_module(f"engine.families.{mapping.FAMILY}")
    trunk = family.Model(family.ModelArgs.from_dict(checkpoint.config))
    trunk_weights, head_weights = {}, {}
    adapted = lora.deltas(gguf, checkpoint.lora) if checkpoint.lora else {}
    dense_keys = dict(getattr(mapping, "DENSE", ()))
    tables = {name: _affine_table(gguf, name) for name in _lookup_tables(gguf, adapted)}
    arrays = tensors(gguf, [name for name in gguf.tensors if name not in tables and (
        name in dense_keys or mapping.key(name) is not None or RankHead.key(name) is not None)])
    arrays.update({name: table[0] for name, table in tables.items()})
    dense_weights = {dense_keys[name]: arrays.pop(name) for name in gguf.tensors if name in dense_keys}
    for name in gguf.tensors:
        if name in dense_keys:
            continue
        hf_key = mapping.key(name)
        if hf_key is not None:
            weight = arrays.pop(name)  # a kept table's packed codes pass as they are (no mapping transforms one)
            if name in adapted:  # --lora: llama.cpp's adapters, merged
                weight = weight.astype(mx.float32) + mx.array(adapted.pop(name))
            if hasattr(mapping, "transform"):
                weight = mapping.transform(name, weight, checkpoint.config)
            trunk_weights[hf_key] = weight
        elif (head_key := RankHead.key(name)) is not None:
            head_weights[head_key] = arrays.pop(name)
        else:
            raise UnsupportedCheckpoint(f"{checkpoint.path}: tensor {name!r} has no place in the "
                                        f"{mapping.FAMILY} family (GGUF architecture {gguf.architecture!r})")
    if adapted:
        raise UnsupportedCheckpoint(f"{checkpoint.path}: --lora adapts {', '.join(sorted(adapted))}, which this "
                                    f"model reads as no weight of its trunk")
    if hasattr(mapping, "rename"):  # names that depend on the whole file (t5encoder's gated feed-forward)
        trunk_weights = mapping.rename(trunk_weights, checkpoint.config)
    model: nn.Module = trunk
    weights = trunk.sanitize(trunk_weights)
    if is_reranker(gguf):
        hidden = int(checkpoint.config["hidden_size"])
        cls_width = head_weights["cls.weight"].size // hidden if "cls.weight" in head_weights else hidden
        if "cls_output.weight" in head_weights:
            n_out = head_weights["cls_output.bias"].shape[0] if "cls_output.bias" in head_weights else \
                head_weights["cls_output.weight"].size // cls_width
        else:  # jina-bert-v2: `cls` is the classifier itself
            n_out = cls_width
        n_cls_out = len(checkpoint.config.get("id2label") or {}) or 1  # as llama.cpp: the labels' count, else 1
        if n_out != n_cls_out:
            raise UnsupportedCheckpoint(f"{checkpoint.path}: the classifier has {n_out} outputs but the file names "
                                        f"{n_cls_out} label(s) ({gguf.architecture}.classifier.output_labels); "
                                        f"llama.cpp refuses it too")
        options = {"pooling": Pooling.LAST if mapping.CAUSAL else Pooling.CLS, "softmax": gguf.architecture == "qwen3"}
        if hasattr(mapping, "head_options"):  # an architecture llama.cpp scores its own way (modern-bert)
            options.update(mapping.head_options(checkpoint.config))
        model = RankHead(trunk, hidden, n_out, present=set(head_weights), cls_width=cls_width, **options)
        weights = {**{f"trunk.{k}": v for k, v in weights.items()}, **head_weights}
        if mapping.FAMILY == "bert" and "cls.weight" not in head_weights:  # XLM-R conversions keep their head
            log.warning("%s: a BERT cross-encoder converted by llama.cpp has no pooler and no token types; it is "
                        "scored as llama-server scores it (classifier on the [CLS] state), which cannot reproduce "
                        "the original checkpoint's scores", checkpoint.path)
        if "cls.weight" in head_weights and "cls_output.weight" not in head_weights:  # jina-reranker-v1
            log.warning("%s: a jina reranker converted for llama.cpp has no pooler; it is scored as llama-server "
                        "scores it (tanh of the classifier on the [CLS] state), which cannot reproduce the original "
                        "checkpoint's scores", checkpoint.path)
    # ggml drops trailing dimensions of size 1 (a one-label classifier is stored as a vector): restore them
    expected = dict(tree_flatten(model.parameters()))
    weights = {k: v.reshape(expected[k].shape) if k in expected and v.shape != expected[k].shape
               and v.size == expected[k].size else v for k, v in weights.items()}
    weights, quant = _with_tables(model, weights, list(tables.values()))
    compute = compute_dtype(dtype, weights)
    materialize(model, weights, quant, compute, f"{checkpoint.path} ({mapping.FAMILY} family)")
    return model, trunk, mapping.FAMILY, _projection(dense_weights, checkpoint, compute)


# The token table is only looked up (a gather of the rows a pass reads), never multiplied, so in a format MLX's
# quantized arrays share (quants.AFFINE_BITS) it keeps its bits on every device: an nn.QuantizedEmbedding gives
# the rows dequantize_into would, bit for bit, from a fraction of the memory (SmolLM2-135M Q4_1's Q8_0 table:
# 35 MB against 113 MB of float32, and that much less to write at startup).
LOOKUP_TABLES = ("token_embd.weight",)

AffineTable = tuple[mx.array, mx.array, mx.array, int]  # packed codes, scales, biases, bits


def _lookup_tables(gguf: GGUFFile, adapted: dict) -> list[str]:
    """The tensors of LOOKUP_TABLES this file stores in an MLX-affine format (a --lora delta on one: float)."""
    return [name for name in LOOKUP_TABLES if name in gguf.tensors and name not in adapted
            and gguf.tensors[name].ggml_type in quants.AFFINE_BITS and len(gguf.tensors[name].shape) == 2]


def _affine_table(gguf: GGUFFile, name: str) -> AffineTable:
    info = gguf.tensors[name]
    packed, scales, biases = quants.to_mlx_affine(
        info.ggml_type, gguf.raw(name).reshape(gguf.blocks(name), -1), info.shape[0])
    return mx.array(packed), mx.array(scales), mx.array(biases), quants.AFFINE_BITS[info.ggml_type]


def _with_tables(model: nn.Module, weights: dict[str, mx.array],
                 tables: list[AffineTable]) -> tuple[dict[str, mx.array], Quantization | None]:
    """The final weights with each kept table's scales and biases beside its codes, where the family looks it up
    through a plain nn.Embedding large enough (weights.keeps_lookup_bits; else the table dequantized, as every
    other tensor), and the quantization that makes those embeddings MLX's quantized ones (None: none kept)."""
    if not tables:
        return weights, None
    by_codes = {id(table[0]): table for table in tables}
    modules = dict(model.named_modules())
    out, layers = dict(weights), {}
    for key, value in weights.items():
        table = by_codes.get(id(value))
        if table is None:
            continue
        codes, scales, biases, bits = table
        path = key.removesuffix(".weight")
        if key.endswith(".weight") and path in modules and keeps_lookup_bits(modules[path]):
            out[f"{path}.scales"], out[f"{path}.biases"] = scales, biases
            layers[path] = {"group_size": quants.AFFINE_GROUP, "bits": bits}
        else:
            out[key] = mx.dequantize(codes, scales, biases, group_size=quants.AFFINE_GROUP, bits=bits)
    if not layers:
        return out, None
    first = next(iter(layers.values()))
    return out, Quantization(first["group_size"], first["bits"], layers)


def _projection(dense: dict[str, mx.array], checkpoint: Checkpoint, compute: mx.Dtype) -> Projection | None:
    """sentence-transformers' Dense layers kept by the converter (identity activations, no bias)."""
    if not dense:
        return None
    layers = [dense[f"dense.{i}.weight"] for i in range(len(dense))]
    shapes = [(w.shape[1], w.shape[0], False) for w in layers]
    if shapes[0][0] != int(checkpoint.config["hidden_size"]) or any(a[1] != b[0] for a, b in zip(shapes, shapes[1:])):
        raise UnsupportedCheckpoint(f"{checkpoint.path}: Dense layers of widths {shapes} do not chain from the "
                                    f"hidden size {checkpoint.config['hidden_size']}")
    projection = Projection(shapes, ("torch.nn.modules.linear.Identity",) * len(shapes))
    materialize(projection, dense, None, compute, f"{checkpoint.path} (Dense layers)")
    return projection


def file_counts(gguf: GGUFFile) -> tuple[int, int]:
    """(n_params, size in bytes) as llama.cpp counts them: every tensor of the file."""
    return (sum(t.n_elements for t in gguf.tensors.values()), sum(t.nbytes for t in gguf.tensors.values()))
