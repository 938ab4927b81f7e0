"""The real all-MiniLM-L6-v2 through the whole engine vs sentence-transformers on the same weights (fp32, CPU)."""
from __future__ import annotations

import numpy as np
import pytest

from engine import Pooling
from tests.engine.helpers import cosine, start_engine, torch

LONG = ("In the early morning, before the markets opened, the analysts gathered around the long table to review "
        "the quarterly figures, which showed revenue up 12.5% year over year, operating costs down slightly, "
        "and a backlog of orders that stretched well into the following spring. Nobody was surprised; the "
        "signs had been there for months. Still, the chief financial officer insisted on walking through every "
        "line item, from freight and warehousing to software licences and the small but persistent losses in "
        "the European subsidiary, because, as she liked to say, the numbers you skip are the numbers that bite "
        "you later. By nine o'clock the coffee was cold, the whiteboard was full, and a plan had emerged. "
        "Its first step was simple: close the loss-making warehouse in Rotterdam, move the stock to the "
        "larger site near Antwerp, renegotiate the two largest supplier contracts, and hire a small team to "
        "rebuild the forecasting models that had failed so badly during the previous winter.")

SENTENCES = [
    # short
    "hello", "Hi!", "ok", "a", "Yes.", "The cat sat on the mat.", "What time is it?",
    "Machine learning is fun.", "I love New York.", "Paris is the capital of France.",
    # long (~200 tokens) and medium
    LONG, LONG[:400], LONG.upper(), " ".join(LONG.split()[::-1]),
    "The committee, after lengthy deliberation and several rounds of amendments, finally approved the "
    "proposal to renovate the old library, expand its reading rooms, and digitise the archive.",
    # punctuation
    "Wait... what?!", "(parentheses) [brackets] {braces} <angles>", "semi;colon:colon,comma.period",
    "\"quoted\" and 'single-quoted' — em dash – en dash", "!!!???...,,,", "e-mail: someone@example.com",
    "https://example.org/path?query=1&other=two#fragment",
    # numbers
    "3.14159 2.71828 1.41421", "Call 555-0199 before 10:30 pm on 2024-02-29.", "1234567890",
    "The price rose from $1,299.99 to €1.499,00 (+15%).", "0x1F 0b1010 1e-9 -42",
    # unicode: accents, CJK, emoji, other scripts
    "Café naïve résumé coöperate façade", "Ñandú, pingüino, acción", "Straße Größe Übermaß",
    "東京は日本の首都です。", "我喜欢自然语言处理", "한국어 문장입니다", "Привет, как дела?",
    "مرحبا بالعالم", "שלום עולם", "नमस्ते दुनिया", "Γειά σου Κόσμε", "😀 🎉 👍🏽 🇫🇷",
    "I ❤️ pizza 🍕 and 🍣", "ｆｕｌｌｗｉｄｔｈ ＡＢＣ", "zero\u200bwidth space", "tab\tseparated\nnew line",
    # empty / whitespace
    "", "   ",
    # code
    "def add(a, b):\n    return a + b", "for (int i = 0; i < n; ++i) { sum += a[i]; }",
    "SELECT name, COUNT(*) FROM users GROUP BY name HAVING COUNT(*) > 1;", "<div class=\"x\">Hi</div>",
    "import numpy as np; np.linalg.norm(x, ord=2)",
    # repeated words
    "the the the the the the the the", "buffalo " * 20, "ha" * 40, "word " * 120,
    # mixed case and misc
    "MiXeD CaSe TeXt", "ALL CAPS SENTENCE HERE", "unaffable antidisestablishmentarianism",
]


@pytest.fixture(scope="module")
def minilm_engine(minilm_path):
    eng = start_engine(minilm_path)
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def st_model(minilm_path):
    torch()
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(minilm_path), device="cpu")
    # The pipeline is Transformer -> Pooling -> Normalize; Engine.embed returns pooled, unnormalized vectors.
    assert type(model[-1]).__name__ == "Normalize"
    del model[len(model) - 1]
    assert [type(m).__name__ for m in model] == ["Transformer", "Pooling"]
    return model


def test_sentence_set_is_varied_enough(minilm_engine):
    assert len(SENTENCES) >= 50
    lengths = [len(minilm_engine.encode_prompt([s])) for s in SENTENCES]
    assert min(lengths) == 2  # the empty string is [CLS] [SEP]
    assert 180 <= max(lengths) <= 256  # a long input, still within MiniLM's 256-token max_seq_length


def test_tokenization_matches_sentence_transformers(minilm_engine, st_model):
    for text in SENTENCES:
        expected = st_model.tokenize([text])["input_ids"][0].tolist()
        assert minilm_engine.encode_prompt([text]) == expected, text


def test_minilm_matches_sentence_transformers(minilm_engine, st_model):
    assert minilm_engine.info.pooling is Pooling.MEAN  # from 1_Pooling/config.json
    token_lists = [minilm_engine.encode_prompt([s]) for s in SENTENCES]
    ours = minilm_engine.embed(token_lists).vectors
    ref = st_model.encode(SENTENCES, batch_size=16, normalize_embeddings=False, convert_to_numpy=True)
    assert ref.shape == (len(SENTENCES), 384)
    worst_cos, worst_abs = 1.0, 0.0
    for text, a, b in zip(SENTENCES, ours, ref, strict=True):
        assert a.dtype == np.float32 and a.shape == (384,)
        c = cosine(a, b)
        assert c >= 0.999999, (text, c)
        worst_cos = min(worst_cos, c)
        worst_abs = max(worst_abs, float(np.abs(a - b).max()))
    # MiniLM's pooled components are O(0.1-1); fp32 differences stay around 1e-6.
    assert worst_abs < 2e-5, worst_abs
    # unnormalized means the raw pooled norm, far from 1
    assert not np.allclose([np.linalg.norm(v) for v in ours], 1.0, atol=1e-3)
