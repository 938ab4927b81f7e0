"""Plain data shared by the engine and its callers. Nothing here imports MLX."""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Union


class TokenSpan(NamedTuple):
    """One token of a text and where it came from (TEI's /tokenize)."""

    id: int
    text: str  # the text it covers; a special token's own text
    special: bool
    start: int | None  # UTF-8 byte offsets in the text; None for a special token
    stop: int | None


class Pooling(str, enum.Enum):
    """How per-token hidden states become one vector (llama-server's --pooling, plus max and TEI's splade)."""

    NONE = "none"
    MEAN = "mean"
    CLS = "cls"
    LAST = "last"
    MAX = "max"
    RANK = "rank"
    SPLADE = "splade"  # a masked LM's logits -> log(1 + relu), max (or sum) over tokens: one sparse vector


class VocabType(enum.IntEnum):
    """llama.h's vocabulary kinds, as /v1/models meta.vocab_type reports them."""

    NONE = 0
    SPM = 1
    BPE = 2
    WPM = 3
    UGM = 4


@dataclass(frozen=True)
class EngineOptions:
    """Everything the engine needs to load and serve one checkpoint."""

    model_path: str | None = None  # a local Hugging Face layout folder
    hf_repo: str | None = None  # org/name[:QUANT] resolved through the huggingface-hub cache
    hf_file: str | None = None  # llama's --hf-file: the .gguf of the -hf repository to serve
    offline: bool = False
    pooling: Pooling | None = None  # None: 1_Pooling/config.json, else the family default
    ubatch_tokens: int = 512  # llama's effective n_ubatch: the longest input accepted
    ctx_size: int = 0  # llama's -c; 0 = the model's own
    parallel: int = -1  # llama's -np; -1 = auto (4 slots, unified KV)
    truncate: bool = False  # cut over-long inputs instead of refusing them
    max_batch_tokens: int = 512  # rows x width of one forward pass (benchmarks/batch_budget.py)
    max_batch_rows: int = 64
    max_seq: int = 0  # most tokens per input; 0 = the per-input limit (both fitted to memory at load)
    max_queue_items: int = 4096  # inputs waiting for the engine thread; more is QueueFull
    threads: int = -1  # BLAS threads; <= 0 leaves the library default
    dtype: str = "auto"  # compute dtype: auto (float32 on a CPU, the checkpoint's on a GPU) | float32 | float16 | bfloat16
    keep_quantized: bool = False  # MLX-quantized layers keep their bits on a CPU too (memory over speed)
    rerank_sigmoid: bool = False  # cross-encoder scores as sigmoid(logit) instead of the raw logit
    rerank_instruction: str | None = None  # generative rerankers: the server-wide <Instruct> text
    rerank_chunks: int = 0  # rerankers: most windows an over-long document is split into; 0 = off (refused or cut)
    default_prompt_name: str | None = None  # embedding models: the prompt texts get when a request names none
    image_max_pixels: int = 40_000_000  # an image with more pixels is refused from its header, before decoding
    # dynamic-resolution image processors (Qwen2-VL's): the fewest / most tokens one image becomes; <= 0 = the
    # checkpoint's own pixel bound (llama's --image-min-tokens / --image-max-tokens)
    image_min_tokens: int = -1
    image_max_tokens: int = -1
    # llama.cpp LoRA adapter GGUFs (--lora: scale 1, --lora-scaled) merged into a GGUF model's weights at load
    lora: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True)
class ModelInfo:
    """What a loaded checkpoint is, for /props, /v1/models and the limits."""

    path: str
    model_type: str
    architecture: str
    vocab_type: VocabType
    n_vocab: int
    n_embd: int
    n_ctx_train: int  # position capacity
    n_params: int
    size_bytes: int
    ftype: str
    pooling: Pooling  # resolved: --pooling > 1_Pooling > family default
    max_input_tokens: int  # per-input limit: min(positions, ubatch, slot context)
    truncate_tokens: int  # the checkpoint's own max length, used when truncating
    slot_ctx: int  # llama's per-slot n_ctx
    n_slots: int  # llama's total_slots
    bos_token: str = ""
    eos_token: str = ""
    kind: str = "embedder"  # "embedder" | "cross-encoder" | "generative-reranker" | "classifier"
    batch_tokens: int = 0  # fitted at load: rows x padded width of one forward pass
    batch_rows: int = 0  # fitted at load: the most rows of one forward pass
    widths: tuple[int, ...] = ()  # the row widths warmed at load (passes run at any width up to max_seq)
    file_format: str = "safetensors"  # "safetensors" | "gguf"
    family: str = ""  # the engine/families file serving it (model_type aliases resolved: mistral -> llama)
    # embedding models: named prompts (config_sentence_transformers.json), the default one, and the family's
    # instruction template ({task}, {text}) where its model card defines one
    prompts: tuple[tuple[str, str], ...] = ()
    default_prompt_name: str | None = None
    instruction_template: str | None = None
    # task adapters (jina-embeddings-v3): each task's name, in adapter order, and the instruction its texts get
    # (config.json task_instructions; "" none); the task a request naming none gets (None: the adapters off)
    tasks: tuple[tuple[str, str], ...] = ()
    default_task: str | None = None
    chat_template_inputs: bool = False  # texts are rendered with the checkpoint's chat template
    modalities: tuple[str, ...] = ("text",)  # what an input may be: "text", "image"
    image_tokens: int = 0  # a dual-encoder's image tower: what one image counts as (usage, batch budgets)
    image_token_bounds: tuple[int, int] | None = None  # dynamic-resolution images: fewest and most tokens of one
    vision_language: bool = False  # text and images interleaved in one input, fed to a decoder (engine/multimodal/inputs.py)
    multi_vector: bool = False  # late interaction: one L2-normalized vector per token, scored by MaxSim
    # a text late-interaction (pylate ColBERT) model: each text is a query or a document (engine/text/late_interaction.py),
    # chosen by prompt_name, so the engine formats its texts itself (Engine.embed_prompts)
    query_document_roles: bool = False
    # whether the checkpoint's sentence-transformers modules end in Normalize; None when it does not say (GGUF)
    normalize_module: bool | None = None
    # how the weights run, chosen at load: "quantized kernels", "dequantized to float32 at load", or the compute
    # dtype of a float checkpoint; resident_bytes: what they hold in memory (size_bytes, but a GGUF's size_bytes
    # counts its file as llama.cpp does)
    weights: str = ""
    resident_bytes: int = 0
    kernels: str = ""  # the kernel set chosen from the device at load: "cpu-arithmetic" or "fused"
    # a sparse (SPLADE) encoder: the most nonzero entries a vector keeps (its config's max_active_dims); None: all
    max_active_dims: int | None = None
    # sequence classifiers and cross-encoders: the head's labels (config.json id2label, in id order), and whether
    # they are scored independently (problem_type multi_label_classification: sigmoid) rather than by softmax
    labels: tuple[str, ...] = ()
    multi_label: bool = False

    @property
    def is_reranker(self) -> bool:
        return self.kind in ("cross-encoder", "generative-reranker")

    @property
    def is_classifier(self) -> bool:
        """A sequence classifier with several labels (TEI's classifier; /predict and /classify serve it)."""
        return self.kind == "classifier"

    @property
    def is_embedder(self) -> bool:
        return self.kind == "embedder"

    @property
    def is_sparse(self) -> bool:
        """A SPLADE encoder: one vector over the vocabulary (n_embd = n_vocab), mostly zeros."""
        return self.pooling is Pooling.SPLADE

    @property
    def takes_images(self) -> bool:
        return "image" in self.modalities


@dataclass(frozen=True)
class ImageInput:
    """One input holding images: its parts in request order, text pieces (str) and encoded images (bytes:
    PNG, JPEG, ...), which the engine decodes off its thread. A vision-language family receives them in order
    (engine/multimodal/inputs.py); a dual-encoder's image tower embeds one image alone and refuses anything beside it."""

    parts: tuple[str | bytes, ...]

    @classmethod
    def image(cls, data: bytes) -> ImageInput:
        """An input that is one image alone."""
        return cls((data,))

    @property
    def images(self) -> list[bytes]:
        return [part for part in self.parts if isinstance(part, bytes)]

    @property
    def text(self) -> str:
        return "".join(part for part in self.parts if isinstance(part, str))


# The query or a document of a rerank: a text, or an image with any text beside it (rerankers that take images)
RerankItem = Union[str, ImageInput]


@dataclass
class Timings:
    """Seconds spent per stage of one request (summed over its inputs' batches)."""

    tokenize_s: float = 0.0
    queue_s: float = 0.0
    inference_s: float = 0.0


@dataclass
class EmbedResult:
    """Embeddings for one request, in input order.

    vectors[i] is float32 [D] for pooled modes, [n_tokens_i, D] for Pooling.NONE (a multi-vector model's rows
    come L2-normalized by the model itself); pooled vectors are never normalized here.
    """

    vectors: list
    n_tokens: list[int]
    timings: Timings = field(default_factory=Timings)


@dataclass(frozen=True)
class SparseVector:
    """A sparse vector's nonzero entries, indices ascending (vocabulary ids for a SPLADE encoder): int64 and
    float32 numpy arrays of the same length."""

    indices: Any
    values: Any
    dimension: int  # the full width (the vocabulary size)


@dataclass
class SparseResult:
    """Sparse embeddings for one request, in input order (Engine.embed_sparse)."""

    vectors: list[SparseVector]
    n_tokens: list[int]
    timings: Timings = field(default_factory=Timings)


@dataclass
class RerankResult:
    """One relevance score per document, in document order (not sorted)."""

    scores: list[float]
    n_tokens: list[int]
    timings: Timings = field(default_factory=Timings)


@dataclass
class ClassifyResult:
    """Per input, one score per label in the head's label order (ModelInfo.labels): probabilities (softmax over
    the labels, or each label's sigmoid for a multi-label head or a one-label cross-encoder) or raw logits."""

    scores: list[list[float]]
    labels: tuple[str, ...]
    n_tokens: list[int]
    timings: Timings = field(default_factory=Timings)


DEFAULT_MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"


class ModelState(str, enum.Enum):
    """Where one checkpoint of a Residency stands."""

    UNLOADED = "unloaded"
    LOADING = "loading"
    LOADED = "loaded"
    FAILED = "failed"  # the last load failed; the next request or load retries


@dataclass(frozen=True)
class ResidencyStatus:
    """One checkpoint's state in a Residency, for /models and /metrics."""

    state: ModelState
    in_use: int = 0  # leases held now
    load_s: float | None = None  # how long the last successful load took
    last_error: str | None = None  # the last load failure, cleared by a successful load
    info: ModelInfo | None = None  # while loaded

    @property
    def loaded_bytes(self) -> int:
        """What the model holds in memory while loaded: its weights as loaded (ModelInfo.resident_bytes, measured at
        load), not its file size; 0 while not loaded."""
        if self.info is None:
            return 0
        return self.info.resident_bytes or self.info.size_bytes
