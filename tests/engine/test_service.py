"""engine/runtime/engine.py: the Engine facade on the real MiniLM: batch invariance, limits, truncation, errors."""
from __future__ import annotations

import json
import shutil
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from engine import Engine, EngineOptions
from engine.errors import (CheckpointNotFound, EmptyInput, ForwardFailed, InputTooLong, InvalidTokens, NotLoaded,
                           OutOfMemory, QueueFull, ReplyTimeout, TooManyInputs, UnsupportedCheckpoint)
from tests.engine.helpers import start_engine

SEP = 102


@pytest.fixture(scope="module")
def minilm(minilm_path):
    eng = start_engine(minilm_path)
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def one_lane(minilm_path):
    """A single-lane engine (-t 1): one thread computes, so a held pass holds the whole engine."""
    eng = start_engine(minilm_path, threads=1)
    yield eng
    eng.close()


@pytest.fixture
def gated_runner(one_lane, monkeypatch):
    """Hold the (single-lane) engine thread inside its next forward pass until the test releases it."""
    real = one_lane._worker._runner
    entered, release = threading.Event(), threading.Event()

    def runner(*args):
        entered.set()
        assert release.wait(60), "the test never released the engine thread"
        return real(*args)

    monkeypatch.setattr(one_lane._worker, "_runner", runner)
    try:
        yield entered, release
    finally:
        release.set()


def _ids(eng: Engine, text: str) -> list[int]:
    return eng.encode_prompt([text])


def _long_ids(eng: Engine, n: int) -> list[int]:
    """Exactly n tokens: [CLS] + n-2 word tokens + [SEP]."""
    ids = _ids(eng, "word " * (n - 2))
    assert len(ids) == n
    return ids


def _wait_until(predicate, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.005)


# -- loading --------------------------------------------------------------------------------------------------
def test_info_of_minilm(minilm, minilm_path):
    info = minilm.info
    assert info.path == str(minilm_path)
    assert (info.model_type, info.architecture, info.n_vocab, info.n_embd, info.n_ctx_train) == \
        ("bert", "BertModel", 30522, 384, 512)
    assert info.max_input_tokens == 512  # min(positions 512, ubatch 512)
    assert info.truncate_tokens == 256  # sentence_bert_config.json max_seq_length
    assert (info.slot_ctx, info.n_slots) == (512, 4)  # -c 0 -np -1: 4 slots sharing the model's context
    assert (info.bos_token, info.eos_token) == ("[CLS]", "[SEP]")
    assert info.kernels == "cpu-arithmetic"  # this machine has no GPU: our kernels, chosen at load
    assert minilm.is_loaded


def test_missing_folder_surfaces_from_wait_loaded(tmp_path):
    eng = Engine(EngineOptions(model_path=str(tmp_path / "nowhere")))
    try:
        with pytest.raises(CheckpointNotFound, match="nowhere"):
            eng.wait_loaded(30)
        assert not eng.is_loaded
        with pytest.raises(NotLoaded):
            eng.info  # noqa: B018
        with pytest.raises(NotLoaded):
            eng.embed([[101, 102]])
    finally:
        eng.close()


def test_unsupported_model_type_surfaces_from_wait_loaded(tmp_path, minilm_path):
    shutil.copy(minilm_path / "tokenizer.json", tmp_path / "tokenizer.json")
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2", "architectures": ["GPT2Model"]}))
    eng = Engine(EngineOptions(model_path=str(tmp_path)))
    try:
        with pytest.raises(UnsupportedCheckpoint, match="gpt2"):
            eng.wait_loaded(30)
    finally:
        eng.close()


def test_broken_weights_surface_from_wait_loaded(tmp_path, minilm_path):
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(minilm_path / name, tmp_path / name)
    (tmp_path / "model.safetensors").write_bytes(b"not a safetensors file")
    eng = Engine(EngineOptions(model_path=str(tmp_path)))
    try:
        with pytest.raises(Exception) as caught:  # (today a bare RuntimeError from mlx, not an EngineError)
            eng.wait_loaded(30)
        assert not isinstance(caught.value, NotLoaded)
        assert "model.safetensors" in str(caught.value)
        assert not eng.is_loaded
    finally:
        eng.close()


# -- batch invariance -------------------------------------------------------------------------------------------
TARGET = "The same sentence must embed identically wherever it sits."
COMPANY = ["ok", "word " * 200, "A medium length sentence about nothing in particular, really.", "🙂",
           "短い文", "x " * 120]


def test_alone_and_in_a_mixed_batch_agree(minilm):
    target = _ids(minilm, TARGET)
    alone = minilm.embed([target]).vectors[0]
    company = [_ids(minilm, t) for t in COMPANY]
    mixed = minilm.embed(company[:3] + [target] + company[3:]).vectors
    np.testing.assert_allclose(mixed[3], alone, rtol=0, atol=1e-5)
    # every companion equals its own lone embedding too
    for ids, vec in zip(company[:3] + [target] + company[3:], mixed, strict=True):
        np.testing.assert_allclose(vec, minilm.embed([ids]).vectors[0], rtol=0, atol=1e-5)


def test_embed_prompts_tokenizes_in_the_engine(minilm, minilm_path):
    """Text and mixed prompts go in as sent; the engine tokenizes them (timed) and embeds the ids the checkpoint's
    own tokenizer gives, under llama's mixed-prompt rule (only a leading text gets [CLS]/[SEP])."""
    from tokenizers import Tokenizer

    reference = Tokenizer.from_file(str(minilm_path / "tokenizer.json"))
    reference.no_padding()  # the file pads to 128: sentence-transformers pads per batch, to its longest text
    prompts = [[TARGET], ["ok", 2003, "x"], [101, 2003, 102]]
    token_lists = [reference.encode(TARGET).ids,
                   [*reference.encode("ok").ids, 2003, *reference.encode("x", add_special_tokens=False).ids],
                   [101, 2003, 102]]
    assert token_lists[0][0] == 101 and token_lists[0][-1] == 102 and len(token_lists[1]) == 5
    result = minilm.embed_prompts(prompts)
    assert result.timings.tokenize_s > 0
    assert result.n_tokens == [len(ids) for ids in token_lists]
    for got, expected in zip(result.vectors, minilm.embed(token_lists).vectors, strict=True):
        np.testing.assert_allclose(got, expected, rtol=0, atol=1e-5)


def test_split_into_small_batches_agrees(minilm_path, minilm):
    small = start_engine(minilm_path, max_batch_rows=2, max_batch_tokens=256)
    try:
        token_lists = [_ids(minilm, t) for t in [TARGET, *COMPANY]]
        expected = minilm.embed(token_lists).vectors
        got = small.embed(token_lists).vectors
        assert small.stats()["n_decode_total"] >= 4  # really split (plus nothing else ran on it)
        for a, b in zip(got, expected, strict=True):
            np.testing.assert_allclose(a, b, rtol=0, atol=1e-5)
    finally:
        small.close()


def test_concurrent_requests_agree_with_lone_embeddings(one_lane, gated_runner):
    """Several threads' inputs, queued together while the engine is busy, share forward passes."""
    entered, release = gated_runner
    target = _ids(one_lane, TARGET)
    company = [_ids(one_lane, t) for t in COMPANY if len(t) < 200]
    n_threads = 6
    barrier = threading.Barrier(n_threads)

    def request(k: int):
        mine = [company[k % len(company)], target, company[(k + 2) % len(company)]]
        barrier.wait(10)
        return mine, one_lane.embed(mine).vectors

    with ThreadPoolExecutor(n_threads + 1) as pool:
        blocker = pool.submit(one_lane.embed, [[101, 102]])
        assert entered.wait(30)
        before = one_lane.stats()["n_decode_total"]
        answers = [pool.submit(request, k) for k in range(n_threads)]
        _wait_until(lambda: one_lane.stats()["requests_deferred"] == 3 * n_threads)
        release.set()
        blocker.result(30)
        answers = [a.result(60) for a in answers]
    passes = one_lane.stats()["n_decode_total"] - before
    assert passes < 3 * n_threads  # inputs of different requests really shared forward passes

    lone = {tuple(ids): one_lane.embed([ids]).vectors[0] for ids in [target, *company]}
    for mine, vectors in answers:
        assert len(vectors) == 3
        for ids, vec in zip(mine, vectors, strict=True):
            np.testing.assert_allclose(vec, lone[tuple(ids)], rtol=0, atol=1e-5)


# -- input checks ---------------------------------------------------------------------------------------------
def test_empty_input(minilm):
    with pytest.raises(EmptyInput):
        minilm.embed([[]])
    with pytest.raises(EmptyInput):
        minilm.embed([[101, 102], []])
    assert minilm.stats()["requests_deferred"] == 0  # nothing of the refused request was queued


@pytest.mark.parametrize("bad", [[101, 30522, 102], [101, -1, 102], [10**9]])
def test_invalid_tokens(minilm, bad):
    with pytest.raises(InvalidTokens):
        minilm.embed([bad])


def test_highest_valid_token_is_accepted(minilm):
    assert minilm.embed([[101, 30521, 102]]).vectors[0].shape == (384,)


@pytest.fixture(scope="module")
def small_ubatch(minilm_path):
    eng = start_engine(minilm_path, ubatch_tokens=32)
    yield eng
    eng.close()


def test_ubatch_limit(small_ubatch):
    assert small_ubatch.info.max_input_tokens == 32
    assert small_ubatch.embed([_long_ids(small_ubatch, 32)]).n_tokens == [32]
    with pytest.raises(InputTooLong) as caught:
        small_ubatch.embed([_long_ids(small_ubatch, 33)])
    assert (caught.value.limit_kind, caught.value.limit, caught.value.n_tokens) == ("ubatch", 32, 33)


def test_truncation_under_a_small_ubatch_cuts_to_it(small_ubatch):
    assert small_ubatch.info.truncate_tokens == 32  # min(max_seq_length 256, what the server accepts)
    ids = _long_ids(small_ubatch, 40)
    result = small_ubatch.embed([ids], truncate=True)
    assert result.n_tokens == [32]
    cut = ids[:31] + [SEP]
    np.testing.assert_allclose(result.vectors[0], small_ubatch.embed([cut]).vectors[0], rtol=0, atol=1e-6)


@pytest.fixture(scope="module")
def split_context(minilm_path):
    eng = start_engine(minilm_path, ctx_size=512, parallel=2)
    yield eng
    eng.close()


def test_context_limit_per_slot(split_context):
    info = split_context.info
    assert (info.slot_ctx, info.n_slots) == (256, 2)  # -c 512 -np 2 -> 256 per slot
    assert info.max_input_tokens == 256
    assert split_context.embed([_long_ids(split_context, 256)]).n_tokens == [256]
    with pytest.raises(InputTooLong) as caught:
        split_context.embed([_long_ids(split_context, 257)])
    assert (caught.value.limit_kind, caught.value.limit, caught.value.n_tokens) == ("context", 256, 257)


def test_ubatch_is_named_before_context(minilm_path):
    eng = start_engine(minilm_path, ctx_size=512, parallel=2, ubatch_tokens=128)
    try:
        with pytest.raises(InputTooLong) as caught:
            eng.embed([_long_ids(eng, 300)])
        assert (caught.value.limit_kind, caught.value.limit) == ("ubatch", 128)
    finally:
        eng.close()


def test_unified_context_with_auto_parallel(minilm_path):
    eng = start_engine(minilm_path, ctx_size=512, parallel=-1)
    try:
        assert (eng.info.slot_ctx, eng.info.n_slots) == (512, 4)
        assert eng.info.max_input_tokens == 512
    finally:
        eng.close()


def test_position_limit(minilm_path):
    eng = start_engine(minilm_path, ubatch_tokens=1024)
    try:
        assert eng.info.max_input_tokens == 512
        with pytest.raises(InputTooLong) as caught:
            eng.embed([_long_ids(eng, 513)])
        assert (caught.value.limit_kind, caught.value.limit) == ("positions", 512)
    finally:
        eng.close()


def test_too_long_without_truncation(minilm):
    with pytest.raises(InputTooLong) as caught:
        minilm.embed([_long_ids(minilm, 600)])
    assert caught.value.limit_kind == "ubatch"


def test_truncation_keeps_trailing_sep(minilm):
    ids = _long_ids(minilm, 600)
    result = minilm.embed([ids], truncate=True)
    assert result.n_tokens == [256]  # MiniLM's max_seq_length
    cut = ids[:255] + [SEP]
    direct = minilm.embed([cut])
    assert direct.n_tokens == [256]
    np.testing.assert_allclose(result.vectors[0], direct.vectors[0], rtol=0, atol=1e-6)
    # and the cut really changed the input: the full text's first 256 tokens without [SEP] differ
    assert not np.allclose(result.vectors[0], minilm.embed([ids[:256]]).vectors[0], atol=1e-4)


def test_truncation_from_engine_options(minilm_path, minilm):
    eng = start_engine(minilm_path, truncate=True)
    try:
        ids = _long_ids(eng, 700)
        assert eng.embed([ids]).n_tokens == [256]
        with pytest.raises(InputTooLong):
            eng.embed([ids], truncate=False)  # the per-call flag wins
    finally:
        eng.close()


def test_inputs_within_the_limit_are_not_truncated(minilm):
    # truncation only applies to inputs the server would otherwise refuse (over max_input_tokens)
    ids = _long_ids(minilm, 300)
    assert minilm.embed([ids], truncate=True).n_tokens == [300]


# -- queue, timeouts, failures ---------------------------------------------------------------------------------
def test_a_request_larger_than_the_queue_is_refused_whole(minilm_path):
    eng = start_engine(minilm_path, max_queue_items=2)
    try:
        ids = [101, 7592, 102]
        with pytest.raises(TooManyInputs, match="3 inputs; the engine queue holds at most 2"):
            eng.embed([ids, ids, ids])
        assert eng.stats()["requests_deferred"] == 0  # all or nothing
        assert len(eng.embed([ids, ids]).vectors) == 2
    finally:
        eng.close()


def test_too_many_inputs_is_refused_before_tokenizing(minilm_path, monkeypatch):
    eng = start_engine(minilm_path, max_queue_items=2)
    try:
        def untouchable(*args, **kwargs):
            raise AssertionError("tokenized a request that is refused by its count")

        monkeypatch.setattr(eng.tokenizer, "encode_prompts", untouchable)
        monkeypatch.setattr(eng.tokenizer, "encode", untouchable)
        for call in (eng.embed_prompts, eng.embed):
            with pytest.raises(TooManyInputs, match="3 inputs; the engine queue holds at most 2"):
                call([["a"], ["b"], ["c"]])
    finally:
        eng.close()


def test_queue_full_counts_inputs_already_waiting(minilm_path):
    eng = start_engine(minilm_path, max_queue_items=2, threads=1)  # one lane: the held pass holds the engine
    real = eng._worker._runner
    entered, release = threading.Event(), threading.Event()

    def runner(*args):
        entered.set()
        release.wait(60)
        return real(*args)

    eng._worker._runner = runner
    ids = [101, 7592, 102]
    try:
        with ThreadPoolExecutor(2) as pool:
            busy = pool.submit(eng.embed, [ids])  # taken by the engine thread, held in the runner
            assert entered.wait(30)
            waiting = pool.submit(eng.embed, [ids, ids])  # fills the queue
            _wait_until(lambda: eng.stats()["requests_deferred"] == 2)
            with pytest.raises(QueueFull):
                eng.embed([ids], timeout_s=10)  # (a timeout, not a hang, if the bound were not enforced)
            release.set()
            assert len(busy.result(30).vectors) == 1
            assert len(waiting.result(30).vectors) == 2
    finally:
        release.set()
        eng.close()


def test_reply_timeout_while_the_engine_is_busy(one_lane, gated_runner):
    entered, release = gated_runner
    ids = _ids(one_lane, "hello there")
    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(one_lane.embed, [ids])
        assert entered.wait(30)  # the engine thread is now inside a forward pass
        started = time.monotonic()
        with pytest.raises(ReplyTimeout):
            one_lane.embed([ids], timeout_s=0.05)
        assert time.monotonic() - started < 5
        release.set()
        assert first.result(30).vectors[0].shape == (384,)
    # the abandoned input is dropped, the engine keeps serving
    _wait_until(lambda: one_lane.stats()["requests_deferred"] == 0)
    assert one_lane.embed([ids]).vectors[0].shape == (384,)
    assert one_lane.stats()["requests_processing"] == 0


def test_forward_failure_then_recovery(one_lane, monkeypatch):
    real = one_lane._worker._runner
    calls = []

    def flaky(*args):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("simulated out-of-memory")
        return real(*args)

    ids = _ids(one_lane, "hello")
    healthy = one_lane.embed([ids]).vectors[0]
    monkeypatch.setattr(one_lane._worker, "_runner", flaky)
    with pytest.raises(ForwardFailed, match="simulated out-of-memory"):
        one_lane.embed([ids, ids])
    again = one_lane.embed([ids])
    np.testing.assert_allclose(again.vectors[0], healthy, atol=1e-6)  # the engine serves on, unchanged
    assert len(calls) == 2


def test_memory_exhaustion_in_a_pass_fails_that_batch_lowers_the_caps_and_serving_goes_on(minilm_path, monkeypatch):
    eng = start_engine(minilm_path, threads=1)  # one lane: the four inputs go into one pass
    try:
        real = eng._worker._runner
        rows_seen = []

        def out_of_memory_on_big_batches(ids, *args):
            rows_seen.append(ids.shape[0])
            if ids.shape[0] > 2:  # what MLX raises when an allocation fails
                raise RuntimeError("[metal::malloc] Attempting to allocate 4294967296 bytes which is greater than "
                                   "the maximum allowed buffer size of 2147483648 bytes.")
            return real(ids, *args)

        texts = [_ids(eng, f"text number {i}") for i in range(4)]
        alone = [eng.embed([ids]).vectors[0] for ids in texts]
        monkeypatch.setattr(eng._worker, "_runner", out_of_memory_on_big_batches)
        with pytest.raises(OutOfMemory, match="ran out of memory.*now capped at 2 rows"):
            eng.embed(texts)
        assert eng._worker.limits.max_rows == 2
        again = eng.embed(texts)  # the same request now runs as passes of at most two rows
        for got, want in zip(again.vectors, alone, strict=True):
            np.testing.assert_allclose(got, want, atol=1e-5)
        assert max(rows_seen[1:]) <= 2
    finally:
        eng.close()


@pytest.mark.parametrize("bad", [[-1], [30522], [5, 2813866525688]])
def test_decode_and_pieces_refuse_unknown_ids(minilm, bad):
    with pytest.raises(InvalidTokens):
        minilm.decode(bad)
    with pytest.raises(InvalidTokens):
        minilm.token_pieces(bad)
    assert minilm.decode([7592]) == "hello"


def test_stats_and_timings(minilm_path):
    eng = start_engine(minilm_path, threads=1)  # one lane: one request, one pass
    try:
        before = eng.stats()
        token_lists = [_long_ids(eng, 10), _long_ids(eng, 20)]
        result = eng.embed(token_lists)
        after = eng.stats()
        assert after["prompt_tokens_total"] - before["prompt_tokens_total"] == 30
        assert after["n_decode_total"] - before["n_decode_total"] == 1  # both inputs shared one pass
        assert after["n_tokens_max"] == 30  # a fresh engine: its largest pass is this one
        assert after["requests_processing"] == 0 and after["requests_deferred"] == 0
        assert result.timings.inference_s > 0 and result.timings.queue_s >= 0
        assert result.n_tokens == [10, 20]
    finally:
        eng.close()


def test_passes_run_at_exact_widths_and_keep_the_vectors(minilm, monkeypatch):
    """Every input length gets its own pass width (none of them warmed at load), and a vector does not depend on
    the width it ran at: alone, or padded inside a batch of longer inputs."""
    assert minilm.info.widths == (16, 64)
    widths = []
    real = minilm._worker._runner
    monkeypatch.setattr(minilm._worker, "_runner", lambda ids, *rest: widths.append(ids.shape[1]) or real(ids, *rest))
    ids = [_ids(minilm, "word " * n) for n in (1, 9, 15, 30, 70, 150)]
    alone = [minilm.embed([one]).vectors[0] for one in ids]
    assert widths == [len(one) for one in ids]
    together = minilm.embed(ids).vectors
    for a, b in zip(alone, together, strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-5)
