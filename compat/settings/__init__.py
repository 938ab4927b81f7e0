"""Every command-line option, declared once, and llama-server's way of resolving them (docs/llama-server-contract.md §7.1).

    declaration.py     how an option is declared (option(), the Option record, converters, spelling indexes)
    server_options.py  the server's option table: the Settings fields, and llama's options ignored here
    resolver.py        argv > LLAMA_ARG_* environment > config files > defaults (parse_settings)
    per_model.py       each model's settings on a several-model server (ModelSettings)
    help.py            the -h text and the option table's rows (the README's table)
    commands.py        the offline commands' options (mlx-embed, mlx-rerank)

The names other modules use are importable from here.
"""
from compat.settings.commands import EmbedCommand, RerankCommand, command_table, parse_command
from compat.settings.declaration import FALSEY, TRUTHY, HelpRequested, SettingsError
from compat.settings.help import format_help, option_table
from compat.settings.per_model import ModelSettings
from compat.settings.resolver import parse_settings
from compat.settings.server_options import GROUPS, Settings

__all__ = ["FALSEY", "GROUPS", "TRUTHY", "EmbedCommand", "HelpRequested", "ModelSettings", "RerankCommand",
           "Settings", "SettingsError", "command_table", "format_help", "option_table", "parse_command",
           "parse_settings"]
