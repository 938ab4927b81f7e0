"""llama.cpp's INI dialect (common/preset.cpp), for config.ini files and --models-preset files.

Grammar, as llama's PEG parser has it: `[section]` headers, `key = value` lines, `;` or `#` comments (also at
the end of a line, where they end the value), blank lines; keys match `[a-zA-Z_][a-zA-Z0-9_.-]*`. One
leniency: lines may be indented. This module only parses; what keys mean is up to the caller.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
import importlib.util
from pathlib import Path


def config_examples_dir() -> Path:
    """The example config files: installed as the compat.config_examples data package, else config/ here."""
    try:
        spec = importlib.util.find_spec("compat.config_examples")
    except ModuleNotFoundError:
        spec = None
    if spec is not None and spec.submodule_search_locations:
        return Path(list(spec.submodule_search_locations)[0])
    return Path(__file__).resolve().parent.parent / "config"


class PresetError(ValueError):
    """An INI file that does not parse; the message names the file and the line."""


@dataclass(frozen=True)
class IniEntry:
    key: str
    value: str  # trailing blanks and any comment removed; may be empty
    line: int  # 1-based, for messages


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
