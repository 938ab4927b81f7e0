"""SPLADE sparse encoders (BertForMaskedLM / DistilBertForMaskedLM heads + SpladePooling) against
sentence-transformers' SparseEncoder.encode on the same random weights (torch CPU, fp32): the layouts a
SparseEncoder saves (MLMTransformer + SpladePooling, and the fill-mask Transformer + SpladePooling of
sentence-transformers >= 6, with max_active_dims in its config) and TEI's --pooling splade on a bare masked LM.
Tiny (hidden 64, 2 layers) on all-MiniLM-L6-v2's WordPiece tokenizer (vocabulary 30522)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from engine import Encoder, Pooling
from engine.errors import InvalidInput, NotSparse, SparseOnly, UnsupportedCheckpoint
from tests.engine.helpers import ENCODER_TEXTS, perturb_vectors, start_engine, torch, with_minilm_tokenizer

# short ones (the engine warms only up to max_seq); SparseEncoder encodes "" as [CLS][SEP], ours refuses it
TEXTS = [t for t in ENCODER_TEXTS if t and len(t) < 100]
FAST = {"threads": 2, "max_seq": 64}
VALUE_TOLERANCE = 2e-5  # fp32 MLX vs fp32 torch on logits of order 1


def make_masked_lm(out: Path, architecture: str, *, seed: int) -> Path:
    """A random masked LM whose decoder bias is mostly negative, so that relu leaves a sparse vector (a random
    head gives logits around 0: half the vocabulary would be active)."""
    t = torch()
    import transformers

    n_vocab = with_minilm_tokenizer(out)
    t.manual_seed(seed)
    if architecture == "BertForMaskedLM":
        config = transformers.BertConfig(vocab_size=n_vocab, hidden_size=64, num_hidden_layers=2,
                                         num_attention_heads=4, intermediate_size=128, initializer_range=0.2)
    else:
        config = transformers.DistilBertConfig(vocab_size=n_vocab, dim=64, n_layers=2, n_heads=4, hidden_dim=128,
                                               initializer_range=0.2)
    model = getattr(transformers, architecture)(config)
    perturb_vectors(model, seed)
    with t.no_grad():
        bias = model.cls.predictions.bias if architecture == "BertForMaskedLM" else model.vocab_projector.bias
        bias.copy_(t.randn(bias.shape, generator=t.Generator().manual_seed(seed)) - 3.0)
    model.eval()
    model.save_pretrained(str(out))
    return out


def save_sparse_encoder(mlm: Path, out: Path, *, new_layout: bool, strategy: str = "max",
                        activation: str = "relu", max_active_dims: int | None = None) -> Path:
    from sentence_transformers import SparseEncoder
    from sentence_transformers.sparse_encoder.modules import SpladePooling

    if new_layout:
        from sentence_transformers.base.modules import Transformer

        first = Transformer(str(mlm), transformer_task="fill-mask")
    else:
        from sentence_transformers.sparse_encoder.modules import MLMTransformer

        first = MLMTransformer(str(mlm))
    SparseEncoder(modules=[first, SpladePooling(strategy, activation)], device="cpu",
                  max_active_dims=max_active_dims).save(str(out))
    return out


def reference(folder: Path, texts: list[str], **kwargs) -> np.ndarray:
    torch()
    from sentence_transformers import SparseEncoder

    model = SparseEncoder(str(folder), device="cpu")
    return model.encode(texts, convert_to_tensor=True, **kwargs).to_dense().numpy()


def check_matches(ours, expected: np.ndarray) -> None:
    """Our sparse vectors hold exactly the reference's nonzero entries (an entry within the tolerance of 0
    may fall either side of relu's edge), in ascending index order, with its values."""
    assert len(ours.vectors) == len(expected)
    for vector, row in zip(ours.vectors, expected):
        assert vector.dimension == row.size
        assert np.all(np.diff(vector.indices) > 0)
        assert np.all(vector.values != 0)
        dense = np.zeros(row.size, np.float32)
        dense[vector.indices] = vector.values
        np.testing.assert_allclose(dense, row, atol=VALUE_TOLERANCE, rtol=1e-4)
        both = set(vector.indices.tolist()) ^ set(np.flatnonzero(row).tolist())
        assert all(abs(row[i]) < VALUE_TOLERANCE and abs(dense[i]) < VALUE_TOLERANCE for i in both)
        assert 0 < vector.indices.size < row.size // 2  # sparse, and not empty


@pytest.fixture(scope="module")
def bert_mlm(tmp_path_factory):
    return make_masked_lm(tmp_path_factory.mktemp("bert-mlm"), "BertForMaskedLM", seed=3)


@pytest.fixture(scope="module")
def distilbert_mlm(tmp_path_factory):
    return make_masked_lm(tmp_path_factory.mktemp("distilbert-mlm"), "DistilBertForMaskedLM", seed=5)


def test_bert_sparse_encoder_matches_sparse_encoder(bert_mlm, tmp_path):
    folder = save_sparse_encoder(bert_mlm, tmp_path / "st", new_layout=False)
    with Encoder(folder, **FAST) as encoder:
        info = encoder.info
        assert (info.pooling.value, info.is_sparse, info.n_embd, info.max_active_dims) == ("splade", True, 30522, None)
        check_matches(encoder.embed_sparse(TEXTS), reference(folder, TEXTS))
        # batch invariance: one text alone gives what it gave in the batch
        check_matches(encoder.embed_sparse(TEXTS[1]), reference(folder, TEXTS[1:2]))
        # top-k per call, as SparseEncoder.encode(max_active_dims=) keeps it
        check_matches(encoder.embed_sparse(TEXTS, max_active_dims=5), reference(folder, TEXTS, max_active_dims=5))
        assert all(v.indices.size == 5 for v in encoder.embed_sparse(TEXTS, max_active_dims=5).vectors)
        # a dense normalized vector of a sparse model is refused (TEI: `normalize` is not available for SPLADE)
        with pytest.raises(SparseOnly, match="embed_sparse"):
            encoder.encode(TEXTS[:1])
        # raw, it is the dense vocabulary-wide vector (TEI's /embed with normalize false)
        raw = encoder.encode(TEXTS[:2], normalize=False)
        np.testing.assert_allclose(raw, reference(folder, TEXTS[:2]), atol=VALUE_TOLERANCE, rtol=1e-4)


def test_distilbert_sum_log1p_relu_with_max_active_dims(distilbert_mlm, tmp_path):
    folder = save_sparse_encoder(distilbert_mlm, tmp_path / "st", new_layout=True, strategy="sum",
                                 activation="log1p_relu", max_active_dims=7)
    with Encoder(folder, **FAST) as encoder:
        assert encoder.info.max_active_dims == 7
        ours = encoder.embed_sparse(TEXTS)
        check_matches(ours, reference(folder, TEXTS))  # the reference applies its config's max_active_dims too
        assert all(v.indices.size == 7 for v in ours.vectors)
        # a request's own max_active_dims wins over the checkpoint's
        check_matches(encoder.embed_sparse(TEXTS, max_active_dims=20), reference(folder, TEXTS, max_active_dims=20))


def test_pooling_splade_on_a_bare_masked_lm(bert_mlm, distilbert_mlm, tmp_path):
    """TEI's --pooling splade: max over tokens of log(1 + relu), the SparseEncoder default."""
    for mlm, name in ((bert_mlm, "bert"), (distilbert_mlm, "distilbert")):
        folder = save_sparse_encoder(mlm, tmp_path / name, new_layout=True)
        with Encoder(mlm, pooling="splade", **FAST) as encoder:
            check_matches(encoder.embed_sparse(TEXTS), reference(folder, TEXTS))


def test_refusals(bert_mlm, tmp_path):
    from tests.engine.helpers import make_random_bert

    bare = make_random_bert(tmp_path / "bare")
    with pytest.raises(UnsupportedCheckpoint, match="BertForMaskedLM, DistilBertForMaskedLM"):
        start_engine(bare, pooling=Pooling.SPLADE, max_seq=64)
    with Encoder(bare, **FAST) as dense:
        with pytest.raises(NotSparse, match="SPLADE"):
            dense.embed_sparse(["hello"])
    folder = save_sparse_encoder(bert_mlm, tmp_path / "st", new_layout=True)
    with Encoder(folder, **FAST) as encoder:
        with pytest.raises(InvalidInput, match="max_active_dims must be a positive integer"):
            encoder.embed_sparse(["hello"], max_active_dims=0)
    # another --pooling serves a SparseEncoder's trunk as a dense embedder
    with Encoder(folder, pooling="mean", **FAST) as trunk:
        assert not trunk.info.is_sparse and trunk.info.n_embd == 64


def _modules(*types: str) -> list[dict]:
    paths = {"MLMTransformer": "", "Transformer": "", "SpladePooling": "1_SpladePooling", "Pooling": "1_Pooling",
             "Normalize": "2_Normalize", "SparseStaticEmbedding": "0_SparseStaticEmbedding"}
    return [{"idx": i, "name": str(i), "path": paths[t], "type": f"sentence_transformers.sparse_encoder.modules.{t}"}
            for i, t in enumerate(types)]


def _read(folder: Path, modules: list[dict], splade: dict | None = None, sbert: dict | None = None,
          st_config: dict | None = None):
    import json

    from engine.loading.safetensors import SafetensorsFormat

    folder.mkdir(parents=True, exist_ok=True)
    files = {"config.json": {"model_type": "bert", "architectures": ["BertForMaskedLM"]}, "modules.json": modules,
             "1_SpladePooling/config.json": splade, "sentence_bert_config.json": sbert,
             "config_sentence_transformers.json": st_config}
    for name, content in files.items():
        if content is not None:
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            (folder / name).write_text(json.dumps(content), encoding="utf-8")
    return SafetensorsFormat.read(folder)


def test_reading_sparse_encoder_modules(tmp_path):
    """What modules.json and the SpladePooling config make of a checkpoint, refusals by name included."""
    read = _read(tmp_path / "a", _modules("MLMTransformer", "SpladePooling"),
                 {"pooling_strategy": "sum", "activation_function": "log1p_relu"}, st_config={"max_active_dims": 9})
    assert (read.splade.strategy, read.splade.activation, read.splade.max_active_dims) == ("sum", "log1p_relu", 9)
    read = _read(tmp_path / "b", _modules("Transformer", "SpladePooling"), sbert={"transformer_task": "fill-mask"})
    assert (read.splade.strategy, read.splade.activation, read.splade.max_active_dims) == ("max", "relu", None)
    assert _read(tmp_path / "c", _modules("Transformer", "Pooling")).splade is None
    refusals = [
        (_modules("Transformer", "SpladePooling"), None, None, None, "masked-LM Transformer followed by SpladePooling"),
        (_modules("MLMTransformer", "SpladePooling", "Normalize"), None, None, None, r"SpladePooling \+ Normalize"),
        (_modules("MLMTransformer"), None, None, None, "an MLMTransformer without SpladePooling"),
        (_modules("MLMTransformer", "SpladePooling"), {"pooling_strategy": "mean"}, None, None, "'mean'"),
        (_modules("MLMTransformer", "SpladePooling"), None, None, {"max_active_dims": 0}, "positive integer"),
        (_modules("SparseStaticEmbedding"), None, None, None, "SparseStaticEmbedding"),
    ]
    for i, (modules, splade, sbert, st_config, message) in enumerate(refusals):
        with pytest.raises(UnsupportedCheckpoint, match=message):
            _read(tmp_path / f"r{i}", modules, splade, sbert, st_config)
