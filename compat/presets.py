"""llama.cpp's INI dialect (common/preset.cpp), for config.ini files and --models-preset files.

Grammar, as llama's PEG parser has it: `[section]` headers, `key = value` lines, `;` or `#` comments (also at
the end of a line, where they end the value), blank lines; keys match `[a-zA-Z_][a-zA-Z0-9_.-]*`. One
leniency: lines may be indented. This module only parses; what keys mean is up to the caller.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from engine import data_folder

# Sections that hold settings for everything (llama: [*], [default] and keys before any header); every other
# section of a preset or --config file declares a model.
GLOBAL_SECTIONS = ("", "*", "default")
# Keys only presets have (llama's): load-on-startup means something here; stop-timeout (how long llama waits
# for a model's child process) and dedup-cache-models are accepted for llama's files and mean nothing.
LOAD_ON_STARTUP = "load-on-startup"
PRESET_ONLY_KEYS = (LOAD_ON_STARTUP, "stop-timeout", "dedup-cache-models")


def config_examples_dir() -> Path:
    """The example config files: installed as the compat.config_examples data package, else config/ here."""
    return data_folder("compat.config_examples", "config")


class PresetError(ValueError):
    """An INI file that does not parse; the message names the file and the line."""


@dataclass(frozen=True)
class IniEntry:
    key: str
    value: str  # trailing blanks and any comment removed; may be empty
    line: int  # 1-based, for messages; 0: not from a file


@dataclass(frozen=True)
class IniSection:
    """One [section] of a file, or the one a command-line option stands for (--embedding-model)."""

    source: str  # the file, or the option
    name: str
    entries: tuple[IniEntry, ...]

    def where(self, entry: IniEntry) -> str:
        """Names the file, section, line and key, for error messages."""
        line = f" line {entry.line}" if entry.line else ""
        return f'{self.source}: [{self.name}]{line}: key "{entry.key}"'


_HEADER = re.compile(r"\[[ \t]*([^\]]*[^\]\s])[ \t]*\][ \t]*(?:[;#].*)?")
# A value runs up to the first ';' or '#', so neither can appear inside one (as in llama).
_ENTRY = re.compile(r"([A-Za-z_][A-Za-z0-9_.-]*)[ \t]*=[ \t]*([^;#]*?)[ \t]*(?:[;#].*)?")
_BLANK_OR_COMMENT = re.compile(r"(?:[;#].*)?")


def parse_ini(text: str, source: str) -> dict[str, list[IniEntry]]:
    """Sections in file order, each with its entries in order. Keys before any header go in section "".

    A repeated header continues its section. `source` names the file in error messages.
    """
    sections: dict[str, list[IniEntry]] = {}
    current = ""
    for number, raw in enumerate(re.split(r"\r\n|\n|\r", text.removeprefix("\ufeff")), start=1):
        line = raw.lstrip(" \t")
        if _BLANK_OR_COMMENT.fullmatch(line):
            continue
        if header := _HEADER.fullmatch(line):
            current = header.group(1)
            sections.setdefault(current, [])
        elif entry := _ENTRY.fullmatch(line):
            sections.setdefault(current, []).append(IniEntry(entry.group(1), entry.group(2), number))
        else:
            raise PresetError(f"{source}:{number}: syntax error: {raw.strip()!r} (expected [section] or key = value)")
    return sections


def read_ini(path: Path) -> dict[str, list[IniEntry]]:
    """parse_ini on a file; an unreadable file is a PresetError too."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeError) as exc:
        raise PresetError(f"cannot read config file {path}: {exc}") from None
    return parse_ini(text, str(path))
