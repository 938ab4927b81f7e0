"""engine/families/lfm2.py against transformers' Lfm2 on the same random weights (torch CPU, fp32): short
causal convolutions and attention layers interleaved, padding zeroed before each convolution."""
from __future__ import annotations

import pytest

from engine import Pooling
from engine.errors import UnsupportedCheckpoint
from engine.families import lfm2
from tests.engine.families.decoder_fixture import check_batch_invariant, check_pooled, check_tokens_match, save_random
from tests.engine.helpers import start_engine


@pytest.fixture(scope="module")
def causal(tmp_path_factory):
    return save_random(tmp_path_factory.mktemp("lfm2") / "m", "Lfm2ForCausalLM", "Lfm2Config", seed=14,
                       num_hidden_layers=3, layer_types=["conv", "full_attention", "conv"], conv_bias=True,
                       intermediate_size=96, block_multiple_of=16)


def test_lfm2_tokens_match_transformers(causal):
    check_tokens_match(*causal)


def test_lfm2_mean_pooling_matches_and_is_batch_invariant(causal):
    eng = start_engine(causal[0], pooling=Pooling.MEAN)
    try:
        assert eng.info.family == "lfm2"
        check_pooled(eng, *causal, Pooling.MEAN)
        check_batch_invariant(eng, causal[0])
    finally:
        eng.close()


def test_bidirectional_lfm2_is_refused():
    with pytest.raises(UnsupportedCheckpoint, match="bidirectional LFM2"):
        lfm2.ModelArgs.from_dict(dict(vocab_size=10, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                                      is_causal=False))
