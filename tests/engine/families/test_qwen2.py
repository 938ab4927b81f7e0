"""engine/families/qwen2.py against transformers' Qwen2 on the same random weights (torch CPU, fp32): biased
q/k/v (no o_proj bias), and Qwen's sliding window on the layers from max_window_layers on."""
from __future__ import annotations

import pytest

from engine import Pooling
from engine.families import qwen2
from tests.engine.families.decoder_fixture import check_batch_invariant, check_pooled, check_tokens_match, save_random
from tests.engine.helpers import start_engine


@pytest.fixture(scope="module")
def windowed(tmp_path_factory):
    return save_random(tmp_path_factory.mktemp("qwen2") / "m", "Qwen2ForCausalLM", "Qwen2Config", seed=6,
                       use_sliding_window=True, sliding_window=8, max_window_layers=1, tie_word_embeddings=True)


def test_layer_types_follow_use_sliding_window_and_max_window_layers(windowed):
    base = dict(model_type="qwen2", vocab_size=10, hidden_size=8, num_hidden_layers=3, num_attention_heads=2,
                intermediate_size=8, sliding_window=4, max_window_layers=1)
    plain = qwen2.ModelArgs.from_dict(base)
    assert plain.layer_types == [qwen2.FULL] * 3 and plain.sliding_window is None  # the window is unused
    assert plain._layer_types() == plain.layer_types and plain.sliding_window is None  # asking changes nothing
    args = qwen2.ModelArgs.from_dict({**base, "use_sliding_window": True})
    assert args.layer_types == [qwen2.FULL, qwen2.SLIDING, qwen2.SLIDING] and args.window(qwen2.SLIDING) == 4
    assert args.qkv_bias and not args.o_bias


def test_qwen2_tokens_match_transformers(windowed):
    check_tokens_match(*windowed)


def test_qwen2_mean_pooling_matches_and_is_batch_invariant(windowed):
    eng = start_engine(windowed[0], pooling=Pooling.MEAN)
    try:
        check_pooled(eng, *windowed, Pooling.MEAN)
        check_batch_invariant(eng, windowed[0])
    finally:
        eng.close()
