"""The commands: `mlx-embed-server` (llama-server's command line, then the server), and the offline `mlx-embed`
and `mlx-rerank` (compat/tools.py, compat/corpus/)."""
from __future__ import annotations

import logging
import os
import sys

from compat.catalog import read_catalog
from compat.settings import (
    EmbedCommand,
    HelpRequested,
    RerankCommand,
    Settings,
    SettingsError,
    parse_command,
    parse_settings,
)

_LEVELS = {0: logging.ERROR, 1: logging.ERROR, 2: logging.WARNING, 3: logging.INFO}


def configure_logging(settings: Settings) -> None:
    if settings.log_disable:
        logging.disable(logging.CRITICAL)
        return
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if settings.log_file:
        handlers.append(logging.FileHandler(settings.log_file))
    logging.basicConfig(level=_LEVELS.get(settings.verbosity, logging.DEBUG), handlers=handlers, force=True,
                        format="%(asctime)s %(levelname).1s %(name)s: %(message)s")


def main(argv: list[str] | None = None) -> int:
    # Logging for what the settings parser reports (env overrides, ignored flags) before --log-* apply.
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname).1s %(name)s: %(message)s")
    try:
        settings = parse_settings(sys.argv[1:] if argv is None else argv, os.environ)
        catalog = read_catalog(settings)  # the several models' files: wrong ones stop the start too
    except HelpRequested as help_text:
        print(help_text.text)
        return 0
    except SettingsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    configure_logging(settings)
    from compat import (
        server,  # imports the engine's threads and the HTTP server once the options are valid
    )

    return server.run(settings, catalog)


def _offline(command: type[EmbedCommand] | type[RerankCommand], argv: list[str] | None) -> int:
    try:
        options = parse_command(command, sys.argv[1:] if argv is None else argv)
    except HelpRequested as help_text:
        print(help_text.text, end="")
        return 0
    except SettingsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    from compat import tools  # imports the engine once the options are valid

    tools.configure_logging(options.verbose)
    try:
        if isinstance(options, RerankCommand):
            return tools.rerank_documents(options, sys.stdout)
        if options.input is not None:
            from compat.corpus.groups import JobFailed
            from compat.corpus.job import run_command

            try:
                return run_command(options, progress_to=sys.stderr)
            except JobFailed as exc:
                print(f"error: {exc}", file=sys.stderr)
                return 1
        return tools.embed_texts(options, sys.stdout)
    except (SettingsError, tools.EngineError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


def embed_main(argv: list[str] | None = None) -> int:
    """mlx-embed: texts (-p) to vectors, or a corpus (--input) to Parquet."""
    return _offline(EmbedCommand, argv)


def rerank_main(argv: list[str] | None = None) -> int:
    """mlx-rerank: one query, documents scored and ranked."""
    return _offline(RerankCommand, argv)


if __name__ == "__main__":
    sys.exit(main())
