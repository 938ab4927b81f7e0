"""What a checkpoint is served as (engine.loading.registry.kind_of), from config.json, modules.json and 1_Pooling, in
both modes: sequence classifiers are never embedders, a causal LM is a yes/no reranker only with --reranking
and only when it is not a sentence-transformers embedding export, anything else is refused with what is served."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine import checkpoint
from engine.loading import formats, registry
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
])
@pytest.mark.parametrize("rank", [False, True])
def test_encoders_are_what_their_architecture_says_in_either_mode(tmp_path, model_type, arch, kind, rank):
    ckpt = folder(tmp_path, {"model_type": model_type, "architectures": [arch]})
    assert registry.kind_of(ckpt, rank=rank) == kind


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
    ckpt = folder(tmp_path, {"model_type": "t5", "architectures": ["T5EncoderModel"]}, ST_MODULES)
    with pytest.raises(UnsupportedCheckpoint) as err:
        registry.kind_of(ckpt)
    message = str(err.value)
    assert "model_type 't5' (T5EncoderModel) is not supported" in message
    for family in ("bert", "gte", "modernbert", "nomic_bert", "qwen3", "xlm_roberta"):
        assert family in message


def test_unknown_architecture_of_a_known_family_lists_its_architectures(tmp_path):
    ckpt = folder(tmp_path, {"model_type": "new", "architectures": ["NewForQuestionAnswering"]})
    with pytest.raises(UnsupportedCheckpoint) as err:
        registry.kind_of(ckpt)
    assert "architecture 'NewForQuestionAnswering' of model_type 'new' is not supported" in str(err.value)
    assert "NewForSequenceClassification" in str(err.value) and "NewModel" in str(err.value)
