"""The README documents every option exactly as compat/settings/ declares it, and CI runs its test command."""
from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

from readme_options import commands_markdown, options_markdown  # noqa: E402


def _readme() -> str:
    return (ROOT / "README.md").read_text(encoding="utf-8")


def test_options_table_matches_the_declaration():
    block = re.search(r"<!-- options:begin[^>]*-->\n(.*?)<!-- options:end -->", _readme(), re.S)
    assert block, "README has no options block"
    assert block.group(1) == options_markdown()


def test_offline_commands_tables_match_the_declaration():
    block = re.search(r"<!-- commands:begin[^>]*-->\n(.*?)<!-- commands:end -->", _readme(), re.S)
    assert block, "README has no offline commands block"
    assert block.group(1) == commands_markdown(), "regenerate it: .venv/bin/python scripts/readme_options.py --commands"


def test_ci_runs_the_readme_test_command():
    commands = re.findall(r"```sh\n(.*?)\n```", _readme(), re.S)
    test_command = next(c for c in commands if "pytest" in c)
    assert test_command in (ROOT / ".ci" / "run").read_text()
