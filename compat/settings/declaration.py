"""How an option is declared: `option()` on a pydantic field, the Option record every parser reads, the
converters from an option's text to its value, and the index from each spelling to its option.

The server's options (server_options.py) and the offline commands' (commands.py) are both declared this way;
this module knows no option of its own.
"""
from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field

from engine.types import Pooling

Kind = Literal["value", "flag", "paired", "accumulating", "repeated"]


class SettingsError(Exception):
    """A configuration llama-server would refuse; the CLI prints `error: <message>` and exits 1."""


class HelpRequested(Exception):
    """-h/--help: the CLI prints `text` and exits 0."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text


def option(
    default: Any,
    *,
    flags: list[str],
    help: str,
    group: str,
    kind: Kind = "value",
    env: str | None = None,
    metavar: str | None = None,
    implies: dict[str, Any] | None = None,
    per_model: bool = False,
    secret: bool = False,
) -> Any:
    """A Settings field that is also an option.

    kind: value (takes one argument), flag (no argument, can only turn on), paired (`--x` / `--no-x`; the
    `--no-` spellings are derived), accumulating (comma-separated, repeats append) or repeated (each occurrence
    appends its whole value, commas included: the offline commands' texts). `implies`: other
    fields a flag also sets when it is given (`--reranking` turns on embedding with rank pooling). `per_model`:
    each model of a several-model server has its own value (a model section may set it); the others are
    server-wide. `secret`: the value never appears in a repr (API keys).
    """
    extra = {"flags": flags, "env": env, "help": help, "group": group, "kind": kind, "metavar": metavar,
             "implies": implies or {}, "per_model": per_model}
    if default == []:
        return Field(default_factory=list, json_schema_extra=extra, repr=not secret)
    return Field(default, json_schema_extra=extra, repr=not secret)


class ExplicitSettings(BaseModel):
    """Settings built only from the values our parsers give (resolver.py reads argv, the environment and the
    config files; nothing else may: field-named variables such as THREADS or RAY_ADDRESS must not leak in).
    Validated as pydantic-settings' BaseSettings validates with its init values as the only source (extra keys
    refused, defaults validated, any type allowed), without importing it (0.13 s alone; 20-50 ms of CPU in a
    server's start, where falcon imports asyncio anyway)."""

    model_config = ConfigDict(extra="forbid", validate_default=True, arbitrary_types_allowed=True)


TRUTHY = ("on", "enabled", "true", "1")  # llama.cpp's words, exact and case-sensitive
FALSEY = ("off", "disabled", "false", "0")
_STOI = re.compile(r"[ \t\n\v\f\r]*([+-]?[0-9]+)")


@dataclass(frozen=True, eq=False)  # compared and hashed by identity
class Option:
    """One option as the parsers read it: a declared field's, or (field None) a llama option accepted and ignored."""

    field: str | None  # None: accepted for compatibility and ignored
    flags: tuple[str, ...]
    no_flags: tuple[str, ...]  # paired options: the spellings that turn it off
    env: str | None
    kind: str  # a Kind, or "ignored"
    arity: Literal["none", "one", "optional"]
    choices: tuple[str, ...]  # "optional" arity: the values that may follow
    metavar: str | None
    help: str
    group: str
    default: Any
    implies: Mapping[str, Any]
    convert: Callable[[str], Any]  # the text of a value option to its value
    per_model: bool  # a model section of a several-model server may set it

    @property
    def config_key(self) -> str:
        return next(flag for flag in self.flags if flag.startswith("--")).lstrip("-")


def _stoi(text: str) -> int:
    """std::stoi: leading blanks, a sign and digits; whatever follows is dropped."""
    match = _STOI.match(text)
    if match is None:
        raise ValueError(f"invalid integer {text!r}")
    value = int(match.group(1))
    if not -(2**31) <= value < 2**31:
        raise ValueError(f"integer out of range: {text!r}")
    return value


class Stoul32:
    """Field metadata (`Annotated[int, STOUL32]`): the option's text is read as llama reads --seed, std::stoul
    into a uint32_t: a sign is allowed and the value wraps modulo 2**32 (-1 is 4294967295)."""


STOUL32 = Stoul32()


def _stoul32(text: str) -> int:
    """std::stoul (leading blanks, a sign and digits, whatever follows dropped; a negative value wraps), kept in
    a uint32_t."""
    match = _STOI.match(text)
    if match is None:
        raise ValueError(f"invalid integer {text!r}")
    value = int(match.group(1))
    if abs(value) >= 2**64:
        raise ValueError(f"integer out of range: {text!r}")
    return value % 2**32


class Bytes:
    """Field metadata (`Annotated[int, BYTES]`): the option's text is an amount of memory, plain bytes or a number
    with a unit: K, M, G, T (and KiB, MiB, GiB, TiB) are powers of 1024, KB, MB, GB, TB powers of 1000; case and
    a space before the unit do not matter, and a fraction is allowed with a unit (1.5GiB)."""


BYTES = Bytes()

_UNITS = {"": 1, "b": 1, **{f"{p}{s}": 1024 ** (i + 1) for i, p in enumerate("kmgt") for s in ("", "ib")},
          **{f"{p}b": 1000 ** (i + 1) for i, p in enumerate("kmgt")}}
_AMOUNT = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-z]*)\s*", re.IGNORECASE)


def parse_bytes(text: str) -> int:
    """An amount of memory (Bytes) in bytes, rounded down."""
    match = _AMOUNT.fullmatch(text)
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _UNITS or ("." in match.group(1) and _UNITS[unit] == 1):
        raise ValueError(f"invalid amount of memory {text!r} (bytes, or a number with K, M, G, T, KiB, MiB, GiB, "
                         "TiB, KB, MB, GB or TB)")
    number = match.group(1)
    whole, _, fraction = number.partition(".")
    scale = _UNITS[unit]
    return int(whole or 0) * scale + (int(fraction) * scale // 10 ** len(fraction) if fraction else 0)


def _pooling(text: str) -> Pooling:
    try:
        return Pooling(text)
    except ValueError:
        names = ", ".join(p.value for p in Pooling)
        raise ValueError(f"invalid value {text!r} (expected one of {names})") from None


def _converter(annotation: Any, metadata: Sequence[Any] = ()) -> Callable[[str], Any]:
    if any(isinstance(item, Stoul32) for item in metadata):
        return _stoul32
    if any(isinstance(item, Bytes) for item in metadata):
        return parse_bytes
    types = set(get_args(annotation)) or {annotation}
    if int in types:
        return _stoi
    if Pooling in types:
        return _pooling
    return str


def declared_options(declaring: type[ExplicitSettings]) -> list[Option]:
    """The options `declaring`'s fields declare, in field order."""
    options = []
    for name, info in declaring.model_fields.items():
        meta = info.json_schema_extra
        assert isinstance(meta, dict), f"{name} is not declared with option()"
        kind = meta["kind"]
        flags = tuple(meta["flags"])
        no_flags = tuple("--no-" + f[2:] for f in flags if f.startswith("--")) if kind == "paired" else ()
        options.append(Option(
            field=name, flags=flags, no_flags=no_flags, env=meta["env"], kind=kind,
            arity="none" if kind in ("flag", "paired") else "one", choices=(), metavar=meta["metavar"],
            help=meta["help"], group=meta["group"], default=info.get_default(call_default_factory=True),
            implies=meta["implies"], convert=_converter(info.annotation, info.metadata), per_model=meta["per_model"]))
    return options


def spelling_index(spelling_of: Callable[[str], str],
                   options: Sequence[Option]) -> dict[str, tuple[Option, bool]]:
    """Every spelling -> (its option, whether the spelling negates it); a spelling declared twice is a bug."""
    index: dict[str, tuple[Option, bool]] = {}
    for opt in options:
        for spelling, negated in [*((f, False) for f in opt.flags), *((f, True) for f in opt.no_flags)]:
            key = spelling_of(spelling)
            assert key not in index, f"option spelling {spelling} declared twice"
            index[key] = (opt, negated)
    return index
