"""Engine.embed_late_chunks (Jina's late chunking): consecutive chunks of one document embedded in one pass, each
chunk's vector pooled from the token rows that start inside it. Checked against transformers on the same weights:
the whole document through the reference model, its rows grouped by the HF tokenizer's own offsets, pooled (and
projected by sentence-transformers' Dense module) by hand; and against our own --pooling none rows."""
from __future__ import annotations

import concurrent.futures

import numpy as np
import pytest

from engine.errors import InputTooLong, InvalidInput
from engine.types import Pooling
from tests.engine.helpers import (
    cosine,
    hf_hidden,
    load_hf_model,
    make_random_bert,
    perturb_vectors,
    save_sentence_transformer,
    start_engine,
    torch,
)

CHUNKS = ["The quick brown fox jumps over the lazy dog. ", "It was not amused; the dog, that is, ",
          "went back to sleep under the 東京 café table.", " Then nothing happened for a while."]


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    """A random BERT with perturbed norms, and its reference model."""
    folder = make_random_bert(tmp_path_factory.mktemp("late-bert"), seed=3)
    model = load_hf_model(folder)
    perturb_vectors(model, 5)
    model.save_pretrained(str(folder))
    return folder, model


def reference_rows(model, folder, text: str) -> tuple[np.ndarray, list, list[int]]:
    """transformers' rows of `text`, each token's start offset (None for special tokens) and the ids."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(folder))
    enc = tok(text, return_offsets_mapping=True, return_special_tokens_mask=True)
    starts = [None if special else start for (start, _), special in zip(enc["offset_mapping"],
                                                                       enc["special_tokens_mask"])]
    return hf_hidden(model, enc["input_ids"]), starts, enc["input_ids"]


def chunk_rows(starts: list, chunks: list[str], first_char: int = 0) -> list[list[int]]:
    bounds = np.cumsum([0, *(len(c) for c in chunks)]) + first_char
    return [[r for r, s in enumerate(starts) if s is not None and bounds[i] <= s < bounds[i + 1]]
            for i in range(len(chunks))]


@pytest.fixture(scope="module")
def mean_engine(bert):
    eng = start_engine(bert[0], pooling=Pooling.MEAN)
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def none_engine(bert):
    eng = start_engine(bert[0], pooling=Pooling.NONE)
    yield eng
    eng.close()


def test_each_chunk_is_the_mean_of_its_rows_in_transformers(bert, mean_engine):
    folder, model = bert
    rows, starts, ids = reference_rows(model, folder, "".join(CHUNKS))
    assert mean_engine.tokenizer.encode("".join(CHUNKS)) == ids
    result = mean_engine.embed_late_chunks(CHUNKS)
    groups = chunk_rows(starts, CHUNKS)
    assert len(result.vectors) == len(CHUNKS) and all(groups)
    for vector, group in zip(result.vectors, groups):
        expected = rows[group].mean(axis=0)
        assert cosine(vector, expected) >= 0.99999
        np.testing.assert_allclose(vector, expected, atol=2e-4)
    assert sum(result.n_tokens) == len(ids)
    assert result.n_tokens[1:] == [len(g) for g in groups[1:]]


def test_late_chunks_equal_the_pooling_none_rows_of_the_whole_text(bert, mean_engine, none_engine):
    ids = none_engine.tokenizer.encode("".join(CHUNKS))
    rows = none_engine.embed([ids]).vectors[0]
    _, starts, _ = reference_rows(bert[1], bert[0], "".join(CHUNKS))
    late = mean_engine.embed_late_chunks(CHUNKS)
    for vector, group in zip(late.vectors, chunk_rows(starts, CHUNKS)):
        np.testing.assert_allclose(vector, rows[group].mean(axis=0), atol=1e-5)
    # one chunk: the mean of its non-special rows, the ordinary vector but for [CLS] and [SEP]
    (single,) = mean_engine.embed_late_chunks(["".join(CHUNKS)]).vectors
    np.testing.assert_allclose(single, rows[1:-1].mean(axis=0), atol=1e-5)
    ordinary = mean_engine.embed([ids]).vectors[0]
    np.testing.assert_allclose(ordinary, rows.mean(axis=0), atol=1e-5)
    assert not np.allclose(single, ordinary, atol=1e-4)


def test_cls_and_last_pooling_read_each_chunks_first_and_last_row(bert):
    folder, model = bert
    rows, starts, _ = reference_rows(model, folder, "".join(CHUNKS))
    groups = chunk_rows(starts, CHUNKS)
    for mode, pick in (("cls", 0), ("last", -1)):
        eng = start_engine(folder, pooling=Pooling(mode))
        try:
            vectors = eng.embed_late_chunks(CHUNKS).vectors
        finally:
            eng.close()
        for vector, group in zip(vectors, groups):
            assert cosine(vector, rows[group[pick]]) >= 0.99999, mode


def test_the_prompt_applies_once_and_belongs_to_no_chunk(bert, tmp_path):
    folder, model = bert
    st = save_sentence_transformer(folder, tmp_path / "st", pooling="mean", dense=((64, 32, True, True),),
                                   normalize=True, prompts={"query": "query: "})
    eng = start_engine(st)
    try:
        result = eng.embed_late_chunks(CHUNKS, prompt_name="query", embd_normalize=2)
    finally:
        eng.close()
    from sentence_transformers import SentenceTransformer

    reference = SentenceTransformer(str(st), device="cpu")
    text = "query: " + "".join(CHUNKS)
    rows, starts, ids = reference_rows(model, folder, text)
    t = torch()
    dense = reference[2]
    for vector, group in zip(result.vectors, chunk_rows(starts, CHUNKS, first_char=len("query: "))):
        with t.inference_mode():
            pooled = t.tensor(rows[group].mean(axis=0))[None]
            expected = dense({"sentence_embedding": pooled})["sentence_embedding"][0].numpy()
        expected = expected / np.linalg.norm(expected)
        assert cosine(vector, expected) >= 0.99999
        np.testing.assert_allclose(vector, expected, atol=2e-4)
    assert sum(result.n_tokens) == len(ids)  # the prompt's tokens are counted, in the first chunk


def test_an_over_long_document_is_refused_or_cut_as_truncate_says(bert):
    eng = start_engine(bert[0], pooling=Pooling.MEAN, ubatch_tokens=32)
    try:
        with pytest.raises(InputTooLong):
            eng.embed_late_chunks(CHUNKS)
        with pytest.raises(InvalidInput, match="chunk 3 starts no token"):
            eng.embed_late_chunks(CHUNKS, truncate=True)
        filler = " ".join(f"word{i}" for i in range(40)) + "."
        kept = eng.embed_late_chunks([filler, CHUNKS[3]], truncate=True, truncation_direction="left")
        assert sum(kept.n_tokens) == 32  # the filler's start is cut, [CLS] and [SEP] kept
        assert kept.n_tokens[1] == len(eng.tokenizer.encode(CHUNKS[3], add_special=False))
        with pytest.raises(InvalidInput, match="chunk 0 starts no token"):
            eng.embed_late_chunks([CHUNKS[3], filler], truncate=True, truncation_direction="left")
    finally:
        eng.close()


def test_empty_chunks_and_models_that_cannot_late_chunk_are_refused(mean_engine, none_engine):
    with pytest.raises(InvalidInput, match="chunk 1 starts no token"):
        mean_engine.embed_late_chunks(["some text", "", "more text"])
    with pytest.raises(InvalidInput, match="at least one chunk"):
        mean_engine.embed_late_chunks([])
    with pytest.raises(InvalidInput, match="late chunking is not supported by this model .*pooling is 'none'"):
        none_engine.embed_late_chunks(CHUNKS)


def test_a_late_chunked_document_is_the_same_beside_concurrent_requests(mean_engine):
    alone = mean_engine.embed_late_chunks(CHUNKS).vectors
    others = [[mean_engine.tokenizer.encode(f"other text number {i}")] for i in range(16)]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        busy = [pool.submit(mean_engine.embed, ids) for ids in others]
        late = pool.submit(mean_engine.embed_late_chunks, CHUNKS)
        for future in busy:
            future.result()
        for a, b in zip(alone, late.result().vectors):
            np.testing.assert_allclose(a, b, atol=1e-5)


def test_the_python_api_late_chunks_and_cuts_either_way(bert, mean_engine):
    from engine import Encoder

    encoder = Encoder(bert[0], pooling="mean", truncate=True, ubatch_tokens=32, threads=2)
    try:
        embedded = encoder.embed_late_chunks(CHUNKS[:2])
        expected = mean_engine.embed_late_chunks(CHUNKS[:2], embd_normalize=2)
        np.testing.assert_allclose(embedded.vectors, np.asarray(expected.vectors), atol=1e-6)
        assert embedded.n_tokens == expected.n_tokens
        text = " ".join(f"word{i}" for i in range(40))
        ids = mean_engine.tokenizer.encode(text)
        for direction in ("left", "right"):
            (vector,) = encoder.encode(text, truncation_direction=direction)
            cut = mean_engine.tokenizer.truncate(ids, 32, direction)
            np.testing.assert_allclose(vector, mean_engine.embed([cut], embd_normalize=2).vectors[0], atol=1e-6)
    finally:
        encoder.close()
