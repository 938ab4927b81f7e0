"""Every command-line option, declared once, and llama-server's way of resolving them (contract §7.1).

Each Settings field carries its llama-server spellings in its metadata (see `option`); the options that
mean nothing here are the `_IGNORED` table. `parse_settings` merges, low to high: defaults, the system
config files, `--config FILE`, the environment and the command line, then lets pydantic validate the
result. Nothing else in the project reads argv or LLAMA_ARG_* variables.
"""
from __future__ import annotations

import copy
import dataclasses
import logging
import re
import stat
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

from pydantic import Field, PrivateAttr, ValidationError, ValidationInfo, field_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from compat.presets import (
    GLOBAL_SECTIONS,
    PRESET_ONLY_KEYS,
    IniSection,
    PresetError,
    config_examples_dir,
    read_ini,
)
from engine.types import DEFAULT_MODEL_NAME, EngineOptions, Pooling

logger = logging.getLogger(__name__)

Kind = Literal["value", "flag", "paired", "accumulating", "repeated"]

GROUPS = ("server", "model", "embeddings", "batching", "models", "http", "logging", "ignored-for-compatibility")

SYSTEM_CONFIG_FILE = Path("/etc/llama.cpp/config.ini")


# --image-min-tokens / --image-max-tokens (llama.cpp's reading: N tokens are N x (patch x merge)^2 pixels)
_IMAGE_TOKENS_HELP = ("{} tokens one image becomes in dynamic-resolution vision models (Qwen3-VL, ColQwen2): {} to "
                      "N x (patch x merge)^2 pixels; 0 or less = the checkpoint's preprocessor_config.json bound; "
                      "fixed-size and tiling models do not use it")


class SettingsError(Exception):
    """A configuration llama-server would refuse; the CLI prints `error: <message>` and exits 1."""


class HelpRequested(Exception):
    """-h/--help: the CLI prints `text` and exits 0."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text


def option(
    default: Any,
    *,
    flags: list[str],
    help: str,
    group: str,
    kind: Kind = "value",
    env: str | None = None,
    metavar: str | None = None,
    implies: dict[str, Any] | None = None,
    per_model: bool = False,
    secret: bool = False,
) -> Any:
    """A Settings field that is also an option.

    kind: value (takes one argument), flag (no argument, can only turn on), paired (`--x` / `--no-x`; the
    `--no-` spellings are derived), accumulating (comma-separated, repeats append) or repeated (each occurrence
    appends its whole value, commas included: the offline commands' texts). `implies`: other
    fields a flag also sets when it is given (`--reranking` turns on embedding with rank pooling). `per_model`:
    each model of a several-model server has its own value (a model section may set it); the others are
    server-wide. `secret`: the value never appears in a repr (API keys).
    """
    extra = {"flags": flags, "env": env, "help": help, "group": group, "kind": kind, "metavar": metavar,
             "implies": implies or {}, "per_model": per_model}
    if default == []:
        return Field(default_factory=list, json_schema_extra=extra, repr=not secret)
    return Field(default, json_schema_extra=extra, repr=not secret)


class ExplicitSettings(BaseSettings):
    """Settings built only from the values our parsers give: pydantic-settings must not read os.environ
    (field-named variables such as THREADS or RAY_ADDRESS would leak in) or argv itself."""

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings,)


class Settings(ExplicitSettings):
    """The resolved configuration. Field order is the order environment variables are applied in."""

    model_config = SettingsConfigDict(extra="forbid")

    config: str | None = option(
        None, flags=["--config"], env="LLAMA_ARG_CONFIG", metavar="FILE", group="server",
        help="INI file read like llama.cpp's config.ini, over the system config files")
    host: str = option(
        "127.0.0.1", flags=["--host"], env="LLAMA_ARG_HOST", metavar="HOST", group="server",
        help="IP address to listen on, or a UNIX socket if the address ends with .sock")
    port: int = option(8080, flags=["--port"], env="LLAMA_ARG_PORT", metavar="PORT", group="server",
                       help="port to listen on; 0 picks a free one")
    api_prefix: str = option("", flags=["--api-prefix"], env="LLAMA_ARG_API_PREFIX", metavar="PREFIX",
                             group="server", help="prefix path the server serves from, without the trailing slash")
    api_key: list[str] = option(
        [], flags=["--api-key"], kind="accumulating", env="LLAMA_API_KEY", metavar="KEY", group="server", secret=True,
        help="API key for authentication; several comma-separated, or repeat the option")
    api_key_file: str | None = option(
        None, flags=["--api-key-file"], env="LLAMA_ARG_API_KEY_FILE", metavar="FNAME", group="server",
        help="file with one API key per line ('#' lines skipped), added to --api-key")
    metrics: bool = option(False, flags=["--metrics"], kind="flag", env="LLAMA_ARG_ENDPOINT_METRICS",
                           group="server", help="enable the Prometheus-compatible /metrics endpoint")
    props: bool = option(False, flags=["--props"], kind="flag", env="LLAMA_ARG_ENDPOINT_PROPS", group="server",
                         help="allow changing global properties via POST /props")
    slots: bool = option(True, flags=["--slots"], kind="paired", env="LLAMA_ARG_ENDPOINT_SLOTS", group="server",
                         help="expose the /slots endpoint")

    model: str | None = option(
        None, flags=["-m", "--model"], env="LLAMA_ARG_MODEL", metavar="PATH", group="model", per_model=True,
        help="model folder in Hugging Face layout (config.json, tokenizer.json, *.safetensors), or a .gguf file")
    hf_repo: str | None = option(
        None, flags=["-hf", "-hfr", "--hf-repo"], env="LLAMA_ARG_HF_REPO", metavar="<user>/<model>",
        group="model", per_model=True,
        help="Hugging Face repository, downloaded into the Hugging Face cache; org/name:QUANT (e.g. :Q8_0) serves "
             "the repository's .gguf whose name contains QUANT (default Q4_K_M)")
    hf_file: str | None = option(
        None, flags=["-hff", "--hf-file"], env="LLAMA_ARG_HF_FILE", metavar="FILE", group="model", per_model=True,
        help="the .gguf file of the -hf repository to serve (overrides the :QUANT tag)")
    offline: bool = option(False, flags=["--offline"], kind="flag", env="LLAMA_ARG_OFFLINE", group="model",
                           per_model=True, help="use only the local Hugging Face cache, never the network")
    alias: list[str] = option(
        [], flags=["-a", "--alias"], kind="accumulating", env="LLAMA_ARG_ALIAS", metavar="STRING", group="model",
        per_model=True, help="model name aliases, comma-separated; one model: the API reports the alphabetically first; "
                                 "several: requests may name the model by any of them")
    tags: list[str] = option([], flags=["--tags"], kind="accumulating", env="LLAMA_ARG_TAGS", metavar="STRING",
                             group="model", per_model=True, help="model tags, comma-separated, reported by /v1/models")

    embedding: bool = option(False, flags=["--embedding", "--embeddings"], kind="flag",
                             env="LLAMA_ARG_EMBEDDINGS", group="embeddings", per_model=True,
                             help="serve the embedding routes (one model: without it they answer 501, as in llama-server)")
    pooling: Pooling | None = option(
        None, flags=["--pooling"], env="LLAMA_ARG_POOLING", metavar="{none,mean,cls,last,rank,max}",
        group="embeddings", per_model=True, help="pooling type; unset = the model's own (max is our extension)")
    embd_normalize: int = option(
        2, flags=["--embd-normalize"], metavar="N", group="embeddings", per_model=True,
        help="default normalization of pooled vectors on every embedding route (a request's embd_normalize "
             "overrides it): -1 none, 0 max absolute, 1 taxicab, 2 Euclidean, >2 p-norm")
    reranking: bool = option(
        False, flags=["--reranking", "--rerank"], kind="flag", env="LLAMA_ARG_RERANKING", group="embeddings",
        per_model=True, implies={"embedding": True, "pooling": Pooling.RANK.value},
        help="enable the reranking endpoint (implies --embedding --pooling rank)")
    truncate: bool = option(
        False, flags=["--truncate"], kind="paired", env="LLAMA_ARG_TRUNCATE", group="embeddings", per_model=True,
        help="cut over-long inputs to the model's maximum length instead of refusing them")
    rerank_sigmoid: bool = option(
        False, flags=["--rerank-sigmoid"], kind="paired", env="LLAMA_ARG_RERANK_SIGMOID", group="embeddings",
        per_model=True, help="cross-encoder scores as sigmoid(logit) in [0, 1] instead of the raw logit (generative "
             "rerankers always give P(yes))")
    rerank_instruction: str | None = option(
        None, flags=["--rerank-instruction"], env="LLAMA_ARG_RERANK_INSTRUCTION", metavar="TEXT",
        group="embeddings", per_model=True,
        help="generative rerankers: the <Instruct> task text; unset = the model card's web search instruction; "
             "a request's 'instruction' overrides it")
    default_prompt_name: str | None = option(
        None, flags=["--default-prompt-name"], env="LLAMA_ARG_DEFAULT_PROMPT_NAME", metavar="NAME",
        group="embeddings", per_model=True,
        help="embedding models: the prompt (a name from the checkpoint's config_sentence_transformers.json "
             "'prompts') put before every text input when a request gives no 'prompt_name'; unset = the "
             "checkpoint's default_prompt_name, else none")

    media_path: str | None = option(
        None, flags=["--media-path"], env="LLAMA_ARG_MEDIA_PATH", metavar="PATH", group="embeddings",
        help="folder images may be read from through file:// URLs (relative to it, leading slashes included, as "
             "llama-server reads them, or absolute inside it; no '..', symlinks resolved); unset = file:// URLs "
             "are refused")
    allow_remote_media: bool = option(
        False, flags=["--allow-remote-media"], kind="paired", env="LLAMA_ARG_ALLOW_REMOTE_MEDIA", group="embeddings",
        help="let requests name images by http(s):// URL, which the server then downloads (bounded by "
             "--media-max-bytes and --media-timeout)")
    media_max_bytes: int = option(
        20 << 20, flags=["--media-max-bytes"], env="LLAMA_ARG_MEDIA_MAX_BYTES", metavar="N", group="embeddings",
        help="most bytes of one encoded image, whatever its source")
    media_timeout: int = option(
        10, flags=["--media-timeout"], env="LLAMA_ARG_MEDIA_TIMEOUT", metavar="SECONDS", group="embeddings",
        help="most seconds downloading one http(s) image may take, checked as its bytes arrive; each wait on the "
             "server (connecting, every read) is bounded by it too")
    image_max_count: int = option(
        16, flags=["--image-max-count"], env="LLAMA_ARG_IMAGE_MAX_COUNT", metavar="N", group="embeddings",
        help="most images in one request")
    image_max_pixels: int = option(
        40_000_000, flags=["--image-max-pixels"], env="LLAMA_ARG_IMAGE_MAX_PIXELS", metavar="N", group="embeddings",
        per_model=True, help="most pixels (width x height) of one image, checked from its header before decoding")
    image_min_tokens: int = option(
        -1, flags=["--image-min-tokens"], env="LLAMA_ARG_IMAGE_MIN_TOKENS", metavar="N", group="embeddings",
        per_model=True, help=_IMAGE_TOKENS_HELP.format("fewest", "smaller images grow"))
    image_max_tokens: int = option(
        -1, flags=["--image-max-tokens"], env="LLAMA_ARG_IMAGE_MAX_TOKENS", metavar="N", group="embeddings",
        per_model=True, help=_IMAGE_TOKENS_HELP.format("most", "larger images shrink"))

    ctx_size: int = option(0, flags=["-c", "--ctx-size"], env="LLAMA_ARG_CTX_SIZE", metavar="N",
                           group="batching", per_model=True,
                           help="context size of all slots together; 0 = the model's own")
    batch_size: int = option(2048, flags=["-b", "--batch-size"], env="LLAMA_ARG_BATCH", metavar="N",
                             group="batching", per_model=True,
                             help="logical batch size; in embedding mode it lowers -ub when smaller, as in llama-server")
    ubatch_size: int = option(512, flags=["-ub", "--ubatch-size"], env="LLAMA_ARG_UBATCH", metavar="N",
                              group="batching", per_model=True,
                              help="physical batch size: one limit on the tokens of one input (with positions, -c and --max-seq)")
    parallel: int = option(-1, flags=["-np", "--parallel"], env="LLAMA_ARG_N_PARALLEL", metavar="N",
                           group="batching", per_model=True, help="number of server slots; -1 = auto (4)")
    dtype: Literal["auto", "float32", "float16", "bfloat16"] = option(
        "auto", flags=["--dtype"], env="LLAMA_ARG_DTYPE", metavar="{auto,float32,float16,bfloat16}",
        group="batching", per_model=True,
        help="compute dtype: auto = float32 on a CPU (half-precision matmuls are slow there), the checkpoint's "
             "own dtype on a GPU; the others force it (quantized layers keep their bits)")
    threads: int = option(-1, flags=["-t", "--threads"], env="LLAMA_ARG_THREADS", metavar="N", group="batching",
                          help="CPU threads for the engine: two passes compute at once on 2+ threads, sharing them for BLAS; "
                               "-1 = every core")
    max_batch_tokens: int = option(
        512, flags=["--max-batch-tokens"], env="LLAMA_ARG_MAX_BATCH_TOKENS", metavar="N", group="batching",
        per_model=True, help="most rows x width in one forward pass (rows run at their longest input's length; lowered at startup to what fits in memory)")
    max_batch_rows: int = option(64, flags=["--max-batch-rows", "--rows"], env="LLAMA_ARG_MAX_BATCH_ROWS",
                                 metavar="N", group="batching", per_model=True,
                                 help="most inputs in one forward pass (lowered at startup to what fits in memory)")
    max_seq: int = option(0, flags=["--max-seq"], env="LLAMA_ARG_MAX_SEQ", metavar="N", group="batching",
                          per_model=True,
                          help="most tokens per input, also the widest shape warmed at startup; "
                               "0 = the per-input limit (positions, -ub, -c), lowered to what fits in memory")
    max_queue_items: int = option(
        4096, flags=["--max-queue-items"], env="LLAMA_ARG_MAX_QUEUE_ITEMS", metavar="N", group="batching",
        per_model=True, help="most inputs waiting for the model; a request that finds it full gets 503 (retry later), one with more inputs than it can ever hold 413")

    models_preset: str | None = option(
        None, flags=["--models-preset"], env="LLAMA_ARG_MODELS_PRESET", metavar="FILE", group="models",
        help="INI file of models to serve, one [section] per model id, keys as the per-model options; "
             "re-read on SIGHUP or POST /models?reload=1")
    embedding_model: list[str] = option(
        [], flags=["--embedding-model"], kind="accumulating", env="LLAMA_ARG_EMBEDDING_MODEL", metavar="REF[=ALIAS]",
        group="models", help="also serve this embedding model (a folder, a .gguf file or an org/name[:QUANT] repository); repeatable")
    reranker_model: list[str] = option(
        [], flags=["--reranker-model"], kind="accumulating", env="LLAMA_ARG_RERANKER_MODEL", metavar="REF[=ALIAS]",
        group="models", help="also serve this reranker (a folder, a .gguf file or an org/name[:QUANT] repository); repeatable")
    models_max: int = option(
        4, flags=["--models-max"], env="LLAMA_ARG_MODELS_MAX", metavar="N", group="models",
        help="most models loaded at once; the least recently used idle one is unloaded first; 0 = no limit")
    sleep_idle_seconds: int = option(
        -1, flags=["--sleep-idle-seconds"], metavar="N", group="models",
        help="unload a model nobody has used for N seconds (several-model server); -1 = never")

    threads_http: int = option(-1, flags=["--threads-http"], env="LLAMA_ARG_THREADS_HTTP", metavar="N",
                               group="http", help="threads serving HTTP requests; -1 = auto")
    timeout: int = option(3600, flags=["-to", "--timeout"], env="LLAMA_ARG_TIMEOUT", metavar="N", group="http",
                          help="HTTP read/write timeout in seconds, also each request's deadline (a lazy model load included; "
                               "504 when it passes)")
    payload_limit: int = option(
        2_000_000, flags=["--payload-limit"], env="LLAMA_ARG_PAYLOAD_LIMIT", metavar="BYTES", group="http",
        help="largest request body in bytes (TEI's flag); a larger one is answered 413 before it is read to the "
             "end, chunked bodies included")
    max_client_batch_size: int = option(
        2048, flags=["--max-client-batch-size"], env="LLAMA_ARG_MAX_CLIENT_BATCH_SIZE", metavar="N",
        group="http",
        help="most inputs (texts, or documents to rerank or score by MaxSim) in one request (TEI's flag); more is 413")
    connection_limit: int = option(
        1000, flags=["--connection-limit"], env="LLAMA_ARG_CONNECTION_LIMIT", metavar="N", group="http",
        help="most open client connections, idle keep-alive ones included; beyond it new connections wait in "
             "the listen backlog")
    shutdown_timeout: int = option(
        30, flags=["--shutdown-timeout"], env="LLAMA_ARG_SHUTDOWN_TIMEOUT", metavar="N", group="http",
        help="on SIGTERM or SIGINT, seconds to let requests in flight finish (/health answers 503 meanwhile) "
             "before exiting; a second signal exits at once")
    cors_origins: str = option("*", flags=["--cors-origins"], env="LLAMA_ARG_CORS_ORIGINS", metavar="ORIGINS",
                               group="http", help="allowed CORS origins: * (any), localhost (localhost, 127.0.0.1 and ::1 "
                                                   "only) or a comma-separated list of origins")
    cors_methods: str = option(
        "GET, POST, DELETE, OPTIONS", flags=["--cors-methods"], env="LLAMA_ARG_CORS_METHODS", metavar="METHODS",
        group="http", help="allowed CORS methods")
    cors_headers: str = option("*", flags=["--cors-headers"], env="LLAMA_ARG_CORS_HEADERS", metavar="HEADERS",
                               group="http", help="allowed CORS headers")
    cors_credentials: bool = option(
        True, flags=["--cors-credentials"], kind="paired", env="LLAMA_ARG_CORS_CREDENTIALS", group="http",
        help="allow CORS credentials")

    verbosity: int = option(
        3, flags=["-lv", "--verbosity", "--log-verbosity"], env="LLAMA_ARG_LOG_VERBOSITY", metavar="N",
        group="logging", help="log threshold: 0 generic, 1 error, 2 warning, 3 info, 4 trace, 5 debug")
    verbose: bool = option(False, flags=["-v", "--verbose", "--log-verbose"], kind="flag", group="logging",
                           implies={"verbosity": 5}, help="log everything (sets the verbosity to 5)")
    log_disable: bool = option(False, flags=["--log-disable"], kind="flag", group="logging", help="log nothing")
    log_file: str | None = option(None, flags=["--log-file"], env="LLAMA_ARG_LOG_FILE", metavar="FNAME",
                                  group="logging", help="also write the log to this file")

    @field_validator("alias", "tags")
    @classmethod
    def _sorted_set(cls, value: list[str]) -> list[str]:
        return sorted(set(value))  # llama keeps them in a std::set

    @field_validator("parallel")
    @classmethod
    def _parallel_not_zero(cls, value: int) -> int:
        if value == 0:
            raise ValueError("n_parallel must not be 0 (-1 = auto)")
        return value

    @field_validator("payload_limit", "max_client_batch_size", "connection_limit", "media_max_bytes", "media_timeout",
                     "image_max_count", "image_max_pixels")
    @classmethod
    def _positive(cls, value: int) -> int:
        if value < 1:
            raise ValueError("must be 1 or more")
        return value

    @field_validator("image_max_tokens")
    @classmethod
    def _image_token_bounds_ordered(cls, value: int, info: ValidationInfo) -> int:
        low = info.data.get("image_min_tokens", -1)
        if value > 0 and low > value:  # llama.cpp refuses max_pixels < min_pixels too
            raise ValueError(f"{value} is below --image-min-tokens ({low})")
        return value

    @field_validator("shutdown_timeout")
    @classmethod
    def _not_negative(cls, value: int) -> int:
        if value < 0:
            raise ValueError("must be 0 (exit at once) or more")
        return value

    @field_validator("models_max")
    @classmethod
    def _models_max_not_negative(cls, value: int) -> int:
        if value < 0:
            raise ValueError("must be 0 (no limit) or more")
        return value

    @field_validator("sleep_idle_seconds")
    @classmethod
    def _sleep_never_or_positive(cls, value: int) -> int:
        if value == 0 or value < -1:
            raise ValueError("must be -1 (never) or a number of seconds")
        return value

    # Where the options came from, so that each model of a several-model server is resolved the same way
    # (ModelSettings): the config files read, and the command line and environment laid over them.
    _config_files: tuple[Path, ...] = PrivateAttr(default=())
    _command_line: tuple[Any, ...] = PrivateAttr(default=())  # _Arg
    _environment: dict[str, str] = PrivateAttr(default_factory=dict)  # the option variables only

    def __eq__(self, other: object) -> bool:
        # settings are equal when their options are, wherever they came from
        return type(other) is type(self) and self.__dict__ == other.__dict__

    @property
    def model_name(self) -> str:
        """The name the API reports: llama's first alias, else --hf-repo, else -m as typed."""
        if self.alias:
            return self.alias[0]
        return self.hf_repo or self.model or DEFAULT_MODEL_NAME

    @property
    def n_ubatch(self) -> int:
        """llama's effective n_ubatch (it forces n_batch = n_ubatch in embedding mode)."""
        return min(self.batch_size, self.ubatch_size)

    def engine_options(self, model_path: str | None) -> EngineOptions:
        return EngineOptions(
            model_path=model_path,
            hf_repo=self.hf_repo,
            hf_file=self.hf_file,
            offline=self.offline,
            pooling=self.pooling,
            ubatch_tokens=self.n_ubatch,
            ctx_size=self.ctx_size,
            parallel=self.parallel,
            truncate=self.truncate,
            max_batch_tokens=self.max_batch_tokens,
            max_batch_rows=self.max_batch_rows,
            max_seq=self.max_seq,
            max_queue_items=self.max_queue_items,
            threads=self.threads,
            dtype=self.dtype,
            rerank_sigmoid=self.rerank_sigmoid,
            rerank_instruction=self.rerank_instruction,
            default_prompt_name=self.default_prompt_name,
            image_max_pixels=self.image_max_pixels,
            image_min_tokens=self.image_min_tokens,
            image_max_tokens=self.image_max_tokens,
        )


# llama-server options that mean nothing here. They are accepted (once logged) so launch scripts keep working;
# each string is one option's spellings. Their environment variables are not read.
_IGNORED_WITH_VALUE = (
    "-ngl --gpu-layers --n-gpu-layers", "-fa --flash-attn", "--temp", "-s --seed", "-ctk --cache-type-k",
    "-ctv --cache-type-v", "-n --n-predict --predict", "-hft --hf-token", "--mmproj",
    "-cram --cache-ram", "--chat-template", "--chat-template-file",
    "--reasoning-format", "--slot-save-path", "-gan --grp-attn-n", "-gaw --grp-attn-w", "-dev --device",
    "--models-dir", "-mu --model-url", "--lora", "--spec-type", "--tools",
)
_IGNORED_FLAGS = (
    "--jinja --no-jinja", "-cb --cont-batching -nocb --no-cont-batching", "-kvu --kv-unified -no-kvu --no-kv-unified",
    "--no-mmproj", "--ui --webui --no-ui --no-webui", "--reuse-port", "--cache-prompt --no-cache-prompt",
    "--swa-full", "--context-shift --no-context-shift", "--no-warmup", "--mlock", "--no-mmap",
    "--no-models-autoload", "--log-prefix --no-log-prefix", "--log-timestamps --no-log-timestamps",
)
# Options whose value may be left out: the next argument is taken only if it is one of these.
_IGNORED_OPTIONAL_VALUE = {"--log-colors": ("on", "off", "auto")}

TRUTHY = ("on", "enabled", "true", "1")  # llama.cpp's words, exact and case-sensitive
FALSEY = ("off", "disabled", "false", "0")
_STOI = re.compile(r"[ \t\n\v\f\r]*([+-]?[0-9]+)")


@dataclass(frozen=True, eq=False)  # compared and hashed by identity
class _Option:
    field: str | None  # None: accepted for compatibility and ignored
    flags: tuple[str, ...]
    no_flags: tuple[str, ...]  # paired options: the spellings that turn it off
    env: str | None
    kind: str  # a Kind, or "ignored"
    arity: Literal["none", "one", "optional"]
    choices: tuple[str, ...]  # "optional" arity: the values that may follow
    metavar: str | None
    help: str
    group: str
    default: Any
    implies: Mapping[str, Any]
    convert: Callable[[str], Any]  # the text of a value option to its value
    per_model: bool  # a model section of a several-model server may set it

    @property
    def config_key(self) -> str:
        return next(flag for flag in self.flags if flag.startswith("--")).lstrip("-")


def _stoi(text: str) -> int:
    """std::stoi: leading blanks, a sign and digits; whatever follows is dropped."""
    match = _STOI.match(text)
    if match is None:
        raise ValueError(f"invalid integer {text!r}")
    value = int(match.group(1))
    if not -(2**31) <= value < 2**31:
        raise ValueError(f"integer out of range: {text!r}")
    return value


def _pooling(text: str) -> Pooling:
    try:
        return Pooling(text)
    except ValueError:
        names = ", ".join(p.value for p in Pooling)
        raise ValueError(f"invalid value {text!r} (expected one of {names})") from None


def _converter(annotation: Any) -> Callable[[str], Any]:
    types = set(get_args(annotation)) or {annotation}
    if int in types:
        return _stoi
    if Pooling in types:
        return _pooling
    return str


def _declared_options(declaring: type[BaseSettings]) -> list[_Option]:
    """The options `declaring`'s fields declare, then (for the server's Settings) llama's ignored ones."""
    options = []
    for name, info in declaring.model_fields.items():
        meta = info.json_schema_extra
        assert isinstance(meta, dict), f"{name} is not declared with option()"
        kind = meta["kind"]
        flags = tuple(meta["flags"])
        no_flags = tuple("--no-" + f[2:] for f in flags if f.startswith("--")) if kind == "paired" else ()
        options.append(_Option(
            field=name, flags=flags, no_flags=no_flags, env=meta["env"], kind=kind,
            arity="none" if kind in ("flag", "paired") else "one", choices=(), metavar=meta["metavar"],
            help=meta["help"], group=meta["group"], default=info.get_default(call_default_factory=True),
            implies=meta["implies"], convert=_converter(info.annotation), per_model=meta["per_model"]))
    if declaring is not Settings:
        return options
    ignored: list[tuple[str, Literal["none", "one", "optional"], tuple[str, ...]]] = [
        *((spellings, "one", ()) for spellings in _IGNORED_WITH_VALUE),
        *((spellings, "none", ()) for spellings in _IGNORED_FLAGS),
        *((spellings, "optional", values) for spellings, values in _IGNORED_OPTIONAL_VALUE.items()),
    ]
    for spellings, arity, choices in ignored:
        metavar = {"one": "VALUE", "none": None, "optional": f"[{'|'.join(choices)}]"}[arity]
        options.append(_Option(
            field=None, flags=tuple(spellings.split()), no_flags=(), env=None, kind="ignored", arity=arity,
            choices=choices, metavar=metavar, help="accepted and ignored", group="ignored-for-compatibility",
            default=None, implies={}, convert=str, per_model=False))
    return options


_OPTIONS = _declared_options(Settings)


def _spelling_index(spelling_of: Callable[[str], str],
                    options: Sequence[_Option] = _OPTIONS) -> dict[str, tuple[_Option, bool]]:
    """Every spelling -> (its option, whether the spelling negates it); a spelling declared twice is a bug."""
    index: dict[str, tuple[_Option, bool]] = {}
    for opt in options:
        for spelling, negated in [*((f, False) for f in opt.flags), *((f, True) for f in opt.no_flags)]:
            key = spelling_of(spelling)
            assert key not in index, f"option spelling {spelling} declared twice"
            index[key] = (opt, negated)
    return index


_BY_FIELD = {opt.field: opt for opt in _OPTIONS if opt.field}
_BY_FLAG = _spelling_index(lambda flag: flag)
# INI keys: any spelling without its dashes, or the env name.
_BY_INI_KEY = _spelling_index(lambda flag: flag.lstrip("-"))
_BY_INI_KEY.update({opt.env: (opt, False) for opt in _OPTIONS if opt.env})

_HELP_FLAGS = ("-h", "--help", "--usage")


def _no_env(env: str) -> str:
    return env.replace("LLAMA_ARG_", "LLAMA_ARG_NO_")


def _ini_option(key: str) -> tuple[_Option, bool] | None:
    return _BY_INI_KEY.get(key) or _BY_INI_KEY.get(key.replace("_", "-"))


def _env_is_set(opt: _Option, environ: Mapping[str, str]) -> bool:
    return opt.env is not None and (opt.env in environ or (opt.kind == "paired" and _no_env(opt.env) in environ))


# Every variable an option reads, LLAMA_ARG_NO_X included: what a Settings keeps of the environment.
_OPTION_VARIABLES = frozenset(name for opt in _OPTIONS if opt.env
                              for name in (opt.env, *([_no_env(opt.env)] if opt.kind == "paired" else [])))

PER_MODEL_FIELDS = frozenset(opt.field for opt in _OPTIONS if opt.per_model)
MODEL_IDENTITY = frozenset({"model", "hf_repo", "hf_file", "alias", "tags"})  # name one model, so never inherited
MODEL_KIND = frozenset({"embedding", "reranking", "pooling"})  # on the command line: the -m model's kind


def _csv(text: str) -> list[str]:
    return [item.strip() for item in text.split(",") if item.strip()]


def _read_key_file(path: str) -> list[str]:
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
        mode = Path(path).stat().st_mode
    except OSError as exc:
        raise ValueError(f"failed to open file '{path}': {exc.strerror}") from None
    if mode & stat.S_IROTH:
        logger.warning("warning: the API key file %s is readable by every user of this machine (mode %s); "
                       "restrict it, e.g. chmod 600 %s", path, stat.filemode(mode), path)
    return [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]


@contextmanager
def _handling(where: str) -> Iterator[None]:
    """Reword a bad value as llama does, naming where it came from."""
    try:
        yield
    except ValueError as exc:
        raise SettingsError(f"error while handling {where}: {exc}") from None


@dataclass(frozen=True)
class _Arg:
    """One option found on the command line."""

    opt: _Option
    spelling: str  # as typed, underscores made hyphens
    value: str | None
    negated: bool


def _read_command_line(argv: list[str], by_flag: Mapping[str, tuple[_Option, bool]] = _BY_FLAG,
                       help_text: Callable[[], str] = lambda: format_help()) -> list[_Arg]:
    """Split argv into options and their values, before anything is applied."""
    found = []
    i = 0
    while i < len(argv):
        token = argv[i]
        i += 1
        name, equals, value = token.partition("=") if token.startswith("-") else (token, "", "")
        inline = value if equals else None
        if name.startswith("--"):
            name = name.replace("_", "-")
        if name in _HELP_FLAGS:
            raise HelpRequested(help_text())
        if name not in by_flag:
            raise SettingsError(f"invalid argument: {token}")
        opt, negated = by_flag[name]
        if opt.arity == "none" and inline is not None:
            raise SettingsError(f'error while handling argument "{name}": this option takes no value')
        if opt.arity == "one" and inline is None:
            if i == len(argv):
                raise SettingsError(f'error while handling argument "{name}": expected value for argument')
            inline = argv[i]
            i += 1
        if opt.arity == "optional" and inline is None and i < len(argv) and argv[i] in opt.choices:
            inline = argv[i]
            i += 1
        found.append(_Arg(opt, name, inline, negated))
    return found


class _Resolver:
    """Applies options layer by layer onto a dict of field values, each later application winning."""

    def __init__(self, quiet: bool = False) -> None:
        self.values: dict[str, Any] = {}
        # An accumulating option gathers repeats within one layer; a higher layer replaces what it gathered.
        self._filled_by: dict[str, str] = {}
        self._ignored_seen: set[_Option] = set()
        self._quiet = quiet  # resolving one model: what the server's own parse logged is not logged again

    def copy(self) -> _Resolver:
        twin = _Resolver(self._quiet)
        twin.values = copy.deepcopy(self.values)
        twin._filled_by = dict(self._filled_by)
        return twin

    def forget(self, fields: Collection[str]) -> None:
        for field in fields:
            self.values.pop(field, None)
            self._filled_by.pop(field, None)

    def apply(self, opt: _Option, value: str | bool, layer: str) -> None:
        """value: the text of a value/accumulating option, the on/off state of a flag/paired one."""
        assert opt.field is not None
        if isinstance(value, bool):
            self.values[opt.field] = value
            if value:
                self.values.update(opt.implies)
        elif opt.kind == "accumulating":
            self._extend(opt.field, _csv(value), layer)
        elif opt.kind == "repeated":
            self._extend(opt.field, [value], layer)
        else:
            self.values[opt.field] = opt.convert(value)
            if opt.field == "api_key_file":
                self._extend("api_key", _read_key_file(value), layer)

    def _extend(self, field: str, items: list[str], layer: str) -> None:
        if self._filled_by.get(field) != layer:
            self._filled_by[field] = layer
            self.values[field] = []
        self.values[field].extend(items)

    def ignore(self, opt: _Option, spelling: str) -> None:
        if opt not in self._ignored_seen and not self._quiet:
            self._ignored_seen.add(opt)
            logger.info("ignoring %s: not used by mlx-embed-server", spelling)

    def _apply_text(self, opt: _Option, negated: bool, text: str, layer: str) -> None:
        """An INI value: flags apply whatever it says, as llama does; paired options read it as a boolean."""
        if opt.kind == "flag":
            self.apply(opt, True, layer)
        elif opt.kind == "paired":
            self.apply(opt, (text in TRUTHY) != negated, layer)
        else:
            self.apply(opt, text, layer)

    def apply_ini(self, path: Path, only: Collection[str] | None = None) -> None:
        """A config file's global sections (as llama: [*], [default] and keys before any section)."""
        try:
            sections = read_ini(path)
        except PresetError as exc:
            raise SettingsError(str(exc)) from None
        if not self._quiet:
            logger.info("using config file: %s", path)
        layer = f"file:{path}"
        for section, entries in sections.items():
            if section not in GLOBAL_SECTIONS:
                continue
            for entry in entries:
                if entry.key == "version" or entry.key in PRESET_ONLY_KEYS:  # llama's; models.py reads them
                    continue
                found = _ini_option(entry.key)
                if found is None:
                    if not self._quiet:
                        logger.warning("%s:%d: unknown key %r ignored", path, entry.line, entry.key)
                    continue
                opt, negated = found
                if opt.field is None:
                    self.ignore(opt, entry.key)
                elif only is not None and opt.field not in only:
                    continue
                elif opt.field == "config":  # config files do not chain
                    if not self._quiet:
                        logger.warning("%s:%d: key %r ignored in a config file", path, entry.line, entry.key)
                else:
                    with _handling(f'key "{entry.key}" in {path} line {entry.line}'):
                        self._apply_text(opt, negated, entry.value, layer)

    def apply_section(self, section: IniSection, *, names_a_model: bool) -> None:
        """A models preset's [*] or one model's section: per-model options only, and strictly (anything else
        is an error naming the file, the section and the key)."""
        layer = f"section:{section.source}:{section.name}"
        for entry in section.entries:
            if entry.key == "version":
                continue
            where = section.where(entry)
            found = _ini_option(entry.key)
            if found is None:
                raise SettingsError(f"{where}: no such option")
            opt, negated = found
            if opt.field is None:  # a llama option without meaning here: accepted, as on the command line
                continue
            if not opt.per_model:
                raise SettingsError(f"{where}: a server-wide option, not a model's; set it on the command line, "
                                    f"in the environment or in the [*] section of --config")
            if not names_a_model and opt.field in MODEL_IDENTITY:
                raise SettingsError(f"{where}: names one model; put it in that model's own section")
            try:
                self._apply_text(opt, negated, entry.value, layer)
            except ValueError as exc:
                raise SettingsError(f"{where}: {exc}") from None

    def apply_env(self, environ: Mapping[str, str], only: Collection[str] | None = None) -> None:
        for opt in _OPTIONS:
            if opt.env is None or not _env_is_set(opt, environ) or (only is not None and opt.field not in only):
                continue
            with _handling(f'environment variable "{opt.env}"'):
                if opt.kind == "paired" and _no_env(opt.env) in environ:
                    self.apply(opt, False, "env")  # LLAMA_ARG_NO_X, whatever its value, wins
                    continue
                text = environ[opt.env]
                if opt.kind == "flag":
                    if text in TRUTHY:  # anything else is silently ignored, as llama does
                        self.apply(opt, True, "env")
                elif opt.kind == "paired":
                    if text not in TRUTHY and text not in FALSEY:
                        raise ValueError("invalid boolean value")
                    self.apply(opt, text in TRUTHY, "env")
                else:
                    self.apply(opt, text, "env")

    def apply_command_line(self, args: Sequence[_Arg], environ: Mapping[str, str],
                           only: Collection[str] | None = None) -> None:
        for arg in args:
            if only is not None and arg.opt.field not in only:
                continue
            if arg.opt.field is None:
                self.ignore(arg.opt, arg.spelling)
                continue
            if _env_is_set(arg.opt, environ) and not self._quiet:
                logger.warning("warn: %s environment variable is set, but will be overwritten by command line "
                               "argument %s", arg.opt.env, arg.spelling)
            with _handling(f'argument "{arg.spelling}"'):
                self.apply(arg.opt, not arg.negated if arg.value is None else arg.value, "cli")


def _user_config_file(environ: Mapping[str, str]) -> Path | None:
    """${XDG_CONFIG_HOME:-$HOME/.config}/llama.cpp/config.ini; None without either variable."""
    if base := environ.get("XDG_CONFIG_HOME"):
        return Path(base) / "llama.cpp" / "config.ini"
    if home := environ.get("HOME"):
        return Path(home) / ".config" / "llama.cpp" / "config.ini"
    return None


def parse_settings(
    argv: list[str], environ: Mapping[str, str], *, system_config_files: list[Path] | None = None
) -> Settings:
    """Resolve the options as llama-server does. argv excludes the program name.

    system_config_files replaces /etc/llama.cpp/config.ini and the user's config.ini (tests pass temp files);
    the ones that do not exist are skipped.
    """
    args = _read_command_line(argv)
    resolver = _Resolver()
    if system_config_files is None:
        system_config_files = [SYSTEM_CONFIG_FILE, *filter(None, [_user_config_file(environ)])]
    files = [path for path in system_config_files if path.is_file()]
    config_env = _BY_FIELD["config"].env or ""
    config = next((a.value for a in reversed(args) if a.opt.field == "config"), environ.get(config_env))
    if config is not None:
        if not Path(config).is_file():
            raise SettingsError(f"config file not found: {config}")
        files.append(Path(config))
    for path in files:
        resolver.apply_ini(path)
    resolver.apply_env(environ)
    resolver.apply_command_line(args, environ)
    settings = _build(resolver.values)
    settings._config_files = tuple(files)
    settings._command_line = tuple(args)
    settings._environment = {name: value for name, value in environ.items() if name in _OPTION_VARIABLES}
    return settings


def _build(values: dict[str, Any], where: str = "", declaring: type[BaseSettings] = Settings,
           by_field: Mapping[str, _Option] = _BY_FIELD) -> Any:
    """Validate resolved values; `where` prefixes the message (a model's section)."""
    try:
        return declaring(**values)
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            opt = by_field[str(error["loc"][0])]
            message = str(error["msg"]).removeprefix("Value error, ")
            problems.append(f"invalid value for {', '.join(opt.flags)}: {message}")
        raise SettingsError(where + "; ".join(problems)) from None


class ModelSettings:
    """The settings each model of a several-model server runs with, resolved as llama's router does.

    Per-model options, low to high: defaults, the config files' global sections, the models preset's [*], the
    model's own section, then the environment and the command line. On the command line, -m/-hf/--alias/--tags
    and --embedding/--reranking/--pooling describe the -m model only; its other per-model options override
    every model (llama: "command-line arguments have the highest priority"). Server-wide options are the
    server's own whatever a file says. Files are read when this is made: make a new one to re-read them.
    """

    def __init__(self, settings: Settings, preset_globals: Sequence[IniSection] = ()) -> None:
        self._settings = settings
        self._base = _Resolver(quiet=True)
        for path in settings._config_files:
            self._base.apply_ini(path, only=PER_MODEL_FIELDS)
        for section in preset_globals:
            self._base.apply_section(section, names_a_model=False)

    def resolve(self, section: IniSection | None) -> Settings:
        """The settings of the model `section` declares; None: the command line's -m model."""
        resolver = self._base.copy()
        only = PER_MODEL_FIELDS
        if section is not None:
            resolver.forget(MODEL_IDENTITY)  # a section names its own checkpoint
            resolver.apply_section(section, names_a_model=True)
            only = PER_MODEL_FIELDS - MODEL_IDENTITY - MODEL_KIND
        environment, command_line = self._settings._environment, self._settings._command_line
        resolver.apply_env(environment, only)
        resolver.apply_command_line(command_line, environment, only)
        resolved = _build(resolver.values, f"{section.source}: [{section.name}]: " if section else "")
        return self._settings.model_copy(update={field: getattr(resolved, field) for field in PER_MODEL_FIELDS})


def _shown_default(opt: _Option) -> str:
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
    return _help_text(_OPTIONS, GROUPS, [
        "usage: mlx-embed-server [options]",
        "",
        "A llama-server compatible embeddings and reranking server on MLX. Options are read, low to high, from",
        "/etc/llama.cpp/config.ini, ${XDG_CONFIG_HOME:-$HOME/.config}/llama.cpp/config.ini, --config FILE,",
        "the environment and the command line.",
        f"Example config files: {config_examples_dir()}",
    ])


def _help_text(options: Sequence[_Option], groups: Sequence[str], intro: list[str]) -> str:
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
        for opt in _OPTIONS
    ]


# -- the offline commands (mlx-embed, mlx-rerank) ---------------------------------------------------------------
# Their own options are declared below like the server's; those they share with the server (-m, -hf, --pooling,
# --embd-normalize, --truncate, ...) are the server's declarations, reused. They read the command line only:
# no config files, no environment (a server's LLAMA_ARG_* must not change a one-off command).


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

    model_config = SettingsConfigDict(extra="forbid")

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
        return _build({server: getattr(self, name) for name, server in self.shared_fields().items()})

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
                "instruction": self.instruction, "batch_size": self.batch_size or None}

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


def command_options(command: type[BaseSettings]) -> list[_Option]:
    return _declared_options(command)


def command_table(command: type[BaseSettings]) -> list[dict[str, Any]]:
    """One row per option of an offline command: flags, default, help, group, shared (a server option reused) and
    server_help (its help is the server's, unchanged)."""
    rows = []
    for opt in command_options(command):
        meta = command.model_fields[str(opt.field)].json_schema_extra
        server = _BY_FIELD.get(meta.get("server_field")) if isinstance(meta, dict) else None
        rows.append({"flags": list(opt.flags + opt.no_flags), "default": opt.default, "help": opt.help,
                     "group": opt.group, "shared": server is not None,
                     "server_help": server is not None and opt.help == server.help})
    return rows


def command_help(command: type[BaseSettings]) -> str:
    return _help_text(command_options(command), _COMMAND_GROUPS, _COMMAND_USAGE[command])


def parse_command(command: type[_ModelOptions], argv: list[str]) -> Any:
    """An offline command's options from its command line (argv without the program name)."""
    options = command_options(command)
    by_flag = _spelling_index(lambda flag: flag, options)
    args = _read_command_line(argv, by_flag, lambda: command_help(command))
    resolver = _Resolver(quiet=True)
    for arg in args:
        with _handling(f'argument "{arg.spelling}"'):
            resolver.apply(arg.opt, not arg.negated if arg.value is None else arg.value, "cli")
    return _build(resolver.values, declaring=command, by_field={opt.field: opt for opt in options if opt.field})
