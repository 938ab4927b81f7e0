"""What a checkpoint is served as (engine.loading.registry.kind_of), from config.json, modules.json and 1_Pooling, in
both modes: sequence classifiers are never embedders, a causal LM is a yes/no reranker only with --reranking
and only when it is not a sentence-transformers embedding export, anything else is refused with what is served."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine import checkpoint
from engine.loading import formats, hub, registry, safetensors
from engine.errors import UnsupportedCheckpoint

ST_POOLING = {"1_Pooling/config.json": {"pooling_mode_lasttoken": True}}
ST_MODULES = {"modules.json": [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
                               {"idx": 1, "name": "1", "path": "1_Pooling",
                                "type": "sentence_transformers.models.Pooling"}]}


def folder(root: Path, config: dict, files: dict | None = None) -> checkpoint.Checkpoint:
    for rel, content in {"config.json": config, **(files or {})}.items():
        target = root / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(content), encoding="utf-8")
    return formats.open_checkpoint(root)


@pytest.mark.parametrize("model_type,arch,kind", [
    ("bert", "BertForSequenceClassification", registry.CROSS_ENCODER),
    ("xlm-roberta", "XLMRobertaForSequenceClassification", registry.CROSS_ENCODER),
    ("new", "NewForSequenceClassification", registry.CROSS_ENCODER),
    ("new", "NewForTokenClassification", registry.EMBEDDER),
    ("new", "NewModel", registry.EMBEDDER),
    ("gte", "GteModel", registry.EMBEDDER),  # transformers' spelling of the same architectures
    ("gte", "GteForSequenceClassification", registry.CROSS_ENCODER),
    ("nomic_bert", "NomicBertModel", registry.EMBEDDER),
    ("modernbert", "ModernBertForMaskedLM", registry.EMBEDDER),
    ("mpnet", "MPNetForMaskedLM", registry.EMBEDDER),  # all-mpnet-base-v2
    ("distilbert", "DistilBertModel", registry.EMBEDDER),
    ("distilbert", "DistilBertForMaskedLM", registry.EMBEDDER),
    ("roberta", "RobertaForMaskedLM", registry.EMBEDDER),  # all-distilroberta-v1
    ("roberta", "RobertaForSequenceClassification", registry.CROSS_ENCODER),
    ("camembert", "CamembertModel", registry.EMBEDDER),
    ("camembert", "CamembertForSequenceClassification", registry.CROSS_ENCODER),
    ("t5", "T5EncoderModel", registry.EMBEDDER),  # sentence-t5, gtr-t5
])
@pytest.mark.parametrize("rank", [False, True])
def test_encoders_are_what_their_architecture_says_in_either_mode(tmp_path, model_type, arch, kind, rank):
    # a one-label head's config.json names its label (transformers writes id2label whenever it is not the default 2)
    ckpt = folder(tmp_path, {"model_type": model_type, "architectures": [arch], "id2label": {"0": "LABEL_0"}})
    assert registry.kind_of(ckpt, rank=rank) == kind


@pytest.mark.parametrize("labels", [None, {"0": "negative", "1": "positive"}, {"0": "a", "1": "b", "2": "c"}])
@pytest.mark.parametrize("rank", [False, True])
def test_a_head_with_several_labels_is_a_classifier_in_either_mode(tmp_path, labels, rank):
    """Without id2label or num_labels transformers builds its default two labels."""
    config = {"model_type": "bert", "architectures": ["BertForSequenceClassification"],
              **({"id2label": labels} if labels else {})}
    ckpt = folder(tmp_path, config)
    assert registry.kind_of(ckpt, rank=rank) == registry.CLASSIFIER
    assert registry.label_names(ckpt) == (tuple(labels.values()) if labels else ("LABEL_0", "LABEL_1"))


def test_id2label_keys_must_be_the_label_ids(tmp_path):
    ckpt = folder(tmp_path, {"model_type": "bert", "architectures": ["BertForSequenceClassification"],
                             "id2label": {"0": "a", "2": "b"}})
    with pytest.raises(UnsupportedCheckpoint, match=r"id2label ids must be 0\.\.1"):
        registry.kind_of(ckpt)


@pytest.mark.parametrize("model_type,arch", [("nomic_bert", "NomicBertForSequenceClassification"),
                                             ("qwen3", "Qwen3ForSequenceClassification"),
                                             ("llama", "LlamaForSequenceClassification")])
def test_a_sequence_classifier_is_never_an_embedder(tmp_path, model_type, arch):
    ckpt = folder(tmp_path, {"model_type": model_type, "architectures": [arch]}, ST_POOLING)
    for rank in (False, True):
        with pytest.raises(UnsupportedCheckpoint) as err:
            registry.kind_of(ckpt, rank=rank)
        message = str(err.value)
        assert f"{arch} is a sequence classifier: it is never served as an embedding model" in message
        assert "BertForSequenceClassification" in message and "NewForSequenceClassification" in message


def test_a_causal_lm_is_a_generative_reranker_only_with_reranking(tmp_path):
    ckpt = folder(tmp_path, {"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"]})
    assert registry.kind_of(ckpt, rank=True) == registry.GENERATIVE_RERANKER
    assert registry.kind_of(ckpt, rank=False) == registry.EMBEDDER


@pytest.mark.parametrize("layout", [ST_POOLING, ST_MODULES], ids=["1_Pooling", "modules.json"])
def test_a_sentence_transformers_export_of_a_causal_lm_is_an_embedder(tmp_path, layout):
    """Qwen3-Embedding ships Qwen3ForCausalLM with a pooling layout: --reranking does not make it a reranker."""
    ckpt = folder(tmp_path, {"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"]}, layout)
    assert registry.kind_of(ckpt, rank=True) == registry.EMBEDDER
    assert registry.kind_of(ckpt, rank=False) == registry.EMBEDDER


def test_unknown_model_type_lists_the_supported_ones(tmp_path):
    ckpt = folder(tmp_path, {"model_type": "xlnet", "architectures": ["XLNetModel"]}, ST_MODULES)
    with pytest.raises(UnsupportedCheckpoint) as err:
        registry.kind_of(ckpt)
    message = str(err.value)
    assert "model_type 'xlnet' (XLNetModel) is not supported" in message
    for family in ("bert", "gte", "modernbert", "nomic_bert", "qwen3", "xlm_roberta"):
        assert family in message


def test_unknown_architecture_of_a_known_family_lists_its_architectures(tmp_path):
    ckpt = folder(tmp_path, {"model_type": "new", "architectures": ["NewForQuestionAnswering"]})
    with pytest.raises(UnsupportedCheckpoint) as err:
        registry.kind_of(ckpt)
    assert "architecture 'NewForQuestionAnswering' of model_type 'new' is not supported" in str(err.value)
    assert "NewForSequenceClassification" in str(err.value) and "NewModel" in str(err.value)


# -- custom code (config.json's auto_map) and adapters ----------------------------------------------------------
NOMIC_AUTO_MAP = {"AutoConfig": "nomic-ai/nomic-bert-2048--configuration_hf_nomic_bert.NomicBertConfig",
                  "AutoModel": "nomic-ai/nomic-bert-2048--modeling_hf_nomic_bert.NomicBertModel",
                  "AutoModelForSequenceClassification":
                      "nomic-ai/nomic-bert-2048--modeling_hf_nomic_bert.NomicBertForSequenceClassification"}


@pytest.mark.parametrize("model_type,arch,auto_map,rank", [
    ("nomic_bert", "NomicBertModel", NOMIC_AUTO_MAP, False),  # nomic-embed-text: the class the family implements
    ("new", "NewModel", {"AutoModel": "Alibaba-NLP/new-impl--modeling.NewModel"}, False),
    ("new", "NewForSequenceClassification",
     {"AutoModelForSequenceClassification": "Alibaba-NLP/new-impl--modeling.NewForSequenceClassification"}, True),
    ("llama", "LlamaBidirectionalModel", {"AutoModel": "llama_bidirectional_model.LlamaBidirectionalModel"}, False),
    ("bert", "BertModel", {"AutoTokenizer": ["tokenization_x.XTokenizer", None]}, False),  # no model class named
])
def test_custom_code_of_a_class_a_family_implements_is_served(tmp_path, model_type, arch, auto_map, rank):
    ckpt = folder(tmp_path, {"model_type": model_type, "architectures": [arch], "auto_map": auto_map})
    assert registry.kind_of(ckpt, rank=rank) in (registry.EMBEDDER, registry.CROSS_ENCODER, registry.CLASSIFIER)


@pytest.mark.parametrize("model_type,arch,auto_map,kind_key,cls", [
    # a fine-tune saved as BertModel over jina-embeddings-v2's own code (ALiBi, GLU feed-forward)
    ("bert", "BertModel", {"AutoModel": "jinaai/jina-bert-implementation--modeling_bert.JinaBertModel"},
     "AutoModel", "JinaBertModel"),
    ("xlm-roberta", "XLMRobertaForSequenceClassification",
     {"AutoModelForSequenceClassification": ["modeling_custom.CustomRerankerForSequenceClassification", None]},
     "AutoModelForSequenceClassification", "CustomRerankerForSequenceClassification"),
])
def test_custom_code_of_an_unknown_class_is_refused_by_name(tmp_path, model_type, arch, auto_map, kind_key, cls):
    ckpt = folder(tmp_path, {"model_type": model_type, "architectures": [arch], "auto_map": auto_map})
    with pytest.raises(UnsupportedCheckpoint) as err:
        registry.kind_of(ckpt, rank=kind_key != "AutoModel")
    message = str(err.value)
    assert f"auto_map has {kind_key} run the checkpoint's own code" in message
    assert f"its class {cls} is not implemented here" in message
    assert arch in message  # what the model type is served as


def test_an_adapter_folder_is_refused_with_the_merge_instruction(tmp_path):
    (tmp_path / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA"}), encoding="utf-8")
    (tmp_path / "adapter_model.safetensors").write_bytes(b"")
    for reader in (lambda: hub.resolve(str(tmp_path), None, True),  # no config.json (LLM2Vec, colSmol)
                   lambda: safetensors.weight_files(folder(tmp_path, {"model_type": "bert"}).path)):  # beside a config
        with pytest.raises(UnsupportedCheckpoint) as err:
            reader()
        assert "a PEFT adapter" in str(err.value)
        assert "merge it into its base model (peft's merge_and_unload) and save the result first" in str(err.value)
