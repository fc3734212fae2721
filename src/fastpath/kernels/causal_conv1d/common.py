"""Triton pieces shared by the causal-conv1d kernels: tap loads, masks and the dW/dB partials.

Every kernel works on a (BLOCK_L x BLOCK_D) tile of positions x channels and reads arbitrary
strides, so one kernel serves channel-last (stride_d == 1, the layout transformers passes) and
contiguous (stride_l == 1) inputs; Triton specializes unit strides, so the unit-stride axis gets
vectorized loads. Widths 2..4 are handled as width 4 with the first 4-W taps skipped at compile
time (KPAD = 4 - W): tap k in 0..3 reads position t - 3 + k with weight w[k - KPAD].
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def load_x_tap(
    x_base, init_base, pos, L, mask, stride_l, stride_il,
    WIDTH: tl.constexpr, HAS_INIT: tl.constexpr,
):
    """x at positions `pos` as fp32, shaped like `x_base + pos`: negative positions read the
    initial state (its column W-1+pos) or zero. One loader for both strategies: the tile kernels
    pass pos[:, None] against (1, BLOCK_D) bases, the row kernels a row index splat over the
    channel vector (a scalar mixed into a vector mask trips the interpreter)."""
    val = tl.load(x_base + pos * stride_l, mask=mask & (pos >= 0) & (pos < L),
                  other=0.0).to(tl.float32)
    if HAS_INIT:
        val += tl.load(init_base + (pos + WIDTH - 1) * stride_il,
                       mask=mask & (pos < 0) & (pos >= 1 - WIDTH), other=0.0).to(tl.float32)
    return val


@triton.jit
def load_seq_tap(seq_base, pos, L, seq0, HAS_INIT: tl.constexpr):
    """seq_idx at positions `pos` (a vector or one row): the initial state counts as seq_idx[0]
    (Dao 1.7.0), other out-of-range positions as -1 (their x is zero anyway, or their gradient
    is masked)."""
    s = tl.load(seq_base + pos, mask=(pos >= 0) & (pos < L), other=-1)
    if HAS_INIT:
        s = tl.where(pos < 0, seq0, s)
    return s


@triton.jit
def load_weight_tap(w_base, offs_d, mask_d, k: tl.constexpr, stride_wk, KPAD: tl.constexpr):
    """Weight of padded tap k (0..3) as fp32 (BLOCK_D,); only called for k >= KPAD."""
    return tl.load(w_base + (k - KPAD) * stride_wk, mask=mask_d, other=0.0).to(tl.float32)


@triton.jit
def load_taps(w_base, BIAS, offs_d, mask_d, stride_wk, KPAD: tl.constexpr, HAS_BIAS: tl.constexpr,
              BLOCK_D: tl.constexpr):
    """(w0, w1, w2, w3, bias) as fp32 (BLOCK_D,) each, for the kernels that keep all taps in
    registers; taps below KPAD (widths < 4) and a missing bias are zero, decided at compile time."""
    zero = tl.zeros((BLOCK_D,), dtype=tl.float32)
    w3 = load_weight_tap(w_base, offs_d, mask_d, 3, stride_wk, KPAD)
    w2 = load_weight_tap(w_base, offs_d, mask_d, 2, stride_wk, KPAD)
    w1 = zero
    w0 = zero
    if KPAD <= 1:
        w1 = load_weight_tap(w_base, offs_d, mask_d, 1, stride_wk, KPAD)
    if KPAD <= 0:
        w0 = load_weight_tap(w_base, offs_d, mask_d, 0, stride_wk, KPAD)
    bias_v = zero
    if HAS_BIAS:
        bias_v = tl.load(BIAS + offs_d, mask=mask_d, other=0.0).to(tl.float32)
    return w0, w1, w2, w3, bias_v


@triton.jit
def pre_activation(xs, ss, j: tl.constexpr, taps, tap: tl.constexpr, KPAD: tl.constexpr,
                   HAS_SEQ: tl.constexpr):
    """bias + sum_k w[k] x(t - 3 + k) for the output at position j+3 of a window of positions
    (xs / ss: x and seq_idx at those positions; its taps are xs[j..j+3]). `tap(xv, s, s_out, w,
    HAS_SEQ)` weights one seq_idx-masked tap in the caller's layout (rows or tiles)."""
    w0, w1, w2, w3, bias_v = taps
    s0 = ss[j + 3]
    acc = xs[j + 3] * w3 + bias_v
    if KPAD <= 2:
        acc += tap(xs[j + 2], ss[j + 2], s0, w2, HAS_SEQ)
    if KPAD <= 1:
        acc += tap(xs[j + 1], ss[j + 1], s0, w1, HAS_SEQ)
    if KPAD <= 0:
        acc += tap(xs[j], ss[j], s0, w0, HAS_SEQ)
    return acc


@triton.jit
def store_dw_partials(DW_PART, DB_PART, part, offs_d, mask_d, D, acc_w0, acc_w1, acc_w2, acc_w3,
                      acc_b, WIDTH: tl.constexpr, HAS_BIAS: tl.constexpr, REDUCE: tl.constexpr):
    """A backward program's fp32 dW / dB partials, [part, W, D] and [part, D] (the layout the
    launcher sums in a fixed order); REDUCE sums tile accumulators over their rows first."""
    KPAD: tl.constexpr = 4 - WIDTH
    dw_base = DW_PART + part * (WIDTH * D) + offs_d
    tl.store(dw_base + (3 - KPAD) * D, _rows_sum(acc_w3, REDUCE), mask=mask_d)
    tl.store(dw_base + (2 - KPAD) * D, _rows_sum(acc_w2, REDUCE), mask=mask_d)
    if KPAD <= 1:
        tl.store(dw_base + (1 - KPAD) * D, _rows_sum(acc_w1, REDUCE), mask=mask_d)
    if KPAD <= 0:
        tl.store(dw_base + (0 - KPAD) * D, _rows_sum(acc_w0, REDUCE), mask=mask_d)
    if HAS_BIAS:
        tl.store(DB_PART + part * D + offs_d, _rows_sum(acc_b, REDUCE), mask=mask_d)


@triton.jit
def _rows_sum(acc, REDUCE: tl.constexpr):
    if REDUCE:
        acc = tl.sum(acc, axis=0)
    return acc


@triton.jit
def silu_fp32(z):
    return z * tl.sigmoid(z)


@triton.jit
def silu_grad_fp32(z):
    """d/dz z*sigmoid(z) = s * (1 + z * (1 - s))."""
    s = tl.sigmoid(z)
    return s * (1.0 + z * (1.0 - s))


def next_pow2(n: int) -> int:
    return triton.next_power_of_2(max(int(n), 1))
