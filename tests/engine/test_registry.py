"""engine/loading/registry.py: config.json -> family -> loaded MLX trunk, and the refusals that name what was refused."""
from __future__ import annotations

import json
import shutil

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten
from safetensors.numpy import load_file, save_file

from engine import Pooling
from engine.loading import formats, registry
from engine.errors import UnsupportedCheckpoint
from tests.engine.helpers import hf_hidden, load_hf_model, make_random_bert


@pytest.fixture(scope="module")
def random_bert(tmp_path_factory):
    return make_random_bert(tmp_path_factory.mktemp("reg-bert"), seed=5)


def _clone(src, dst):
    shutil.copytree(src, dst)
    return dst


def _edit_config(folder, **changes):
    cfg = json.loads((folder / "config.json").read_text())
    cfg.update(changes)
    (folder / "config.json").write_text(json.dumps(cfg))


def test_minilm_loads(minilm_path):
    loaded = formats.load(formats.open_checkpoint(minilm_path))
    assert loaded.family == "bert"
    assert loaded.kind == registry.EMBEDDER
    assert loaded.ftype == "F32"
    assert loaded.hidden_size == 384
    assert loaded.n_positions == 512
    assert loaded.default_pooling is Pooling.MEAN
    # all-MiniLM-L6-v2 has 22.7M parameters including the pooler; the trunk alone is 22,565,376
    assert loaded.n_params == 22_565_376
    assert loaded.size_bytes == 4 * loaded.n_params


def test_unsupported_model_type_is_named(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2", "architectures": ["GPT2Model"]}))
    with pytest.raises(UnsupportedCheckpoint, match="gpt2"):
        formats.load(formats.open_checkpoint(tmp_path))


def test_model_type_alias(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "xlm-roberta"}))
    assert registry.family_name(formats.open_checkpoint(tmp_path)) == "xlm_roberta"


@pytest.mark.parametrize("arch, kind", [("BertModel", registry.EMBEDDER), ("BertForMaskedLM", registry.EMBEDDER),
                                        ("", registry.EMBEDDER),
                                        ("BertForSequenceClassification", registry.CROSS_ENCODER)])
def test_kind_of_bert_architectures(tmp_path, arch, kind):
    cfg = {"model_type": "bert", **({"architectures": [arch]} if arch else {}), "id2label": {"0": "LABEL_0"}}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    assert registry.kind_of(formats.open_checkpoint(tmp_path)) == kind


def test_unserved_architecture_is_named(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert",
                                                      "architectures": ["BertForTokenClassification"]}))
    with pytest.raises(UnsupportedCheckpoint, match="BertForTokenClassification"):
        registry.kind_of(formats.open_checkpoint(tmp_path))


def test_weights_that_do_not_match_the_config_are_refused(tmp_path, random_bert):
    folder = _clone(random_bert, tmp_path / "mismatch")
    _edit_config(folder, num_hidden_layers=3)  # the file only has 2 layers
    with pytest.raises(UnsupportedCheckpoint, match="do not match"):
        formats.load(formats.open_checkpoint(folder))


def test_missing_weights_file_is_refused(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "bert", "architectures": ["BertModel"], "vocab_size": 8, "hidden_size": 8,
        "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 16}))
    with pytest.raises(UnsupportedCheckpoint, match="model.safetensors"):
        formats.load(formats.open_checkpoint(tmp_path))


def test_half_precision_checkpoint_runs_in_fp32(tmp_path, random_bert):
    folder = _clone(random_bert, tmp_path / "f16")
    weights = load_file(str(folder / "model.safetensors"))
    save_file({k: (v.astype(np.float16) if v.dtype == np.float32 else v) for k, v in weights.items()},
              str(folder / "model.safetensors"), metadata={"format": "pt"})
    loaded = formats.load(formats.open_checkpoint(folder))
    assert loaded.ftype == "F16"
    assert {p.dtype for _, p in tree_flatten(loaded.model.parameters())} == {mx.float32}
    # Same numbers as transformers on the fp16-rounded weights, upcast to fp32.
    ref = load_hf_model(folder, "BertModel").float()
    ids = [101, 7592, 2088, 1010, 2023, 2003, 1037, 3231, 102]
    ours = np.array(loaded.model(mx.array([ids]), mx.ones((1, len(ids)), dtype=mx.int32)))[0]
    np.testing.assert_allclose(ours, hf_hidden(ref, ids), rtol=0, atol=1e-4)


def test_idefics3_serves_colidefics3_only(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "idefics3", "architectures": ["ColIdefics3"]}))
    assert registry.kind_of(formats.open_checkpoint(tmp_path)) == registry.EMBEDDER
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "idefics3",
                                                      "architectures": ["Idefics3ForConditionalGeneration"]}))
    with pytest.raises(UnsupportedCheckpoint, match=r"'Idefics3ForConditionalGeneration'.*\(supported: ColIdefics3\)"):
        registry.kind_of(formats.open_checkpoint(tmp_path))
