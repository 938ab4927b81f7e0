"""Per-model settings: what each model of a several-model server runs with, resolved from the same layers as
the server's own options plus the models preset's sections."""
from __future__ import annotations

from collections.abc import Sequence

from compat.presets import IniSection
from compat.settings.resolver import Resolver, validated
from compat.settings.server_options import MODEL_IDENTITY, MODEL_KIND, PER_MODEL_FIELDS, Settings


class ModelSettings:
    """The settings each model of a several-model server runs with, resolved as llama's router does.

    Per-model options, low to high: defaults, the config files' global sections, the models preset's [*], the
    model's own section, then the environment and the command line. On the command line, -m/-hf/--alias/--tags
    and --embedding/--reranking/--pooling describe the -m model only; its other per-model options override
    every model (llama: "command-line arguments have the highest priority"). Server-wide options are the
    server's own whatever a file says. Files are read when this is made: make a new one to re-read them.
    """

    def __init__(self, settings: Settings, preset_globals: Sequence[IniSection] = ()) -> None:
        self._settings = settings
        self._base = Resolver(quiet=True)
        for path in settings._config_files:
            self._base.apply_ini(path, only=PER_MODEL_FIELDS)
        for section in preset_globals:
            self._base.apply_section(section, names_a_model=False)

    def resolve(self, section: IniSection | None) -> Settings:
        """The settings of the model `section` declares; None: the command line's -m model."""
        resolver = self._base.copy()
        only = PER_MODEL_FIELDS
        if section is not None:
            resolver.forget(MODEL_IDENTITY)  # a section names its own checkpoint
            resolver.apply_section(section, names_a_model=True)
            only = PER_MODEL_FIELDS - MODEL_IDENTITY - MODEL_KIND
        environment, command_line = self._settings._environment, self._settings._command_line
        resolver.apply_env(environment, only)
        resolver.apply_command_line(command_line, environment, only)
        resolved = validated(resolver.values, f"{section.source}: [{section.name}]: " if section else "")
        return self._settings.model_copy(update={field: getattr(resolved, field) for field in PER_MODEL_FIELDS})
