"""The layered resolver: the server's options from, low to high, the defaults, the system config files
(/etc/llama.cpp/config.ini, then the user's), `--config FILE`, the LLAMA_ARG_* environment and the command
line, as llama-server resolves them (docs/llama-server-contract.md §7.1); pydantic validates the result.

Besides compat/cli.py (which hands over sys.argv and os.environ), this is the only code that reads the command
line or the environment: every other module gets a Settings.
"""
from __future__ import annotations

import copy
import logging
import stat
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from compat.presets import GLOBAL_SECTIONS, PRESET_ONLY_KEYS, IniSection, PresetError, read_ini
from compat.settings.declaration import (
    FALSEY,
    TRUTHY,
    ExplicitSettings,
    HelpRequested,
    Option,
    SettingsError,
    spelling_index,
)
from compat.settings.help import format_help
from compat.settings.server_options import MODEL_IDENTITY, SERVER_OPTIONS, SERVER_OPTIONS_BY_FIELD, Settings

logger = logging.getLogger("compat.settings")  # the name its log lines have always carried

SYSTEM_CONFIG_FILE = Path("/etc/llama.cpp/config.ini")

_BY_FLAG = spelling_index(lambda flag: flag, SERVER_OPTIONS)
# INI keys: any spelling without its dashes, or the env name.
_BY_INI_KEY = spelling_index(lambda flag: flag.lstrip("-"), SERVER_OPTIONS)
_BY_INI_KEY.update({opt.env: (opt, False) for opt in SERVER_OPTIONS if opt.env})

_HELP_FLAGS = ("-h", "--help", "--usage")


def _no_env(env: str) -> str:
    return env.replace("LLAMA_ARG_", "LLAMA_ARG_NO_")


def _ini_option(key: str) -> tuple[Option, bool] | None:
    return _BY_INI_KEY.get(key) or _BY_INI_KEY.get(key.replace("_", "-"))


def _env_is_set(opt: Option, environ: Mapping[str, str]) -> bool:
    return opt.env is not None and (opt.env in environ or (opt.kind == "paired" and _no_env(opt.env) in environ))


# Every variable an option reads, LLAMA_ARG_NO_X included: what a Settings keeps of the environment.
_OPTION_VARIABLES = frozenset(name for opt in SERVER_OPTIONS if opt.env
                              for name in (opt.env, *([_no_env(opt.env)] if opt.kind == "paired" else [])))


def _csv(text: str) -> list[str]:
    return [item.strip() for item in text.split(",") if item.strip()]


def _read_key_file(path: str) -> list[str]:
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
        mode = Path(path).stat().st_mode
    except OSError as exc:
        raise ValueError(f"failed to open file '{path}': {exc.strerror}") from None
    if mode & stat.S_IROTH:
        logger.warning("warning: the API key file %s is readable by every user of this machine (mode %s); "
                       "restrict it, e.g. chmod 600 %s", path, stat.filemode(mode), path)
    return [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]


@contextmanager
def handling(where: str) -> Iterator[None]:
    """Reword a bad value as llama does, naming where it came from."""
    try:
        yield
    except ValueError as exc:
        raise SettingsError(f"error while handling {where}: {exc}") from None


@dataclass(frozen=True)
class CommandLineArg:
    """One option found on the command line."""

    opt: Option
    spelling: str  # as typed, underscores made hyphens
    value: str | None
    negated: bool


def read_command_line(argv: list[str], by_flag: Mapping[str, tuple[Option, bool]] = _BY_FLAG,
                      help_text: Callable[[], str] = format_help) -> list[CommandLineArg]:
    """Split argv into options and their values, before anything is applied."""
    found = []
    i = 0
    while i < len(argv):
        token = argv[i]
        i += 1
        name, equals, value = token.partition("=") if token.startswith("-") else (token, "", "")
        inline = value if equals else None
        if name.startswith("--"):
            name = name.replace("_", "-")
        if name in _HELP_FLAGS:
            raise HelpRequested(help_text())
        if name not in by_flag:
            raise SettingsError(f"invalid argument: {token}")
        opt, negated = by_flag[name]
        if opt.arity == "none" and inline is not None:
            raise SettingsError(f'error while handling argument "{name}": this option takes no value')
        if opt.arity == "one" and inline is None:
            if i == len(argv):
                raise SettingsError(f'error while handling argument "{name}": expected value for argument')
            inline = argv[i]
            i += 1
        if opt.arity == "optional" and inline is None and i < len(argv) and argv[i] in opt.choices:
            inline = argv[i]
            i += 1
        found.append(CommandLineArg(opt, name, inline, negated))
    return found


class Resolver:
    """Applies options layer by layer onto a dict of field values, each later application winning."""

    def __init__(self, quiet: bool = False) -> None:
        self.values: dict[str, Any] = {}
        # An accumulating option gathers repeats within one layer; a higher layer replaces what it gathered.
        self._filled_by: dict[str, str] = {}
        self._ignored_seen: set[Option] = set()
        self._quiet = quiet  # resolving one model: what the server's own parse logged is not logged again

    def copy(self) -> Resolver:
        twin = Resolver(self._quiet)
        twin.values = copy.deepcopy(self.values)
        twin._filled_by = dict(self._filled_by)
        return twin

    def forget(self, fields: Collection[str]) -> None:
        for field in fields:
            self.values.pop(field, None)
            self._filled_by.pop(field, None)

    def apply(self, opt: Option, value: str | bool, layer: str) -> None:
        """value: the text of a value/accumulating option, the on/off state of a flag/paired one."""
        assert opt.field is not None
        if isinstance(value, bool):
            self.values[opt.field] = value
            if value:
                self.values.update(opt.implies)
        elif opt.kind == "accumulating":
            self._extend(opt.field, _csv(value), layer)
        elif opt.kind == "repeated":
            self._extend(opt.field, [value], layer)
        else:
            self.values[opt.field] = opt.convert(value)
            if opt.field == "api_key_file":
                self._extend("api_key", _read_key_file(value), layer)

    def _extend(self, field: str, items: list[str], layer: str) -> None:
        if self._filled_by.get(field) != layer:
            self._filled_by[field] = layer
            self.values[field] = []
        self.values[field].extend(items)

    def ignore(self, opt: Option, spelling: str) -> None:
        if opt not in self._ignored_seen and not self._quiet:
            self._ignored_seen.add(opt)
            logger.info("ignoring %s: not used by mlx-embed-server", spelling)

    def _apply_text(self, opt: Option, negated: bool, text: str, layer: str) -> None:
        """An INI value: flags apply whatever it says, as llama does; paired options read it as a boolean."""
        if opt.kind == "flag":
            self.apply(opt, True, layer)
        elif opt.kind == "paired":
            self.apply(opt, (text in TRUTHY) != negated, layer)
        else:
            self.apply(opt, text, layer)

    def apply_ini(self, path: Path, only: Collection[str] | None = None) -> None:
        """A config file's global sections (as llama: [*], [default] and keys before any section)."""
        try:
            sections = read_ini(path)
        except PresetError as exc:
            raise SettingsError(str(exc)) from None
        if not self._quiet:
            logger.info("using config file: %s", path)
        layer = f"file:{path}"
        for section, entries in sections.items():
            if section not in GLOBAL_SECTIONS:
                continue
            for entry in entries:
                if entry.key == "version" or entry.key in PRESET_ONLY_KEYS:  # llama's; catalog.py reads them
                    continue
                found = _ini_option(entry.key)
                if found is None:
                    if not self._quiet:
                        logger.warning("%s:%d: unknown key %r ignored", path, entry.line, entry.key)
                    continue
                opt, negated = found
                if opt.field is None:
                    self.ignore(opt, entry.key)
                elif only is not None and opt.field not in only:
                    continue
                elif opt.field == "config":  # config files do not chain
                    if not self._quiet:
                        logger.warning("%s:%d: key %r ignored in a config file", path, entry.line, entry.key)
                else:
                    with handling(f'key "{entry.key}" in {path} line {entry.line}'):
                        self._apply_text(opt, negated, entry.value, layer)

    def apply_section(self, section: IniSection, *, names_a_model: bool) -> None:
        """A models preset's [*] or one model's section: per-model options only, and strictly (anything else
        is an error naming the file, the section and the key)."""
        layer = f"section:{section.source}:{section.name}"
        for entry in section.entries:
            if entry.key == "version":
                continue
            where = section.where(entry)
            found = _ini_option(entry.key)
            if found is None:
                raise SettingsError(f"{where}: no such option")
            opt, negated = found
            if opt.field is None:  # a llama option without meaning here: accepted, as on the command line
                continue
            if not opt.per_model:
                raise SettingsError(f"{where}: a server-wide option, not a model's; set it on the command line, "
                                    f"in the environment or in the [*] section of --config")
            if not names_a_model and opt.field in MODEL_IDENTITY:
                raise SettingsError(f"{where}: names one model; put it in that model's own section")
            try:
                self._apply_text(opt, negated, entry.value, layer)
            except ValueError as exc:
                raise SettingsError(f"{where}: {exc}") from None

    def apply_env(self, environ: Mapping[str, str], only: Collection[str] | None = None) -> None:
        for opt in SERVER_OPTIONS:
            if opt.env is None or not _env_is_set(opt, environ) or (only is not None and opt.field not in only):
                continue
            with handling(f'environment variable "{opt.env}"'):
                if opt.kind == "paired" and _no_env(opt.env) in environ:
                    self.apply(opt, False, "env")  # LLAMA_ARG_NO_X, whatever its value, wins
                    continue
                text = environ[opt.env]
                if opt.kind == "flag":
                    if text in TRUTHY:  # anything else is silently ignored, as llama does
                        self.apply(opt, True, "env")
                elif opt.kind == "paired":
                    if text not in TRUTHY and text not in FALSEY:
                        raise ValueError("invalid boolean value")
                    self.apply(opt, text in TRUTHY, "env")
                else:
                    self.apply(opt, text, "env")

    def apply_command_line(self, args: Sequence[CommandLineArg], environ: Mapping[str, str],
                           only: Collection[str] | None = None) -> None:
        for arg in args:
            if only is not None and arg.opt.field not in only:
                continue
            if arg.opt.field is None:
                self.ignore(arg.opt, arg.spelling)
                continue
            if _env_is_set(arg.opt, environ) and not self._quiet:
                logger.warning("warn: %s environment variable is set, but will be overwritten by command line "
                               "argument %s", arg.opt.env, arg.spelling)
            with handling(f'argument "{arg.spelling}"'):
                self.apply(arg.opt, not arg.negated if arg.value is None else arg.value, "cli")


def _user_config_file(environ: Mapping[str, str]) -> Path | None:
    """${XDG_CONFIG_HOME:-$HOME/.config}/llama.cpp/config.ini; None without either variable."""
    if base := environ.get("XDG_CONFIG_HOME"):
        return Path(base) / "llama.cpp" / "config.ini"
    if home := environ.get("HOME"):
        return Path(home) / ".config" / "llama.cpp" / "config.ini"
    return None


def parse_settings(
    argv: list[str], environ: Mapping[str, str], *, system_config_files: list[Path] | None = None
) -> Settings:
    """Resolve the options as llama-server does. argv excludes the program name.

    system_config_files replaces /etc/llama.cpp/config.ini and the user's config.ini (tests pass temp files);
    the ones that do not exist are skipped.
    """
    args = read_command_line(argv)
    resolver = Resolver()
    if system_config_files is None:
        system_config_files = [SYSTEM_CONFIG_FILE, *filter(None, [_user_config_file(environ)])]
    files = [path for path in system_config_files if path.is_file()]
    config_env = SERVER_OPTIONS_BY_FIELD["config"].env or ""
    config = next((a.value for a in reversed(args) if a.opt.field == "config"), environ.get(config_env))
    if config is not None:
        if not Path(config).is_file():
            raise SettingsError(f"config file not found: {config}")
        files.append(Path(config))
    for path in files:
        resolver.apply_ini(path)
    resolver.apply_env(environ)
    resolver.apply_command_line(args, environ)
    settings = validated(resolver.values)
    settings._config_files = tuple(files)
    settings._command_line = tuple(args)
    settings._environment = {name: value for name, value in environ.items() if name in _OPTION_VARIABLES}
    return settings


def validated(values: dict[str, Any], where: str = "", declaring: type[ExplicitSettings] = Settings,
              by_field: Mapping[str, Option] = SERVER_OPTIONS_BY_FIELD) -> Any:
    """`declaring` (the server's Settings, or an offline command) made from resolved values; a value pydantic
    refuses is a SettingsError naming its flags, `where` prefixing the message (a model's section)."""
    try:
        return declaring(**values)
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            opt = by_field[str(error["loc"][0])]
            message = str(error["msg"]).removeprefix("Value error, ")
            problems.append(f"invalid value for {', '.join(opt.flags)}: {message}")
        raise SettingsError(where + "; ".join(problems)) from None
