"""A Hugging Face model folder (config.json, safetensors weights, sentence-transformers modules, tokenizer) as
one implementation of the checkpoint-format seam (engine/loading/formats.py)."""
from __future__ import annotations

import importlib
import json
from pathlib import Path
from types import ModuleType
from typing import Any

import mlx.core as mx

from engine.checkpoint import Checkpoint, Splade, read_json, read_json_optional
from engine.errors import CheckpointNotFound, UnsupportedCheckpoint
from engine.loading import heads, registry, weights
from engine.text.tokenizer import TextTokenizer
from engine.types import Pooling

# sentence-transformers module types we understand, by their last dotted name. Checkpoints spell the full
# path in several historical ways (models.Pooling, sentence_transformers.base.modules.…); only the class
# name matters, and it is data: we never import what a checkpoint names.
_KNOWN_MODULES = {"Transformer", "Pooling", "Normalize", "Dense", "LogitScore", "MLMTransformer", "SpladePooling"}
# A SparseEncoder's SpladePooling: its pooling strategies and activations (sentence-transformers' SpladePooling)
_SPLADE_STRATEGIES = ("max", "sum")
_SPLADE_ACTIVATIONS = ("relu", "log1p_relu")

# 1_Pooling modes we implement, in both key styles.
_POOLING_NAMES = {"cls": Pooling.CLS, "mean": Pooling.MEAN, "max": Pooling.MAX, "lasttoken": Pooling.LAST}
_LEGACY_POOLING_KEYS = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_lasttoken": "lasttoken",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
}
# tokenizer_config.json uses a huge sentinel for "no limit".
_MAX_SANE_LENGTH = 1_000_000


class SafetensorsFormat:
    """A model folder: its config files read into the Checkpoint, its family found by config.json
    (engine/loading/registry.py), its weights loaded from model.safetensors (or its shards)."""

    name = "safetensors"

    @classmethod
    def require(cls, path: Path, given: str) -> None:
        if not (path / "config.json").is_file():
            refuse_adapter(path)
            raise CheckpointNotFound(f"{given}: not a Hugging Face model folder (no config.json) nor a .gguf file")

    @classmethod
    def read(cls, path: Path, label: str = "") -> Checkpoint:
        config = read_json(path / "config.json")
        tokenizer_config = read_json_optional(path / "tokenizer_config.json")
        special_tokens = read_json_optional(path / "special_tokens_map.json")
        modules = read_json_optional(path / "modules.json") or []  # sentence-transformers' module list
        pooling = _read_pooling(path / "1_Pooling" / "config.json")
        prompts, default_prompt_name = _read_prompts(path / "config_sentence_transformers.json")
        sbert = read_json_optional(path / "sentence_bert_config.json")
        message = (sbert.get("modality_config") or {}).get("message")
        return Checkpoint(
            path=path,
            config=config,
            tokenizer_config=tokenizer_config,
            special_tokens=special_tokens,
            module_types=_module_types(modules, path / "modules.json"),
            pooling=pooling,
            max_seq_length=_max_seq_length(sbert, tokenizer_config),
            prompts=prompts,
            default_prompt_name=default_prompt_name,
            message_modality=message if isinstance(message, dict) else None,
            chat_template_kwargs=dict((sbert.get("processing_kwargs") or {}).get("chat_template") or {}),
            dense_folders=tuple(path / str(m.get("path", "")) for m in modules
                                if str(m.get("type", "")).endswith(".Dense")),
            logit_score=_logit_score(path, modules),
            splade=_read_splade(path, modules, sbert),
            label=label,
            format=cls(),
        )

    def open_tokenizer(self, checkpoint: Checkpoint) -> TextTokenizer:
        """tokenizer.json, else a SentencePiece model or transformers' conversion (engine/text/tokenizer.py)."""
        return TextTokenizer(checkpoint)

    def kind_of(self, checkpoint: Checkpoint, rank: bool = False) -> str:
        return registry.kind_of(checkpoint, rank)

    def load(self, checkpoint: Checkpoint, kind: str, dtype: str = "auto",
             keep_quantized: bool = False) -> registry.LoadedModel:
        """Build the family's module for this checkpoint and load its weights (strict: every key must match);
        MLX-quantized layers keep their bits on a GPU or with keep_quantized, else are dequantized at load."""
        name = registry.family_name(checkpoint)
        family: ModuleType = importlib.import_module(f"engine.families.{name}")
        model_class = registry.model_class(family, checkpoint)
        args = family.ModelArgs.from_dict(checkpoint.config)
        quant = weights.quantization(checkpoint.config)
        raw: dict[str, mx.array] = {}
        for file in weight_files(checkpoint.path):
            raw.update(mx.load(str(file)))
        projection = tensors = None
        if kind == registry.GENERATIVE_RERANKER:
            model = trunk = family.CausalLM(args)
        elif kind in (registry.CROSS_ENCODER, registry.CLASSIFIER):
            cls = family.SequenceClassifier
            tensors = cls.sanitize(raw)  # sanitized once: the label count reads it, then the model loads it
            labels = cls.label_count(tensors)
            named = len(registry.label_names(checkpoint))
            if labels != named:
                raise UnsupportedCheckpoint(
                    f"{checkpoint.path}: its classifier head has {labels} rows but config.json names {named} "
                    f"label{'s' if named > 1 else ''} (id2label / num_labels); a cross-encoder has one label, a "
                    f"sequence classifier names each of its labels")
            model = cls(args, labels)
            trunk = model.trunk
        elif checkpoint.splade is not None:  # a sparse encoder: the trunk and its MLM head
            model = registry.masked_lm_class(family, checkpoint)(args)
            trunk = model.trunk
        elif model_class.multi_vector:  # it projects each token itself
            model = trunk = model_class(args)
            folders = checkpoint.dense_folders or tuple(f for f in (checkpoint.path / "1_Dense",) if f.is_dir())
            if folders:
                if trunk.projection_prefix is None:
                    raise UnsupportedCheckpoint(f"{checkpoint.path}: Dense modules beside a {name} checkpoint are "
                                                f"not supported (the family projects its tokens itself)")
                raw = heads.replace_own_projection(raw, folders, trunk.projection_prefix)
        else:
            model = trunk = model_class(args)
            try:
                projection, dense, raw = heads.split_projection(raw, checkpoint.dense_folders, trunk.hidden_size,
                                                                quant.bits if quant else None)
            except UnsupportedCheckpoint as exc:
                raise UnsupportedCheckpoint(f"{checkpoint.path}: {exc}") from exc
        if tensors is None:
            tensors = model.sanitize(raw)
        dtype_ = weights.compute_dtype(dtype, tensors)
        keep = weights.keeps_bits(keep_quantized)
        weights.materialize(model, tensors, quant, dtype_, f"{checkpoint.path} ({name} family)", keep)
        n_params, size_bytes = weights.size(model)
        if projection is not None:
            weights.materialize(projection, dense, quant, dtype_, f"{checkpoint.path} (Dense modules)", keep)
            extra_params, extra_bytes = weights.size(projection)
            n_params, size_bytes = n_params + extra_params, size_bytes + extra_bytes
        loaded = registry.LoadedModel.of(
            model, trunk, family=name, kind=kind, n_params=n_params, size_bytes=size_bytes,
            ftype=weights.ftype({**tensors, **(dense if projection is not None else {})}, quant),
            default_pooling=registry.default_pooling(checkpoint), projection=projection,
            input_builder=registry.input_builder(name, kind),
            weights=weights.placement(quant is not None, keep, dtype_))
        if checkpoint.splade is not None:  # one vector over the vocabulary
            loaded.hidden_size, loaded.default_pooling = int(args.vocab_size), Pooling.SPLADE
        return loaded


def weight_files(path: Path) -> list[Path]:
    """model.safetensors, or the shards its index names (each once, in name order)."""
    single = path / "model.safetensors"
    if single.exists():
        return [single]
    index = path / "model.safetensors.index.json"
    if index.exists():
        names = sorted(set(read_json(index)["weight_map"].values()))
        return [path / n for n in names]
    refuse_adapter(path)
    raise UnsupportedCheckpoint(
        f"{path}: no model.safetensors (or index) found; only safetensors checkpoints are supported")


def refuse_adapter(path: Path) -> None:
    """A PEFT adapter (vidore/colqwen2.5-v0.2, colSmol, LLM2Vec): we load whole models, never merge adapters."""
    if (path / "adapter_model.safetensors").is_file() or (path / "adapter_config.json").is_file():
        raise UnsupportedCheckpoint(f"{path}: a PEFT adapter (adapter_model.safetensors), not a whole model; merge it "
                                    f"into its base model (peft's merge_and_unload) and save the result first")


def _module_types(modules: list[dict[str, Any]], modules_file: Path) -> tuple[str, ...]:
    names = []
    for module in modules:
        name = str(module.get("type", "")).rsplit(".", 1)[-1]
        if name not in _KNOWN_MODULES:
            raise UnsupportedCheckpoint(
                f"{modules_file}: sentence-transformers module {module.get('type')!r} is not supported "
                f"(supported: {', '.join(sorted(_KNOWN_MODULES))})")
        # A listed folder may be absent (MiniLM lists a 2_Normalize folder it does not ship): fine.
        names.append(name)
    return tuple(names)


def _logit_score(path: Path, modules: list[dict[str, Any]]) -> tuple[int, int] | None:
    """The token ids a LogitScore module compares (its config.json's true_token_id and false_token_id)."""
    for module in modules:
        if str(module.get("type", "")).endswith(".LogitScore"):
            config_file = path / str(module.get("path", "")) / "config.json"
            config = read_json(config_file)
            ids = config.get("true_token_id"), config.get("false_token_id")
            if not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
                raise UnsupportedCheckpoint(f"{config_file}: a LogitScore module needs integer true_token_id and "
                                            f"false_token_id")
            return ids[0], ids[1]
    return None


def _read_splade(path: Path, modules: list[dict[str, Any]], sbert: dict[str, Any]) -> Splade | None:
    """A SparseEncoder's SPLADE head: a masked-LM Transformer (MLMTransformer, or a Transformer whose
    sentence_bert_config.json says transformer_task "fill-mask") followed by SpladePooling, and nothing else."""
    names = [str(m.get("type", "")).rsplit(".", 1)[-1] for m in modules]
    if "SpladePooling" not in names:
        if "MLMTransformer" in names:
            raise UnsupportedCheckpoint(f"{path / 'modules.json'}: an MLMTransformer without SpladePooling is not "
                                        f"supported (a sparse encoder is MLMTransformer + SpladePooling)")
        return None
    masked_lm = names[0] == "MLMTransformer" or (names[0] == "Transformer"
                                                 and sbert.get("transformer_task") == "fill-mask")
    if names[1:] != ["SpladePooling"] or not masked_lm:
        raise UnsupportedCheckpoint(
            f"{path / 'modules.json'}: sparse encoder modules {' + '.join(names)} are not supported (supported: a "
            f"masked-LM Transformer followed by SpladePooling)")
    config_file = path / str(modules[1].get("path", "")) / "config.json"
    config = read_json_optional(config_file)
    strategy = config.get("pooling_strategy", "max")
    activation = config.get("activation_function", "relu")
    if strategy not in _SPLADE_STRATEGIES or activation not in _SPLADE_ACTIVATIONS:
        raise UnsupportedCheckpoint(
            f"{config_file}: SpladePooling with pooling_strategy {strategy!r} and activation_function "
            f"{activation!r} is not supported (supported: {', '.join(_SPLADE_STRATEGIES)}; "
            f"{', '.join(_SPLADE_ACTIVATIONS)})")
    top = read_json_optional(path / "config_sentence_transformers.json").get("max_active_dims")
    if top is not None and (isinstance(top, bool) or not isinstance(top, int) or top <= 0):
        raise UnsupportedCheckpoint(f"{path / 'config_sentence_transformers.json'}: max_active_dims must be a "
                                    f"positive integer, not {top!r}")
    return Splade(strategy=strategy, activation=activation, max_active_dims=top)


def _read_pooling(path: Path) -> Pooling | None:
    if not path.is_file():
        return None
    cfg = json.loads(path.read_text(encoding="utf-8"))
    if cfg.get("include_prompt") is False:
        raise UnsupportedCheckpoint(f"{path}: include_prompt=false pooling is not supported")
    if "pooling_mode" in cfg:  # sentence-transformers >= 6 style
        mode = str(cfg["pooling_mode"])
    else:
        chosen = [mode for key, mode in _LEGACY_POOLING_KEYS.items() if cfg.get(key)]
        if len(chosen) > 1:
            raise UnsupportedCheckpoint(f"{path}: combined pooling modes {chosen} are not supported")
        mode = chosen[0] if chosen else "mean"
    if mode not in _POOLING_NAMES:
        raise UnsupportedCheckpoint(f"{path}: pooling mode {mode!r} is not supported "
                                    f"(supported: {', '.join(_POOLING_NAMES)})")
    return _POOLING_NAMES[mode]


def _read_prompts(path: Path) -> tuple[dict[str, str], str | None]:
    """sentence-transformers' `prompts` ({name: text}) and `default_prompt_name`, checked to agree.

    pylate's ColBERT checkpoints also name a `query_prefix` and a `document_prefix` (a token such as "[Q] " put
    right after the first token of a query or document): they lead the "query" and "document" prompts, so that
    those names are the model's prompts (what /props lists and a request's prompt_name picks); a ColBERT model
    applies them itself, as tokens (engine/text/late_interaction.py)."""
    cfg = read_json_optional(path)
    prompts = cfg.get("prompts") or {}
    if not isinstance(prompts, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                for k, v in prompts.items()):
        raise UnsupportedCheckpoint(f"{path}: 'prompts' must map prompt names to strings")
    prompts = dict(prompts)
    for name in ("query", "document"):
        prefix = cfg.get(f"{name}_prefix")
        if isinstance(prefix, str) and prefix:
            prompts[name] = prefix + prompts.get(name, "")
    default = cfg.get("default_prompt_name")
    if default is not None and default not in prompts:
        raise UnsupportedCheckpoint(f"{path}: default_prompt_name {default!r} is not one of its prompts "
                                    f"({', '.join(sorted(prompts)) or 'none'})")
    return dict(prompts), default


def _max_seq_length(sbert: dict[str, Any], tokenizer_config: dict[str, Any]) -> int | None:
    if isinstance(sbert.get("max_seq_length"), int) and sbert["max_seq_length"] > 0:
        return sbert["max_seq_length"]
    # sentence-transformers >= 6 moved max_seq_length here.
    value = tokenizer_config.get("model_max_length")
    if isinstance(value, (int, float)) and 0 < value < _MAX_SANE_LENGTH:
        return int(value)
    return None
