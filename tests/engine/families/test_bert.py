"""engine/families/bert.py against transformers' BertModel on the same weights (torch CPU, fp32)."""
from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from safetensors import safe_open

from engine import Pooling
from engine.errors import UnsupportedCheckpoint
from engine.families import bert
from tests.engine.helpers import cosine, hf_hidden, load_hf_model, make_random_bert, start_engine

TEXTS = [
    "hello",
    "The quick brown fox jumps over the lazy dog.",
    "Splade models expand queries: 3 terms, 42 weights, café, naïve, 東京, 🙂!",
    "a " * 60,
    "def f(x):\n    return x ** 2  # square",
    "",
]
ATOL = 1e-4


def _hf_masked_mean(hidden: np.ndarray) -> np.ndarray:
    return hidden.astype(np.float64).mean(axis=0)


# -- the tiny real BERT (BertForMaskedLM, gamma/beta keys, `bert.` prefix) ---------------------------------
@pytest.fixture(scope="module")
def real_tiny(tiny_bert_path):
    eng_none = start_engine(tiny_bert_path, pooling=Pooling.NONE)
    eng_default = start_engine(tiny_bert_path)
    ref = load_hf_model(tiny_bert_path, "BertModel")
    yield eng_none, eng_default, ref
    eng_none.close()
    eng_default.close()


def test_real_tiny_checkpoint_has_old_key_names(tiny_bert_path):
    # The point of this checkpoint: the loader must map these. If it ever changes, the tests below lose value.
    keys = list(safe_open(str(tiny_bert_path / "model.safetensors"), "np").keys())
    assert any(k.startswith("bert.") for k in keys)
    assert any(k.endswith(".gamma") for k in keys) and any(k.endswith(".beta") for k in keys)


def test_real_tiny_reference_loaded_the_gamma_beta_weights(real_tiny, tiny_bert_path):
    # transformers must map gamma/beta itself, otherwise the reference would be a freshly initialized model.
    _, _, ref = real_tiny
    with safe_open(str(tiny_bert_path / "model.safetensors"), "np") as f:
        gamma = f.get_tensor("bert.embeddings.LayerNorm.gamma")
    assert not np.allclose(gamma, 1.0)
    np.testing.assert_array_equal(ref.embeddings.LayerNorm.weight.detach().numpy(), gamma)


def test_real_tiny_info_and_family_default_pooling(real_tiny):
    _, eng, _ = real_tiny
    info = eng.info
    assert info.architecture == "BertForMaskedLM"
    assert info.n_embd == 128
    assert info.n_ctx_train == 512
    # no 1_Pooling/config.json: the family default, what sentence-transformers does with a bare encoder
    assert info.pooling is Pooling.MEAN


def test_real_tiny_tokenizer_matches_transformers(real_tiny, tiny_bert_path):
    from transformers import AutoTokenizer

    eng, _, _ = real_tiny
    hf_tok = AutoTokenizer.from_pretrained(str(tiny_bert_path))
    for text in TEXTS:
        assert eng.encode_prompt([text]) == hf_tok(text)["input_ids"], text


def test_real_tiny_hidden_states_match_transformers(real_tiny):
    eng, _, ref = real_tiny
    token_lists = [eng.encode_prompt([t]) for t in TEXTS]
    result = eng.embed(token_lists)  # one padded batch of very different lengths
    for ids, ours in zip(token_lists, result.vectors, strict=True):
        expected = hf_hidden(ref, ids)
        assert ours.shape == expected.shape
        np.testing.assert_allclose(ours, expected, rtol=0, atol=ATOL)


def test_real_tiny_pooled_vectors_match_transformers(real_tiny):
    _, eng, ref = real_tiny
    token_lists = [eng.encode_prompt([t]) for t in TEXTS]
    result = eng.embed(token_lists)
    for ids, ours in zip(token_lists, result.vectors, strict=True):
        expected = _hf_masked_mean(hf_hidden(ref, ids))
        assert ours.shape == (128,)
        np.testing.assert_allclose(ours, expected, rtol=0, atol=ATOL)
        assert cosine(ours, expected) >= 0.999999


# -- tiny random BertModel checkpoints, one per activation -------------------------------------------------
# initializer_range 0.2 makes the MLP inputs large enough that erf-GELU and tanh-GELU differ by ~1e-3 in
# the final hidden states: a swapped activation fails the 1e-4 comparison (checked below, not assumed).
@pytest.fixture(scope="module", params=["gelu", "gelu_new"])
def random_bert(request, tmp_path_factory):
    act = request.param
    path = make_random_bert(tmp_path_factory.mktemp(f"bert-{act}"), hidden_act=act, seed=1234,
                            initializer_range=0.2)
    eng = start_engine(path, pooling=Pooling.NONE)
    ref = load_hf_model(path, "BertModel")
    yield act, path, eng, ref
    eng.close()


def test_random_checkpoint_has_token_type_embeddings(random_bert):
    _, path, _, _ = random_bert
    with safe_open(str(path / "model.safetensors"), "np") as f:
        types = f.get_tensor("embeddings.token_type_embeddings.weight")
    assert types.shape == (2, 64)
    assert np.abs(types[0]).max() > 0.01  # row 0 is added to every token: dropping it must show


def test_random_bert_hidden_states_match_transformers(random_bert):
    act, _, eng, ref = random_bert
    assert ref.config.hidden_act == act
    token_lists = [eng.encode_prompt([t]) for t in TEXTS]
    result = eng.embed(token_lists)
    for ids, ours in zip(token_lists, result.vectors, strict=True):
        np.testing.assert_allclose(ours, hf_hidden(ref, ids), rtol=0, atol=ATOL)


def test_random_bert_activation_matters_at_this_tolerance(random_bert):
    """The same weights with the other GELU differ far beyond ATOL, so the comparison above discriminates."""
    from transformers.activations import ACT2FN

    act, path, _, ref = random_bert
    other = load_hf_model(path, "BertModel")
    for layer in other.encoder.layer:
        layer.intermediate.intermediate_act_fn = ACT2FN["gelu_new" if act == "gelu" else "gelu"]
    ids = [101, *range(2000, 2060), 102]
    assert np.abs(hf_hidden(ref, ids) - hf_hidden(other, ids)).max() > 5 * ATOL


# -- pieces of the family file -----------------------------------------------------------------------------
def test_sanitize_maps_prefix_gamma_beta_and_drops_heads_and_buffers():
    w = {
        "bert.embeddings.LayerNorm.gamma": mx.ones(2),
        "bert.embeddings.LayerNorm.beta": mx.zeros(2),
        "bert.embeddings.position_ids": mx.zeros((1, 4), dtype=mx.int64),
        "bert.encoder.layer.0.output.dense.weight": mx.ones((2, 2)),
        "bert.pooler.dense.weight": mx.ones((2, 2)),
        "cls.predictions.bias": mx.ones(2),
        "classifier.weight": mx.ones((1, 2)),
        "embeddings.word_embeddings.weight": mx.ones((3, 2)),
    }
    out = bert.Model.sanitize(w)
    assert sorted(out) == [
        "embeddings.LayerNorm.bias",
        "embeddings.LayerNorm.weight",
        "embeddings.word_embeddings.weight",
        "encoder.layer.0.output.dense.weight",
    ]
    # gamma is the scale (weight), beta the shift (bias): swapped names would load a broken model
    assert out["embeddings.LayerNorm.weight"].tolist() == [1.0, 1.0]
    assert out["embeddings.LayerNorm.bias"].tolist() == [0.0, 0.0]


def test_relative_position_embeddings_are_refused():
    with pytest.raises(UnsupportedCheckpoint, match="relative_key"):
        bert.ModelArgs(vocab_size=10, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                       intermediate_size=16, position_embedding_type="relative_key")


def test_unknown_activation_is_refused_by_name():
    args = bert.ModelArgs(vocab_size=10, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                          intermediate_size=16, hidden_act="quick_gelu_v9")
    with pytest.raises(UnsupportedCheckpoint, match="quick_gelu_v9"):
        bert.Model(args)


def test_custom_code_of_another_class_is_refused_at_startup(tmp_path):
    """jina-embeddings-v2's layout: model_type bert, its own code named in auto_map; the error names the class."""
    import json

    path = make_random_bert(tmp_path / "custom")
    config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    config["auto_map"] = {"AutoConfig": "jinaai/jina-bert-implementation--configuration_bert.JinaBertConfig",
                          "AutoModel": "jinaai/jina-bert-implementation--modeling_bert.JinaBertModel"}
    (path / "config.json").write_text(json.dumps(config), encoding="utf-8")
    with pytest.raises(UnsupportedCheckpoint, match="its class JinaBertModel is not implemented here"):
        start_engine(path)
