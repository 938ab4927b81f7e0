"""Print the README's option tables from the one option declaration (compat/settings/).

    .venv/bin/python scripts/readme_options.py              # paste between the README's options markers
    .venv/bin/python scripts/readme_options.py --commands   # mlx-embed / mlx-rerank, between the commands markers
tests/test_readme.py fails when the README's tables and the declaration disagree.
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

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


if __name__ == "__main__":
    sys.stdout.write(commands_markdown() if sys.argv[1:] == ["--commands"] else options_markdown())
