"""The compute kernels the families share, in two sets chosen once from the device.

- `cpu-arithmetic` (a CPU): exp, softmax and GELU written out in arithmetic that `mx.compile` fuses (MLX's exp
  and erf are scalar loops on a Linux CPU: docs/mlx-on-linux.md), LayerNorm as MLX's own op-by-op fallback, with
  its element-wise steps fused for a small input (fewer graph nodes, the same bits), and attention computed
  blockwise above BLOCKWISE_FROM tokens (below it, the dense matmul + softmax + matmul, faster there). Both attention
  paths exponentiate in log2 units with `exp2_shifted`; a fused kernel is only fed contiguous operands (a
  broadcast operand makes it index every element through strides, about 3x slower here).
- `fused` (a GPU: Metal or CUDA): MLX's own kernels, mx.fast.scaled_dot_product_attention, mx.fast.rope,
  mx.fast.layer_norm, mx.softmax and the erf GELU. Nothing tuned for the CPU runs there.

Both sets compute the same function (tests/engine/families/test_kernels.py compares them on this CPU, where the
fused ops run too, only slower). `select()` sets the set for the process (the device is one per process);
`active().name` says which is in use.

Masks are described (`Mask`), not materialized: the dense path builds the boolean matrix once per pass and
layer kind, the blockwise path builds only the tiles where a mask changes anything.

Blockwise attention (`_blockwise`): queries in blocks of `bq` rows, keys in tiles, an online softmax over the
tiles of a block (running maximum, rescaled accumulator), and the softmax's denominator computed by the
P @ V matmul itself (a column of ones appended to V). Tiles where no query sees any key (above the causal
diagonal, outside a sliding window) are skipped; a tile where every query sees every key gets no mask pass;
only the tiles crossing the diagonal, a window's edge, or padding keys that matter are masked. Scores are
computed in log2 units (the scale times log2(e) folded into the queries) and exponentiated by one fused
kernel (`_exp2_bits`) compiled for each tile shape: every tile is a multiple of `bq` wide (the input is padded
to a multiple of `bq`), so a model sees a handful of shapes. Memory: the tiles (at most TILE_ELEMENTS floats
each) of the few operations MLX has scheduled ahead, whatever the length (transient_bytes() bounds them), as
query blocks are chained (mx.depends), plus q, k, v and the output: linear in the length. A bias (MPNet, T5)
or a dense boolean mask makes the pass dense.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import mlx.core as mx
import mlx.nn as nn
import numpy as np

# -- arithmetic exp, softmax, GELU (the CPU set) -------------------------------------------------------------

_LOG2E = 1.4426950408889634
_LN2 = 0.6931471805599453
# 2^f on [-0.5, 0.5]: Taylor terms of e^(f ln 2); relative error below 4e-6 before normalization.
_EXP2_TERMS = tuple(_LN2 ** k / math.factorial(k) for k in range(7))

# Adding then subtracting 1.5 * 2^23 rounds a float32 of magnitude below 2^22 to the nearest integer: plain
# arithmetic the compiled kernel vectorizes, where floor is a call per element (measured 35% off the kernel).
_ROUND = 12582912.0


def _exp_parts(x: mx.array) -> tuple[mx.array, mx.array]:
    """e^x for x <= 0 from arithmetic only, as (2^f polynomial, the float bits of 2^n) with e^x = 2^n * 2^f."""
    t = mx.maximum(x, -87.0) * _LOG2E
    n = (t + _ROUND) - _ROUND  # |f| <= 0.5 below
    f = t - n
    p = _EXP2_TERMS[-1]
    for c in reversed(_EXP2_TERMS[:-1]):
        p = p * f + c
    return p, (n.astype(mx.int32) + 127) << 23


# shapeless, so a pass of a width never seen runs at once: a shaped compilation retraces for every new shape,
# and dense passes run at their inputs' exact widths. The bit view cannot be traced shapeless, so it stays
# outside (a view costs no copy).
_exp_parts_compiled = mx.compile(_exp_parts, shapeless=True)


def _exp(x: mx.array) -> mx.array:
    p, bits = _exp_parts_compiled(x)
    return p * mx.view(bits, mx.float32)


def _softmax_arithmetic(scores: mx.array) -> mx.array:
    """Softmax over the last axis with the arithmetic exp (MLX's exp is a scalar loop on a Linux CPU)."""
    weights = _exp(scores - mx.max(scores, axis=-1, keepdims=True))
    return weights * (1.0 / mx.sum(weights, axis=-1, keepdims=True))


# erf(x) as a ratio of odd/even polynomials on [-4, 4] (the rational form Eigen and XLA use for float32).
# Pure arithmetic fused by mx.compile runs ~7x faster than MLX's erf on a Linux CPU (docs/mlx-on-linux.md).
# Max error against the exact erf GELU: about 1e-6 (tests/engine/families/test_base.py).
_ERF_P = (-2.72614225801306e-10, 2.77068142495902e-08, -2.10102402082508e-06, -5.69250639462346e-05,
          -7.34990630326855e-04, -2.95459980854025e-03, -1.60960333262415e-02)
_ERF_Q = (-1.45660718464996e-05, -2.13374055278905e-04, -1.68282697438203e-03, -7.37332916720468e-03,
          -1.42647390514189e-02)


def _gelu_erf_arithmetic(x: mx.array) -> mx.array:
    u = mx.clip(x * 0.7071067811865476, -4.0, 4.0)
    u2 = u * u
    p = _ERF_P[0]
    for c in _ERF_P[1:]:
        p = p * u2 + c
    q = _ERF_Q[0]
    for c in _ERF_Q[1:]:
        q = q * u2 + c
    return x * (0.5 + 0.5 * (u * p) / q)


# shapeless: one compilation serves every batch shape, so a request never waits for a compiler.
_gelu_erf_compiled = mx.compile(_gelu_erf_arithmetic, shapeless=True)

# LayerNorm: MLX's mx.fast.layer_norm has no CPU kernel and runs its fallback op by op (18 graph nodes: a cast,
# two means, each a sum and a multiply, the broadcasts between, rsqrt, the affine), and on a CPU every node costs
# a scheduler dispatch (~10 us here: more than the arithmetic of a short input). The same computation, op for op
# and in the same order, with its element-wise steps fused by mx.compile gives the same bits in a few nodes.
# Shapeless, so every shape shares one trace (a shapeless mean divides by the element count it reads at run time);
# one trace per eps and affine terms. float32 only: other dtypes keep MLX's function (its casts are not
# reproduced here).
_LAYER_NORMS: dict[tuple[float, bool, bool], Callable[..., mx.array]] = {}


def _layer_norm_of(has_weight: bool, has_bias: bool, eps: float) -> Callable[..., mx.array]:
    def layer_norm(x: mx.array, *affine: mx.array) -> mx.array:
        xc = x - mx.mean(x, axis=-1, keepdims=True)
        y = xc * mx.rsqrt(mx.mean(mx.square(xc), axis=-1, keepdims=True) + mx.array(eps, dtype=mx.float32))
        if has_weight:
            y = y * affine[0]
        if has_bias:
            y = y + affine[-1]
        return y

    return layer_norm


# Above this many elements the fused steps cost more than the nodes they save: their broadcast operands (the row
# statistics, the affine terms) are indexed element by element through strides, where MLX's own broadcasting
# kernels stream (13 LayerNorms at 32 x 17 x 384: 38-53 ms fused against 25-32 ms op by op; at 1 x 17 x 384,
# 0.9-1.5 ms against 1.1-3.0).
FUSED_LAYER_NORM_UP_TO = 1 << 14


def _layer_norm_arithmetic(x: mx.array, weight: mx.array | None, bias: mx.array | None, eps: float) -> mx.array:
    """mx.fast.layer_norm(x, weight, bias, eps), in fewer graph nodes for a small x (the same bits for float32)."""
    if x.size > FUSED_LAYER_NORM_UP_TO or any(a is not None and a.dtype != mx.float32 for a in (x, weight, bias)):
        return mx.fast.layer_norm(x, weight, bias, eps)
    key = (eps, weight is not None, bias is not None)
    fn = _LAYER_NORMS.get(key)
    if fn is None:
        fn = _LAYER_NORMS[key] = mx.compile(_layer_norm_of(key[1], key[2], eps), shapeless=True)
    return fn(x, *(a for a in (weight, bias) if a is not None))


# 2^23 * (sqrt(2) * 2^g - 1) + 0.5 on g in [-0.5, 0.5], degree 5, least squares on Chebyshev nodes: within 0.92
# of the exact value, i.e. a relative error of about 1.1e-7 once it is the mantissa of 2^(g + 0.5).
_MANTISSA = (3474676.598654147, 8223001.614598265, 2849810.6269584047, 658451.0361165389, 114789.56837510702,
             15897.312182120297)


def _exp2_bits_of(u: mx.array) -> mx.array:
    """The float32 bits of 2^(s - m) (s - m <= 0, in log2 units), given u = s - (m + 0.5): one fused kernel.

    With r = round(u) (= floor(s - m) up to ties, where both roundings give the same bits),
    2^(s - m) = 2^(r + 1) * 2^(g - 0.5) = 2^r * sqrt(2) * 2^g with g = u - r in [-0.5, 0.5]: exponent field
    r + 127 and mantissa sqrt(2) * 2^g - 1 in [0, 1), the Estrin-form polynomial above. Below 2^-126 the
    exponent field clamps to 0 (a subnormal below 2^-126: nothing a softmax sum can see); a masked -1e30 gives
    about 5e-39. The chain fits the fuser's depth limit of 11 operations only when traced with shapes (a
    shapeless trace adds a broadcast per operation), hence a shape-specialized compile for large operands (the
    blockwise tiles, of a few shapes) and the shapeless one below SHAPED_EXP2_FROM elements.
    """
    r = (u + _ROUND) - _ROUND
    g = u - r
    g2 = g * g
    a = _MANTISSA
    mantissa = ((a[0] + a[1] * g) + g2 * (a[2] + a[3] * g)) + (g2 * g2) * (a[4] + a[5] * g)
    return mantissa.astype(mx.int32) + (mx.maximum(r + 127.0, 0.0).astype(mx.int32) << 23)


_exp2_bits = mx.compile(_exp2_bits_of)
# The same chain traced shapeless: split in two kernels (3.4 against 1.8 ns per element here, the same bits), but
# no trace per new shape (5-8 ms each), which dense passes at their inputs' exact widths would pay.
_exp2_bits_shapeless = mx.compile(_exp2_bits_of, shapeless=True)
SHAPED_EXP2_FROM = 1 << 20  # elements: from here a trace costs less than the time the shaped kernel saves


def exp2_shifted(s: mx.array, m: mx.array) -> mx.array:
    """2^(s - m) for s <= m (m broadcasts over s's last axis): the subtraction, then one fused pass over its
    contiguous result (see _exp2_bits_of). The same subtraction inside the fused kernel costs it a strided
    index per element for the broadcast operand: 5.2 against 1.8 ns per element here, for the same bits."""
    u = s - (m + 0.5)
    return mx.view(_exp2_bits(u) if u.size >= SHAPED_EXP2_FROM else _exp2_bits_shapeless(u), mx.float32)


# -- masks -------------------------------------------------------------------------------------------------

@dataclass(eq=False)
class Mask:
    """Which keys each query attends to, described: `keys` [B, L] (True = a real token) and the structure.

    causal: a query sees keys at or before it. window: within `window` positions (causal: q - k < window;
    bidirectional: |q - k| < window). diagonal: every query also sees itself, so no row is fully masked
    (a padding query's output is discarded, but NaN would leak through 0 * NaN). queries: [B, Lq] positions
    of the queries when only some are computed (the last layer of a last-token-pooled pass); None means
    every position, in order. source: the 1/0 attention mask `keys` was computed from: already on the host's side
    of the graph, so reading it never waits for a pass computing on the stream (keys itself is lazy).
    """

    keys: mx.array
    causal: bool = False
    window: int | None = None
    diagonal: bool = False
    queries: mx.array | None = None
    source: mx.array | None = None  # the [B, L] 1/0 array keys came from, read on the host without waiting
    _dense: mx.array | None = field(default=None, init=False, repr=False)
    _host: tuple[np.ndarray, bool] | None = field(default=None, init=False, repr=False)

    @property
    def length(self) -> int:
        return self.keys.shape[1]

    @property
    def structured(self) -> bool:
        """Whether positions matter (causal or windowed), beyond which keys are real."""
        return self.causal or self.window is not None

    def at(self, positions: mx.array) -> Mask:
        """The same mask for one query per row, at positions [B] (int)."""
        return Mask(self.keys, self.causal, self.window, self.diagonal, positions.reshape(-1, 1), self.source)

    def dense(self) -> mx.array:
        """Boolean [B, 1, Lq or 1, L] (True = attend), built once per mask."""
        if self._dense is None:
            self._dense = self.block(0, None, 0, self.length)
        return self._dense

    def block(self, q0: int, q1: int | None, k0: int, k1: int) -> mx.array:
        """The boolean mask of queries q0:q1 (None: to the end, or the given query positions) over keys k0:k1,
        [B or 1, 1, rows, k1 - k0]; keys past the input's length are padding."""
        length = self.length
        keys = self.keys[:, k0:min(k1, length)]
        if k1 > length:
            keys = mx.concatenate([keys, mx.zeros((keys.shape[0], k1 - length), dtype=mx.bool_)], axis=1)
        if not self.structured and not self.diagonal:
            return keys[:, None, None, :]
        if self.queries is not None:
            qpos = self.queries[:, :, None]  # [B, Lq, 1]
        else:
            qpos = mx.arange(q0, length if q1 is None else q1)[None, :, None]
        delta = qpos - mx.arange(k0, k1)[None, None, :]  # q - k
        allowed = keys[:, None, :]
        if self.causal:
            allowed = allowed & (delta >= 0)
        if self.window is not None:
            allowed = allowed & (mx.abs(delta) < self.window)
        if self.diagonal:
            allowed = allowed | (delta == 0)
        return allowed[:, None]

    def host(self) -> tuple[np.ndarray, bool]:
        """(for each key, whether it is real in every row; whether every row's real tokens are a prefix),
        read once (a [B, L] copy to the host)."""
        if self._host is None:
            keys = np.array(self.keys if self.source is None else self.source) != 0
            lengths = keys.sum(axis=1)
            prefix = bool((keys == (np.arange(keys.shape[1])[None, :] < lengths[:, None])).all())
            self._host = (keys.all(axis=0), prefix)
        return self._host

    def padding_matters(self) -> bool:
        """Whether masking padding keys changes a real token's output. Not for a causal pass over right-padded
        rows: a real query sees only earlier keys, all real (a padding query may see padding: it is discarded,
        and it always sees real keys or itself, so it stays finite)."""
        real_everywhere, prefix = self.host()
        if real_everywhere.all():
            return False
        return not (self.causal and prefix)


# -- dense attention (short inputs on a CPU; any input given as a boolean array) ---------------------------

def _grouped(q: mx.array, k: mx.array, v: mx.array) -> tuple[mx.array, mx.array, mx.array, int]:
    """q [B, H, L, Dh] -> [B, Hkv, G, L, Dh] with k, v [B, Hkv, 1, L, Dh]: query head i reads key head
    i // G, as transformers' repeat_kv, by broadcasting instead of copying."""
    b, h, length, dh = q.shape
    groups = h // k.shape[1]
    return q.reshape(b, k.shape[1], groups, length, dh), k[:, :, None], v[:, :, None], groups


def _merge_heads(out: mx.array, b: int, h: int, length: int, dh: int) -> mx.array:
    return out.reshape(b, h, length, dh).transpose(0, 2, 1, 3).reshape(b, length, h * dh)


def _dense_attention(q: mx.array, k: mx.array, v: mx.array, mask: mx.array | None, scale: float,
                     bias: mx.array | None = None) -> mx.array:
    """mask None: every query sees every key (the masking pass would change nothing)."""
    b, h, length, dh = q.shape
    if h != k.shape[1]:
        q, k, v, _ = _grouped(q, k, v)
        mask = None if mask is None else mask[:, :, None]
    # scores in log2 units (the scale times log2(e) folded into the queries) for exp2_shifted
    scores = (q * (scale * _LOG2E)) @ k.swapaxes(-1, -2)
    if bias is not None:
        scores = scores + bias * _LOG2E
    if mask is not None:
        scores = mx.where(mask, scores, -1e30)
    weights = exp2_shifted(scores, scores.max(axis=-1, keepdims=True))
    weights = weights * (1.0 / weights.sum(axis=-1, keepdims=True))
    return _merge_heads(weights @ v, b, h, length, dh)


# -- blockwise attention (long inputs on a CPU) ------------------------------------------------------------

BLOCKWISE_FROM = 512  # tokens: from this query length on, the CPU set attends blockwise
TILE_ELEMENTS = 1 << 22  # scores in one tile, all rows and heads together (16 MiB of float32)
MAX_BLOCK_ROWS = 256
MAX_TILE_KEYS = 2048
# MLX allocates each operation's output when it schedules it, about ten operations ahead of the one computing
LOOKAHEAD_TILES = 16


def transient_bytes() -> int:
    """A bound on what blockwise attention holds beyond q, k, v and its output, whatever the length: the
    tiles (scores, exponentials) of the operations MLX has scheduled ahead."""
    return LOOKAHEAD_TILES * TILE_ELEMENTS * 4


def tile_shape(rows_times_heads: int) -> tuple[int, int]:
    """(query block rows bq, widest key tile): bq a power of two up to MAX_BLOCK_ROWS with a square tile
    within TILE_ELEMENTS, the key tile a multiple of bq up to MAX_TILE_KEYS within TILE_ELEMENTS."""
    bq = MAX_BLOCK_ROWS
    while bq > 16 and rows_times_heads * bq * bq > TILE_ELEMENTS:
        bq //= 2
    bk = max(bq, min(MAX_TILE_KEYS, TILE_ELEMENTS // (rows_times_heads * bq)) // bq * bq)
    return bq, bk


@dataclass(frozen=True)
class Tile:
    k0: int
    k1: int
    structure: bool  # positions decide within the tile (the diagonal, a window's edge)
    keys: bool  # padding keys in the tile matter


def _visibility(mask: Mask, q0: int, q1: int, k0: int, k1: int) -> str:
    """'all', 'none' or 'some': which (query, key) pairs of the block the causal / window structure allows."""
    dmin, dmax = q0 - (k1 - 1), (q1 - 1) - k0  # q - k over the tile
    w = mask.window
    if mask.causal:
        if dmax < 0 or (w is not None and dmin >= w):
            return "none"
        return "all" if dmin >= 0 and (w is None or dmax < w) else "some"
    if w is None:
        return "all"
    if dmin >= w or dmax <= -w:
        return "none"
    return "all" if dmax < w and -dmin < w else "some"


def plan(mask: Mask, padded: int, bq: int, bk: int) -> list[tuple[int, list[Tile]]]:
    """For each query block (q0), the key tiles it reads: bq-aligned, invisible ones skipped, consecutive
    unmasked (or padding-only) ones merged up to bk keys."""
    real_everywhere, _ = mask.host()
    real = np.zeros(padded, dtype=bool)
    real[:len(real_everywhere)] = real_everywhere
    padding = mask.padding_matters() or (padded > mask.length and not mask.causal)
    blocks = []
    for q0 in range(0, padded, bq):
        q1 = q0 + bq
        tiles: list[Tile] = []
        for k0 in range(0, padded, bq):
            k1 = k0 + bq
            seen = _visibility(mask, q0, q1, k0, k1)
            if seen == "none":
                continue
            tile = Tile(k0, k1, seen == "some", padding and not real[k0:k1].all())
            last = tiles[-1] if tiles else None
            if (last is not None and not tile.structure and not last.structure and last.keys == tile.keys
                    and last.k1 == k0 and last.k1 - last.k0 + bq <= bk):
                tiles[-1] = Tile(last.k0, k1, False, tile.keys)
            else:
                tiles.append(tile)
        blocks.append((q0, tiles))
    return blocks


def _blockwise(q: mx.array, k: mx.array, v: mx.array, mask: Mask, scale: float) -> mx.array:
    b, h, length, dh = q.shape
    bq, bk = tile_shape(b * h)
    padded = -(-length // bq) * bq
    q, k, v, _ = _grouped(q * (scale * _LOG2E), k, v)
    kt = k.swapaxes(-1, -2)  # [B, Hkv, 1, Dh, L]
    v1 = mx.concatenate([v, mx.ones(v.shape[:-1] + (1,), dtype=v.dtype)], axis=-1)  # sums ride the P @ V matmul
    if padded > length:
        extra = padded - length
        q = mx.pad(q, [(0, 0)] * 3 + [(0, extra), (0, 0)])
        kt = mx.pad(kt, [(0, 0)] * 4 + [(0, extra)])
        v1 = mx.pad(v1, [(0, 0)] * 3 + [(0, extra), (0, 0)])
    structures: dict[tuple[int, int], mx.array] = {}  # the same relative pattern recurs along the diagonal

    def tile_mask(q0: int, tile: Tile) -> mx.array:
        if not tile.keys:
            key = (tile.k0 - q0, tile.k1 - tile.k0)
            if key not in structures:
                structures[key] = Mask(mx.ones((1, padded), dtype=mx.bool_), mask.causal, mask.window).block(
                    q0, q0 + bq, tile.k0, tile.k1)
            return structures[key][:, :, None]
        if tile.structure or mask.diagonal:
            return mask.block(q0, q0 + bq, tile.k0, tile.k1)[:, :, None]
        return mask.block(0, 0, tile.k0, tile.k1)[:, :, None]  # padding only: [B, 1, 1, 1, keys]

    outs: list[mx.array] = []
    for q0, tiles in plan(mask, padded, bq, bk):
        block = q[..., q0:q0 + bq, :]
        if outs:  # one query block at a time: MLX allocates ahead of computing, so chained blocks bound memory
            block = mx.depends(block, outs[-1])
        acc = top = None
        for tile in tiles:
            scores = block @ kt[..., tile.k0:tile.k1]
            if tile.structure or tile.keys:
                scores = mx.where(tile_mask(q0, tile), scores, -1e30)
            tile_top = scores.max(axis=-1, keepdims=True)
            new_top = tile_top if top is None else mx.maximum(top, tile_top)
            pv = exp2_shifted(scores, new_top) @ v1[..., tile.k0:tile.k1, :]
            acc = pv if acc is None else acc * mx.exp((top - new_top) * _LN2) + pv
            top = new_top
        outs.append(acc[..., :dh] / acc[..., dh:])
    out = mx.concatenate(outs, axis=-2) if len(outs) > 1 else outs[0]
    return _merge_heads(out[..., :length, :], b, h, length, dh)


def _attention_arithmetic(q: mx.array, k: mx.array, v: mx.array, mask: Mask | mx.array, scale: float,
                          bias: mx.array | None = None) -> mx.array:
    """Blockwise from BLOCKWISE_FROM query rows on; dense below, and for a dense mask or a bias [L, L] given."""
    if isinstance(mask, Mask):
        if mask.queries is None and bias is None and q.shape[2] >= BLOCKWISE_FROM:
            return _blockwise(q, k, v, mask, scale)
        if mask.source is not None and not mask.structured and not mask.diagonal and not mask.padding_matters():
            # no key is padding (a lone input, equal lengths): nothing to mask. Read from `source`, on the host
            # already: deciding never waits for a pass computing on the stream
            return _dense_attention(q, k, v, None, scale, bias)
        mask = mask.dense()
    return _dense_attention(q, k, v, mask, scale, bias)


# -- fused (GPU) -------------------------------------------------------------------------------------------

FUSED_BLOCK_ROWS = 1024  # query rows per call when a window or padding needs a mask matrix on a long input


def _attention_fused(q: mx.array, k: mx.array, v: mx.array, mask: Mask | mx.array, scale: float,
                     bias: mx.array | None = None) -> mx.array:
    """mx.fast.scaled_dot_product_attention: "causal" or a key mask [B, 1, 1, L] when that is all the mask
    says (memory linear in the length); a mask matrix otherwise, one band of query rows at a time on a long
    input (memory linear too). A bias joins the mask as one additive matrix."""
    b, h, length, dh = q.shape
    sdpa = mx.fast.scaled_dot_product_attention
    if bias is not None:
        allowed = mask.dense() if isinstance(mask, Mask) else mask
        additive = mx.where(allowed, bias.astype(q.dtype), mx.array(-1e30, dtype=q.dtype))
        return _merge_heads(sdpa(q, k, v, scale=scale, mask=additive), b, h, length, dh)
    if not isinstance(mask, Mask):
        return _merge_heads(sdpa(q, k, v, scale=scale, mask=mask), b, h, length, dh)
    if mask.queries is None and not mask.diagonal and not mask.structured:
        return _merge_heads(sdpa(q, k, v, scale=scale, mask=mask.dense()), b, h, length, dh)
    if mask.queries is None and mask.causal and mask.window is None and not mask.padding_matters():
        return _merge_heads(sdpa(q, k, v, scale=scale, mask="causal"), b, h, length, dh)
    if mask.queries is not None or length < BLOCKWISE_FROM:
        return _merge_heads(sdpa(q, k, v, scale=scale, mask=mask.dense()), b, h, length, dh)
    outs = []
    for q0 in range(0, length, FUSED_BLOCK_ROWS):
        q1 = min(length, q0 + FUSED_BLOCK_ROWS)
        k0, k1 = 0, length
        if mask.window is not None:
            k0, k1 = max(0, q0 - mask.window + 1), min(length, q1 + mask.window - 1)
        if mask.causal:
            k1 = q1
        band = mask.block(q0, q1, k0, k1)
        outs.append(sdpa(q[:, :, q0:q1], k[:, :, k0:k1], v[:, :, k0:k1], scale=scale, mask=band))
    return _merge_heads(mx.concatenate(outs, axis=2), b, h, length, dh)


# -- the two sets and the choice ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Kernels:
    name: str  # what /props and the load log show
    attention: Callable[..., mx.array]  # (q, k, v, mask, scale, bias=None) -> [B, Lq, H * Dh]
    softmax: Callable[[mx.array], mx.array]
    gelu_erf: Callable[[mx.array], mx.array]
    layer_norm: Callable[..., mx.array]  # (x, weight or None, bias or None, eps), as mx.fast.layer_norm
    fused_rope: bool  # rotary embeddings by mx.fast.rope (else cos / sin tables)


CPU_ARITHMETIC = Kernels("cpu-arithmetic", _attention_arithmetic, _softmax_arithmetic, _gelu_erf_compiled,
                         _layer_norm_arithmetic, fused_rope=False)
FUSED = Kernels("fused", _attention_fused, lambda scores: mx.softmax(scores, axis=-1, precise=True),
                lambda x: nn.gelu(x), mx.fast.layer_norm, fused_rope=True)
SETS = {kernels.name: kernels for kernels in (CPU_ARITHMETIC, FUSED)}


def for_device(device: mx.Device | None = None) -> Kernels:
    """The set for a device (default: MLX's default device): fused on a GPU (Metal or CUDA), else arithmetic."""
    device = device or mx.default_device()
    return FUSED if device.type == mx.gpu else CPU_ARITHMETIC


_active = for_device()


def active() -> Kernels:
    """The set every family computes with now."""
    return _active


def select(kernels: Kernels | str | None = None) -> Kernels:
    """Set the process's kernels (None: the default device's) and return them. The engine calls it once at load,
    before the first pass (engine/runtime/shapes.py, which logs the choice)."""
    global _active
    _active = for_device() if kernels is None else SETS[kernels] if isinstance(kernels, str) else kernels
    return _active


class using:
    """`with using("fused"):` computes with that set inside the block (tests compare the two on one device)."""

    def __init__(self, kernels: Kernels | str):
        self.kernels = SETS[kernels] if isinstance(kernels, str) else kernels

    def __enter__(self) -> Kernels:
        global _active
        self.before, _active = _active, self.kernels
        return _active

    def __exit__(self, *exc) -> None:
        global _active
        _active = self.before
