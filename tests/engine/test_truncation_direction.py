"""Engine.embed / embed_prompts `truncation_direction` (TEI's field): "right" cuts an over-long input's end, "left"
keeps its end, the template's special tokens kept either way; checked against the `tokenizers` library's own
truncation directions (what TEI uses) on the bundled MiniLM, each cut input embedded uncut for comparison."""
from __future__ import annotations

import numpy as np
import pytest
from tokenizers import Tokenizer

from engine.errors import InvalidInput
from tests.conftest import minilm_dir
from tests.engine.helpers import start_engine

LIMIT = 64
TEXT = " ".join(f"word{i} and then some" for i in range(60))  # far over LIMIT tokens


def reference_ids(direction: str) -> list[int]:
    tok = Tokenizer.from_file(str(minilm_dir() / "tokenizer.json"))
    tok.no_padding()
    tok.enable_truncation(LIMIT, direction=direction)
    return tok.encode(TEXT).ids


@pytest.fixture(scope="module")
def engine():
    eng = start_engine(minilm_dir(), ubatch_tokens=LIMIT)
    yield eng
    eng.close()


@pytest.mark.parametrize("direction,spelling", [("right", "right"), ("right", "Right"), ("left", "left"),
                                                ("left", "Left")])
def test_a_cut_input_is_the_tokenizers_library_cut(engine, direction, spelling):
    expected = reference_ids(direction)
    assert len(expected) == LIMIT
    ids = engine.tokenizer.encode(TEXT)
    assert len(ids) > LIMIT
    assert engine.fit(ids, truncate=True) == reference_ids("right")  # the default is unchanged
    cut = engine.embed([ids], truncate=True, truncation_direction=spelling)
    whole = engine.embed([expected], truncate=False)
    assert cut.n_tokens == [LIMIT]
    np.testing.assert_allclose(cut.vectors[0], whole.vectors[0], atol=1e-6)
    prompted = engine.embed_prompts([[TEXT]], truncate=True, truncation_direction=spelling)
    np.testing.assert_allclose(prompted.vectors[0], whole.vectors[0], atol=1e-6)


def test_left_and_right_differ_and_short_inputs_are_untouched(engine):
    left = engine.embed_prompts([[TEXT], ["short text"]], truncate=True, truncation_direction="left")
    right = engine.embed_prompts([[TEXT], ["short text"]], truncate=True)
    assert not np.allclose(left.vectors[0], right.vectors[0])
    np.testing.assert_array_equal(left.vectors[1], right.vectors[1])


@pytest.mark.parametrize("bad", ["up", "LEFT", "", None, 1])
def test_a_bad_direction_is_refused(engine, bad):
    with pytest.raises(InvalidInput, match="truncation direction must be one of 'right', 'left'"):
        engine.embed_prompts([["a"]], truncation_direction=bad)


class _PlainTemplate:
    """A chat template reduced to a wrapper around the text (InputFitter.chat_ids reads only `render`)."""

    def render(self, text: str, system: str | None) -> str:
        return f"[CLS] {text} [SEP]"


def test_a_chat_templated_input_is_cut_on_the_right_only(engine):
    from engine.runtime.fitting import InputFitter

    fitter = InputFitter(engine.tokenizer, engine.info, engine.options, chat=_PlainTemplate())
    assert len(fitter.chat_ids(TEXT, None, True)) == LIMIT
    assert len(fitter.chat_ids("short", None, True, "left")) < LIMIT  # nothing to cut: no refusal
    with pytest.raises(InvalidInput, match="chat template, which is only truncated on the right"):
        fitter.chat_ids(TEXT, None, True, "left")
