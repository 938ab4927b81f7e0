"""Qwen3-Embedding's instruction and prompts through the engine, against sentence-transformers on the same tiny
random Qwen3-Embedding layout (bare Qwen3Model, <|endoftext|> appended, last-token pooling), with the prompts
its config_sentence_transformers.json ships."""
from __future__ import annotations

import numpy as np
import pytest

from engine.errors import InvalidInput
from tests.engine.families.decoder_fixture import MIN_COSINE, TEXTS, save_random
from tests.engine.helpers import cosine, start_engine

CARD_QUERY_PROMPT = "Instruct: Given a web search query, retrieve relevant passages that answer the query\nQuery:"
ST_MODULES = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
              {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
TASK = "Given a question, retrieve code that answers it"


@pytest.fixture(scope="module")
def qwen3_embedding(tmp_path_factory):
    folder, _ = save_random(
        tmp_path_factory.mktemp("qwen3-instruct") / "m", "Qwen3Model", "Qwen3Config", seed=8, append_eos=True,
        files={"modules.json": ST_MODULES,
               "1_Pooling/config.json": {"word_embedding_dimension": 64, "pooling_mode_lasttoken": True},
               "config_sentence_transformers.json": {"prompts": {"query": CARD_QUERY_PROMPT, "document": ""},
                                                     "default_prompt_name": None}})
    eng = start_engine(folder)
    yield folder, eng
    eng.close()


def embed(eng, **choice) -> list[np.ndarray]:
    return eng.embed_prompts(eng.format_prompts([[t] for t in TEXTS], **choice)).vectors


def test_instruction_is_the_cards_template(qwen3_embedding):
    from sentence_transformers import SentenceTransformer

    folder, eng = qwen3_embedding
    assert eng.info.instruction_template == "Instruct: {task}\nQuery:{text}"
    st = SentenceTransformer(str(folder), device="cpu")
    expected = st.encode(TEXTS, prompt=f"Instruct: {TASK}\nQuery:")
    ours = embed(eng, instruction=TASK)
    assert min(cosine(a, b) for a, b in zip(ours, expected, strict=True)) >= MIN_COSINE
    # the card's own query prompt, by name, is the same template with its default task
    by_name = embed(eng, prompt_name="query")
    expected = st.encode(TEXTS, prompt_name="query")
    assert min(cosine(a, b) for a, b in zip(by_name, expected, strict=True)) >= MIN_COSINE
    default_task = embed(eng, instruction="Given a web search query, retrieve relevant passages that answer the query")
    np.testing.assert_allclose(np.array(default_task), np.array(by_name), rtol=0, atol=1e-6)
    # documents embed verbatim (the "document" prompt is empty), and differ from queries
    plain = embed(eng)
    np.testing.assert_allclose(np.array(embed(eng, prompt_name="document")), np.array(plain), rtol=0, atol=1e-6)
    assert max(cosine(a, b) for a, b in zip(plain, ours, strict=True)) < 0.999


def test_instruction_token_counts_include_the_template(qwen3_embedding):
    _, eng = qwen3_embedding
    [ids] = eng.format_prompts([["hello"]], instruction="t")
    assert ids == ["Instruct: t\nQuery:hello"]
    assert eng.embed_prompts([ids]).n_tokens[0] == len(eng.tokenizer.encode("Instruct: t\nQuery:hello"))
    with pytest.raises(InvalidInput, match="cannot be combined"):
        eng.format_prompts([["x"]], prompt_name="query", instruction="t")
