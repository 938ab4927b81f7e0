"""Loading a model for serving, on the engine thread: the checkpoint found and read by its format, its kind
checked against the server's mode, its pooling chosen, the runner built with the tokenizer, prompts and input
builders the request side uses, the shapes fitted to memory, and the ModelInfo the server reports."""
from __future__ import annotations

import importlib
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

import numpy as np

from engine.checkpoint import Checkpoint, Splade
from engine.compute.pipeline import (
    ClassifierPipeline,
    CrossEncoderPipeline,
    EmbeddingPipeline,
    GenerativeRerankPipeline,
)
from engine.errors import UnsupportedCheckpoint
from engine.families import kernels
from engine.loading import formats, hub, registry
from engine.multimodal.images import ImageProcessor
from engine.multimodal.inputs import InputBuilder
from engine.multimodal.pairs import PairBuilder
from engine.multimodal.qwen_images import QwenImageProcessor
from engine.runtime import blas, limits, malloc, shapes
from engine.runtime.fitting import InputFitter
from engine.runtime.scheduler import BatchLimits, warm_widths
from engine.runtime.worker import Runner
from engine.text.chat_inputs import ChatInputs
from engine.text.late_interaction import LateFormat
from engine.text.prompts import INSTRUCTION_TEMPLATES, RerankPrompt, default_prompt_name
from engine.text.tokenizer import TextTokenizer
from engine.types import EngineOptions, ModelInfo, Pooling

log = logging.getLogger(__name__)


@dataclass
class ServedModel:
    """What the request side of a loaded model builds and fits its inputs with (never the model itself: its
    runner belongs to the worker, so that closing the worker frees the weights)."""

    tokenizer: TextTokenizer
    batch_limits: BatchLimits  # fitted to memory at load
    info: ModelInfo
    fitter: InputFitter  # the model's limits applied to its inputs
    load_s: float  # how long the load took
    scores_are_probabilities: bool = False  # a reranker head whose scores are already in [0, 1]
    prompt: RerankPrompt | None = None  # generative text rerankers only
    pairs: PairBuilder | None = None  # generative rerankers that take images: builds each pair
    chat: ChatInputs | None = None  # embedders whose texts go through their chat template
    images: ImageProcessor | None = None  # dual-encoders with an image tower only
    builder: InputBuilder | None = None  # vision-language families (engine/multimodal/inputs.py) only
    pools_segments: bool = False  # the runner pools chunks of one input (late chunking)
    late: LateFormat | None = None  # text late-interaction (pylate ColBERT) models: their query / document formats


def load(opts: EngineOptions, lanes: int, blas_threads: int) -> tuple[Runner, ServedModel]:
    """The model `opts` names, ready to serve: the runner that computes its batches, and what the request side
    uses; `lanes` and `blas_threads`: the thread plan it runs under."""
    started = time.monotonic()
    blas.set_budget(blas_threads)
    malloc.drop_mlx_buffer_cache()  # what the load and the passes free goes back to the heap (engine/runtime/malloc.py)
    ckpt = formats.open_checkpoint(hub.resolve(opts.model_path, opts.hf_repo, opts.offline, opts.hf_file),
                                   label=opts.model_path or "")
    ckpt = with_splade(ckpt, opts.pooling)
    if opts.lora:
        if ckpt.format.name != "gguf":
            raise UnsupportedCheckpoint(f"{ckpt.path}: --lora / --lora-scaled apply llama.cpp adapter GGUFs to a "
                                        f"GGUF model; this is a {ckpt.format.name} checkpoint (merge the adapter "
                                        f"into it first)")
        ckpt = replace(ckpt, lora=opts.lora)
    rank_mode = opts.pooling is Pooling.RANK
    kind = ckpt.format.kind_of(ckpt, rank=rank_mode)
    if rank_mode and kind == registry.EMBEDDER:
        raise UnsupportedCheckpoint(
            f"{ckpt.path}: rank mode (--reranking / --pooling rank) needs a reranker checkpoint; "
            f"{ckpt.architecture or ckpt.model_type} is an embedding model")
    if kind == registry.CLASSIFIER and opts.pooling not in (None, Pooling.RANK):
        raise UnsupportedCheckpoint(
            f"{ckpt.path}: {ckpt.architecture} is a sequence classifier, scored by its own head; --pooling "
            f"{opts.pooling.value} is not supported for it (start it with --reranking, or without a pooling)")
    if not rank_mode and kind not in (registry.EMBEDDER, registry.CLASSIFIER):
        raise UnsupportedCheckpoint(
            f"{ckpt.path}: {ckpt.architecture} is a reranker ({kind}), not an embedding model; "
            f"start it with --reranking")
    embedder = kind == registry.EMBEDDER
    token_bounds = None  # dynamic-resolution image processors: the fewest and most tokens of one image
    prompt_default = default_prompt_name(ckpt, opts.default_prompt_name) if embedder else None
    chat = ChatInputs(ckpt) if embedder and ckpt.message_modality is not None else None
    tokenizer, loaded = _tokenizer_and_weights(ckpt, kind, opts)
    # a classifier's head pools as llama-server's rank pooling does (its first token, through the head)
    mode = Pooling.RANK if kind == registry.CLASSIFIER else registry.choose_pooling(opts.pooling, ckpt, loaded)
    prompt = pairs = images = builder = None
    if kind == registry.GENERATIVE_RERANKER:
        if loaded.input_builder is not None:  # its prompts hold images (engine/multimodal/builders/<family>_reranker.py)
            pairs = loaded.input_builder(ckpt, tokenizer)
            token_bounds = bound_image_tokens(pairs, opts, loaded.family)
        else:
            prompt = RerankPrompt(ckpt, fallback=f"{loaded.family}_reranker.jinja")
        yes_id, no_id = answer_tokens(tokenizer, ckpt)
        runner: Runner = GenerativeRerankPipeline(loaded.model, yes_id, no_id, tokenizer.pad_id)
    elif kind == registry.CROSS_ENCODER:
        runner = CrossEncoderPipeline(loaded.model)
    elif kind == registry.CLASSIFIER:
        runner = ClassifierPipeline(loaded.model)
    else:
        runner = EmbeddingPipeline(loaded.model, mode, loaded.projection,
                                   (ckpt.splade.strategy, ckpt.splade.activation) if ckpt.splade else ("max", "relu"))
        if loaded.input_builder is not None:
            builder = loaded.input_builder(ckpt, tokenizer)
            token_bounds = bound_image_tokens(builder, opts, loaded.family)
        if loaded.image_size:
            images = ImageProcessor.from_checkpoint(ckpt.path, loaded.image_size)
            bound_image_tokens(images, opts, loaded.family)
            side = loaded.image_size  # run the vision tower once now, so no request compiles it
            runner.launch_images(np.zeros((1, 3, side, side), np.float32))()
    late_roles = embedder and getattr(loaded.model, "late_interaction", False)
    tasks = tuple(getattr(loaded.model, "tasks", ())) if embedder else ()
    n_positions = loaded.n_positions
    slot_ctx, n_slots = limits.slots(opts.ctx_size, opts.parallel, n_positions)
    max_input = limits.input_limit(n_positions, opts.ubatch_tokens, slot_ctx if opts.ctx_size > 0 else None)
    if opts.max_seq > 0:
        max_input = min(max_input, opts.max_seq)
    fitted = shapes.prepare(runner, tokenizer.pad_id, max_input, opts.max_batch_tokens, opts.max_batch_rows,
                            loaded.fixed_width or 0)
    info = ModelInfo(
        path=ckpt.display_path, model_type=ckpt.model_type, architecture=ckpt.architecture,
        vocab_type=tokenizer.vocab_type, n_vocab=tokenizer.n_vocab, n_embd=loaded.hidden_size,
        n_ctx_train=n_positions, n_params=loaded.n_params, size_bytes=loaded.size_bytes, ftype=loaded.ftype,
        pooling=mode, max_input_tokens=fitted.max_seq,
        truncate_tokens=limits.truncation_length(ckpt.max_seq_length, n_positions, fitted.max_seq),
        slot_ctx=slot_ctx, n_slots=n_slots, bos_token=tokenizer.bos_token, eos_token=tokenizer.eos_token,
        kind=loaded.kind, family=loaded.family, batch_tokens=fitted.max_tokens, batch_rows=fitted.max_rows,
        widths=tuple(warm_widths(fitted.max_seq, fitted.fixed_width)),
        prompts=tuple(ckpt.prompts.items()) if embedder else (), default_prompt_name=prompt_default,
        instruction_template=INSTRUCTION_TEMPLATES.get(ckpt.model_type) if embedder else None,
        tasks=tasks, default_task=default_task(tasks, getattr(loaded.model, "default_task", None), prompt_default),
        file_format=ckpt.format.name, chat_template_inputs=chat is not None,
        modalities=("text", "image") if (images, builder, pairs) != (None, None, None) else ("text",),
        image_tokens=loaded.image_tokens, image_token_bounds=token_bounds, vision_language=builder is not None,
        multi_vector=loaded.multi_vector, query_document_roles=late_roles, weights=loaded.weights,
        resident_bytes=loaded.resident_bytes,
        kernels=kernels.active().name,  # chosen by shapes.prepare, before the first pass
        max_active_dims=ckpt.splade.max_active_dims if ckpt.splade is not None else None,
        normalize_module=None if ckpt.format.name == "gguf" else "Normalize" in ckpt.module_types,
        labels=served_labels(ckpt, kind),
        multi_label=kind == registry.CLASSIFIER and registry.is_multi_label(ckpt))
    log.info("loaded %s (%s, %s, %s) in %.2f s: pooling %s, %d params, weights %s (%d bytes resident), "
             "per-input limit %d tokens, batches of up to %d rows / %d tokens, %d lanes sharing %d BLAS threads, "
             "BLAS: %s; %s",
             ckpt.path, ckpt.model_type, ckpt.architecture or "-", loaded.kind, time.monotonic() - started,
             mode.value, loaded.n_params, loaded.weights, loaded.resident_bytes, fitted.max_seq, fitted.max_rows,
             fitted.max_tokens, lanes,
             blas_threads, blas.description, malloc.description)
    return runner, ServedModel(tokenizer=tokenizer, batch_limits=fitted, info=info,
                               fitter=InputFitter(tokenizer, info, opts, prompt, chat),
                               load_s=time.monotonic() - started,
                               scores_are_probabilities=loaded.scores_are_probabilities, prompt=prompt, pairs=pairs,
                               chat=chat, images=images, builder=builder,
                               pools_segments=getattr(runner, "pools_segments", False),
                               late=LateFormat.read(ckpt.path, tokenizer, ckpt.tokenizer_config)
                               if late_roles else None)


def _tokenizer_and_weights(ckpt: Checkpoint, kind: str, opts: EngineOptions) -> tuple[TextTokenizer,
                                                                                     registry.LoadedModel]:
    """The tokenizer built on a second thread while this one reads the weights (on SmolLM2's GGUF: 49k tokens
    against 540 MB of dequantized weights; each would leave a core idle). A tokenizer that cannot be built is
    reported first, as when it was built first."""
    with ThreadPoolExecutor(1, thread_name_prefix="tokenizer") as pool:
        pending = pool.submit(ckpt.format.open_tokenizer, ckpt)
        try:
            loaded = formats.load(ckpt, kind, opts.dtype, opts.keep_quantized)
        except BaseException:
            pending.result()  # raises the tokenizer's own error, if it has one
            raise
        return pending.result(), loaded


def default_task(tasks: tuple[tuple[str, str], ...], configured: str | None, prompt: str | None) -> str | None:
    """The task adapter a request naming none gets: config.json's `task`, else the default prompt
    (sentence-transformers' default_prompt_name, or --default-prompt-name) when it names a task, else none (the
    adapters off, as Jina's encode(task=None))."""
    if configured is not None:
        return configured
    return prompt if prompt in {name for name, _ in tasks} else None


def with_splade(ckpt: Checkpoint, flag: Pooling | None) -> Checkpoint:
    """--pooling splade makes any masked-LM checkpoint a sparse encoder (TEI's: max over tokens, relu); another
    --pooling serves a SparseEncoder's trunk as a dense embedder pooled that way; no flag: as its modules say."""
    if flag is Pooling.SPLADE and ckpt.splade is None:
        return replace(ckpt, splade=Splade())
    if flag is not None and flag is not Pooling.SPLADE and ckpt.splade is not None:
        return replace(ckpt, splade=None)
    return ckpt


def served_labels(ckpt: Checkpoint, kind: str) -> tuple[str, ...]:
    """A classifier's labels; a cross-encoder's one label (LABEL_0 where its config does not name it). A GGUF
    reranker's head has the file's classifier.output_labels (several: llama-server ranks by the first, and
    /predict and /classify score them all), else one output."""
    if kind == registry.CLASSIFIER:
        return registry.label_names(ckpt)
    if kind == registry.CROSS_ENCODER:
        if ckpt.format.name == "gguf":
            return registry.label_names(ckpt) if ckpt.config.get("id2label") else ("LABEL_0",)
        names = registry.label_names(ckpt)
        return names if len(names) == 1 else ("LABEL_0",)
    return ()


def bound_image_tokens(builder: object, opts: EngineOptions, family: str) -> tuple[int, int] | None:
    """--image-min-tokens / --image-max-tokens on a family's image processor; its token bounds after them.

    They move the pixel bounds of a dynamic-resolution processor (Qwen2-VL's, which a builder keeps as
    `processor`), as llama.cpp does. Other families resize to a fixed size or a tile grid, which llama.cpp does
    not bound either: they are left as the reference makes them, and the log says so.
    """
    processor = getattr(builder, "processor", None)
    if isinstance(processor, QwenImageProcessor):
        builder.processor = processor.with_token_bounds(opts.image_min_tokens, opts.image_max_tokens)
        return builder.processor.token_bounds
    given = [flag for flag, value in (("--image-min-tokens", opts.image_min_tokens),
                                      ("--image-max-tokens", opts.image_max_tokens)) if value > 0]
    if given:
        log.warning("%s: not used by the %s family, whose images have a fixed size or a tile grid; only "
                    "dynamic-resolution models (Qwen3-VL, ColQwen2) take image token bounds", " and ".join(given),
                    family)
    return None


def answer_tokens(tokenizer: TextTokenizer, ckpt: Checkpoint) -> tuple[int, int]:
    """The (yes, no) token ids a generative reranker compares: its LogitScore module's, else "yes" and "no"
    as the tokenizer encodes them."""
    if ckpt.logit_score is None:
        return _single_token(tokenizer, "yes", ckpt), _single_token(tokenizer, "no", ckpt)
    if not all(0 <= token < tokenizer.n_vocab for token in ckpt.logit_score):
        raise UnsupportedCheckpoint(f"{ckpt.path}: the LogitScore module's token ids {ckpt.logit_score} are "
                                    f"outside the vocabulary ({tokenizer.n_vocab} tokens)")
    return ckpt.logit_score


def _single_token(tokenizer: TextTokenizer, word: str, ckpt: Checkpoint) -> int:
    ids = tokenizer.encode(word, add_special=False, parse_special=False)
    if len(ids) != 1:
        raise UnsupportedCheckpoint(f"{ckpt.path}: {word!r} is {len(ids)} tokens for this tokenizer; the yes/no "
                                    f"reranker recipe needs it to be exactly one")
    return ids[0]


def token_vectors_reason(opts: EngineOptions) -> str | None:
    """Why the model `opts` names gives one vector per token rather than one per input (a multi-vector family, or
    pooling none), read from its configuration files without loading its weights; None when it gives one per
    input, or its family is not known here (loading it says why)."""
    if opts.pooling is Pooling.NONE:
        return "pooling none gives one vector per token"
    path = hub.resolve(opts.model_path, opts.hf_repo, opts.offline, opts.hf_file)
    if formats.format_of(path) is not formats.SafetensorsFormat:
        return None  # a GGUF: llama.cpp's families pool
    checkpoint = formats.open_checkpoint(path, label=opts.model_path or "")
    try:
        family = importlib.import_module(f"engine.families.{registry.family_name(checkpoint)}")
    except ImportError:
        return None
    if getattr(registry.model_class(family, checkpoint), "multi_vector", False):
        return "is a multi-vector (late-interaction) model: it gives one vector per token"
    return None
