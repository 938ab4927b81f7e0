"""GGUF `jina-bert-v3` (jina-embeddings-v3 as llama.cpp's converter writes it, commit 3f545bec): a tiny random
checkpoint in Jina's published remote layout (XLMRobertaLoRA names, five task adapters, XLM-R's real unigram
vocabulary), written with the gguf package's GGUFWriter exactly as `convert_hf_to_gguf.py` writes it: the base file
holds the trunk only (each task's LoRA goes to its own adapter GGUF), with mean pooling and the tokenizer.json
vocabulary. Token ids equal the real llama-server's on the same file, F32 vectors equal llama-server's and the
safetensors folder's as we serve it (no task: Jina's encode(task=None)) to cosine >= 0.9999, identity as
llama-server's /v1/models and /props report it.

The opt-in test converts the same folder with llama.cpp's own converter and checks that its file holds exactly
what ours holds: `MLX_EMBED_LLAMA_CPP=/path/to/llama.cpp .venv/bin/python -m pytest -q tests/engine/test_gguf_jina_v3.py`
(a llama.cpp checkout at commit 3f545bec with its gguf-py; `git archive` of convert_hf_to_gguf.py, conversion/ and
gguf-py/ is enough).
"""
from __future__ import annotations

import base64
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from tests.engine.families.decoder_fixture import pooled_layout, write_files
from tests.engine.helpers import cosine, perturb_vectors, start_engine, torch
from tests.engine.test_gguf_written import _xlmr_tokenizer_json, add_encoder_specials, finish

gguf = pytest.importorskip("gguf")

LAYERS, HIDDEN, HEADS, FF = 3, 64, 4, 96  # what tests/engine/families/test_jina_embeddings_v3.py's remote_layout writes
# whitespace runs and ends: this tokenizer.json does not clean up spaces (remove_extra_whitespaces false)
TEXTS = ["hello", "  two  spaces  here ", "   ", "x\t\ty  ", "Paris est la capitale de la France.",
         "what is rotary position embedding? " * 12, "Rotary embeddings rotate query and key pairs."]


@pytest.fixture(scope="module")
def remote(tmp_path_factory) -> Path:
    """jina-embeddings-v3's remote layout (task None: no adapter merged) on XLM-R's tokenizer.json, with its
    mean-pooling sentence-transformers files."""
    from tests.engine.families.test_jina_embeddings_v3 import INSTRUCTIONS, remote_layout

    t = torch()
    import transformers

    root = tmp_path_factory.mktemp("jina_v3_gguf")
    spec = _xlmr_tokenizer_json()
    # the converter reads the charsmap at normalizer.precompiled_charsmap (a lone Precompiled normalizer)
    spec["normalizer"] = next(n for n in spec["normalizer"]["normalizers"] if n["type"] == "Precompiled")
    t.manual_seed(53)
    config = transformers.JinaEmbeddingsV3Config(
        vocab_size=len(spec["model"]["vocab"]), hidden_size=HIDDEN, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
        intermediate_size=FF, rope_parameters={"rope_type": "default", "rope_theta": 1000.0}, initializer_range=0.2,
        pad_token_id=1)
    model = transformers.JinaEmbeddingsV3Model(config)
    perturb_vectors(model, 53)
    model.eval()
    native = root / "native"
    model.save_pretrained(str(native))
    specials = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>",
                "cls_token": "<s>", "sep_token": "</s>", "mask_token": "<mask>"}
    (native / "tokenizer.json").write_text(json.dumps(spec), encoding="utf-8")
    (native / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "XLMRobertaTokenizer",
                                                              "clean_up_tokenization_spaces": False,
                                                              "model_max_length": 8192, **specials}))
    (native / "special_tokens_map.json").write_text(json.dumps(specials))
    (native / "vocab.txt").write_text("")  # remote_layout copies it (a WordPiece fixture's); XLM-R has none
    folder = root / "remote"
    remote_layout(native, model, folder, None)
    (folder / "vocab.txt").unlink()
    config = json.loads((folder / "config.json").read_text())
    config.update(pad_token_id=1, bos_token_id=0, eos_token_id=2)  # XLM-R's, as jina-embeddings-v3 publishes
    (folder / "config.json").write_text(json.dumps(config))
    write_files(folder, pooled_layout("mean", INSTRUCTIONS))
    shutil.rmtree(native)
    return folder


def write_jina_v3_gguf(folder: Path, path: Path) -> None:
    """`folder` as convert_hf_to_gguf.py --outtype f32 writes its base file (XLMRobertaModel with
    lora_adaptations -> jina-bert-v3): the `.parametrizations.weight.original` weights under the converter's
    tensor names, the adapters left out; tokenizer.json's unigram vocabulary and XLM-R's special tokens."""
    from safetensors.numpy import load_file

    config = json.loads((folder / "config.json").read_text())
    spec = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
    tok_config = json.loads((folder / "tokenizer_config.json").read_text())
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.JINA_BERT_V3, config["num_hidden_layers"])
    writer = gguf.GGUFWriter(str(path), "jina-bert-v3")
    writer.add_type(gguf.GGUFType.MODEL)
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_context_length(config["max_position_embeddings"] - config["pad_token_id"] - 1)
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_rope_freq_base(config["rotary_emb_base"])
    writer.add_layer_norm_eps(config["layer_norm_eps"])
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_causal_attention(False)
    writer.add_pooling_type(gguf.PoolingType.MEAN)
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    vocab = spec["model"]["vocab"]
    writer.add_tokenizer_model("t5")
    writer.add_tokenizer_pre("default")
    writer.add_token_list([piece for piece, _ in vocab])
    writer.add_token_scores([float(score) for _, score in vocab])
    ids = {piece: i for i, (piece, _) in enumerate(vocab)}
    special = {ids[t["content"]] for t in spec["added_tokens"]}
    writer.add_token_types([2 if i == spec["model"]["unk_id"] else 3 if i in special else 1 for i in range(len(vocab))])
    writer.add_add_space_prefix(True)
    writer.add_token_type_count(config["type_vocab_size"])
    writer.add_remove_extra_whitespaces(tok_config["clean_up_tokenization_spaces"])
    writer.add_precompiled_charsmap(base64.b64decode(spec["normalizer"]["precompiled_charsmap"]))
    add_encoder_specials(writer, ids["<s>"], ids["</s>"], ids["<pad>"], ids["<unk>"])
    writer.add_mask_token_id(ids["<mask>"])
    for key, value in load_file(str(folder / "model.safetensors")).items():
        if key.endswith((".0.lora_A", ".0.lora_B")):
            continue  # each task's adapter: its own GGUF
        base = key.removeprefix("roberta.").replace(".parametrizations.weight.original", ".weight")
        module, kind = base.rsplit(".", 1)
        name = names.get_name(module)
        assert name is not None, key
        writer.add_tensor(f"{name}.{kind}", np.ascontiguousarray(value, dtype=np.float32))
    finish(writer)


@pytest.fixture(scope="module")
def jina_v3_gguf(remote, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("jina_v3_file") / "tiny-jina-embeddings-v3-f32.gguf"
    write_jina_v3_gguf(remote, path)
    return path


def test_jina_bert_v3_gguf_ids_vectors_and_identity_equal_llama_servers_and_the_folders(remote, jina_v3_gguf):
    from tests.engine.test_gguf_jina import identity_of, llama_identity
    from tests.peer_llama import LlamaServer

    eng = start_engine(jina_v3_gguf, max_seq=512)
    try:
        assert eng.info.pooling.value == "mean" and eng.info.n_embd == HIDDEN
        ids = [eng.encode_prompt([s]) for s in TEXTS]
        ours = eng.embed(ids).vectors
        identity = identity_of(eng.info)
    finally:
        eng.close(wait=True)
    assert identity["ftype"] == "all F32"
    folder = start_engine(remote, max_seq=512)
    try:
        assert folder.info.pooling.value == "mean"
        served = folder.embed(ids).vectors  # the same ids through the safetensors family
    finally:
        folder.close(wait=True)
    with LlamaServer(jina_v3_gguf, "--embedding") as llama:
        assert ids == [llama.tokenize(s) for s in TEXTS]
        theirs = llama.embeddings(TEXTS)
        assert identity == llama_identity(llama)
    assert min(cosine(a, b) for a, b in zip(ours, theirs, strict=True)) >= 0.9999
    assert min(cosine(a, b) for a, b in zip(ours, served, strict=True)) >= 0.9999
    assert cosine(ours[4], ours[6]) < 0.99  # the random model tells texts apart


def test_jina_bert_v3_gguf_written_as_llama_cpps_converter_writes_it(remote, jina_v3_gguf, tmp_path):
    from tests.engine.test_gguf_encoders import _llama_cpp, assert_same_file, convert

    root = _llama_cpp()
    converted = tmp_path / "converted.gguf"
    folder = tmp_path / "for-converter"
    shutil.copytree(remote, folder)
    config = json.loads((folder / "config.json").read_text())
    config["architectures"] = ["XLMRobertaModel"]  # as jinaai/jina-embeddings-v3 names it (auto_map: the LoRA class)
    (folder / "config.json").write_text(json.dumps(config))
    convert(root, folder, converted)
    assert_same_file(jina_v3_gguf, converted)
    adapters = sorted(p.name for p in tmp_path.glob("lora-*-converted.gguf"))
    assert adapters == sorted(f"lora-{task}-converted.gguf" for task in config["lora_adaptations"])
    for task in config["lora_adaptations"]:
        ours = tmp_path / f"ours-{task}.gguf"
        write_task_adapter(remote, ours, task)
        assert_same_file(ours, tmp_path / f"lora-{task}-converted.gguf")


def write_task_adapter(folder: Path, path: Path, task: str) -> None:
    """One task's LoRA as the converter writes `lora-<task>-<name>.gguf`: general.type adapter, the alpha, task
    name and prompt prefix, and each parametrized weight's `.lora_a` / `.lora_b` of that task (token_embd's B
    transposed, token_types' pair swapped), F32."""
    from safetensors.numpy import load_file

    config = json.loads((folder / "config.json").read_text())
    index = config["lora_adaptations"].index(task)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.JINA_BERT_V3, config["num_hidden_layers"])
    writer = gguf.GGUFWriter(str(path), "jina-bert-v3")
    writer.add_type(gguf.GGUFType.ADAPTER)
    writer.add_string(gguf.Keys.Adapter.TYPE, "lora")
    writer.add_float32(gguf.Keys.Adapter.LORA_ALPHA, config["lora_alpha"])
    writer.add_string(gguf.Keys.Adapter.LORA_TASK_NAME, task)
    writer.add_string(gguf.Keys.Adapter.LORA_PROMPT_PREFIX, config["task_instructions"][task])
    for key, value in load_file(str(folder / "model.safetensors")).items():
        if not key.endswith((".0.lora_A", ".0.lora_B")):
            continue
        module = key.removeprefix("roberta.").replace(".parametrizations.weight.0.lora_", ".weight.lora_")
        base, kind = module.rsplit(".weight.lora_", 1)
        name = f"{names.get_name(base)}.weight.lora_{kind.lower()}"
        data = value[index]
        if name == "token_embd.weight.lora_b":
            data = data.T
        elif name.startswith("token_types.weight."):
            name = name[:-1] + ("a" if name[-1] == "b" else "b")
        writer.add_tensor(name, np.ascontiguousarray(data, dtype=np.float32))
    finish(writer)


def test_task_adapters_with_lora_equal_llama_servers(remote, jina_v3_gguf, tmp_path):
    """--lora / --lora-scaled: the task's adapter merged into the base file's weights, as llama-server applies it
    to every embedding (its graph leaves the token-type adapter out, so this is not jina's encode(task))."""
    from tests.peer_llama import LlamaServer

    query, passage = tmp_path / "lora-retrieval.query.gguf", tmp_path / "lora-retrieval.passage.gguf"
    write_task_adapter(remote, query, "retrieval.query")
    write_task_adapter(remote, passage, "retrieval.passage")
    runs = {"query": ((str(query), 1.0),), "both": ((str(query), 0.5), (str(passage), 0.7))}
    ours, ids = {}, None
    for run, lora in {"base": (), **runs}.items():
        eng = start_engine(jina_v3_gguf, max_seq=512, lora=lora)
        try:
            ids = [eng.encode_prompt([s]) for s in TEXTS]
            ours[run] = eng.embed(ids).vectors
        finally:
            eng.close(wait=True)
    flags = {"query": ["--lora", str(query)], "both": ["--lora-scaled", f"{query}:0.5,{passage}:0.7"]}
    for run, args in flags.items():
        with LlamaServer(jina_v3_gguf, "--embedding", *args) as llama:
            assert ids == [llama.tokenize(s) for s in TEXTS]
            theirs = llama.embeddings(TEXTS)
        assert min(cosine(a, b) for a, b in zip(ours[run], theirs, strict=True)) >= 0.9999, run
        assert min(cosine(a, b) for a, b in zip(ours[run], ours["base"], strict=True)) < 0.999, run  # it moved


def test_lora_on_a_wrong_file_is_refused_naming_it(remote, jina_v3_gguf, tmp_path):
    from engine.errors import UnsupportedCheckpoint

    with pytest.raises(UnsupportedCheckpoint, match="general.type is 'model', not 'adapter'"):
        start_engine(jina_v3_gguf, lora=((str(jina_v3_gguf), 1.0),))
    with pytest.raises(UnsupportedCheckpoint, match="apply llama.cpp adapter GGUFs to a GGUF model"):
        start_engine(remote, lora=((str(jina_v3_gguf), 1.0),))
