"""The server's option table: every flag, environment variable, config key, default and help of
mlx-embed-server, declared once as the fields of `Settings`, and the llama-server options accepted here and
ignored. Everything else (the resolver, the help, the README's tables, the offline commands' shared options)
reads this table.
"""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, PrivateAttr, ValidationInfo, field_validator

from compat.settings.declaration import BYTES, STOUL32, ExplicitSettings, Option, declared_options, option
from engine.types import DEFAULT_MODEL_NAME, EngineOptions, Pooling

GROUPS = ("server", "model", "embeddings", "batching", "models", "http", "logging", "ignored-for-compatibility")


# --image-min-tokens / --image-max-tokens (llama.cpp's reading: N tokens are N x (patch x merge)^2 pixels)
_IMAGE_TOKENS_HELP = ("{} tokens one image becomes in dynamic-resolution vision models (Qwen3-VL, ColQwen2): {} to "
                      "N x (patch x merge)^2 pixels; 0 or less = the checkpoint's preprocessor_config.json bound; "
                      "fixed-size and tiling models do not use it")


class Settings(ExplicitSettings):
    """The resolved configuration. Field order is the order environment variables are applied in."""

    model_config = ConfigDict(extra="forbid")

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
    seed: Annotated[int, STOUL32] = option(
        4294967295, flags=["-s", "--seed"], metavar="SEED", group="server", per_model=True,
        help="llama-server's RNG seed: nothing samples here, /props reports it (default_generation_settings.params"
             ".seed); read as llama reads it, so -1 is the default 4294967295 (llama: a random seed)")

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
        None, flags=["--pooling"], env="LLAMA_ARG_POOLING", metavar="{none,mean,cls,last,rank,max,splade}",
        group="embeddings", per_model=True,
        help="pooling type; unset = the model's own (max and splade are our extensions: splade serves a "
             "BertForMaskedLM / DistilBertForMaskedLM as a sparse encoder on /embed_sparse, as TEI's --pooling splade)")
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
    rerank_chunks: int = option(
        0, flags=["--rerank-chunks"], env="LLAMA_ARG_RERANK_CHUNKS", metavar="N", group="embeddings",
        per_model=True,
        help="rerankers: split a document over the model's limit into at most N overlapping token windows (a "
             "quarter of a window shared), each scored beside the query, the document getting its best window's "
             "score; 0 = off (such a document is refused, or cut with --truncate); a request's "
             "'max_chunks_per_doc' overrides it")
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
        help="most seconds downloading one http(s) image may take: one deadline over name resolution, connecting, "
             "the answer's headers and its body")
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
             "own dtype on a GPU; the others force it (and the dtype quantized layers are dequantized to)")
    keep_quantized: bool = option(
        False, flags=["--keep-quantized"], kind="paired", env="LLAMA_ARG_KEEP_QUANTIZED", group="batching",
        per_model=True,
        help="MLX-quantized folders keep their bits on a CPU too (smaller in memory, but MLX's CPU quantized "
             "matmul is far slower); by default a CPU dequantizes them to the compute dtype at load, a GPU always "
             "runs its quantized kernels. GGUF block formats are always dequantized at load")
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
                          help="most tokens per input; 0 = the per-input limit (positions, -ub, -c), lowered to "
                               "what fits in memory (startup runs rows of 16 and 64 tokens and charges the rest by their memory law)")
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
    lora: list[str] = option(
        [], flags=["--lora"], kind="accumulating", metavar="FNAME", group="models",
        help="llama.cpp LoRA adapter GGUF merged into a GGUF model's weights at load (scale 1), as llama-server "
             "applies it to every embedding (jina-embeddings-v3's task adapters); several comma-separated, or "
             "repeat the option")
    lora_scaled: list[str] = option(
        [], flags=["--lora-scaled"], kind="accumulating", metavar="FNAME:SCALE", group="models",
        help="a LoRA adapter GGUF as --lora, with its scale; several comma-separated, or repeat the option")
    models_max: int = option(
        4, flags=["--models-max"], env="LLAMA_ARG_MODELS_MAX", metavar="N", group="models",
        help="most models loaded at once; the least recently used idle one is unloaded first; 0 = no limit")
    models_memory: Annotated[int, BYTES] = option(
        0, flags=["--models-memory"], env="LLAMA_ARG_MODELS_MEMORY", metavar="BYTES", group="models",
        help="most memory the loaded models may hold together, each counted at its resident size measured at load "
             "(before its first load, its weight files' size): the least recently used idle one is unloaded first, "
             "and a model that alone holds more is refused; bytes or with a unit (4G, 512M, 1.5GiB: powers of 1024; "
             "4GB: of 1000); 0 = no limit")
    models_memory_floor: Annotated[int, BYTES] = option(
        0, flags=["--models-memory-floor"], env="LLAMA_ARG_MODELS_MEMORY_FLOOR", metavar="BYTES", group="models",
        help="system memory to keep free (Linux MemAvailable) when a model loads: idle models are unloaded to make "
             "room, and a load that would leave less even so is refused (503); same units as --models-memory; "
             "0 = none")
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

    @field_validator("rerank_chunks")
    @classmethod
    def _chunks_off_or_positive(cls, value: int) -> int:
        if value < 0:
            raise ValueError("must be 0 (off) or a number of windows")
        return value

    @field_validator("lora_scaled")
    @classmethod
    def _adapter_and_scale(cls, value: list[str]) -> list[str]:
        for item in value:
            parts = item.split(":")
            if len(parts) != 2:
                raise ValueError(f"{item!r}: lora-scaled format: FNAME:SCALE")
            float(parts[1])
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
    _command_line: tuple[Any, ...] = PrivateAttr(default=())  # resolver.CommandLineArg
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
            keep_quantized=self.keep_quantized,
            rerank_sigmoid=self.rerank_sigmoid,
            rerank_instruction=self.rerank_instruction,
            rerank_chunks=self.rerank_chunks,
            default_prompt_name=self.default_prompt_name,
            image_max_pixels=self.image_max_pixels,
            image_min_tokens=self.image_min_tokens,
            image_max_tokens=self.image_max_tokens,
            lora=tuple((path, 1.0) for path in self.lora)
            + tuple((item.split(":")[0], float(item.split(":")[1])) for item in self.lora_scaled),
        )


# llama-server options that mean nothing here. They are accepted (once logged) so launch scripts keep working;
# each string is one option's spellings. Their environment variables are not read.
_IGNORED_WITH_VALUE = (
    "-ngl --gpu-layers --n-gpu-layers", "-fa --flash-attn", "--temp", "-ctk --cache-type-k",
    "-ctv --cache-type-v", "-n --n-predict --predict", "-hft --hf-token", "--mmproj",
    "-cram --cache-ram", "--chat-template", "--chat-template-file",
    "--reasoning-format", "--slot-save-path", "-gan --grp-attn-n", "-gaw --grp-attn-w", "-dev --device",
    "--models-dir", "-mu --model-url", "--spec-type", "--tools",
)
_IGNORED_FLAGS = (
    "--jinja --no-jinja", "-cb --cont-batching -nocb --no-cont-batching", "-kvu --kv-unified -no-kvu --no-kv-unified",
    "--no-mmproj", "--ui --webui --no-ui --no-webui", "--reuse-port", "--cache-prompt --no-cache-prompt",
    "--swa-full", "--context-shift --no-context-shift", "--no-warmup", "--mlock", "--no-mmap",
    "--no-models-autoload", "--log-prefix --no-log-prefix", "--log-timestamps --no-log-timestamps",
)
# Options whose value may be left out: the next argument is taken only if it is one of these.
_IGNORED_OPTIONAL_VALUE = {"--log-colors": ("on", "off", "auto")}


def _ignored_options() -> list[Option]:
    """llama's options that mean nothing here, as options the parsers accept and ignore."""
    ignored: list[tuple[str, Literal["none", "one", "optional"], tuple[str, ...]]] = [
        *((spellings, "one", ()) for spellings in _IGNORED_WITH_VALUE),
        *((spellings, "none", ()) for spellings in _IGNORED_FLAGS),
        *((spellings, "optional", values) for spellings, values in _IGNORED_OPTIONAL_VALUE.items()),
    ]
    options = []
    for spellings, arity, choices in ignored:
        metavar = {"one": "VALUE", "none": None, "optional": f"[{'|'.join(choices)}]"}[arity]
        options.append(Option(
            field=None, flags=tuple(spellings.split()), no_flags=(), env=None, kind="ignored", arity=arity,
            choices=choices, metavar=metavar, help="accepted and ignored", group="ignored-for-compatibility",
            default=None, implies={}, convert=str, per_model=False))
    return options


# Every server option, the ignored ones last; and the declared ones by field.
SERVER_OPTIONS = [*declared_options(Settings), *_ignored_options()]
SERVER_OPTIONS_BY_FIELD = {opt.field: opt for opt in SERVER_OPTIONS if opt.field}

PER_MODEL_FIELDS = frozenset(opt.field for opt in SERVER_OPTIONS if opt.per_model)
MODEL_IDENTITY = frozenset({"model", "hf_repo", "hf_file", "alias", "tags"})  # name one model, so never inherited
MODEL_KIND = frozenset({"embedding", "reranking", "pooling"})  # on the command line: the -m model's kind
