"""Print the README's option table from the one option declaration (compat/settings.py).

    .venv/bin/python scripts/readme_options.py   # paste between the README's options markers
tests/test_readme.py fails when the README's table and the declaration disagree.
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from compat.settings import option_table  # noqa: E402

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


if __name__ == "__main__":
    sys.stdout.write(options_markdown())
