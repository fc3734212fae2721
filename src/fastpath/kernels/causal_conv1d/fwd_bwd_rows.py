"""Sliding-row Triton kernels for causal conv1d: each x / dy element is loaded once.

Why: the 2D-tile kernels (fwd_tile / bwd_tile) load W (fwd) or 2W-1 (bwd) shifted copies
of every tile; those loads are issued back to back, so each one goes to L2 again and the
kernels top out at ~0.7x copy bandwidth (fwd) / ~1000 GB/s (bwd) on an H200. Here a program owns
BLOCK_D channels (16-byte vectors along D in the channel-last layout) and a chunk of rows, walks
the rows in order and keeps the last W-1 input rows (and, in the backward, the last W-1
pre-activation gradients) in registers. Rows are taken 4 at a time: the 4 loads are issued
before any store, so they are in flight together; the 4 steps then walk a window of the 7 rows
r-3..r+3 (a static_range, unrolled at compile time).

Widths 2..4 use the width-4 formulation with the first 4-W taps at weight 0 (KPAD, as in
common.py). Position conventions: row r of batch b; negative rows are the initial state
(or zeros); seq_idx is a per-row scalar.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from fastpath.kernels.causal_conv1d.common import (
    load_seq_tap,
    load_taps,
    load_x_tap,
    next_pow2,
    pre_activation,
    silu_fp32,
    silu_grad_fp32,
    store_dw_partials,
)
from fastpath.kernels.causal_conv1d.launchers import Plan, backward_launcher, forward_launcher


@triton.jit
def _splat(mask_d, r):
    """r broadcast over the channel vector (masks mixing a vector and a scalar condition trip
    the interpreter; on GPU the splat folds away)."""
    return r + tl.zeros(mask_d.shape, dtype=tl.int32)


@triton.jit
def _row(x_base, r, L, mask_d, stride_l):
    return tl.load(x_base + r * stride_l, mask=mask_d & (_splat(mask_d, r) < L),
                   other=0.0).to(tl.float32)


@triton.jit
def _rows4(base, r, L, mask_d, stride_l):
    """Rows r..r+3 as fp32: the 4 loads are issued together, before any store."""
    return (_row(base, r, L, mask_d, stride_l), _row(base, r + 1, L, mask_d, stride_l),
            _row(base, r + 2, L, mask_d, stride_l), _row(base, r + 3, L, mask_d, stride_l))


@triton.jit
def _chunk_halo(x_base, init_base, seq_base, c0, L, mask_d, stride_l, stride_il,
                WIDTH: tl.constexpr, HAS_INIT: tl.constexpr, HAS_SEQ: tl.constexpr):
    """The 3 rows above a chunk starting at row c0 (x as fp32, initial state / zeros for
    negative rows) and their seq_idx, plus seq0 (what the initial state counts as)."""
    xm3 = load_x_tap(x_base, init_base, _splat(mask_d, c0 - 3), L, mask_d, stride_l, stride_il,
                     WIDTH, HAS_INIT)
    xm2 = load_x_tap(x_base, init_base, _splat(mask_d, c0 - 2), L, mask_d, stride_l, stride_il,
                     WIDTH, HAS_INIT)
    xm1 = load_x_tap(x_base, init_base, _splat(mask_d, c0 - 1), L, mask_d, stride_l, stride_il,
                     WIDTH, HAS_INIT)
    seq0 = 0
    sm3 = 0
    sm2 = 0
    sm1 = 0
    if HAS_SEQ:
        if HAS_INIT:
            seq0 = tl.load(seq_base)
        sm3 = load_seq_tap(seq_base, c0 - 3, L, seq0, HAS_INIT)
        sm2 = load_seq_tap(seq_base, c0 - 2, L, seq0, HAS_INIT)
        sm1 = load_seq_tap(seq_base, c0 - 1, L, seq0, HAS_INIT)
    return xm3, xm2, xm1, seq0, sm3, sm2, sm1


@triton.jit
def _chunk_start(X, WEIGHT, BIAS, SEQ, INIT, L, D, rows_per_prog, stride_xb, stride_xd, stride_xl,
                 stride_wd, stride_wk, stride_ib, stride_id, stride_il, stride_sb,
                 WIDTH: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_SEQ: tl.constexpr,
                 HAS_INIT: tl.constexpr, BLOCK_D: tl.constexpr):
    """What a program (channel block, chunk of rows, batch row) of either row kernel starts from:
    its batch row and channels, the x / seq_idx bases, the taps and bias (`load_taps`), its rows
    [c0, c1) and the 3 rows above them (`_chunk_halo`)."""
    pid_b = tl.program_id(2).to(tl.int64)
    offs_d = tl.program_id(0) * BLOCK_D + tl.arange(0, BLOCK_D)
    mask_d = offs_d < D
    x_base = X + pid_b * stride_xb + offs_d * stride_xd
    init_base = INIT + pid_b * stride_ib + offs_d * stride_id
    seq_base = SEQ + pid_b * stride_sb
    taps = load_taps(WEIGHT + offs_d * stride_wd, BIAS, offs_d, mask_d, stride_wk, 4 - WIDTH,
                     HAS_BIAS, BLOCK_D)
    c0 = tl.program_id(1) * rows_per_prog
    c1 = tl.minimum(c0 + rows_per_prog, L)
    xm3, xm2, xm1, seq0, sm3, sm2, sm1 = _chunk_halo(
        x_base, init_base, seq_base, c0, L, mask_d, stride_xl, stride_il, WIDTH, HAS_INIT, HAS_SEQ)
    return (pid_b, offs_d, mask_d, x_base, seq_base, taps, c0, c1,
            xm3, xm2, xm1, seq0, sm3, sm2, sm1)


@triton.jit
def _seq4(seq_base, r, L, seq0, HAS_SEQ: tl.constexpr):
    """seq_idx of rows r..r+3 (all 0 without seq_idx, then unused)."""
    s0 = 0
    s1 = 0
    s2 = 0
    s3 = 0
    if HAS_SEQ:
        s0 = load_seq_tap(seq_base, r, L, seq0, False)
        s1 = load_seq_tap(seq_base, r + 1, L, seq0, False)
        s2 = load_seq_tap(seq_base, r + 2, L, seq0, False)
        s3 = load_seq_tap(seq_base, r + 3, L, seq0, False)
    return s0, s1, s2, s3


@triton.jit
def _tap(xv, s, s_out, w, HAS_SEQ: tl.constexpr):
    if HAS_SEQ:
        return tl.where(s == s_out, xv, 0.0) * w
    return xv * w


@triton.jit
def _fwd_out(out_base, r, L, mask_d, stride_ol, pre, s0,
             SILU: tl.constexpr, HAS_SEQ: tl.constexpr, c1):
    y = pre
    if HAS_SEQ:
        y = tl.where(s0 >= 0, y, 0.0)
    if SILU:
        y = silu_fp32(y)
    tl.store(out_base + r * stride_ol, y.to(out_base.dtype.element_ty),
             mask=mask_d & (_splat(mask_d, r) < c1))


@triton.jit
def _causal_conv1d_fwd_rows_kernel(
    X, WEIGHT, BIAS, SEQ, INIT, OUT,
    L, D, rows_per_prog,
    stride_xb, stride_xd, stride_xl,
    stride_ob, stride_od, stride_ol,
    stride_wd, stride_wk,
    stride_ib, stride_id, stride_il,
    stride_sb,
    WIDTH: tl.constexpr, SILU: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_SEQ: tl.constexpr,
    HAS_INIT: tl.constexpr, BLOCK_D: tl.constexpr,
):
    KPAD: tl.constexpr = 4 - WIDTH
    (pid_b, offs_d, mask_d, x_base, seq_base, taps, c0, c1,
     xm3, xm2, xm1, seq0, sm3, sm2, sm1) = _chunk_start(
        X, WEIGHT, BIAS, SEQ, INIT, L, D, rows_per_prog, stride_xb, stride_xd, stride_xl,
        stride_wd, stride_wk, stride_ib, stride_id, stride_il, stride_sb,
        WIDTH, HAS_BIAS, HAS_SEQ, HAS_INIT, BLOCK_D)
    out_base = OUT + pid_b * stride_ob + offs_d * stride_od
    for r in range(c0, c1, 4):
        x0, x1, x2, x3 = _rows4(x_base, r, L, mask_d, stride_xl)
        s0, s1, s2, s3 = _seq4(seq_base, r, L, seq0, HAS_SEQ)
        xs = (xm3, xm2, xm1, x0, x1, x2, x3)  # the window of rows r-3..r+3
        ss = (sm3, sm2, sm1, s0, s1, s2, s3)
        pre = (pre_activation(xs, ss, 0, taps, _tap, KPAD, HAS_SEQ),
               pre_activation(xs, ss, 1, taps, _tap, KPAD, HAS_SEQ),
               pre_activation(xs, ss, 2, taps, _tap, KPAD, HAS_SEQ),
               pre_activation(xs, ss, 3, taps, _tap, KPAD, HAS_SEQ))
        for j in tl.static_range(4):
            _fwd_out(out_base, r + j, L, mask_d, stride_ol, pre[j], ss[j + 3], SILU, HAS_SEQ, c1)
        xm3, xm2, xm1 = x1, x2, x3
        sm3, sm2, sm1 = s1, s2, s3


@triton.jit
def _grad(dy, pre, s0, SILU: tl.constexpr, HAS_SEQ: tl.constexpr):
    g = dy
    if SILU:
        g = g * silu_grad_fp32(pre)
    if HAS_SEQ:
        g = tl.where(s0 >= 0, g, 0.0)
    return g


@triton.jit
def _bwd_step(
    xs, ss, gm3, gm2, gm1, j: tl.constexpr, r, dy,
    acc_w0, acc_w1, acc_w2, acc_w3, acc_b, taps,
    dx_base, dinit_base, dfin_base, mask_d, L, c0, c1,
    stride_dxl, stride_gl, stride_fl,
    WIDTH: tl.constexpr, SILU: tl.constexpr, HAS_SEQ: tl.constexpr,
    HAS_DFIN: tl.constexpr, HAS_DINIT: tl.constexpr,
):
    """Row r (window row j+3): gradient g(r) of its pre-activation, dW/db partials, and dx of
    row p = r - 3 (window row j; gm3..gm1: g of rows p..p+2)."""
    KPAD: tl.constexpr = 4 - WIDTH
    w0, w1, w2, w3, bias_v = taps
    s0 = ss[j + 3]
    pre = bias_v
    if SILU:
        pre = pre_activation(xs, ss, j, taps, _tap, KPAD, HAS_SEQ)
    g0 = _grad(dy, pre, s0, SILU, HAS_SEQ)
    own = _splat(mask_d, r) < c1  # rows past the chunk belong to the next program's dW
    g_own = tl.where(own, g0, 0.0)
    acc_b += g_own
    acc_w3 += g_own * xs[j + 3]
    acc_w2 += _tap(xs[j + 2], ss[j + 2], s0, g_own, HAS_SEQ)
    if KPAD <= 1:
        acc_w1 += _tap(xs[j + 1], ss[j + 1], s0, g_own, HAS_SEQ)
    if KPAD <= 0:
        acc_w0 += _tap(xs[j], ss[j], s0, g_own, HAS_SEQ)
    # dx(p) = sum_k w[3-k] g(p+k) [seq(p) == seq(p+k)], p = r - 3
    p = r - 3
    dx = gm3 * w3 + _tap(gm2, ss[j + 1], ss[j], w2, HAS_SEQ)
    if KPAD <= 1:
        dx += _tap(gm1, ss[j + 2], ss[j], w1, HAS_SEQ)
    if KPAD <= 0:
        dx += _tap(g0, s0, ss[j], w0, HAS_SEQ)
    if HAS_DFIN:
        f = p - L + (WIDTH - 1)
        fv = _splat(mask_d, f)
        dx += tl.load(dfin_base + f * stride_fl, mask=mask_d & (fv >= 0) & (fv < WIDTH - 1),
                      other=0.0).to(tl.float32)
    pv = _splat(mask_d, p)
    tl.store(dx_base + p * stride_dxl, dx.to(dx_base.dtype.element_ty),
             mask=mask_d & (pv >= c0) & (pv < c1))
    if HAS_DINIT:
        tl.store(dinit_base + (p + WIDTH - 1) * stride_gl, dx.to(dinit_base.dtype.element_ty),
                 mask=mask_d & (pv < 0) & (pv >= 1 - WIDTH))
    return g0, acc_w0, acc_w1, acc_w2, acc_w3, acc_b


@triton.jit
def _causal_conv1d_bwd_rows_kernel(
    X, WEIGHT, BIAS, DOUT, SEQ, INIT, DFIN, DX, DINIT, DW_PART, DB_PART,
    L, D, rows_per_prog, n_chunks,
    stride_xb, stride_xd, stride_xl, stride_ob, stride_od, stride_ol,
    stride_dxb, stride_dxd, stride_dxl, stride_wd, stride_wk, stride_ib, stride_id, stride_il,
    stride_fb, stride_fd, stride_fl, stride_gb, stride_gd, stride_gl, stride_sb,
    WIDTH: tl.constexpr, SILU: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_SEQ: tl.constexpr,
    HAS_INIT: tl.constexpr, HAS_DFIN: tl.constexpr, HAS_DINIT: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    (pid_b, offs_d, mask_d, x_base, seq_base, taps, c0, c1,
     xm3, xm2, xm1, seq0, sm3, sm2, sm1) = _chunk_start(
        X, WEIGHT, BIAS, SEQ, INIT, L, D, rows_per_prog, stride_xb, stride_xd, stride_xl,
        stride_wd, stride_wk, stride_ib, stride_id, stride_il, stride_sb,
        WIDTH, HAS_BIAS, HAS_SEQ, HAS_INIT, BLOCK_D)
    pid_c = tl.program_id(1)
    dout_base = DOUT + pid_b * stride_ob + offs_d * stride_od
    dx_base = DX + pid_b * stride_dxb + offs_d * stride_dxd
    dfin_base = DFIN + pid_b * stride_fb + offs_d * stride_fd
    dinit_base = DINIT + pid_b * stride_gb + offs_d * stride_gd
    zero = tl.zeros((BLOCK_D,), dtype=tl.float32)
    gm3 = zero  # gradients of rows before the chunk never reach a stored dx (or are 0 at < 0)
    gm2 = zero
    gm1 = zero
    acc_w0 = zero
    acc_w1 = zero
    acc_w2 = zero
    acc_w3 = zero
    acc_b = zero
    end = tl.minimum(c1 + 3, L + 3)  # 3 rows past the chunk: dx of its last rows needs g there
    for r in range(c0, end, 4):
        x0, x1, x2, x3 = _rows4(x_base, r, L, mask_d, stride_xl)
        dys = _rows4(dout_base, r, L, mask_d, stride_ol)
        s0, s1, s2, s3 = _seq4(seq_base, r, L, seq0, HAS_SEQ)
        xs = (xm3, xm2, xm1, x0, x1, x2, x3)  # the window of rows r-3..r+3
        ss = (sm3, sm2, sm1, s0, s1, s2, s3)
        for j in tl.static_range(4):  # gm3..gm1: g of window rows j..j+2
            g, acc_w0, acc_w1, acc_w2, acc_w3, acc_b = _bwd_step(
                xs, ss, gm3, gm2, gm1, j, r + j, dys[j], acc_w0, acc_w1, acc_w2, acc_w3, acc_b,
                taps, dx_base, dinit_base, dfin_base, mask_d, L, c0, c1,
                stride_dxl, stride_gl, stride_fl, WIDTH, SILU, HAS_SEQ, HAS_DFIN, HAS_DINIT)
            gm3, gm2, gm1 = gm2, gm1, g
        xm3, xm2, xm1 = x1, x2, x3
        sm3, sm2, sm1 = s1, s2, s3
    store_dw_partials(DW_PART, DB_PART, pid_b * n_chunks + pid_c, offs_d, mask_d, D,
                      acc_w0, acc_w1, acc_w2, acc_w3, acc_b, WIDTH, HAS_BIAS, False)


# ------------------------------------------------------------------ launchers
@functools.lru_cache(maxsize=256)
def _rows_config(batch: int, dim: int, seqlen: int, backward: bool) -> dict:
    block_d = min(512, next_pow2(dim))
    num_warps = max(1, min(4, block_d // 128))
    rows = 128 if backward else 64
    n_d = triton.cdiv(dim, block_d)
    while rows > 16 and n_d * batch * triton.cdiv(seqlen, rows) < 2048:
        rows //= 2
    return {"BLOCK_D": block_d, "ROWS": rows, "num_warps": num_warps}


def _plan(x: torch.Tensor, config: dict | None, backward: bool = False) -> Plan:
    """Grid (channel blocks, chunks of rows, batch), rows per program (a multiple of 4),
    (BLOCK_D,) and num_warps; the backward appends HAS_DINIT in front of BLOCK_D."""
    batch, dim, seqlen = x.shape
    cfg = config or _rows_config(batch, dim, seqlen, backward)
    block_d = cfg["BLOCK_D"]
    rows = max(4, (cfg["ROWS"] + 3) // 4 * 4)
    grid = (triton.cdiv(dim, block_d), max(1, triton.cdiv(seqlen, rows)), batch)
    return grid, (rows,), (block_d,), cfg["num_warps"]


def _bwd_plan(x: torch.Tensor, width: int, has_dinit: bool, config: dict | None) -> Plan:
    grid, sizes, (block_d,), num_warps = _plan(x, config, True)
    return grid, sizes, (has_dinit, block_d), num_warps


# The Triton launch (`kernel[grid](...)`) costs more host time than a B=1 L=4096 conv takes on an
# H200: the second and later calls of a specialisation go through the cached compiled launcher.
causal_conv1d_fwd_rows = forward_launcher(
    _causal_conv1d_fwd_rows_kernel, ("BLOCK_D",), _plan
)
causal_conv1d_bwd_rows = backward_launcher(
    _causal_conv1d_bwd_rows_kernel, ("HAS_DINIT", "BLOCK_D"), _bwd_plan
)
