"""engine/families/kernels.py: blockwise attention against the dense path, and the two kernel sets against each
other (the fused set runs on this CPU too, only slower)."""
from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx.utils import tree_flatten, tree_unflatten

import engine  # noqa: F401  (binds the BLAS before MLX is used)
from engine.families import bert, gemma3_text, kernels, llama, ministral3, qwen3
from engine.families.base import Rotary, rope_inverse_frequencies, sequence_mask, token_positions
from engine.families.kernels import Mask, plan

MIN_COSINE = 0.999999


def _qkv(b: int, h: int, hk: int, length: int, dh: int, seed: int = 0):
    keys = mx.random.split(mx.random.key(seed), 3)
    return tuple(mx.random.normal(shape, key=k) * 2 for shape, k in
                 zip(((b, h, length, dh), (b, hk, length, dh), (b, hk, length, dh)), keys))


def _attention_mask(lengths: list[int], width: int, left: bool) -> mx.array:
    rows = np.zeros((len(lengths), width), dtype=np.int32)
    for i, n in enumerate(lengths):
        if left:
            rows[i, width - n:] = 1
        else:
            rows[i, :n] = 1
    return mx.array(rows)


def _real_rows(out: mx.array, lengths: list[int], left: bool) -> list[np.ndarray]:
    width = out.shape[1]
    return [np.array(out[i, width - n:] if left else out[i, :n]) for i, n in enumerate(lengths)]


def test_exp2_shifted_is_accurate_and_masked_scores_vanish():
    t = np.linspace(-120, 0, 200_001, dtype=np.float32)
    got = np.array(kernels.exp2_shifted(mx.array(t)[None], mx.zeros((1, 1)))).ravel().astype(np.float64)
    exact = np.exp2(t.astype(np.float64))
    rel = np.abs(got - exact) / exact
    assert rel.max() < 3e-6  # float32's rounding of t - 0.5 near a power of two; 1.1e-7 elsewhere
    assert rel[t > -20].max() < 1e-6
    assert float(kernels.exp2_shifted(mx.array([[-1e30]]), mx.zeros((1, 1))).item()) < 1e-37
    assert float(kernels.exp2_shifted(mx.array([[3.0]]), mx.array([[3.0]])).item()) == 1.0


def test_exp2_shifted_gives_the_same_bits_through_either_trace(monkeypatch):
    """Small operands take the shapeless kernel, large ones the shape-specialized one: the same arithmetic, so
    a row's weights do not depend on how many other rows share its pass."""
    scores = mx.random.normal((2, 3, 40, 96), key=mx.random.key(5)) * 20
    top = scores.max(axis=-1, keepdims=True)
    monkeypatch.setattr(kernels, "SHAPED_EXP2_FROM", 1 << 40)
    shapeless = np.array(kernels.exp2_shifted(scores, top))
    monkeypatch.setattr(kernels, "SHAPED_EXP2_FROM", 1)
    assert np.array_equal(np.array(kernels.exp2_shifted(scores, top)), shapeless)


@pytest.mark.parametrize("causal, window, diagonal, left", [
    (True, None, True, False),  # a causal decoder, right-padded
    (True, None, True, True),  # a generative reranker, left-padded
    (True, 300, True, False),  # a sliding layer (Gemma 3, Mistral)
    (False, None, False, False),  # BERT's padding mask
    (False, 257, True, False),  # EmbeddingGemma's bidirectional sliding layer
    (False, 40, True, True),  # a window far narrower than a block, padding on the left
])
def test_blockwise_matches_the_dense_path(causal, window, diagonal, left):
    lengths, width = [1100, 700], 1100
    q, k, v = _qkv(2, 4, 2, width, 16)
    mask = Mask(_attention_mask(lengths, width, left) != 0, causal=causal, window=window, diagonal=diagonal)
    dense = kernels._dense_attention(q, k, v, mask.dense(), 0.25)
    blocked = kernels._blockwise(q, k, v, mask, 0.25)
    for a, b in zip(_real_rows(blocked, lengths, left), _real_rows(dense, lengths, left), strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=2e-5)
    assert np.isfinite(np.array(blocked)).all()


def test_blockwise_is_batch_invariant():
    q, k, v = _qkv(2, 4, 4, 900, 8, seed=3)
    lengths = [900, 520]
    for causal in (True, False):
        mask = Mask(_attention_mask(lengths, 900, False) != 0, causal=causal, diagonal=causal)
        both = kernels._blockwise(q, k, v, mask, 0.3)
        alone = kernels._blockwise(q[1:, :, :520], k[1:, :, :520], v[1:, :, :520],
                                   Mask(mx.ones((1, 520), dtype=mx.bool_), causal=causal, diagonal=causal), 0.3)
        np.testing.assert_allclose(np.array(both[1, :520]), np.array(alone[0]), rtol=0, atol=1e-5)


def test_the_plan_skips_what_no_query_sees_and_masks_only_where_it_matters():
    ones = mx.ones((1, 1024), dtype=mx.bool_)
    causal = plan(Mask(ones, causal=True, diagonal=True), 1024, 256, 1024)
    assert [(q0, [(t.k0, t.k1, t.structure, t.keys) for t in tiles]) for q0, tiles in causal] == [
        (0, [(0, 256, True, False)]),
        (256, [(0, 256, False, False), (256, 512, True, False)]),
        (512, [(0, 512, False, False), (512, 768, True, False)]),
        (768, [(0, 768, False, False), (768, 1024, True, False)]),
    ]
    window = plan(Mask(ones, window=100, diagonal=True), 1024, 256, 1024)
    assert [[(t.k0, t.structure) for t in tiles] for _, tiles in window][1] == [(0, True), (256, True), (512, True)]
    # right padding matters to a bidirectional pass (only in the tiles holding it), not to a causal one
    padded = mx.array([[1] * 1024, [1] * 600 + [0] * 424]) != 0
    assert {t.keys for _, tiles in plan(Mask(padded, causal=True, diagonal=True), 1024, 256, 1024) for t in tiles} \
        == {False}
    bidirectional = plan(Mask(padded), 1024, 256, 1024)
    assert [(t.k0, t.k1, t.keys) for t in bidirectional[0][1]] == [(0, 512, False), (512, 1024, True)]


def test_tiles_stay_within_their_budget():
    for rows_heads in (1, 4, 16, 96, 1024):
        bq, bk = kernels.tile_shape(rows_heads)
        assert bk % bq == 0 and bq >= 16
        assert rows_heads * bq * bk <= kernels.TILE_ELEMENTS or bq == bk == 16


def test_kernels_are_chosen_from_the_device():
    assert kernels.for_device(mx.Device(mx.gpu)) is kernels.FUSED
    assert kernels.for_device(mx.Device(mx.cpu)) is kernels.CPU_ARITHMETIC
    before = kernels.active()
    try:
        assert kernels.select().name == "cpu-arithmetic"  # this machine's default device is its CPU
        with kernels.using("fused"):
            assert kernels.active().name == "fused"
        assert kernels.active().name == "cpu-arithmetic"
        assert kernels.select("fused") is kernels.active() is kernels.FUSED
    finally:
        kernels.select(before)


@pytest.mark.parametrize("rope", [{"rope_type": "default", "rope_theta": 10000.0},
                                  {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                   "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                   "original_max_position_embeddings": 64}])
@pytest.mark.parametrize("left", [False, True])
def test_fused_rope_matches_the_tables_on_real_tokens(rope, left):
    lengths, width = [40, 23], 40
    attention_mask = _attention_mask(lengths, width, left)
    inv_freq = rope_inverse_frequencies(32, rope)
    x = mx.random.normal((2, 3, width, 32), key=mx.random.key(5))
    rotary = Rotary(token_positions(attention_mask), inv_freq, attention_mask)
    with kernels.using("cpu-arithmetic"):
        tables, tables_at = rotary(x), rotary.at(mx.array([39, 30]))(x[:, :, :1])
    with kernels.using("fused"):
        fused, fused_at = rotary(x), rotary.at(mx.array([39, 30]))(x[:, :, :1])
    for a, b in zip(_real_rows(fused.transpose(0, 2, 1, 3), lengths, left),
                    _real_rows(tables.transpose(0, 2, 1, 3), lengths, left), strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=2e-5)
    np.testing.assert_allclose(np.array(fused_at), np.array(tables_at), rtol=0, atol=2e-5)


# -- whole families with each kernel set --------------------------------------------------------------------

def _perturbed(model: nn.Module, seed: int) -> nn.Module:
    """Random init leaves norms at 1 / 0: move every 1-D parameter so a dropped one would show."""
    params = []
    for i, (name, p) in enumerate(tree_flatten(model.parameters())):
        if p.ndim == 1:
            p = p + 0.1 * mx.random.normal(p.shape, key=mx.random.key(seed * 1000 + i))
        params.append((name, p))
    model.update(tree_unflatten(params))
    mx.eval(model.parameters())
    return model


def _bert():
    args = bert.ModelArgs(vocab_size=300, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                          intermediate_size=128, max_position_embeddings=1024)
    return _perturbed(bert.Model(args), 1)


def _qwen3():
    args = qwen3.ModelArgs.from_dict(dict(model_type="qwen3", vocab_size=300, hidden_size=64, num_hidden_layers=2,
                                          num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                          intermediate_size=96, max_position_embeddings=2048, rope_theta=1e6))
    return _perturbed(llama.Model(args), 2)


def _gemma3(bidirectional: bool):
    args = gemma3_text.ModelArgs.from_dict(dict(
        vocab_size=300, hidden_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=1,
        head_dim=16, intermediate_size=96, query_pre_attn_scalar=24, sliding_window=300,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        use_bidirectional_attention=bidirectional))
    return _perturbed(gemma3_text.Model(args), 3)


def _ministral3():
    """YaRN frequencies and Llama 4 query scaling, whose windows (64 tokens) the long inputs cross."""
    rope = {"rope_type": "yarn", "rope_theta": 1e6, "factor": 16.0, "original_max_position_embeddings": 64,
            "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0, "llama_4_scaling_beta": 0.1}
    args = ministral3.ModelArgs.from_dict(dict(model_type="ministral3", vocab_size=300, hidden_size=64,
                                               num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                               head_dim=16, intermediate_size=96, rope_parameters=rope))
    return _perturbed(ministral3.Model(args), 4)


FAMILIES = {"bert": _bert, "qwen3": _qwen3, "gemma3 (causal)": lambda: _gemma3(False),
            "embeddinggemma (bidirectional)": lambda: _gemma3(True), "ministral3": _ministral3}


def _hidden(model: nn.Module, lengths: list[int]) -> list[np.ndarray]:
    width = max(lengths)
    ids = np.zeros((len(lengths), width), dtype=np.int32)  # each input's tokens depend on its length only
    for row, n in enumerate(lengths):
        ids[row, :n] = np.random.default_rng(n).integers(1, 300, n)
    mask = np.array(_attention_mask(lengths, width, False))
    out = model(mx.array(ids * mask), mx.array(mask), mx.zeros(ids.shape, dtype=mx.int32))
    return _real_rows(out.astype(mx.float32), lengths, False)


def _min_cosine(a: list[np.ndarray], b: list[np.ndarray]) -> float:
    rows_a, rows_b = np.concatenate(a).astype(np.float64), np.concatenate(b).astype(np.float64)
    cos = (rows_a * rows_b).sum(-1) / (np.linalg.norm(rows_a, axis=-1) * np.linalg.norm(rows_b, axis=-1))
    return float(cos.min())


@pytest.mark.parametrize("family", list(FAMILIES))
def test_both_kernel_sets_give_the_same_vectors(family):
    model = FAMILIES[family]()
    for lengths in ([37, 5, 20], [700, 530]):  # dense, then blockwise / banded
        with kernels.using("cpu-arithmetic"):
            ours = _hidden(model, lengths)
        with kernels.using("fused"):
            fused = _hidden(model, lengths)
            alone = _hidden(model, lengths[1:])
        assert _min_cosine(ours, fused) >= MIN_COSINE, lengths
        np.testing.assert_allclose(fused[1], alone[0], rtol=0, atol=1e-5)  # batch invariant


@pytest.mark.parametrize("family", ["qwen3", "gemma3 (causal)", "embeddinggemma (bidirectional)", "ministral3"])
@pytest.mark.parametrize("kernel_set", ["cpu-arithmetic", "fused"])
def test_the_last_layer_at_the_needed_rows_only(family, kernel_set):
    model = FAMILIES[family]()
    lengths, width = [600, 17], 600
    ids = mx.random.randint(1, 300, (2, width), key=mx.random.key(0))
    mask = _attention_mask(lengths, width, False)
    last = mx.array([n - 1 for n in lengths])
    with kernels.using(kernel_set):
        full = np.array(model(ids * mask, mask))
        needed = np.array(model(ids * mask, mask, needed=last))
    assert needed.shape == (2, 1, 64)
    for row, n in enumerate(lengths):
        np.testing.assert_allclose(needed[row, 0], full[row, n - 1], rtol=0, atol=1e-5)


def test_sequence_mask_is_described_and_densified_as_before():
    attention_mask = _attention_mask([5, 3], 5, False)
    mask = sequence_mask(attention_mask, causal=True, window=2)
    col = np.arange(5)
    delta = col[:, None] - col[None, :]
    expected = ((delta >= 0) & (np.abs(delta) < 2))[None] & (np.array(attention_mask) != 0)[:, None, :]
    expected |= np.eye(5, dtype=bool)[None]
    np.testing.assert_array_equal(np.array(mask.dense()), expected[:, None])


@pytest.mark.parametrize("affine", ["weight and bias", "weight only", "none"])
def test_the_cpu_layer_norm_gives_mlx_s_own_bits(affine):
    """The CPU set's LayerNorm is mx.fast.layer_norm's own computation in fewer graph nodes: the same bits, for
    every batch shape and width sharing one trace, in float32; other dtypes are MLX's."""
    keys = mx.random.split(mx.random.key(3), 4)
    for shape, eps in (((1, 17, 384), 1e-12), ((3, 40, 384), 1e-12), ((2, 5, 768), 1e-12), ((2, 5, 768), 1e-5),
                       ((7, 32), 1e-6)):
        x = mx.random.normal(shape, key=keys[0]) * 3 + 1
        weight = mx.random.normal(shape[-1:], key=keys[1]) if affine != "none" else None
        bias = mx.random.normal(shape[-1:], key=keys[2]) if affine == "weight and bias" else None
        want = np.array(mx.fast.layer_norm(x, weight, bias, eps))
        assert np.array_equal(np.array(kernels.CPU_ARITHMETIC.layer_norm(x, weight, bias, eps)), want)
    half = (mx.random.normal((2, 9, 64), key=keys[3])).astype(mx.bfloat16)
    got = kernels.CPU_ARITHMETIC.layer_norm(half, None, None, 1e-5)
    assert got.dtype == mx.bfloat16 and np.array_equal(np.array(got.astype(mx.float32)),
                                                       np.array(mx.fast.layer_norm(half, None, None, 1e-5)
                                                                .astype(mx.float32)))


def test_families_layer_norm_follows_the_kernel_set():
    from engine.families.base import LayerNorm

    norm = LayerNorm(48, eps=1e-7)
    norm.weight = mx.random.normal((48,), key=mx.random.key(4))
    x = mx.random.normal((2, 6, 48), key=mx.random.key(5))
    want = np.array(mx.fast.layer_norm(x, norm.weight, norm.bias, 1e-7))
    for name in kernels.SETS:
        with kernels.using(name):
            assert np.array_equal(np.array(norm(x)), want)
    assert set(dict(tree_flatten(norm.parameters()))) == {"weight", "bias"}  # nn.LayerNorm's checkpoint keys


def test_unpadded_rows_skip_the_masking_pass_with_the_same_bits():
    """A pass whose keys are all real (a lone input) skips the masking pass: the same bits as the masked one, and
    padded rows still masked."""
    q, k, v = _qkv(1, 4, 4, 17, 8)
    full = bert.padding_mask(mx.ones((1, 17), dtype=mx.int32))
    masked = kernels._dense_attention(q, k, v, full.dense(), 0.125)
    assert np.array_equal(np.array(kernels.CPU_ARITHMETIC.attention(q, k, v, full, 0.125)), np.array(masked))
    q2, k2, v2 = _qkv(2, 4, 4, 17, 8, seed=1)
    padded = bert.padding_mask(_attention_mask([17, 9], 17, left=False))
    alone = kernels.CPU_ARITHMETIC.attention(q2[1:, :, :9], k2[1:, :, :9], v2[1:, :, :9],
                                             bert.padding_mask(mx.ones((1, 9), dtype=mx.int32)), 0.125)
    batched = kernels.CPU_ARITHMETIC.attention(q2, k2, v2, padded, 0.125)
    assert np.abs(np.array(batched[1, :9]) - np.array(alone[0])).max() < 1e-5
