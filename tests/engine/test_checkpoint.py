"""Finding a checkpoint (engine/loading/hub.py) and reading its configuration files (engine/loading/safetensors.py,
both sentence-transformers layouts, into engine/checkpoint.py's record), and what the Engine makes of them."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from engine import Pooling, checkpoint
from engine.loading import formats, hub, safetensors
from engine.errors import CheckpointNotFound, UnsupportedCheckpoint
from tests.engine.helpers import cosine, hf_hidden, load_hf_model, make_random_bert, start_engine

BERT_CONFIG = {"model_type": "bert", "architectures": ["BertModel"], "vocab_size": 30522, "hidden_size": 64,
               "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 128}


def write_folder(root: Path, files: dict[str, object]) -> Path:
    """A checkpoint folder made of JSON (or text) files only: enough for formats.open_checkpoint()."""
    for rel, content in {"config.json": BERT_CONFIG, **files}.items():
        target = root / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content if isinstance(content, str) else json.dumps(content), encoding="utf-8")
    return root


# -- resolve ------------------------------------------------------------------------------------------------
def test_resolve_local_folder(tmp_path):
    folder = write_folder(tmp_path, {})
    assert hub.resolve(str(folder), None, offline=True) == folder


def test_resolve_missing_folder(tmp_path):
    missing = tmp_path / "does-not-exist"
    with pytest.raises(CheckpointNotFound, match="does-not-exist"):
        hub.resolve(str(missing), None, offline=True)


def test_resolve_folder_without_config(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(CheckpointNotFound, match="config.json"):
        hub.resolve(str(tmp_path), None, offline=True)


def test_resolve_nothing_given():
    with pytest.raises(CheckpointNotFound):
        hub.resolve(None, None, offline=True)


def test_resolve_unknown_hub_repo_offline(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(CheckpointNotFound, match="no-such-org/no-such-model"):
        hub.resolve(None, "no-such-org/no-such-model:Q8_0", offline=True)


def test_default_model_is_the_bundled_minilm(minilm_path):
    assert Path(hub.default_model()) == minilm_path


# -- read: the published MiniLM layout ----------------------------------------------------------------------
def test_read_minilm(minilm_path):
    ck = formats.open_checkpoint(minilm_path)
    assert ck.model_type == "bert"
    assert ck.architecture == "BertModel"
    # modules.json lists a 2_Normalize folder MiniLM does not ship: accepted
    assert not (minilm_path / "2_Normalize").exists()
    assert ck.module_types == ("Transformer", "Pooling", "Normalize")
    assert ck.pooling is Pooling.MEAN  # old-style boolean keys
    assert ck.max_seq_length == 256  # sentence_bert_config.json wins over tokenizer_config's 512
    assert ck.tokenizer_config["model_max_length"] == 512
    assert safetensors.weight_files(ck.path) == [minilm_path / "model.safetensors"]


# -- read: 1_Pooling in both styles ---------------------------------------------------------------------------
@pytest.mark.parametrize("cfg, expected", [
    ({"embedding_dimension": 64, "pooling_mode": "cls", "include_prompt": True}, Pooling.CLS),
    ({"embedding_dimension": 64, "pooling_mode": "mean", "include_prompt": True}, Pooling.MEAN),
    ({"embedding_dimension": 64, "pooling_mode": "max"}, Pooling.MAX),
    ({"embedding_dimension": 64, "pooling_mode": "lasttoken"}, Pooling.LAST),
    ({"word_embedding_dimension": 64, "pooling_mode_cls_token": True, "pooling_mode_mean_tokens": False}, Pooling.CLS),
    ({"word_embedding_dimension": 64, "pooling_mode_max_tokens": True}, Pooling.MAX),
    ({"word_embedding_dimension": 64, "pooling_mode_lasttoken": True}, Pooling.LAST),
    ({"word_embedding_dimension": 64}, Pooling.MEAN),  # no mode set: sentence-transformers' default
])
def test_read_pooling(tmp_path, cfg, expected):
    ck = formats.open_checkpoint(write_folder(tmp_path, {"1_Pooling/config.json": cfg}))
    assert ck.pooling is expected


def test_no_pooling_file_leaves_it_to_the_family(tmp_path):
    assert formats.open_checkpoint(write_folder(tmp_path, {})).pooling is None


@pytest.mark.parametrize("cfg, named", [
    ({"word_embedding_dimension": 64, "pooling_mode_weightedmean_tokens": True}, "weightedmean"),
    ({"word_embedding_dimension": 64, "pooling_mode_mean_sqrt_len_tokens": True}, "mean_sqrt_len_tokens"),
    ({"embedding_dimension": 64, "pooling_mode": "weightedmean"}, "weightedmean"),
    ({"embedding_dimension": 64, "pooling_mode": "cls", "include_prompt": False}, "include_prompt"),
    ({"word_embedding_dimension": 64, "pooling_mode_cls_token": True, "pooling_mode_mean_tokens": True}, "combined"),
])
def test_unsupported_pooling_is_refused_by_name(tmp_path, cfg, named):
    folder = write_folder(tmp_path, {"1_Pooling/config.json": cfg})
    with pytest.raises(UnsupportedCheckpoint, match=named):
        formats.open_checkpoint(folder)


# -- read: modules.json ---------------------------------------------------------------------------------------
def test_sentence_transformers_6_module_paths_are_understood(tmp_path):
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.base.modules.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.base.modules.Pooling"}]
    ck = formats.open_checkpoint(write_folder(tmp_path, {"modules.json": modules}))
    assert ck.module_types == ("Transformer", "Pooling")


def test_every_configuration_file_is_read_once(tmp_path, monkeypatch):
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "2_Dense", "type": "sentence_transformers.models.Dense"}]
    folder = write_folder(tmp_path, {"modules.json": modules, "sentence_bert_config.json": {"max_seq_length": 64}})
    reads: list[str] = []
    real = Path.read_text
    monkeypatch.setattr(Path, "read_text", lambda self, *a, **kw: reads.append(self.name) or real(self, *a, **kw))
    ck = formats.open_checkpoint(folder)
    assert (ck.module_types, ck.dense_folders, ck.max_seq_length) == (("Transformer", "Dense"), (folder / "2_Dense",), 64)
    assert sorted(reads) == sorted(set(reads)) and {"modules.json", "sentence_bert_config.json"} <= set(reads)


def test_unknown_module_type_is_refused_by_name(tmp_path):
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
               {"idx": 2, "name": "2", "path": "2_LSTM", "type": "sentence_transformers.models.LSTM"}]
    with pytest.raises(UnsupportedCheckpoint, match=r"sentence_transformers\.models\.LSTM"):
        formats.open_checkpoint(write_folder(tmp_path, {"modules.json": modules}))


# -- read: max_seq_length --------------------------------------------------------------------------------------
@pytest.mark.parametrize("files, expected", [
    ({"sentence_bert_config.json": {"max_seq_length": 200}, "tokenizer_config.json": {"model_max_length": 128}}, 200),
    ({"tokenizer_config.json": {"model_max_length": 128}}, 128),  # sentence-transformers >= 6 layout
    ({"tokenizer_config.json": {"model_max_length": 1000000000000000019884624838656}}, None),  # "no limit"
    ({"sentence_bert_config.json": {"max_seq_length": 0}, "tokenizer_config.json": {"model_max_length": 64}}, 64),
    ({}, None),
])
def test_read_max_seq_length(tmp_path, files, expected):
    assert formats.open_checkpoint(write_folder(tmp_path, files)).max_seq_length == expected


def test_read_prompts_and_their_default(tmp_path):
    prompts = {"search_query": "search_query: ", "search_document": "search_document: ", "none": ""}
    folder = write_folder(tmp_path, {"config_sentence_transformers.json": {
        "prompts": prompts, "default_prompt_name": "search_document"}})
    ckpt = formats.open_checkpoint(folder)
    assert (ckpt.prompts, ckpt.default_prompt_name) == (prompts, "search_document")
    assert formats.open_checkpoint(write_folder(tmp_path / "bare", {})).prompts == {}


def test_pylate_prefixes_lead_the_query_and_document_prompts(tmp_path):
    folder = write_folder(tmp_path, {"config_sentence_transformers.json": {
        "prompts": {"query": "", "document": "passage: "}, "query_prefix": "[Q] ", "document_prefix": "[D] "}})
    assert formats.open_checkpoint(folder).prompts == {"query": "[Q] ", "document": "[D] passage: "}


@pytest.mark.parametrize("cfg,named", [
    ({"prompts": {"q": "q: "}, "default_prompt_name": "query"}, "default_prompt_name 'query' is not one of its"),
    ({"prompts": {"q": 3}}, "'prompts' must map prompt names to strings"),
    ({"prompts": ["q: "]}, "'prompts' must map prompt names to strings"),
])
def test_inconsistent_prompts_are_refused(tmp_path, cfg, named):
    with pytest.raises(UnsupportedCheckpoint, match=named):
        formats.open_checkpoint(write_folder(tmp_path, {"config_sentence_transformers.json": cfg}))


def test_invalid_json_is_unsupported_and_named(tmp_path):
    folder = write_folder(tmp_path, {"tokenizer_config.json": "{not json"})
    with pytest.raises(UnsupportedCheckpoint, match="tokenizer_config.json"):
        formats.open_checkpoint(folder)


def test_weight_files_without_safetensors(tmp_path):
    ck = formats.open_checkpoint(write_folder(tmp_path, {}))
    (tmp_path / "pytorch_model.bin").write_bytes(b"")
    with pytest.raises(UnsupportedCheckpoint, match="safetensors"):
        safetensors.weight_files(ck.path)


def test_weight_files_from_a_sharded_index(tmp_path):
    index = {"weight_map": {"a": "model-00002-of-00002.safetensors", "b": "model-00001-of-00002.safetensors",
                            "c": "model-00001-of-00002.safetensors"}}
    ck = formats.open_checkpoint(write_folder(tmp_path, {"model.safetensors.index.json": index}))
    assert safetensors.weight_files(ck.path) == [tmp_path / "model-00001-of-00002.safetensors",
                                 tmp_path / "model-00002-of-00002.safetensors"]


# -- a sentence-transformers >= 6 layout through the Engine ----------------------------------------------------
@pytest.fixture(scope="module")
def st6_checkpoint(tmp_path_factory):
    extra = {
        "1_Pooling/config.json": {"embedding_dimension": 64, "pooling_mode": "cls", "include_prompt": True},
        "modules.json": [
            {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.base.modules.Transformer"},
            {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.base.modules.Pooling"},
        ],
    }
    return make_random_bert(tmp_path_factory.mktemp("st6"), seed=3, tokenizer_config={"model_max_length": 128},
                            extra_files=extra)


def test_st6_layout_resolves_cls_and_model_max_length(st6_checkpoint):
    assert not (st6_checkpoint / "sentence_bert_config.json").exists()
    eng = start_engine(st6_checkpoint, truncate=True)
    try:
        info = eng.info
        assert info.pooling is Pooling.CLS
        assert info.truncate_tokens == 128
        assert info.max_input_tokens == 512

        ref = load_hf_model(st6_checkpoint, "BertModel")
        ids = eng.encode_prompt(["a short sentence for the cls token"])
        vec = eng.embed([ids]).vectors[0]
        expected = hf_hidden(ref, ids)[0]
        np.testing.assert_allclose(vec, expected, rtol=0, atol=1e-4)
        assert cosine(vec, expected) >= 0.999999

        # over the per-input limit with truncation on: cut to model_max_length, trailing [SEP] kept
        long_ids = eng.encode_prompt(["word " * 600])
        assert len(long_ids) > 512
        result = eng.embed([long_ids])
        assert result.n_tokens == [128]
        cut = long_ids[:127] + [long_ids[-1]]
        np.testing.assert_allclose(result.vectors[0], eng.embed([cut]).vectors[0], rtol=0, atol=1e-6)
    finally:
        eng.close()


@pytest.mark.parametrize("value, text", [("<s>", "<s>"), ({"content": "</s>", "lstrip": False}, "</s>"),
                                         (None, None), ({"lstrip": True}, None), (5, None)])
def test_special_token_text_reads_both_spellings(value, text):
    # tokenizer_config.json / special_tokens_map.json write a special token as a string or an AddedToken object;
    # the tokenizer, the chat template's variables and the SentencePiece build all read it through this
    assert checkpoint.special_token_text(value) == text
