"""The model catalog: which models a several-model server serves, from the sections of --models-preset, the
model sections of --config, --embedding-model / --reranker-model, and -m beside them. Reads files only; no
engine here.

A model section is named after the model's id and holds per-model options under their command-line names
(compat/settings/per_model.py's ModelSettings resolves them, llama's router precedence). Without any of these
sources the server is the single-model one, and read_catalog says so by returning None.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from compat.presets import (
    GLOBAL_SECTIONS,
    LOAD_ON_STARTUP,
    PRESET_ONLY_KEYS,
    IniEntry,
    IniSection,
    PresetError,
    read_ini,
)
from compat.settings import FALSEY, TRUTHY, ModelSettings, Settings, SettingsError
from engine.types import EngineOptions, Pooling

Kind = Literal["embedding", "rerank"]
EMBEDDING: Kind = "embedding"
RERANK: Kind = "rerank"

_REPOSITORY = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+(?::[\w.-]+)?")  # org/name[:quant]


@dataclass(frozen=True)
class ModelSpec:
    """One configured model."""

    id: str
    aliases: tuple[str, ...]
    tags: tuple[str, ...]
    kind: Kind
    settings: Settings  # the server's settings with this model's per-model options
    options: EngineOptions
    load_on_startup: bool
    source: str  # where it was declared, for messages

    @property
    def names(self) -> tuple[str, ...]:
        """Everything a request's `model` may say to pick it."""
        return tuple(dict.fromkeys((self.id, *self.aliases)))


@dataclass(frozen=True)
class Catalog:
    """Every configured model, in declaration order: the first of a kind is that kind's default."""

    models: tuple[ModelSpec, ...]
    by_name: dict[str, ModelSpec] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # built once per configuration, so a request looks its model up in one step
        object.__setattr__(self, "by_name", {name: spec for spec in self.models for name in spec.names})

    def find(self, name: str) -> ModelSpec | None:
        return self.by_name.get(name)

    def first(self, kind: Kind | None) -> ModelSpec | None:
        """The default model for `kind` (None: any kind)."""
        return next((spec for spec in self.models if kind is None or spec.kind == kind), None)

    @property
    def ids(self) -> list[str]:
        return [spec.id for spec in self.models]


@dataclass(frozen=True)
class _ModelsFile:
    globals: tuple[IniSection, ...]  # [*], [default] and keys before any section
    models: tuple[IniSection, ...]
    load_on_startup: bool  # the global default of load-on-startup


def read_catalog(settings: Settings) -> Catalog | None:
    """The models to serve, or None for the single-model server (-m alone, or nothing).

    Order: the -m model, the --config file's model sections, the preset's sections, --embedding-model,
    --reranker-model. Raises SettingsError naming the file, section and key of a mistake; the files are read
    on every call, so a reload calls this again.
    """
    config = _read_models_file(Path(settings.config)) if settings.config else None
    preset = _read_models_file(Path(settings.models_preset)) if settings.models_preset else None
    # each model section with its file's load-on-startup default
    sections = [(section, file.load_on_startup) for file in (config, preset) if file for section in file.models]
    if not (sections or preset or settings.embedding_model or settings.reranker_model):
        return None
    # --config's global section is already one of the server's config files; only the preset's is added
    resolver = ModelSettings(settings, preset.globals if preset else ())
    specs = []
    if settings.model or settings.hf_repo:
        resolved = resolver.resolve(None)
        specs.append(_spec(resolved.model_name, resolved, _kind_of(resolved), "-m", load_on_startup=False))
    specs += [_section_spec(resolver, section, load_default) for section, load_default in sections]
    for flag, kind, refs in (("--embedding-model", EMBEDDING, settings.embedding_model),
                             ("--reranker-model", RERANK, settings.reranker_model)):
        specs += [_shorthand_spec(resolver, flag, text, kind) for text in refs]
    if not specs:
        raise SettingsError("no models to serve: give --models-preset a [section] per model, or use "
                            "--embedding-model / --reranker-model")
    _check_names(specs)
    return Catalog(tuple(specs))


def _read_models_file(path: Path) -> _ModelsFile:
    try:
        sections = read_ini(path)
    except PresetError as exc:
        raise SettingsError(str(exc)) from None
    as_sections = [IniSection(str(path), name, tuple(entries)) for name, entries in sections.items()]
    globals_ = [section for section in as_sections if section.name in GLOBAL_SECTIONS]
    default = any(_flag(section, entry) for section in globals_ for entry in section.entries
                  if entry.key == LOAD_ON_STARTUP)
    return _ModelsFile(tuple(_without_preset_keys(section) for section in globals_),
                       tuple(section for section in as_sections if section.name not in GLOBAL_SECTIONS), default)


def _section_spec(resolver: ModelSettings, section: IniSection, load_default: bool) -> ModelSpec:
    load_on_startup = load_default
    for entry in section.entries:
        if entry.key == LOAD_ON_STARTUP:
            load_on_startup = _flag(section, entry)
    options = _without_preset_keys(section)
    resolved = resolver.resolve(options)
    if not (resolved.model or resolved.hf_repo):  # llama: a section named after a model needs no model key
        entry = _reference(section.name, f"{section.source}: [{section.name}]: no model (add model = FOLDER "
                                         f"or hf-repo = ORG/NAME, or name the section after one)")
        resolved = resolver.resolve(IniSection(section.source, section.name, (entry, *options.entries)))
    return _spec(section.name, resolved, _kind_of(resolved), f"[{section.name}] in {section.source}",
                 load_on_startup)


def _shorthand_spec(resolver: ModelSettings, flag: str, text: str, kind: Kind) -> ModelSpec:
    """--embedding-model / --reranker-model REF[=ALIAS]: REF a folder or org/name; the id is ALIAS, else REF."""
    ref, sep, alias = text.rpartition("=")
    if not sep:
        ref, alias = text, ""
    if not ref or (sep and not alias):
        raise SettingsError(f"{flag} {text}: expected REF or REF=ALIAS")
    mode = IniEntry("reranking" if kind == RERANK else "embedding", "true", 0)
    section = IniSection(flag, alias or ref, (_reference(ref, f"{flag} {text}: {ref!r} is neither a model folder "
                                                              f"nor a Hugging Face repository (org/name)"), mode))
    resolved = resolver.resolve(section)
    if kind == EMBEDDING and resolved.pooling is Pooling.RANK:  # an inherited --reranking is not this model's
        resolved = resolved.model_copy(update={"pooling": None, "reranking": False})
    return _spec(alias or ref, resolved, kind, f"{flag} {text}", load_on_startup=False)


def _spec(model_id: str, settings: Settings, kind: Kind, source: str, load_on_startup: bool) -> ModelSpec:
    settings = settings.model_copy(update={"embedding": True})  # every model serves its kind's routes
    return ModelSpec(id=model_id, aliases=tuple(settings.alias), tags=tuple(settings.tags), kind=kind,
                     settings=settings, options=settings.engine_options(settings.model),
                     load_on_startup=load_on_startup, source=source)


def _kind_of(settings: Settings) -> Kind:
    return RERANK if settings.pooling is Pooling.RANK else EMBEDDING


def _reference(ref: str, problem: str) -> IniEntry:
    """The option a REF stands for: a folder or (GGUF) file that exists is -m, an org/name[:quant] is -hf."""
    if Path(ref).expanduser().exists():
        return IniEntry("model", ref, 0)
    if _REPOSITORY.fullmatch(ref):
        return IniEntry("hf-repo", ref, 0)
    raise SettingsError(problem)


def _without_preset_keys(section: IniSection) -> IniSection:
    return IniSection(section.source, section.name,
                      tuple(entry for entry in section.entries if entry.key not in PRESET_ONLY_KEYS))


def _flag(section: IniSection, entry: IniEntry) -> bool:
    if entry.value not in TRUTHY and entry.value not in FALSEY:
        raise SettingsError(f"{section.where(entry)}: expected true or false, not {entry.value!r}")
    return entry.value in TRUTHY


def _check_names(specs: list[ModelSpec]) -> None:
    """Ids and aliases pick one model each (llama refuses a name or alias used twice, too)."""
    owner: dict[str, ModelSpec] = {}
    for spec in specs:
        for name in spec.names:
            if name in owner:
                raise SettingsError(f'the model name "{name}" is used twice: by {owner[name].source} and by '
                                    f"{spec.source}")
            owner[name] = spec
