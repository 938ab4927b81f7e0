"""What the option table shows people: the server's -h text and the rows the README's option table is printed
from (scripts/readme_options.py). The offline commands' help is rendered the same way (commands.py)."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from compat.presets import config_examples_dir
from compat.settings.declaration import Option
from compat.settings.server_options import GROUPS, SERVER_OPTIONS


def _shown_default(opt: Option) -> str:
    if opt.kind in ("flag", "paired"):
        return "enabled" if opt.default else "disabled"
    if opt.default is None:
        return "unset"
    if opt.default == []:
        return "none"
    if opt.default == "":
        return '""'
    return str(opt.default)


def format_help() -> str:
    """The -h text: every option by group, with its value, default and environment variable."""
    return render_help(SERVER_OPTIONS, GROUPS, [
        "usage: mlx-embed-server [options]",
        "",
        "A llama-server compatible embeddings and reranking server on MLX. Options are read, low to high, from",
        "/etc/llama.cpp/config.ini, ${XDG_CONFIG_HOME:-$HOME/.config}/llama.cpp/config.ini, --config FILE,",
        "the environment and the command line.",
        f"Example config files: {config_examples_dir()}",
    ])


def render_help(options: Sequence[Option], groups: Sequence[str], intro: list[str]) -> str:
    """A command's -h text: `intro`, then `options` by group in `groups`' order, each with its default."""
    lines = [*intro, "", f"  {'-h, --help, --usage':<48} print this help and exit"]
    for group in groups:
        in_group = [o for o in options if o.group == group]
        if in_group:
            lines += ["", f"{group}:"]
        for opt in in_group:
            head = ", ".join(opt.flags + opt.no_flags) + (f" {opt.metavar}" if opt.metavar else "")
            text = opt.help if opt.kind == "ignored" else f"{opt.help} (default: {_shown_default(opt)})"
            if opt.env:
                text += f" [env: {opt.env}]"
            lines.append(f"  {head:<48} {text}")
    return "\n".join(lines) + "\n"


def option_table() -> list[dict[str, Any]]:
    """One row per option, ignored ones included (group "ignored-for-compatibility").

    Keys: flags (every spelling), env (None if none), config_key, default, help, group, kind, per_model.
    """
    return [
        {"flags": list(opt.flags + opt.no_flags), "env": opt.env, "config_key": opt.config_key,
         "default": opt.default, "help": opt.help, "group": opt.group, "kind": opt.kind, "per_model": opt.per_model}
        for opt in SERVER_OPTIONS
    ]
