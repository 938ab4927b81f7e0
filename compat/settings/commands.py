"""The offline commands' options (mlx-embed, mlx-rerank): EmbedCommand and RerankCommand, their help and
table rows, and parse_command.

Their own options are declared like the server's; those they share with the server (-m, -hf, --pooling,
--embd-normalize, --truncate, ...) are the server's declarations, reused (shared_option). They read the command
line only: no config files, no environment (a server's LLAMA_ARG_* must not change a one-off command).
"""
from __future__ import annotations

import dataclasses
from typing import Any

from pydantic import ConfigDict, Field, field_validator

from compat.settings.declaration import ExplicitSettings, Option, declared_options, option, spelling_index
from compat.settings.help import render_help
from compat.settings.resolver import Resolver, handling, read_command_line, validated
from compat.settings.server_options import SERVER_OPTIONS_BY_FIELD, Settings
from engine.types import Pooling


def shared_option(name: str, **changes: Any) -> Any:
    """Settings' option `name` for an offline command; `changes` replace parts of its declaration (help, flags)."""
    info = Settings.model_fields[name]
    assert isinstance(info.json_schema_extra, dict)
    extra = {**info.json_schema_extra, "env": None, "per_model": False, "group": "model", "server_field": name,
             **changes}
    default = info.get_default(call_default_factory=True)
    return Field(default_factory=list, json_schema_extra=extra) if default == [] else Field(default, json_schema_extra=extra)


# Settings fields whose EngineOptions counterpart (Settings.engine_options) is named otherwise, and the
# EngineOptions fields that name the checkpoint (an offline command passes its -m/-hf as the model reference).
_ENGINE_FIELD = {"ubatch_size": "ubatch_tokens"}
_MODEL_REFERENCE = {"model_path", "hf_repo", "hf_file"}


class _ModelOptions(ExplicitSettings):
    """What both commands share: the model, how it is loaded, and its limits."""

    model_config = ConfigDict(extra="forbid")

    model: str | None = shared_option(
        "model", help="a folder in Hugging Face layout, a .gguf file, or an org/name repository of the Hugging Face "
                      "cache; neither -m nor -hf: the bundled all-MiniLM-L6-v2")
    hf_repo: str | None = shared_option("hf_repo")
    offline: bool = shared_option("offline")
    truncate: bool = shared_option("truncate")
    max_seq: int = shared_option("max_seq", flags=["--max-length", "--max-seq"])
    ubatch_size: int = shared_option("ubatch_size")
    threads: int = shared_option("threads")
    image_min_tokens: int = shared_option("image_min_tokens")
    image_max_tokens: int = shared_option("image_max_tokens")
    instruction: str | None = option(
        None, flags=["--instruction"], metavar="TEXT", group="model",
        help="the task instruction: an embedding model's instruction template (when its family has one), a "
             "generative reranker's <Instruct>")
    json_output: bool = option(False, flags=["--json"], kind="flag", group="output", help="print one JSON object")
    verbose: bool = option(False, flags=["-v", "--verbose"], kind="flag", group="output",
                           help="log what the engine does (the load, its limits) on stderr")

    @classmethod
    def shared_fields(cls) -> dict[str, str]:
        """This command's field -> the Settings field it shares (every option declared with shared_option)."""
        return {name: info.json_schema_extra["server_field"] for name, info in cls.model_fields.items()
                if isinstance(info.json_schema_extra, dict) and "server_field" in info.json_schema_extra}

    def engine_settings(self) -> Settings:
        """The server's Settings with this command's shared options set (the rest at the server's defaults)."""
        return validated({server: getattr(self, name) for name, server in self.shared_fields().items()})

    def engine_kwargs(self) -> dict[str, Any]:
        """engine.Encoder / engine.Reranker options: the EngineOptions fields this command's shared options set,
        through the server's own conversion (Settings.engine_options); the model reference is not among them."""
        opts = self.engine_settings().engine_options(None)
        set_here = {_ENGINE_FIELD.get(server, server) for server in self.shared_fields().values()} - _MODEL_REFERENCE
        return {f.name: getattr(opts, f.name) for f in dataclasses.fields(opts) if f.name in set_here}


class EmbedCommand(_ModelOptions):
    """mlx-embed: embed texts given on the command line, or a corpus file into Parquet."""

    prompt: list[str] = option([], flags=["-p", "--prompt"], kind="repeated", metavar="TEXT", group="input",
                               help="a text to embed; repeat for several")
    image: list[str] = option([], flags=["--image"], kind="repeated", metavar="FILE", group="input",
                              help="an image file to embed (models that take images, e.g. SigLIP); repeat for several; "
                                   "images follow the texts in the output")
    prompt_name: str | None = option(
        None, flags=["--prompt-name"], metavar="NAME", group="model",
        help="a prompt of the model's config_sentence_transformers.json put before every text")
    task: str | None = option(
        None, flags=["--task"], metavar="NAME", group="model",
        help="the task adapter of a model that has them (jina-embeddings-v3: retrieval.query, retrieval.passage, "
             "separation, classification, text-matching), its instruction before every text; unset = "
             "--prompt-name's task, else the model's default")
    dimensions: int | None = option(None, flags=["--dimensions"], metavar="N", group="model",
                                    help="keep the first N components of each vector (Matryoshka), then normalize")
    pooling: Pooling | None = shared_option("pooling")
    embd_normalize: int = shared_option(
        "embd_normalize", help="normalization of the vectors: -1 none, 0 max absolute, 1 taxicab, 2 Euclidean, "
                               ">2 p-norm")
    batch_size: int = option(0, flags=["--batch-size"], metavar="N", group="model",
                             help="most texts in one forward pass; 0 = the engine's limits (as the server's)")
    max_batch_tokens: int = shared_option("max_batch_tokens")

    input: str | None = option(None, flags=["--input"], metavar="FILE", group="corpus",
                               help="embed a corpus file: JSON lines, CSV, Parquet, or plain text (one document per "
                                    "line), by its extension (.jsonl/.json/.ndjson, .csv, .parquet, else text)")
    output: str | None = option(None, flags=["--output"], metavar="FILE", group="corpus",
                                help="the Parquet file a corpus is written to (needed with --input)")
    text_field: str = option("text", flags=["--text-field"], metavar="NAME", group="corpus",
                             help="the field (column) holding each document's text")
    id_field: str = option("id", flags=["--id-field"], metavar="NAME", group="corpus",
                           help="the field (column) holding each document's id; inputs without it are numbered "
                                "by line (row)")
    resume: bool = option(False, flags=["--resume"], kind="flag", group="corpus",
                          help="continue an interrupted run of the same command from its finished row groups")
    rows_per_group: int = option(1024, flags=["--rows-per-group"], metavar="N", group="corpus",
                                 help="input rows per Parquet row group, the unit of --resume")
    quiet: bool = option(False, flags=["--quiet"], kind="flag", group="corpus",
                         help="no progress bar (it is shown only when stderr is a terminal)")
    ray: bool = option(False, flags=["--ray"], kind="flag", group="ray",
                       help="run the corpus job on Ray Data: a local Ray instance, or --ray-address's cluster")
    ray_address: str | None = option(None, flags=["--ray-address"], metavar="ADDR", group="ray",
                                     implies={"ray": True},
                                     help="the Ray cluster to run on (ray://host:10001, host:6379 or auto)")
    ray_actors: int = option(2, flags=["--ray-actors"], metavar="N", group="ray",
                             help="actors embedding at once, one engine each (each takes -t CPUs, default 1)")

    def encode_kwargs(self) -> dict[str, Any]:
        """Encoder.embed / encode_rows keyword arguments this command's options set (a corpus run's and -p's)."""
        return {"normalize": self.embd_normalize, "dimensions": self.dimensions, "prompt_name": self.prompt_name,
                "instruction": self.instruction, "batch_size": self.batch_size or None, "task": self.task}

    def normalize_given(self) -> bool:
        """--embd-normalize set away from its default (2: Euclidean)."""
        return any(opt.field == "embd_normalize" and self.embd_normalize != opt.default
                   for opt in command_options(EmbedCommand))

    def corpus_flags_given(self) -> list[str]:
        """The corpus-mode options (--output, --resume, --ray, ...) set away from their defaults: without --input
        they would do nothing, so the command refuses them."""
        return [opt.flags[0] for opt in command_options(EmbedCommand)
                if opt.group in ("corpus", "ray") and opt.field != "input" and getattr(self, opt.field) != opt.default]

    @field_validator("batch_size", "rows_per_group", "ray_actors")
    @classmethod
    def _count(cls, value: int, info: Any) -> int:
        least = 0 if info.field_name == "batch_size" else 1
        if value < least:
            raise ValueError(f"must be {least} or more")
        return value


class RerankCommand(_ModelOptions):
    """mlx-rerank: score documents against a query."""

    model: str | None = shared_option(
        "model", help="a reranker: a folder in Hugging Face layout, a .gguf file, or an org/name repository of the "
                      "Hugging Face cache (-m or -hf is required)")
    query: str | None = option(None, flags=["-q", "--query"], metavar="TEXT", group="input",
                               help="the query (with --query-image: the text after its image)")
    document: list[str] = option([], flags=["-d", "--document"], kind="repeated", metavar="TEXT", group="input",
                                 help="a document to score; repeat for several")
    image: list[str] = option([], flags=["--image"], kind="repeated", metavar="FILE", group="input",
                              help="an image file to score as a document (rerankers that take images, e.g. "
                                   "Qwen3-VL-Reranker); repeat for several; image documents follow the text ones")
    query_image: str | None = option(None, flags=["--query-image"], metavar="FILE", group="input",
                                     help="an image file as the query (rerankers that take images), -q's text after it")
    top_n: int | None = option(None, flags=["--top-n"], metavar="N", group="output",
                               help="rank only the N best documents (scores still list every document)")
    rerank_sigmoid: bool = shared_option("rerank_sigmoid")

    @field_validator("top_n")
    @classmethod
    def _top_n(cls, value: int | None) -> int | None:
        if value is not None and value < 1:
            raise ValueError("must be 1 or more")
        return value


_COMMAND_GROUPS = ("model", "input", "output", "corpus", "ray")
_COMMAND_USAGE = {
    EmbedCommand: ["usage: mlx-embed [-m REF | -hf REPO] -p TEXT [-p TEXT ...] [options]",
                   "       mlx-embed [-m REF | -hf REPO] --input FILE --output OUT.parquet [options]",
                   "",
                   "Embeds texts with the server's engine (same loader, pooling, normalization and batching), no "
                   "listener."],
    RerankCommand: ["usage: mlx-rerank [-m REF | -hf REPO] -q QUERY -d DOC [-d DOC ...] [options]",
                    "       mlx-rerank [-m REF | -hf REPO] [-q QUERY] [--query-image FILE] [-d DOC ...] "
                    "[--image FILE ...] [options]",
                    "",
                    "Scores documents against a query with the server's engine and its score contract."],
}


def command_options(command: type[ExplicitSettings]) -> list[Option]:
    """An offline command's options, in declaration order."""
    return declared_options(command)


def command_table(command: type[ExplicitSettings]) -> list[dict[str, Any]]:
    """One row per option of an offline command: flags, default, help, group, shared (a server option reused) and
    server_help (its help is the server's, unchanged)."""
    rows = []
    for opt in command_options(command):
        meta = command.model_fields[str(opt.field)].json_schema_extra
        server = SERVER_OPTIONS_BY_FIELD.get(meta.get("server_field")) if isinstance(meta, dict) else None
        rows.append({"flags": list(opt.flags + opt.no_flags), "default": opt.default, "help": opt.help,
                     "group": opt.group, "shared": server is not None,
                     "server_help": server is not None and opt.help == server.help})
    return rows


def command_help(command: type[ExplicitSettings]) -> str:
    """An offline command's -h text."""
    return render_help(command_options(command), _COMMAND_GROUPS, _COMMAND_USAGE[command])


def parse_command(command: type[_ModelOptions], argv: list[str]) -> Any:
    """An offline command's options from its command line (argv without the program name)."""
    options = command_options(command)
    by_flag = spelling_index(lambda flag: flag, options)
    args = read_command_line(argv, by_flag, lambda: command_help(command))
    resolver = Resolver(quiet=True)
    for arg in args:
        with handling(f'argument "{arg.spelling}"'):
            resolver.apply(arg.opt, not arg.negated if arg.value is None else arg.value, "cli")
    return validated(resolver.values, declaring=command, by_field={opt.field: opt for opt in options if opt.field})
