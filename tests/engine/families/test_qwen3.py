"""The Qwen3 generative reranker in the engine: truncation cuts the query/document, never the prompt scaffold."""
from __future__ import annotations

import numpy as np
import pytest

from engine import Pooling
from engine.errors import InputTooLong
from engine.prompts import DEFAULT_INSTRUCTION
from tests.engine.families.qwen3_fixture import make_checkpoint
from tests.engine.helpers import start_engine, torch

LIMIT = 128


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("qwen3") / "model")


@pytest.fixture(scope="module")
def reranker(folder):
    eng = start_engine(folder, pooling=Pooling.RANK, ubatch_tokens=LIMIT)
    yield eng
    eng.close()


def recipe_score(folder, ids: list[int]) -> float:
    """sigmoid(logit_yes - logit_no) at the last position, with transformers on the same ids."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    t = torch()
    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    with t.inference_mode():
        logits = model(input_ids=t.tensor([ids])).logits[0, -1]
    yes, no = tok.convert_tokens_to_ids("yes"), tok.convert_tokens_to_ids("no")
    return float(t.sigmoid(logits[yes] - logits[no]))


def test_truncation_keeps_the_scaffold_and_cuts_the_longest_content(reranker, folder):
    query, document = "What is the capital of China?", "The capital of China is Beijing. " * 40
    with pytest.raises(InputTooLong):
        reranker.rerank(query, [document], truncate=False)
    result = reranker.rerank(query, [document], truncate=True)
    assert result.n_tokens == [LIMIT]

    tok = reranker.tokenizer
    parts = reranker._prompt.parts(None)
    texts = [p.text for p in parts if p.kind == "text"]
    prefix, middle, suffix = (tok.encode(t, add_special=False) for t in texts)
    query_ids = tok.encode(query, add_special=False)
    doc_ids = tok.encode(document, add_special=False)
    kept = LIMIT - len(prefix) - len(middle) - len(suffix) - len(query_ids)
    expected = prefix + query_ids + middle + doc_ids[:kept] + suffix  # the short query is kept whole
    assert DEFAULT_INSTRUCTION in texts[0] and 0 < kept < len(doc_ids)
    assert abs(result.scores[0] - recipe_score(folder, expected)) < 1e-4
    assert np.isfinite(result.scores[0])


def test_truncation_is_longest_first_between_query_and_document(folder):
    eng = start_engine(folder, pooling=Pooling.RANK, ubatch_tokens=96)
    try:
        query, document = "What is the capital of China?", "The capital of China is Beijing. " * 40
        tok = eng.tokenizer
        parts = eng._prompt.parts(None)
        prefix, middle, suffix = (tok.encode(p.text, add_special=False) for p in parts if p.kind == "text")
        query_ids, doc_ids = tok.encode(query, add_special=False), tok.encode(document, add_special=False)
        budget = 96 - len(prefix) - len(middle) - len(suffix)
        assert budget < 2 * len(query_ids)  # so the query has to give up tokens too
        n_query, n_doc = budget - budget // 2, budget // 2  # longest first ends with the two nearly equal
        expected = prefix + query_ids[:n_query] + middle + doc_ids[:n_doc] + suffix
        result = eng.rerank(query, [document], truncate=True)
        assert result.n_tokens == [96]
        assert abs(result.scores[0] - recipe_score(folder, expected)) < 1e-4
    finally:
        eng.close()
