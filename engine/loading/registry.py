"""config.json -> family module -> loaded MLX model. The family file name is the registry."""
from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass
from collections.abc import Callable
from types import ModuleType

import mlx.core as mx
import mlx.nn as nn

from engine.loading import heads, weights
from engine.checkpoint import Checkpoint
from engine.errors import UnsupportedCheckpoint
from engine.families.base import is_bidirectional
from engine.types import Pooling
from engine.multimodal.inputs import InputBuilder

# config.json spellings that differ from our file names.
MODEL_TYPE_ALIASES = {"xlm-roberta": "xlm_roberta", "siglip_text_model": "siglip", "mistral": "llama",
                      "llama_bidirec": "llama", "new": "gte", "lfm2_bidirectional": "lfm2",
                      # ColQwen2 / ColQwen2.5: colpali-engine saves the VLM's config, transformers' export a colqwen2 one
                      "qwen2_vl": "colqwen2", "qwen2_5_vl": "colqwen2"}

# Architectures served by a family other than their model_type's (jina-embeddings-v3's remote code says xlm-roberta).
ARCHITECTURE_FAMILIES = {"XLMRobertaLoRA": "jina_embeddings_v3"}

# transformers' names for architectures whose published checkpoints spell them otherwise.
ARCHITECTURE_ALIASES = {"GteModel": "NewModel", "GteForMaskedLM": "NewForMaskedLM",
                        "GteForTokenClassification": "NewForTokenClassification",
                        "GteForSequenceClassification": "NewForSequenceClassification"}

# What each family file serves, by architectures[0] ("" = a config without architectures).
EMBEDDERS = {
    "bert": {"", "BertModel", "BertForMaskedLM", "BertForPreTraining"},
    "xlm_roberta": {"", "XLMRobertaModel", "XLMRobertaForMaskedLM"},
    "modernbert": {"", "ModernBertModel", "ModernBertForMaskedLM"},
    "mpnet": {"", "MPNetModel", "MPNetForMaskedLM"},  # all-mpnet-base-v2 ships MPNetForMaskedLM's trunk keys
    "distilbert": {"", "DistilBertModel", "DistilBertForMaskedLM"},  # the MLM head is never loaded
    # XLM-RoBERTa's file under their own names (engine/families/roberta.py, camembert.py)
    "roberta": {"", "RobertaModel", "RobertaForMaskedLM"},
    "camembert": {"", "CamembertModel", "CamembertForMaskedLM"},
    # sentence-t5 / gtr-t5 ship T5EncoderModel; sentence-transformers reads any T5 checkpoint's encoder alone
    "t5": {"", "T5EncoderModel", "T5Model", "T5ForConditionalGeneration"},
    # decoder backbones: hidden states after the final norm, the LM head never applied
    "llama": {"", "LlamaModel", "LlamaForCausalLM", "LlamaBidirectionalModel", "MistralModel", "MistralForCausalLM"},
    "qwen2": {"", "Qwen2Model", "Qwen2ForCausalLM"},
    "qwen3": {"", "Qwen3Model", "Qwen3ForCausalLM"},
    "gemma3_text": {"", "Gemma3TextModel", "Gemma3ForCausalLM"},
    "ministral3": {"", "Ministral3Model", "Ministral3ForCausalLM"},  # Nemotron-3-Embed: is_causal false
    "eurobert": {"", "EuroBertModel", "EuroBertForMaskedLM"},  # a Llama stack without the causal mask
    # LFM2.5-Embedding and the LFM2 / LFM2.5 ColBERT retrievers: the bidirectional encoder (conv centered)
    "lfm2": {"", "Lfm2Model", "Lfm2ForCausalLM", "Lfm2BidirectionalModel", "Lfm2BidirectionalForMaskedLM"},
    "nomic_bert": {"", "NomicBertModel", "NomicBertForPreTraining"},
    # gte-multilingual-base ships as NewForTokenClassification (its sparse-weight head); the trunk embeds
    "gte": {"", "NewModel", "NewForMaskedLM", "NewForTokenClassification"},
    "siglip": {"", "SiglipModel", "SiglipTextModel"},
    # late interaction (multi-vector) on the Idefics3 / SmolVLM stack, as colpali-engine saves it
    "idefics3": {"ColIdefics3"},
    # Qwen3-VL-Embedding: the VL export with a last-token pooling layout; inputs built by engine/multimodal/builders/qwen3_vl.py
    "qwen3_vl": {"", "Qwen3VLModel", "Qwen3VLForConditionalGeneration", "Qwen3VLForEmbedding"},
    # SigLIP tower + pixel shuffle + MLP connector + bidirectional Llama, mean-pooled (text and image inputs)
    "llama_nemotron_vl": {"LlamaNemotronVLModel"},
    "colqwen2": {"ColQwen2", "ColQwen2_5", "ColQwen2ForRetrieval"},  # the same on Qwen2-VL and Qwen2.5-VL
    # jina-embeddings-v3: transformers' export, or Jina's remote code with its task LoRA adapters
    "jina_embeddings_v3": {"", "JinaEmbeddingsV3Model", "XLMRobertaLoRA"},
}
CROSS_ENCODERS = {
    "bert": "BertForSequenceClassification",
    "xlm_roberta": "XLMRobertaForSequenceClassification",
    "roberta": "RobertaForSequenceClassification",
    "camembert": "CamembertForSequenceClassification",
    "modernbert": "ModernBertForSequenceClassification",
    "gte": "NewForSequenceClassification",  # gte-multilingual-reranker-base
}
# Causal LMs scored by the yes/no recipe with --reranking (engine/text/prompts.py builds their prompt); with
# --embedding the same checkpoint is an embedder.
GENERATIVE_RERANKERS = {
    "qwen3": "Qwen3ForCausalLM",
    "qwen3_vl": "Qwen3VLForConditionalGeneration",  # Qwen3-VL-Reranker: images in the query and documents
}

# Without 1_Pooling/config.json: what sentence-transformers itself would do with a bare encoder.
FAMILY_DEFAULT_POOLING = {"bert": Pooling.MEAN, "xlm_roberta": Pooling.MEAN, "modernbert": Pooling.MEAN,
                          "nomic_bert": Pooling.MEAN, "gte": Pooling.MEAN, "mpnet": Pooling.MEAN,
                          "distilbert": Pooling.MEAN, "roberta": Pooling.MEAN, "camembert": Pooling.MEAN,
                          "t5": Pooling.MEAN, "eurobert": Pooling.MEAN, "jina_embeddings_v3": Pooling.MEAN}
FAMILY_DEFAULT_POOLING["siglip"] = Pooling.LAST  # reported only: the towers pool at their own last position
FAMILY_DEFAULT_POOLING["idefics3"] = FAMILY_DEFAULT_POOLING["colqwen2"] = Pooling.NONE  # multi-vector: per token
FAMILY_DEFAULT_POOLING["qwen3_vl"] = Pooling.LAST  # every input ends in the assistant header it is read at
FAMILY_DEFAULT_POOLING["llama_nemotron_vl"] = Pooling.MEAN  # its llm_config pools "avg"
# Decoder backbones without 1_Pooling: a bidirectional embedding export (LLM2Vec, EmbeddingGemma) mean-pools,
# a bare Qwen3Model export is Qwen3-Embedding (last token); any other decoder gets what llama-server gives a
# decoder GGUF without a pooling type: none (one vector per token; --pooling picks another).
DECODER_FAMILIES = {"llama", "qwen2", "qwen3", "gemma3_text", "lfm2", "ministral3"}
ARCHITECTURE_DEFAULT_POOLING = {"Qwen3Model": Pooling.LAST, "Lfm2BidirectionalModel": Pooling.MEAN,
                                "Lfm2BidirectionalForMaskedLM": Pooling.MEAN}

EMBEDDER, CROSS_ENCODER, GENERATIVE_RERANKER = "embedder", "cross-encoder", "generative-reranker"


@dataclass
class LoadedModel:
    model: nn.Module
    family: str
    kind: str  # EMBEDDER | CROSS_ENCODER | GENERATIVE_RERANKER
    n_params: int
    size_bytes: int
    ftype: str
    default_pooling: Pooling
    n_positions: int
    hidden_size: int
    fixed_width: int | None = None  # every row padded to this width (families trained on one width)
    image_size: int | None = None  # the square image side a vision tower takes; None: text only
    image_tokens: int = 0  # what one image counts as (its patches)
    projection: heads.Projection | None = None  # Dense modules applied after pooling
    # vision-language families (engine/multimodal/inputs.py): builds an input's prompt and images, (checkpoint, tokenizer) -> it;
    # for a generative reranker, its (query, document) prompts holding images (engine/multimodal/pairs.py)
    input_builder: Callable[..., InputBuilder] | None = None
    multi_vector: bool = False  # one normalized vector per token (late interaction)


def family_name(checkpoint: Checkpoint) -> str:
    if checkpoint.architecture in ARCHITECTURE_FAMILIES:
        return ARCHITECTURE_FAMILIES[checkpoint.architecture]
    return MODEL_TYPE_ALIASES.get(checkpoint.model_type, checkpoint.model_type)


def kind_of(checkpoint: Checkpoint, rank: bool = False) -> str:
    """Whether a checkpoint is an embedder or a reranker; anything else is refused by name, and so is one whose
    config.json has transformers run custom code (auto_map) of a class no family here implements.

    rank: the server was started in rank mode (--reranking), which makes a causal LM that has a yes/no recipe
    a generative reranker; otherwise it is an embedder like any decoder backbone.
    """
    kind = _kind_of(checkpoint, rank)
    _refuse_custom_code(checkpoint, kind)
    return kind


# The auto_map entry transformers (trust_remote_code) would build each kind from, as sentence-transformers loads it.
AUTO_CLASSES = {EMBEDDER: "AutoModel", CROSS_ENCODER: "AutoModelForSequenceClassification",
                GENERATIVE_RERANKER: "AutoModelForCausalLM"}


def _refuse_custom_code(checkpoint: Checkpoint, kind: str) -> None:
    """A checkpoint whose own modeling code (config.json's auto_map) would replace transformers' is served only
    when that class is one a family here implements (nomic-embed's NomicBertModel, gte's NewModel): another
    class under a supported model_type (jina-embeddings-v2's JinaBertModel on "bert") computes something else."""
    auto_map = checkpoint.config.get("auto_map")
    if checkpoint.gguf is not None or not isinstance(auto_map, dict):
        return
    ref = auto_map.get(AUTO_CLASSES[kind])
    if isinstance(ref, (list, tuple)):  # ["slow", "fast"], as tokenizer entries are written
        ref = next((r for r in ref if r), None)
    if not isinstance(ref, str):
        return
    cls = ref.rsplit(".", 1)[-1]
    name = family_name(checkpoint)
    implemented = EMBEDDERS.get(name, set()) | {CROSS_ENCODERS.get(name, ""), GENERATIVE_RERANKERS.get(name, "")}
    if ARCHITECTURE_ALIASES.get(cls, cls) not in implemented - {""}:
        raise UnsupportedCheckpoint(
            f"{checkpoint.path}: config.json's auto_map has {AUTO_CLASSES[kind]} run the checkpoint's own code "
            f"({ref}); its class {cls} is not implemented here (model_type {checkpoint.model_type!r} is served as: "
            f"{', '.join(sorted(implemented - {''}))})")


def _kind_of(checkpoint: Checkpoint, rank: bool) -> str:
    if checkpoint.gguf is not None:
        from engine.loading.gguf.load import is_reranker

        return CROSS_ENCODER if is_reranker(checkpoint.gguf) else EMBEDDER
    name, arch = family_name(checkpoint), checkpoint.architecture
    arch = ARCHITECTURE_ALIASES.get(arch, arch)
    if CROSS_ENCODERS.get(name) == arch:
        return CROSS_ENCODER
    # A sentence-transformers pooling layout (1_Pooling, a Pooling module) marks an embedding export, such as
    # Qwen3-Embedding's Qwen3ForCausalLM: never a yes/no reranker, whatever the mode.
    pooled_export = checkpoint.pooling is not None or "Pooling" in checkpoint.module_types
    if GENERATIVE_RERANKERS.get(name) == arch and ((rank and not pooled_export) or arch not in EMBEDDERS.get(name, ())):
        return GENERATIVE_RERANKER
    if arch in EMBEDDERS.get(name, ()):
        return EMBEDDER
    if arch.endswith("ForSequenceClassification"):
        with_heads = ", ".join(sorted(CROSS_ENCODERS.values()))
        raise UnsupportedCheckpoint(
            f"{checkpoint.path}: {arch} is a sequence classifier: it is never served as an embedding model, and "
            f"only these are served as cross-encoders (--reranking): {with_heads}")
    served = sorted({*EMBEDDERS, *CROSS_ENCODERS, *GENERATIVE_RERANKERS})
    if name not in served:
        raise UnsupportedCheckpoint(
            f"{checkpoint.path}: model_type {checkpoint.model_type!r} ({arch or 'no architecture'}) "
            f"is not supported (supported model types: {', '.join(served)})")
    archs = sorted(a for a in EMBEDDERS.get(name, set()) | {CROSS_ENCODERS.get(name, ""),
                                                               GENERATIVE_RERANKERS.get(name, "")} if a)
    raise UnsupportedCheckpoint(f"{checkpoint.path}: architecture {arch!r} of model_type {checkpoint.model_type!r} "
                                f"is not supported (supported: {', '.join(archs)})")


def load(checkpoint: Checkpoint, kind: str | None = None, dtype: str = "auto") -> LoadedModel:
    """Build the family's module for this checkpoint and load its weights (strict: every key must match).

    kind: what kind_of() decided for the server's mode (default: its embedding-mode answer). dtype: the
    compute dtype (auto: float32 on a CPU, the checkpoint's own on a GPU; see engine/loading/weights.py).
    """
    kind = kind or kind_of(checkpoint)
    if checkpoint.gguf is not None:
        return _load_gguf(checkpoint, kind, dtype)
    name = family_name(checkpoint)
    family: ModuleType = importlib.import_module(f"engine.families.{name}")
    model_class = _model_class(family, checkpoint)
    args = family.ModelArgs.from_dict(checkpoint.config)
    quant = weights.quantization(checkpoint.config)
    raw: dict[str, mx.array] = {}
    for file in checkpoint.weight_files():
        raw.update(mx.load(str(file)))
    projection = tensors = None
    if kind == GENERATIVE_RERANKER:
        model = trunk = family.CausalLM(args)
    elif kind == CROSS_ENCODER:
        cls = family.SequenceClassifier
        tensors = cls.sanitize(raw)  # sanitized once: the label count reads it, then the model loads it
        labels = cls.label_count(tensors)
        if labels != 1:
            raise UnsupportedCheckpoint(f"{checkpoint.path}: a cross-encoder must have exactly one label; "
                                        f"its classifier has {labels} rows")
        model = cls(args, labels)
        trunk = model.trunk
    elif getattr(model_class, "multi_vector", False):  # it projects each token itself
        model = trunk = model_class(args)
        folders = checkpoint.dense_folders or tuple(f for f in (checkpoint.path / "1_Dense",) if f.is_dir())
        if folders:
            prefix = getattr(model, "projection_prefix", None)
            if prefix is None:
                raise UnsupportedCheckpoint(f"{checkpoint.path}: Dense modules beside a {name} checkpoint are not "
                                            f"supported (the family projects its tokens itself)")
            raw = heads.replace_own_projection(raw, folders, prefix)
    else:
        model = trunk = model_class(args)
        try:
            projection, dense, raw = heads.split_projection(raw, checkpoint.dense_folders, trunk.hidden_size,
                                                            quant.bits if quant else None)
        except UnsupportedCheckpoint as exc:
            raise UnsupportedCheckpoint(f"{checkpoint.path}: {exc}") from exc
    if tensors is None:
        tensors = model.sanitize(raw)
    dtype_ = weights.compute_dtype(dtype, tensors)
    what = f"{checkpoint.path} ({name} family)"
    weights.materialize(model, tensors, quant, dtype_, what)
    n_params, size_bytes = weights.size(model)
    if projection is not None:
        weights.materialize(projection, dense, quant, dtype_, f"{checkpoint.path} (Dense modules)")
        extra_params, extra_bytes = weights.size(projection)
        n_params, size_bytes = n_params + extra_params, size_bytes + extra_bytes
    return LoadedModel(
        model=model, family=name, kind=kind, n_params=n_params, size_bytes=size_bytes,
        ftype=weights.ftype({**tensors, **(dense if projection is not None else {})}, quant),
        default_pooling=default_pooling(checkpoint),
        n_positions=trunk.n_positions, hidden_size=projection.out_dims if projection else trunk.hidden_size,
        fixed_width=getattr(trunk, "fixed_width", None), image_size=getattr(trunk, "image_size", None),
        image_tokens=getattr(trunk, "image_tokens", 0), projection=projection,
        input_builder=_input_builder(name) if kind == EMBEDDER else
        _input_builder(f"{name}_reranker") if kind == GENERATIVE_RERANKER else None,
        multi_vector=bool(getattr(model, "multi_vector", False)),
    )


def _model_class(family: ModuleType, checkpoint: Checkpoint) -> type:
    """The family's Model, or its ColBERT variant for a checkpoint in pylate's late-interaction layout: a Dense
    module applied to every token, and no Pooling module."""
    colbert = getattr(family, "ColBERT", None)
    if colbert is not None and checkpoint.dense_folders and checkpoint.pooling is None \
            and "Pooling" not in checkpoint.module_types:
        return colbert
    return family.Model


def _input_builder(family: str) -> Callable[..., InputBuilder] | None:
    """A vision-language family's input builder: engine/multimodal/builders/<family>.py's input_builder, if it has one."""
    if importlib.util.find_spec(f"engine.multimodal.builders.{family}") is None:
        return None
    return importlib.import_module(f"engine.multimodal.builders.{family}").input_builder


def _load_gguf(checkpoint: Checkpoint, kind: str, dtype: str) -> LoadedModel:
    """A GGUF file: the same families, weights named by the file's map; identity counted as llama.cpp does."""
    from engine.loading.gguf import load as gguf_load

    model, trunk, name, projection = gguf_load.build(checkpoint, dtype)
    n_params, size = gguf_load.file_counts(checkpoint.gguf)
    return LoadedModel(model=model, family=name, kind=kind, n_params=n_params, size_bytes=size,
                       ftype=gguf_load.ftype(checkpoint.gguf), default_pooling=Pooling.NONE,
                       n_positions=trunk.n_positions,
                       hidden_size=projection.out_dims if projection else trunk.hidden_size, projection=projection)


def default_pooling(checkpoint: Checkpoint) -> Pooling:
    """The pooling used when neither --pooling nor 1_Pooling/config.json says."""
    name = family_name(checkpoint)
    if name not in DECODER_FAMILIES:
        return FAMILY_DEFAULT_POOLING.get(name, Pooling.MEAN)
    config = checkpoint.config
    if is_bidirectional(config.get("model_type"), config.get("is_causal"), config.get("use_bidirectional_attention")):
        return Pooling.MEAN
    return ARCHITECTURE_DEFAULT_POOLING.get(checkpoint.architecture, Pooling.NONE)
