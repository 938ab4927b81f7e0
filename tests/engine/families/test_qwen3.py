"""The Qwen3 generative reranker in the engine: truncation cuts the query/document, never the prompt scaffold."""
from __future__ import annotations

import pytest

from engine import Pooling
from engine.errors import InputTooLong
from tests.engine.families.qwen3_fixture import CARD_INSTRUCTION, CARD_PREFIX, CARD_SUFFIX, make_checkpoint
from tests.engine.helpers import start_engine, torch

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
