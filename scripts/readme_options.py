"""Print or refresh the option tables of docs/options.md from the one option declaration (compat/settings/).

    .venv/bin/python scripts/readme_options.py              # print the server's table (between the options markers)
    .venv/bin/python scripts/readme_options.py --commands   # print mlx-embed / mlx-rerank's tables (the commands markers)
    .venv/bin/python scripts/readme_options.py --write      # rewrite both blocks in docs/options.md in place
tests/test_readme.py fails when the tables in docs/options.md and the declaration disagree.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OPTIONS_PAGE = ROOT / "docs" / "options.md"
sys.path.insert(0, str(ROOT))

from compat.settings import EmbedCommand, RerankCommand, command_table, option_table  # noqa: E402

IGNORED = "ignored-for-compatibility"


def _cell(text: object) -> str:
    return str(text).replace("|", "\\|")


def options_markdown() -> str:
    rows = option_table()
    lines = ["| flags | env | config key | default | per model | meaning |", "|---|---|---|---|---|---|"]
    for row in rows:
        if row["group"] == IGNORED:
            continue
        default = "" if row["default"] in (None, [], "") else f"`{row['default']}`"
        lines.append("| " + " | ".join([
            ", ".join(f"`{f}`" for f in row["flags"]),
            f"`{row['env']}`" if row["env"] else "—",
            f"`{row['config_key']}`",
            default,
            "yes" if row["per_model"] else "",
            _cell(row["help"]),
        ]) + " |")
    ignored = sorted({f for row in rows if row["group"] == IGNORED for f in row["flags"]})
    lines += ["", "Accepted and ignored (logged once), so llama-server launch scripts keep working: "
              + ", ".join(f"`{f}`" for f in ignored) + "."]
    return "\n".join(lines) + "\n"


def commands_markdown() -> str:
    """The offline commands' options; "server option" marks those reused from the server's declaration."""
    lines: list[str] = []
    for name, command in (("mlx-embed", EmbedCommand), ("mlx-rerank", RerankCommand)):
        lines += [f"`{name}`:", "", "| flags | default | server option | meaning |", "|---|---|---|---|"]
        for row in command_table(command):
            default = "" if row["default"] in (None, [], "") else f"`{row['default']}`"
            meaning = "as in the server's table below" if row["server_help"] else _cell(row["help"])
            lines.append("| " + " | ".join([", ".join(f"`{f}`" for f in row["flags"]), default,
                                            "yes" if row["shared"] else "", meaning]) + " |")
        lines.append("")
    return "\n".join(lines)


def _blocks() -> dict[str, str]:
    """Each marker name (`<!-- NAME:begin ... -->` ... `<!-- NAME:end -->` in docs/options.md) -> its text."""
    return {"options": options_markdown(), "commands": commands_markdown()}


def write_options_page(path: Path = OPTIONS_PAGE) -> None:
    """Replace what lies between each pair of markers in docs/options.md, the markers themselves kept."""
    text = path.read_text(encoding="utf-8")
    for name, body in _blocks().items():
        pattern = re.compile(rf"(<!-- {name}:begin[^>]*-->\n)(.*?)(<!-- {name}:end -->)", re.S)
        if not pattern.search(text):
            raise SystemExit(f"error: {path} has no {name} markers")
        text = pattern.sub(lambda m: m.group(1) + body + m.group(3), text, count=1)
    path.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:
        write_options_page()
    else:
        sys.stdout.write(commands_markdown() if sys.argv[1:] == ["--commands"] else options_markdown())
