"""GGUF files made by llama.cpp's converter, served by the engine: token ids, vectors and scores against
llama-server's answers on the same files (NAME.llama-server.json) and against the safetensors originals."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from engine import Pooling
from engine.errors import CheckpointNotFound, UnsupportedCheckpoint
from engine.checkpoint import Checkpoint
from engine.loading import weights
from engine.loading.gguf import vocab
from engine.loading.gguf.format import GGUFFormat, special_tokens
from engine.loading.gguf.reader import GGUFFile
from engine.loading.gguf.tokenizer import GGUFTokenizer
from tests.conftest import gguf_fixture, minilm_dir, smollm2_gguf
from tests.engine.helpers import cosine, start_engine


def llama_answers(name: str) -> dict:
    return json.loads(gguf_fixture(f"{name}.llama-server.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def minilm_f16():
    eng = start_engine(gguf_fixture("minilm-f16.gguf"))
    yield eng
    eng.close(wait=True)


@pytest.mark.parametrize("name", ["minilm-f16", "minilm-q4_0", "bert-tiny-ce-distilled-f32",
                                  "bert-tiny-ce-distilled-q8_0", "tiny-random-qwen3-last-f16",
                                  "SmolLM2-135M-Instruct.Q4_1"])
def test_token_ids_equal_llama_server(name):
    path = smollm2_gguf() if name.startswith("SmolLM2") else gguf_fixture(f"{name}.gguf")
    # the tokenizer alone: SmolLM2's llama architecture needs the llama family, not its vocabulary
    gguf = GGUFFile(path)
    tok = GGUFTokenizer(Checkpoint(path=path, config={}, format=GGUFFormat(gguf)), gguf)
    answers = llama_answers(name)
    ours = [tok.encode_prompt([s]) for s in answers["sentences"]]
    assert ours == answers["tokenize"]["ids"]
    assert [tok.pieces(ids) for ids in ours] == answers["tokenize"]["pieces"]


ALL_FILES = ["minilm-f16", "minilm-q4_0", "bert-tiny-ce-distilled-f32", "bert-tiny-ce-distilled-q8_0",
             "tiny-random-qwen3-last-f16", "SmolLM2-135M-Instruct.Q4_1"]
SPECIAL_ID_KEYS = ("bos_token_id", "eos_token_id", "seperator_token_id", "padding_token_id", "unknown_token_id")


def _metadata(name: str) -> dict:
    path = smollm2_gguf() if name.startswith("SmolLM2") else gguf_fixture(f"{name}.gguf")
    return dict(GGUFFile(path).metadata)


@pytest.mark.parametrize("name", ALL_FILES)
def test_special_tokens_are_llama_servers(name):
    """/props' bos_token and eos_token, as llama-server reported them for the same file."""
    tokens = special_tokens(_metadata(name), name)
    props = llama_answers(name)["props"]
    assert (tokens["bos_token"], tokens["eos_token"]) == (props["bos_token"], props["eos_token"])


# llama-vocab.cpp's defaults when a file's metadata has no special token ids (per tokenizer model)
@pytest.mark.parametrize("name, bos, eos, pad", [
    ("minilm-f16", 101, None, 0), ("bert-tiny-ce-distilled-q8_0", 101, None, 0),
    ("tiny-random-qwen3-last-f16", 11, 11, None), ("SmolLM2-135M-Instruct.Q4_1", 11, 11, None),  # a byte-level BPE vocabulary, as qwen3
])
def test_special_ids_missing_from_the_metadata_take_llamas_defaults(name, bos, eos, pad):
    meta = {key: value for key, value in _metadata(name).items()
            if key.removeprefix("tokenizer.ggml.") not in SPECIAL_ID_KEYS}
    tokens = meta["tokenizer.ggml.tokens"]
    rules = vocab.special_rules(meta, name)
    assert (rules.bos_id, rules.eos_id, rules.pad_id) == (bos, eos, pad)
    assert special_tokens(meta, name) == {
        "bos_token": tokens[bos] if bos is not None else None, "eos_token": tokens[eos] if eos is not None else None,
        "pad_token": tokens[pad] if pad is not None else None}
    if meta["tokenizer.ggml.model"] == "bert":
        # WordPiece's defaults are the ids the converter writes: llama-server's tokens all the same
        tok, _ = vocab.build(meta, name)
        answers = llama_answers(name)
        assert [tok.encode(s).ids for s in answers["sentences"]] == answers["tokenize"]["ids"]


def test_rerank_prompt_follows_the_files_flags_and_truncates_longest_first():
    path = gguf_fixture("bert-tiny-ce-distilled-f32.gguf")
    gguf = GGUFFile(path)
    tok = GGUFTokenizer(Checkpoint(path=path, config={}, format=GGUFFormat(gguf)), gguf)
    query, document = tok.encode("what is a cat", False, False), tok.encode("a cat is a small animal " * 4, False, False)
    ids, types = tok.encode_pair("what is a cat", "a cat is a small animal " * 4)
    # add_bos, add_eos, no add_sep: [CLS] q [SEP] d [SEP], as llama-server builds it; token types all 0
    assert ids == [101, *query, 102, *document, 102] and set(types) == {0}
    cut, _ = tok.encode_pair("what is a cat", "a cat is a small animal " * 4, max_length=16)
    assert cut == [101, *query, 102, *document[:16 - 3 - len(query)], 102]


def test_minilm_f16_vectors_equal_llama_server_and_the_original(minilm_f16):
    answers = llama_answers("minilm-f16")
    ids = [minilm_f16.encode_prompt([s]) for s in answers["sentences"]]
    ours = minilm_f16.embed(ids).vectors
    assert min(cosine(a, b) for a, b in zip(ours, answers["embeddings"]["vectors"])) >= 0.99999
    from sentence_transformers import SentenceTransformer

    original = SentenceTransformer(str(minilm_dir()), device="cpu").encode(answers["sentences"])
    assert min(cosine(a, b) for a, b in zip(ours, original)) >= 0.9999


def test_minilm_identity_is_read_from_the_file(minilm_f16):
    info = minilm_f16.info
    assert info.path == str(gguf_fixture("minilm-f16.gguf"))  # -m as given
    assert (info.ftype, info.file_format, info.n_embd, info.n_ctx_train, info.n_vocab) == ("F16", "gguf", 384, 512,
                                                                                            30522)
    assert info.pooling is Pooling.MEAN  # bert.pooling_type
    assert (info.bos_token, info.eos_token) == ("[CLS]", "[SEP]")
    # llama.cpp counts every tensor of the file: elements and stored bytes
    assert info.n_params == 22565376 and info.size_bytes == 45586944
    if weights.on_cpu():  # F16 is no block format; it computes in float32 (auto), which is what is resident
        assert (info.weights, info.resident_bytes) == ("float32", 4 * info.n_params)


@pytest.mark.parametrize("name, floor", [("minilm-q4_0", 0.9995), ("tiny-random-qwen3-last-f16", 0.99999),
                                         ("SmolLM2-135M-Instruct.Q4_1", 0.999)])
def test_vectors_equal_llama_server(name, floor):
    answers = llama_answers(name)
    if name.startswith("SmolLM2"):  # no pooling_type in the file: llama-server ran it with --pooling mean
        eng = start_engine(smollm2_gguf(), pooling=Pooling.MEAN, max_seq=64)
    else:
        eng = start_engine(gguf_fixture(f"{name}.gguf"), keep_quantized=True)  # block formats: no effect
    try:
        if ".Q" in name or "_q" in name:  # a block format: dequantized, resident larger than the file, but the
            # Q8_0 token table these files hold, which stays quantized (looked up, never multiplied)
            assert eng.info.weights == "dequantized to float32 at load, embeddings kept quantized"
            assert eng.info.resident_bytes > eng.info.size_bytes
        ids = [eng.encode_prompt([s]) for s in answers["sentences"]]
        ours = eng.embed(ids).vectors
    finally:
        eng.close(wait=True)
    assert min(cosine(a, b) for a, b in zip(ours, answers["embeddings"]["vectors"])) >= floor


# Q8_0: llama.cpp also rounds the activations to 8 bits before each quantized matmul; we multiply fp32
# activations by the dequantized weights, so its scores sit a few 1e-3 away (measured 6.4e-3 at most).
@pytest.mark.parametrize("name, atol", [("bert-tiny-ce-distilled-f32", 5e-4),
                                        ("bert-tiny-ce-distilled-q8_0", 7e-3)])
def test_rerank_scores_equal_llama_server(name, atol):
    answers = llama_answers(name)["rerank"]
    eng = start_engine(gguf_fixture(f"{name}.gguf"), pooling=Pooling.RANK)
    try:
        assert eng.info.kind == "cross-encoder"
        for result in answers["results"]:
            scores = eng.rerank(result["query"], answers["documents"]).scores
            np.testing.assert_allclose(scores, result["scores"], atol=atol)
            assert np.argsort(scores).tolist() == np.argsort(result["scores"]).tolist()
    finally:
        eng.close(wait=True)


def test_a_reranker_file_needs_rank_mode():
    with pytest.raises(UnsupportedCheckpoint, match="--reranking"):
        start_engine(gguf_fixture("bert-tiny-ce-distilled-q8_0.gguf"))


def test_a_file_that_is_not_gguf_is_refused(tmp_path: Path):
    bogus = tmp_path / "model.gguf"
    bogus.write_bytes(b"not a gguf file")
    with pytest.raises(CheckpointNotFound, match="not GGUF"):
        start_engine(bogus)


def test_a_split_file_is_refused_by_name(tmp_path: Path):
    import gguf

    part = tmp_path / "model-00001-of-00002.gguf"
    writer = gguf.GGUFWriter(str(part), "bert")
    writer.add_uint16("split.count", 2)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(UnsupportedCheckpoint, match="split into 2 files is not supported"):
        start_engine(part)


def test_a_quantized_token_table_is_looked_up_as_stored(monkeypatch):
    """minilm-q4_0's Q8_0 token table stays MLX-quantized: its rows are the file's values dequantized, bit for
    bit, the model computes the same vectors as with the table dequantized at load, and it holds a third of the
    memory."""
    import mlx.core as mx
    import mlx.nn as nn

    from engine.loading import formats
    from engine.loading.gguf import load

    path = gguf_fixture("minilm-q4_0.gguf")
    kept = formats.load(formats.open_checkpoint(path))
    table = kept.model.embeddings.word_embeddings
    assert isinstance(table, nn.QuantizedEmbedding) and (table.bits, table.group_size) == (8, 32)
    file = formats.open_checkpoint(path).format.file
    ids = mx.array([0, 1, 101, 2023, 30521])
    np.testing.assert_array_equal(np.array(table(ids)), file.array("token_embd.weight")[np.array(ids)])
    monkeypatch.setattr(load, "LOOKUP_TABLES", ())
    dequantized = formats.load(formats.open_checkpoint(path))
    assert type(dequantized.model.embeddings.word_embeddings) is nn.Embedding
    assert dequantized.weights == "dequantized to float32 at load"
    float_table = dequantized.model.embeddings.word_embeddings.weight.nbytes
    quantized_table = sum(v.nbytes for v in table.parameters().values())
    assert dequantized.resident_bytes - kept.resident_bytes == float_table - quantized_table > 2 * quantized_table
    batch = (mx.array([[101, 2023, 2003, 1037, 3231, 102]]), mx.ones((1, 6), mx.int32), mx.zeros((1, 6), mx.int32))
    np.testing.assert_array_equal(np.array(kept.model(*batch)), np.array(dequantized.model(*batch)))
