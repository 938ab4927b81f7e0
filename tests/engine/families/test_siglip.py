"""SigLIP's text tower against transformers (SiglipModel.get_text_features, SiglipTextModel) on tiny random
checkpoints: fixed 64-token rows padded with the pad token, no mask, last position then the head."""
from __future__ import annotations

import numpy as np
import pytest

from engine import Pooling
from engine.errors import InputTooLong, UnsupportedCheckpoint
from tests.engine.families.siglip_fixture import TEXT_WIDTH, make_checkpoint
from tests.engine.helpers import cosine, start_engine, torch

TEXTS = ["a photo of a cat", "A PHOTO of a Cat!!", "two cats sleeping on a red sofa", "dog",
         "the giant panda is a bear species endemic to china", "quarterly revenue grew twelve percent"]
LONG = "the quick brown fox jumps over the lazy dog " * 12  # well over 64 tokens


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("siglip")
    return {"SiglipModel": make_checkpoint(root / "full"), "SiglipTextModel": make_checkpoint(root / "text", text_only=True)}


def reference(folder, texts: list[str], truncation: bool = False) -> tuple[list[list[int]], np.ndarray]:
    """The processor's padded rows and transformers' text embeddings for them (no attention mask, as trained)."""
    import transformers

    t = torch()
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    rows = tok(texts, padding="max_length", max_length=TEXT_WIDTH, truncation=truncation).input_ids
    architecture = transformers.AutoConfig.from_pretrained(folder).architectures[0]
    model = getattr(transformers, architecture).from_pretrained(folder, dtype=t.float32).eval()
    with t.inference_mode():
        if architecture == "SiglipModel":
            out = model.get_text_features(input_ids=t.tensor(rows))
        else:
            out = model(input_ids=t.tensor(rows))
    return rows, out.pooler_output.float().numpy()


@pytest.mark.parametrize("architecture", ["SiglipModel", "SiglipTextModel"])
def test_text_tower_matches_transformers_and_is_batch_invariant(folders, architecture):
    folder = folders[architecture]
    rows, expected = reference(folder, TEXTS)
    eng = start_engine(folder)
    try:
        info = eng.info
        assert (info.model_type, info.pooling, info.max_input_tokens, info.widths) == (
            "siglip" if architecture == "SiglipModel" else "siglip_text_model", Pooling.LAST, TEXT_WIDTH, (TEXT_WIDTH,))
        assert info.n_embd == 32
        token_lists = [eng.encode_prompt([text]) for text in TEXTS]
        # the processor's rows are our tokens followed by pad (</s>, id 1) up to 64
        assert [ids + [1] * (TEXT_WIDTH - len(ids)) for ids in token_lists] == rows
        together = eng.embed(token_lists).vectors
        alone = [eng.embed([ids]).vectors[0] for ids in token_lists]
    finally:
        eng.close()
    for ours, theirs, single in zip(together, expected, alone, strict=True):
        assert cosine(ours, theirs) >= 0.99999
        np.testing.assert_allclose(ours, single, atol=1e-5)
    # punctuation and case are normalized away by the checkpoint's tokenizer: the same vector
    np.testing.assert_allclose(together[0], together[1], atol=1e-6)
    assert cosine(together[0], together[2]) < 0.999  # different texts stay apart


def test_the_per_input_limit_is_64_tokens_and_truncation_keeps_the_closing_token(folders):
    folder = folders["SiglipModel"]
    rows, expected = reference(folder, [LONG], truncation=True)
    eng = start_engine(folder)
    try:
        ids = eng.encode_prompt([LONG])
        assert len(ids) > TEXT_WIDTH
        with pytest.raises(InputTooLong):
            eng.embed([ids], truncate=False)
        result = eng.embed([ids], truncate=True)
    finally:
        eng.close()
    assert result.n_tokens == [TEXT_WIDTH] and rows[0][-1] == 1
    assert cosine(result.vectors[0], expected[0]) >= 0.99999


def test_a_pooling_other_than_the_heads_is_refused(folders):
    with pytest.raises(UnsupportedCheckpoint, match="pools through its own head"):
        start_engine(folders["SiglipTextModel"], pooling=Pooling.MEAN)
