"""GGUF classifiers with several outputs (llama.cpp's n_cls_out > 1): a tiny random 3-label
BertForSequenceClassification written with the gguf package's GGUFWriter exactly as convert_hf_to_gguf.py (commit
3f545bec) writes it: `bert.classifier.output_labels` from id2label, the classifier as `cls.output` [3, n_embd], the
pooler dropped, no pooling type (llama-server needs --reranking).

What llama-server does with it (src/llama-context.cpp keeps n_cls_out floats per sequence; tools/server's
send_rerank reads embd[0]): /rerank scores each pair by the first label's raw logit, and /v1/embeddings reads
n_embd floats from those n_cls_out (its first n_cls_out values are the logits, the rest is whatever memory follows;
we refuse /v1/embeddings on a reranker instead). Ours: /rerank equal to llama-server's within 1e-3, and /predict
and /classify score all three labels (softmax over llama-server's own logits, which `/embeddings` with
`embd_normalize: -1` shows as its first three floats). A head whose row count disagrees with the labels is refused,
as llama-server refuses it.

Opt-in, the real converter on the same folder: `MLX_EMBED_LLAMA_CPP=/path/to/llama.cpp .venv/bin/python -m pytest
-q tests/engine/test_gguf_classifier.py`.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import requests

from engine import Pooling
from engine.errors import InvalidInput, UnsupportedCheckpoint
from tests.engine.helpers import perturb_vectors, start_engine, torch, with_minilm_tokenizer
from tests.engine.test_gguf_written import _gguf_name, add_minilm_vocabulary, finish

gguf = pytest.importorskip("gguf")

LABELS = ["negative", "neutral", "positive"]
QUERY = "was the film any good?"
DOCUMENTS = ["I loved every minute of it.", "Terrible acting and a worse plot.", "It was fine, I suppose.",
             "The weather in Paris is mild in spring."]
TEXTS = ["I loved it", "terrible", "Gravity is a force that attracts masses. " * 6]


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """A 3-label BertForSequenceClassification (id2label named) on all-MiniLM-L6-v2's WordPiece tokenizer."""
    t = torch()
    from transformers import BertConfig, BertForSequenceClassification

    out = tmp_path_factory.mktemp("bert_cls3") / "bert-cls3"
    n_vocab = with_minilm_tokenizer(out)
    t.manual_seed(5)
    config = BertConfig(vocab_size=n_vocab, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=128, max_position_embeddings=512, type_vocab_size=2,
                        id2label=dict(enumerate(LABELS)), label2id={label: i for i, label in enumerate(LABELS)})
    model = BertForSequenceClassification(config)
    perturb_vectors(model, 5)
    with t.no_grad():  # a head that tells the labels apart
        model.classifier.weight.normal_(0.0, 0.5, generator=t.Generator().manual_seed(6))
    model.eval()
    model.save_pretrained(str(out))
    return out


def write_classifier_gguf(folder: Path, path: Path, labels: list[str] | None = LABELS) -> None:
    """`folder` as convert_hf_to_gguf.py --outtype f32 writes a BertForSequenceClassification (labels None: a
    file whose `cls.output` rows the metadata does not name)."""
    from safetensors.numpy import load_file

    config = json.loads((folder / "config.json").read_text())
    writer = gguf.GGUFWriter(str(path), "bert")
    writer.add_type(gguf.GGUFType.MODEL)
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_layer_norm_eps(config["layer_norm_eps"])
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_causal_attention(False)
    if labels is not None:
        writer.add_classifier_output_labels(labels)
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    writer.add_token_type_count(config["type_vocab_size"])
    add_minilm_vocabulary(writer)
    writer.add_tokenizer_pre("jina-v2-en")
    writer.add_mask_token_id(103)
    writer.add_bool("tokenizer.ggml.normalizer.lowercase", True)
    for key, value in load_file(str(folder / "model.safetensors")).items():
        key = key.removeprefix("bert.")
        if key.startswith("pooler.") or key == "embeddings.position_ids":
            continue  # the converter drops the pooler
        name = {"classifier.weight": "cls.output.weight", "classifier.bias": "cls.output.bias"}.get(key)
        writer.add_tensor(name or _gguf_name(key), np.ascontiguousarray(value, dtype=np.float32))
    finish(writer)


@pytest.fixture(scope="module")
def classifier_gguf(folder, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("bert_cls3_file") / "bert-cls3-f32.gguf"
    write_classifier_gguf(folder, path)
    return path


def llama_logits(llama, text: str) -> list[float]:
    """llama-server's n_cls_out outputs for one text: the first floats of /embeddings without normalization."""
    body = requests.post(llama.base + "/embeddings", json={"content": text, "embd_normalize": -1}, timeout=30).json()
    return body[0]["embedding"][0][:len(LABELS)]


def test_several_label_gguf_ranks_as_llama_server_and_classifies_every_label(classifier_gguf):
    from tests.engine.test_gguf_jina import identity_of, llama_identity
    from tests.peer_llama import LlamaServer

    eng = start_engine(classifier_gguf, pooling=Pooling.RANK, max_seq=128)
    try:
        assert eng.info.kind == "cross-encoder" and eng.info.labels == tuple(LABELS)
        ranked = eng.rerank(QUERY, DOCUMENTS).scores
        raw = eng.classify(TEXTS, raw_scores=True)
        probs = eng.classify(TEXTS)
        identity = identity_of(eng.info)
        with pytest.raises(InvalidInput, match="serves /rerank, not embeddings"):
            eng.embed([[101, 102]])
    finally:
        eng.close(wait=True)
    with LlamaServer(classifier_gguf, "--reranking") as llama:
        theirs = llama.rerank(QUERY, DOCUMENTS)
        their_logits = [llama_logits(llama, text) for text in TEXTS]
        assert identity == llama_identity(llama)
    np.testing.assert_allclose(ranked, theirs, rtol=0, atol=1e-3)
    assert raw.labels == probs.labels == tuple(LABELS)
    np.testing.assert_allclose(raw.scores, their_logits, rtol=0, atol=1e-3)
    for got, logits in zip(probs.scores, their_logits, strict=True):
        e = np.exp(np.asarray(logits) - max(logits))
        np.testing.assert_allclose(got, e / e.sum(), rtol=0, atol=1e-3)
    assert np.ptp(np.asarray(raw.scores), axis=0).max() > 0.05  # the texts' logits differ


def test_a_head_whose_rows_the_labels_do_not_count_is_refused_as_llama_server_refuses_it(folder, tmp_path):
    from tests.peer_llama import LlamaServer

    path = tmp_path / "bert-cls3-unnamed.gguf"
    write_classifier_gguf(folder, path, labels=None)  # llama.cpp reads n_cls_out = 1, the tensor has 3 rows
    with pytest.raises(UnsupportedCheckpoint, match=r"3 outputs but the file names 1 label"):
        start_engine(path, pooling=Pooling.RANK)
    with pytest.raises(RuntimeError, match="exited"), LlamaServer(path, "--reranking"):
        pass


def test_classifier_gguf_written_as_llama_cpps_converter_writes_it(folder, classifier_gguf, tmp_path):
    from tests.engine.test_gguf_encoders import _llama_cpp, assert_same_file, convert

    converted = tmp_path / "converted.gguf"
    convert(_llama_cpp(), folder, converted)
    assert_same_file(classifier_gguf, converted)
