"""Long-document reranking (Engine.rerank `max_chunks`) on the bundled cross-encoder (512-token window): a document
over the limit is scored as the best of its overlapping windows. The windows are rebuilt here from the checkpoint's
tokenizer.json with the `tokenizers` library and the documented rule, and each is scored as a short document of
its own."""
from __future__ import annotations

import random

import pytest
from tokenizers import Tokenizer

from engine import Pooling
from engine.errors import InputTooLong, InvalidInput
from engine.offline import Reranker
from tests.conftest import ce_fixture_dir
from tests.engine.helpers import start_engine

QUERY = "where do emperor penguins raise their chicks"
NEEDLE = ("Emperor penguins raise their chicks on the sea ice of Antarctica, where the males keep the eggs warm "
          "on their feet through the winter while the females hunt at sea.")
WORDS = ("the market report covered quarterly revenue shipping costs warehouse staffing and the new pricing "
         "model for regional customers, together with notes on supplier contracts and tax filings").split()


def filler(seed: int, n_words: int) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(n_words))


# ~3,000 tokens, the passage about penguins deep inside (neither in the first window nor the last)
LONG = f"{filler(1, 1400)}. {NEEDLE} {filler(2, 1400)}."
SHORT = "Penguins are flightless birds of the southern hemisphere."


def ce_tokenizer() -> Tokenizer:
    tok = Tokenizer.from_file(str(ce_fixture_dir() / "tokenizer.json"))
    tok.no_truncation()
    tok.no_padding()
    return tok


def expected_windows(query: str, document: str, tok: Tokenizer | None = None, room: int | None = None) -> list[str]:
    """The documented rule, restated: room = 512 less the pair's tokens with an empty document; windows of `room`
    tokens, each starting room - room // 4 tokens after the last; an edge inside a word moves back to its start."""
    if tok is None:
        tok = ce_tokenizer()
        room = 512 - len(tok.encode(query, "", add_special_tokens=True).ids)
    enc = tok.encode(document, add_special_tokens=False)
    words, offsets, n = enc.word_ids, enc.offsets, len(enc.ids)

    def snap(i: int, floor: int) -> int:
        j = i
        while j > floor and words[j] == words[j - 1]:
            j -= 1
        return j if j > floor else i

    out, start = [], 0
    while start < n:
        end = min(start + room, n)
        if end < n:
            end = snap(end, start)
        out.append(document[offsets[start][0]:offsets[end - 1][1]])
        if end == n:
            return out
        start = snap(min(start + room - room // 4, end), start)
    return out


@pytest.fixture(scope="module")
def engine():
    eng = start_engine(ce_fixture_dir(), pooling=Pooling.RANK)
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def windows():
    return expected_windows(QUERY, LONG)


@pytest.fixture(scope="module")
def alone(engine, windows):
    """Each window scored as a short document of its own: (score, tokens)."""
    results = [engine.rerank(QUERY, [w]) for w in windows]
    return [(r.scores[0], r.n_tokens[0]) for r in results]


def test_the_document_is_long_and_its_windows_fit(engine, windows):
    assert len(engine.tokenizer.encode(LONG)) > 2900
    assert engine.info.max_input_tokens == 512
    assert len(windows) >= 6
    assert NEEDLE not in windows[0] and NEEDLE not in windows[-1]


def test_without_max_chunks_a_long_document_is_refused_as_before(engine):
    with pytest.raises(InputTooLong):
        engine.rerank(QUERY, [SHORT, LONG])
    cut = engine.rerank(QUERY, [LONG], truncate=True)
    assert cut.n_tokens == [512]


def test_a_long_document_scores_its_best_window(engine, windows, alone):
    result = engine.rerank(QUERY, [SHORT, LONG, SHORT], max_chunks=100)
    best = max(score for score, _ in alone)
    assert result.scores[1] == pytest.approx(best, abs=1e-4)
    # the best window is the one holding the passage, not the first one
    assert max(range(len(alone)), key=lambda k: alone[k][0]) not in (0, len(alone) - 1)
    short = engine.rerank(QUERY, [SHORT])
    assert result.scores[0] == pytest.approx(short.scores[0], abs=1e-4) == pytest.approx(result.scores[2], abs=1e-4)
    # usage: every window's tokens; a document that fits is one pair as before
    assert result.n_tokens == [short.n_tokens[0], sum(n for _, n in alone), short.n_tokens[0]]


def test_at_most_max_chunks_windows_the_first_ones(engine, alone):
    result = engine.rerank(QUERY, [LONG], max_chunks=2)
    assert result.scores[0] == pytest.approx(max(s for s, _ in alone[:2]), abs=1e-4)
    assert result.n_tokens == [alone[0][1] + alone[1][1]]


def test_the_server_option_is_the_default_and_zero_is_off():
    eng = start_engine(ce_fixture_dir(), pooling=Pooling.RANK, rerank_chunks=3)
    try:
        windows = expected_windows(QUERY, LONG)[:3]
        expected = max(eng.rerank(QUERY, [w], max_chunks=0).scores[0] for w in windows)
        assert eng.rerank(QUERY, [LONG]).scores[0] == pytest.approx(expected, abs=1e-4)
        with pytest.raises(InputTooLong):
            eng.rerank(QUERY, [LONG], max_chunks=0)
    finally:
        eng.close()


@pytest.mark.parametrize("bad", [-1, 1.5, True])
def test_a_bad_max_chunks_is_refused(engine, bad):
    with pytest.raises(InvalidInput, match="max_chunks"):
        engine.rerank(QUERY, [LONG], max_chunks=bad)


def test_a_query_that_leaves_no_room_is_refused(engine):
    with pytest.raises(InvalidInput, match="leaves no room"):
        engine.rerank(filler(3, 600), [LONG], max_chunks=4)


def test_the_python_api_takes_max_chunks(engine, alone):
    with Reranker(ce_fixture_dir(), threads=2) as rr:
        scores, n_tokens = rr.score(QUERY, [LONG], max_chunks=2)
        ranked = rr.rank(QUERY, [SHORT, LONG], max_chunks=100)
    assert scores[0] == pytest.approx(max(s for s, _ in alone[:2]), abs=1e-4)
    assert n_tokens == [alone[0][1] + alone[1][1]]
    assert {r["index"] for r in ranked} == {0, 1}


def test_a_generative_reranker_scores_windows_of_its_rendered_prompt(tmp_path):
    from tests.engine.families.qwen3_fixture import CARD_INSTRUCTION, CARD_PREFIX, CARD_SUFFIX, make_checkpoint

    folder = make_checkpoint(tmp_path / "model")
    query, document = "What is the capital of China?", f"{filler(4, 50)}. The capital of China is Beijing. {filler(5, 50)}"
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    empty = f"{CARD_PREFIX}<Instruct>: {CARD_INSTRUCTION}\n<Query>: {query}\n<Document>: {CARD_SUFFIX}"
    room = 128 - len(tok.encode(empty, add_special_tokens=False).ids)
    windows = expected_windows(query, document, tok, room)
    eng = start_engine(folder, pooling=Pooling.RANK, ubatch_tokens=128)
    try:
        with pytest.raises(InputTooLong):
            eng.rerank(query, [document])
        alone = [eng.rerank(query, [w]) for w in windows]
        result = eng.rerank(query, [document], max_chunks=len(windows) + 1)
    finally:
        eng.close()
    assert 3 <= len(windows) <= 40
    assert result.scores[0] == pytest.approx(max(r.scores[0] for r in alone), abs=1e-4)
    assert result.n_tokens == [sum(r.n_tokens[0] for r in alone)]


def test_a_gguf_cross_encoder_chunks_with_llama_servers_pair_prompt():
    """The same cross-encoder converted by llama.cpp: its pairs are llama-server's prompt, its windows the same."""
    eng = start_engine(ce_fixture_dir().parent / "gguf" / "bert-tiny-ce-distilled-f32.gguf", pooling=Pooling.RANK)
    try:
        alone = [eng.rerank(QUERY, [w]) for w in expected_windows(QUERY, LONG)]
        result = eng.rerank(QUERY, [LONG], max_chunks=100)
    finally:
        eng.close()
    assert result.scores[0] == pytest.approx(max(r.scores[0] for r in alone), abs=1e-4)
    assert result.n_tokens == [sum(r.n_tokens[0] for r in alone)]
