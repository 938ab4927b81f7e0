"""Which family serves a config.json, as what kind of model, with what default pooling; what a load gives
(LoadedModel) and the one pooling decision. The family file name is the registry."""
from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass

import mlx.nn as nn

from engine.checkpoint import Checkpoint
from engine.errors import UnsupportedCheckpoint
from engine.families.base import Trunk, is_bidirectional
from engine.loading import heads
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

# SPLADE sparse encoders (a SparseEncoder's SpladePooling, or --pooling splade): the masked LMs whose head a
# family builds (its MaskedLM), as TEI serves them
SPARSE_ENCODERS = {"bert": "BertForMaskedLM", "distilbert": "DistilBertForMaskedLM"}

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
# a CROSS_ENCODERS architecture whose head has several labels: a sequence classifier (TEI's /predict, vLLM's
# /classify); with one label it is a cross-encoder reranker
CLASSIFIER = "classifier"


@dataclass
class LoadedModel:
    """What a format's load gives (engine/loading/formats.py): the built module and what the engine reads off it."""

    model: nn.Module
    family: str
    kind: str  # EMBEDDER | CROSS_ENCODER | GENERATIVE_RERANKER | CLASSIFIER
    n_params: int
    size_bytes: int
    ftype: str
    default_pooling: Pooling  # the format's and family's pooling when neither --pooling nor the checkpoint says
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
    pools_itself: bool = False  # the family's own heads give one vector per input (the engine's pooling never applies)
    scores_are_probabilities: bool = False  # a reranker head whose scores are already in [0, 1]
    # how the weights run, chosen at load (engine/loading/weights.py placement): "quantized kernels",
    # "dequantized to float32 at load", or the compute dtype of a float checkpoint
    weights: str = ""
    resident_bytes: int = 0  # what the loaded weights hold in memory (size_bytes for a folder)

    @classmethod
    def of(cls, model: nn.Module, trunk: Trunk, *, family: str, kind: str, n_params: int, size_bytes: int,
           ftype: str, default_pooling: Pooling, projection: heads.Projection | None = None,
           input_builder: Callable[..., InputBuilder] | None = None,
           scores_are_probabilities: bool = False, weights: str = "", resident_bytes: int = 0) -> LoadedModel:
        """A built model and its trunk (the model itself, or the module under its head): widths, limits and
        capabilities as the trunk declares them (engine/families/base.py Trunk), the rest as the format says."""
        return cls(model=model, family=family, kind=kind, n_params=n_params, size_bytes=size_bytes, ftype=ftype,
                   default_pooling=default_pooling, n_positions=trunk.n_positions,
                   hidden_size=projection.out_dims if projection else trunk.hidden_size,
                   fixed_width=trunk.fixed_width, image_size=trunk.image_size, image_tokens=trunk.image_tokens,
                   projection=projection, input_builder=input_builder, multi_vector=trunk.multi_vector,
                   pools_itself=trunk.pools_itself, scores_are_probabilities=scores_are_probabilities,
                   weights=weights, resident_bytes=resident_bytes or size_bytes)


def masked_lm_class(family: ModuleType, checkpoint: Checkpoint) -> type:
    """The family's MaskedLM (its trunk with the MLM head) for a SPLADE checkpoint, which must be a masked LM
    (TEI: "Splade pooling is not supported: model is not a ForMaskedLM model")."""
    name = family_name(checkpoint)
    served = SPARSE_ENCODERS.get(name)
    if served is None or checkpoint.architecture != served or not hasattr(family, "MaskedLM"):
        raise UnsupportedCheckpoint(
            f"{checkpoint.path}: SPLADE pooling (a sparse encoder) needs a masked-LM checkpoint with its MLM head; "
            f"{checkpoint.architecture or checkpoint.model_type} is not one served here (supported: "
            f"{', '.join(sorted(SPARSE_ENCODERS.values()))})")
    if checkpoint.dense_folders:
        raise UnsupportedCheckpoint(f"{checkpoint.path}: Dense modules are not supported with SPLADE pooling")
    return family.MaskedLM


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
                CLASSIFIER: "AutoModelForSequenceClassification", GENERATIVE_RERANKER: "AutoModelForCausalLM"}


def label_names(checkpoint: Checkpoint) -> tuple[str, ...]:
    """A sequence classifier's labels in id order, as transformers reads them from config.json: id2label, else
    `num_labels` LABEL_i names, else transformers' default of two (which it leaves out of config.json)."""
    id2label = checkpoint.config.get("id2label")
    if isinstance(id2label, dict) and id2label:
        try:
            by_id = {int(k): str(v) for k, v in id2label.items()}
        except (TypeError, ValueError):
            raise UnsupportedCheckpoint(f"{checkpoint.path}: config.json's id2label keys must be label ids "
                                        f"(integers), not {sorted(id2label)!r}") from None
        if sorted(by_id) != list(range(len(by_id))):
            raise UnsupportedCheckpoint(f"{checkpoint.path}: config.json's id2label ids must be 0..{len(by_id) - 1}, "
                                        f"not {sorted(by_id)}")
        return tuple(by_id[i] for i in range(len(by_id)))
    n = checkpoint.config.get("num_labels")
    if not (isinstance(n, int) and not isinstance(n, bool) and n > 0):
        n = 2
    return tuple(f"LABEL_{i}" for i in range(n))


def is_multi_label(checkpoint: Checkpoint) -> bool:
    """config.json's problem_type multi_label_classification: each label scored by its own sigmoid."""
    return checkpoint.config.get("problem_type") == "multi_label_classification"


def _refuse_custom_code(checkpoint: Checkpoint, kind: str) -> None:
    """A checkpoint whose own modeling code (config.json's auto_map) would replace transformers' is served only
    when that class is one a family here implements (nomic-embed's NomicBertModel, gte's NewModel): another
    class under a supported model_type (jina-embeddings-v2's JinaBertModel on "bert") computes something else."""
    auto_map = checkpoint.config.get("auto_map")
    if not isinstance(auto_map, dict):
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
    name, arch = family_name(checkpoint), checkpoint.architecture
    arch = ARCHITECTURE_ALIASES.get(arch, arch)
    if CROSS_ENCODERS.get(name) == arch:
        return CLASSIFIER if len(label_names(checkpoint)) > 1 else CROSS_ENCODER
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
            f"only these are served as cross-encoders (--reranking) and classifiers: {with_heads}")
    served = sorted({*EMBEDDERS, *CROSS_ENCODERS, *GENERATIVE_RERANKERS})
    if name not in served:
        raise UnsupportedCheckpoint(
            f"{checkpoint.path}: model_type {checkpoint.model_type!r} ({arch or 'no architecture'}) "
            f"is not supported (supported model types: {', '.join(served)})")
    archs = sorted(a for a in EMBEDDERS.get(name, set()) | {CROSS_ENCODERS.get(name, ""),
                                                               GENERATIVE_RERANKERS.get(name, "")} if a)
    raise UnsupportedCheckpoint(f"{checkpoint.path}: architecture {arch!r} of model_type {checkpoint.model_type!r} "
                                f"is not supported (supported: {', '.join(archs)})")


def model_class(family: ModuleType, checkpoint: Checkpoint) -> type:
    """The family's Model, or its ColBERT variant for a checkpoint in pylate's late-interaction layout: a Dense
    module applied to every token, and no Pooling module."""
    colbert = getattr(family, "ColBERT", None)
    if colbert is not None and checkpoint.dense_folders and checkpoint.pooling is None \
            and "Pooling" not in checkpoint.module_types:
        return colbert
    return family.Model


def input_builder(family: str, kind: str) -> Callable[..., InputBuilder] | None:
    """A vision-language family's input builder, if it has one: engine/multimodal/builders/<family>.py's for an
    embedder, <family>_reranker.py's for a generative reranker; a cross-encoder has none."""
    name = {EMBEDDER: family, GENERATIVE_RERANKER: f"{family}_reranker"}.get(kind)
    if name is None or importlib.util.find_spec(f"engine.multimodal.builders.{name}") is None:
        return None
    return importlib.import_module(f"engine.multimodal.builders.{name}").input_builder


def default_pooling(checkpoint: Checkpoint) -> Pooling:
    """The pooling used when neither --pooling nor 1_Pooling/config.json says."""
    name = family_name(checkpoint)
    if name not in DECODER_FAMILIES:
        return FAMILY_DEFAULT_POOLING.get(name, Pooling.MEAN)
    config = checkpoint.config
    if is_bidirectional(config.get("model_type"), config.get("is_causal"), config.get("use_bidirectional_attention")):
        return Pooling.MEAN
    return ARCHITECTURE_DEFAULT_POOLING.get(checkpoint.architecture, Pooling.NONE)


def choose_pooling(flag: Pooling | None, checkpoint: Checkpoint, loaded: LoadedModel) -> Pooling:
    """The pooling a loaded model serves with, the one place it is decided: rank mode (--reranking) scores with
    the reranker's head; a multi-vector family gives one vector per token and a family with its own pooling
    heads pools through them (--pooling may only name what they do); any other embedder takes --pooling, else
    the pooling its checkpoint stores, else its default (`loaded.default_pooling`, the format's and family's).
    A sparse encoder (checkpoint.splade: its SpladePooling module, or --pooling splade) pools by SPLADE."""
    if flag is Pooling.RANK:
        return flag
    if loaded.default_pooling is Pooling.SPLADE:  # a masked LM built for its SPLADE head (checkpoint.splade)
        return Pooling.SPLADE
    if loaded.multi_vector:  # one vector per token, projected and normalized by the family
        if flag not in (None, Pooling.NONE):
            raise UnsupportedCheckpoint(
                f"{checkpoint.path}: the {loaded.family} family is multi-vector (one vector per token, scored "
                f"by MaxSim); --pooling {flag.value} is not supported for it")
        return Pooling.NONE
    if loaded.pools_itself:  # its heads decide; 1_Pooling does not apply
        if flag not in (None, loaded.default_pooling):
            raise UnsupportedCheckpoint(
                f"{checkpoint.path}: the {loaded.family} family pools through its own head "
                f"({loaded.default_pooling.value}); --pooling {flag.value} is not supported for it")
        return loaded.default_pooling
    return flag or checkpoint.pooling or loaded.default_pooling
