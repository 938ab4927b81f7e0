"""Qwen3 in the engine: as a generative reranker (truncation cuts the query/document, never the prompt scaffold)
and as an embedder (Qwen3-Embedding's layout, and Qwen3ForCausalLM with --embedding) against transformers."""
from __future__ import annotations

import numpy as np
import pytest

from engine import Pooling
from engine.loading import formats, registry
from engine.errors import InputTooLong
from tests.engine.families.decoder_fixture import (
    MIN_COSINE,
    TEXTS,
    check_batch_invariant,
    check_pooled,
    check_tokens_match,
    save_random,
    token_lists,
)
from tests.engine.families.qwen3_fixture import CARD_INSTRUCTION, CARD_PREFIX, CARD_SUFFIX, make_checkpoint
from tests.engine.helpers import cosine, load_hf_model, start_engine, torch

QUERY, DOCUMENT = "What is the capital of China?", "The capital of China is Beijing. " * 40


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("qwen3") / "model")


@pytest.fixture(scope="module")
def reference(folder):
    """The model card's pieces as token ids, and its yes/no score of a token list, with transformers."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    t = torch()
    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    yes, no = tok.convert_tokens_to_ids("yes"), tok.convert_tokens_to_ids("no")

    def encode(text: str) -> list[int]:
        return tok(text, add_special_tokens=False).input_ids

    def score(ids: list[int]) -> float:
        with t.inference_mode():
            logits = model(input_ids=t.tensor([ids])).logits[0, -1]
        return float(t.sigmoid(logits[yes] - logits[no]))

    pieces = {"prefix": encode(CARD_PREFIX + f"<Instruct>: {CARD_INSTRUCTION}\n<Query>: "),
              "middle": encode("\n<Document>: "), "suffix": encode(CARD_SUFFIX),
              "query": encode(QUERY), "document": encode(DOCUMENT)}
    return pieces, score


@pytest.mark.parametrize("limit", [128, 96])
def test_truncation_keeps_the_card_scaffold_and_cuts_content_longest_first(folder, reference, limit):
    pieces, score = reference
    eng = start_engine(folder, pooling=Pooling.RANK, ubatch_tokens=limit)
    try:
        with pytest.raises(InputTooLong):
            eng.rerank(QUERY, [DOCUMENT], truncate=False)
        result = eng.rerank(QUERY, [DOCUMENT], truncate=True)
    finally:
        eng.close()
    n_query, n_doc = len(pieces["query"]), len(pieces["document"])
    budget = limit - len(pieces["prefix"]) - len(pieces["middle"]) - len(pieces["suffix"])
    while n_query + n_doc > budget:  # longest first: the document gives way, then both in turn
        if n_doc >= n_query:
            n_doc -= 1
        else:
            n_query -= 1
    assert 0 < n_doc < len(pieces["document"])
    if limit == 96:
        assert n_query < len(pieces["query"])  # this budget cuts the query too
    expected = (pieces["prefix"] + pieces["query"][:n_query] + pieces["middle"] + pieces["document"][:n_doc]
                + pieces["suffix"])
    assert result.n_tokens == [limit] == [len(expected)]
    assert abs(result.scores[0] - score(expected)) < 1e-4
    # one document token more or less is visible at this tolerance, so the comparison pins the cut
    longer = expected[:-len(pieces["suffix"]) - 1] + pieces["document"][n_doc - 1:n_doc + 1] + pieces["suffix"]
    assert abs(score(longer) - score(expected)) > 1e-4


# -- Qwen3 as an embedder ----------------------------------------------------------------------------------
LASTTOKEN_POOLING = {"word_embedding_dimension": 64, "pooling_mode_lasttoken": True, "include_prompt": True}
ST_MODULES = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
              {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
              {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}]


@pytest.fixture(scope="module")
def qwen3_embedding(tmp_path_factory):
    """Qwen3-Embedding's layout: a bare Qwen3Model (keys without `model.`), a tokenizer that appends
    <|endoftext|>, 1_Pooling lasttoken."""
    return save_random(tmp_path_factory.mktemp("qwen3_embedding") / "m", "Qwen3Model", "Qwen3Config", seed=4,
                       append_eos=True, files={"modules.json": ST_MODULES, "1_Pooling/config.json": LASTTOKEN_POOLING})


@pytest.fixture(scope="module")
def qwen3_embedding_engine(qwen3_embedding):
    eng = start_engine(qwen3_embedding[0])
    yield eng
    eng.close()


def test_qwen3_embedding_tokens_match_transformers(qwen3_embedding):
    check_tokens_match(*qwen3_embedding)


def test_qwen3_embedding_pools_the_appended_endoftext(qwen3_embedding, qwen3_embedding_engine):
    eng = qwen3_embedding_engine
    assert eng.info.pooling is Pooling.LAST and eng.info.kind == "embedder"
    eos = eng.tokenizer.encode("<|endoftext|>", add_special=False, parse_special=True)
    assert all(ids[-1] == eos[0] for ids in token_lists(qwen3_embedding[0]))
    check_pooled(eng, *qwen3_embedding, Pooling.LAST)


def test_qwen3_embedding_is_batch_invariant(qwen3_embedding, qwen3_embedding_engine):
    check_batch_invariant(qwen3_embedding_engine, qwen3_embedding[0])


def test_qwen3_embedding_matches_sentence_transformers(qwen3_embedding, qwen3_embedding_engine):
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(qwen3_embedding[0]), device="cpu")
    expected = st.encode(TEXTS, convert_to_numpy=True)
    ours = qwen3_embedding_engine.embed(token_lists(qwen3_embedding[0])).vectors
    assert min(cosine(a, b) for a, b in zip(ours, expected, strict=True)) >= MIN_COSINE


def test_causal_lm_is_an_embedder_with_embedding_and_a_reranker_with_reranking(folder):
    ckpt = formats.open_checkpoint(folder)
    assert ckpt.architecture == "Qwen3ForCausalLM"
    assert registry.kind_of(ckpt) == registry.EMBEDDER
    assert registry.kind_of(ckpt, rank=True) == registry.GENERATIVE_RERANKER
    embedder = formats.load(ckpt)
    assert "lm_head" not in embedder.model and embedder.default_pooling is Pooling.NONE
    eng = start_engine(folder, pooling=Pooling.LAST)
    try:
        check_pooled(eng, folder, load_hf_model(folder, "AutoModelForCausalLM"), Pooling.LAST)
    finally:
        eng.close()


def test_untied_reranker_head_rows_are_the_lm_head_rows(tmp_path):
    from safetensors.numpy import load_file

    folder = make_checkpoint(tmp_path / "untied", tie=False, seed=5)
    model = formats.load(formats.open_checkpoint(folder), registry.GENERATIVE_RERANKER).model
    head = load_file(str(folder / "model.safetensors"))["lm_head.weight"]
    np.testing.assert_array_equal(np.array(model.head_rows([7, 3])), head[[7, 3]])


def test_qwen3_embedding_truncation_keeps_the_endoftext_it_pools(qwen3_embedding):
    """Cut to 16 tokens, the input still ends with <|endoftext|>: the vector is sentence-transformers' at
    max_seq_length 16 (the tokenizer's own truncation keeps the appended token too)."""
    from sentence_transformers import SentenceTransformer

    folder = qwen3_embedding[0]
    st = SentenceTransformer(str(folder), device="cpu")
    st.max_seq_length = 16
    long_text = TEXTS[2]
    expected = st.encode([long_text], convert_to_numpy=True)[0]
    eng = start_engine(folder, ubatch_tokens=16, truncate=True)
    try:
        ids = token_lists(folder, [long_text])[0]
        assert len(ids) > 16
        result = eng.embed([ids])
        cut = eng.tokenizer.truncate(ids, 16)
    finally:
        eng.close()
    assert result.n_tokens == [16] and cut[-1] == ids[-1]
    assert cosine(result.vectors[0], expected) >= MIN_COSINE
