"""Triton backward of causal depthwise conv1d (+ optional SiLU) in one kernel, deterministic.

A program owns BLOCK_D channels and a chunk of positions, walked in BLOCK_L-row sub-tiles. For
each sub-tile it loads x at offsets -(W-1)..(W-1) once (2W-1 shifted tiles), recomputes the
pre-activations of outputs t..t+W-1, forms g = dy * silu'(pre) there, and produces
dx(t) = sum_j w[W-1-j] g(t+j) (seq_idx-masked) plus the final-state gradient. dW / dbias are
accumulated in registers over the chunk and written as per-chunk fp32 partials, summed
afterwards in a fixed order: the same bits on every run (no atomics), under
torch.use_deterministic_algorithms too. With initial states the walk starts W-1 rows early so
the same code yields dinitial_states.
Tap naming: Xm3..Xp3 = x at t-3..t+3 (only offsets within +-(W-1) are loaded); see
common.py for the width-4 padding (KPAD) convention.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from fastpath.kernels.causal_conv1d.common import (
    load_seq_tap,
    load_taps,
    load_x_tap,
    next_pow2,
    pre_activation,
    silu_grad_fp32,
    store_dw_partials,
)
from fastpath.kernels.causal_conv1d.launchers import Plan, backward_launcher


@triton.jit
def _tap_at(x_base, init_base, seq_base, pos, L, mask_d, seq0, stride_xl, stride_il,
            WIDTH: tl.constexpr, HAS_INIT: tl.constexpr, HAS_SEQ: tl.constexpr):
    """x (fp32, (BLOCK_L, BLOCK_D)) and seq_idx ((BLOCK_L,); `pos` itself without seq_idx, then
    unused) at positions `pos`."""
    xv = load_x_tap(x_base, init_base, pos[:, None], L, mask_d[None, :], stride_xl, stride_il,
                    WIDTH, HAS_INIT)
    s = pos
    if HAS_SEQ:
        s = load_seq_tap(seq_base, pos, L, seq0, HAS_INIT)
    return xv, s


@triton.jit
def _same_seq(xv, s, s_out, HAS_SEQ: tl.constexpr):
    """xv where its seq_idx is the output's (all of it without seq_idx)."""
    if HAS_SEQ:
        xv = tl.where((s == s_out)[:, None], xv, 0.0)
    return xv


@triton.jit
def _masked_tap(xv, s, s_out, w, HAS_SEQ: tl.constexpr):
    return _same_seq(xv, s, s_out, HAS_SEQ) * w[None, :]


@triton.jit
def _grad_at(dout_base, t, j: tl.constexpr, xs, ss, taps, L, mask_d, stride_ol,
             KPAD: tl.constexpr, SILU: tl.constexpr, HAS_SEQ: tl.constexpr):
    """g = dy * silu'(pre) of output t+j (0 outside [0, L) and on padding)."""
    pre = 0.0
    if SILU:
        pre = pre_activation(xs, ss, j, taps, _masked_tap, KPAD, HAS_SEQ)
    pos = t + j
    inside = (pos >= 0) & (pos < L)
    g = tl.load(dout_base + pos[:, None] * stride_ol, mask=inside[:, None] & mask_d[None, :],
                other=0.0).to(tl.float32)
    if SILU:
        g = g * silu_grad_fp32(pre)
    if HAS_SEQ:
        g = tl.where((ss[j + 3] >= 0)[:, None], g, 0.0)
    return g


@triton.jit
def _causal_conv1d_bwd_kernel(
    X, WEIGHT, BIAS, DOUT, SEQ, INIT, DFIN, DX, DINIT, DW_PART, DB_PART,
    L, D, n_iters, n_chunks,
    stride_xb, stride_xd, stride_xl, stride_ob, stride_od, stride_ol,
    stride_dxb, stride_dxd, stride_dxl, stride_wd, stride_wk, stride_ib, stride_id, stride_il,
    stride_fb, stride_fd, stride_fl, stride_gb, stride_gd, stride_gl, stride_sb,
    WIDTH: tl.constexpr, SILU: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_SEQ: tl.constexpr,
    HAS_INIT: tl.constexpr, HAS_DFIN: tl.constexpr, FRONT: tl.constexpr,
    BLOCK_L: tl.constexpr, BLOCK_D: tl.constexpr,
):
    KPAD: tl.constexpr = 4 - WIDTH
    pid_d = tl.program_id(0)
    pid_c = tl.program_id(1)
    pid_b = tl.program_id(2).to(tl.int64)
    offs_d = pid_d * BLOCK_D + tl.arange(0, BLOCK_D)
    mask_d = offs_d < D
    x_base = X + pid_b * stride_xb + offs_d[None, :] * stride_xd
    dout_base = DOUT + pid_b * stride_ob + offs_d[None, :] * stride_od
    dx_base = DX + pid_b * stride_dxb + offs_d[None, :] * stride_dxd
    init_base = INIT + pid_b * stride_ib + offs_d[None, :] * stride_id
    dfin_base = DFIN + pid_b * stride_fb + offs_d[None, :] * stride_fd
    dinit_base = DINIT + pid_b * stride_gb + offs_d[None, :] * stride_gd
    seq_base = SEQ + pid_b * stride_sb
    taps = load_taps(WEIGHT + offs_d * stride_wd, BIAS, offs_d, mask_d, stride_wk, KPAD, HAS_BIAS,
                     BLOCK_D)
    seq0 = 0
    if HAS_SEQ and HAS_INIT:
        seq0 = tl.load(seq_base)

    acc_w0 = tl.zeros((BLOCK_L, BLOCK_D), dtype=tl.float32)
    acc_w1 = tl.zeros((BLOCK_L, BLOCK_D), dtype=tl.float32)
    acc_w2 = tl.zeros((BLOCK_L, BLOCK_D), dtype=tl.float32)
    acc_w3 = tl.zeros((BLOCK_L, BLOCK_D), dtype=tl.float32)
    acc_b = tl.zeros((BLOCK_L, BLOCK_D), dtype=tl.float32)

    row0 = pid_c * n_iters * BLOCK_L - FRONT
    for it in range(n_iters):
        t = row0 + it * BLOCK_L + tl.arange(0, BLOCK_L)
        X0, S0 = _tap_at(x_base, init_base, seq_base, t, L, mask_d, seq0, stride_xl, stride_il,
                         WIDTH, HAS_INIT, HAS_SEQ)
        Xm1, Sm1 = _tap_at(x_base, init_base, seq_base, t - 1, L, mask_d, seq0, stride_xl,
                           stride_il, WIDTH, HAS_INIT, HAS_SEQ)
        Xp1, Sp1 = _tap_at(x_base, init_base, seq_base, t + 1, L, mask_d, seq0, stride_xl,
                           stride_il, WIDTH, HAS_INIT, HAS_SEQ)
        Xm2, Sm2, Xp2, Sp2 = X0, S0, X0, S0  # placeholders where the width has no such tap
        Xm3, Sm3, Xp3, Sp3 = X0, S0, X0, S0
        if WIDTH >= 3:
            Xm2, Sm2 = _tap_at(x_base, init_base, seq_base, t - 2, L, mask_d, seq0, stride_xl,
                               stride_il, WIDTH, HAS_INIT, HAS_SEQ)
            Xp2, Sp2 = _tap_at(x_base, init_base, seq_base, t + 2, L, mask_d, seq0, stride_xl,
                               stride_il, WIDTH, HAS_INIT, HAS_SEQ)
        if WIDTH >= 4:
            Xm3, Sm3 = _tap_at(x_base, init_base, seq_base, t - 3, L, mask_d, seq0, stride_xl,
                               stride_il, WIDTH, HAS_INIT, HAS_SEQ)
            Xp3, Sp3 = _tap_at(x_base, init_base, seq_base, t + 3, L, mask_d, seq0, stride_xl,
                               stride_il, WIDTH, HAS_INIT, HAS_SEQ)
        xs = (Xm3, Xm2, Xm1, X0, Xp1, Xp2, Xp3)
        ss = (Sm3, Sm2, Sm1, S0, Sp1, Sp2, Sp3)

        # g_j: gradient w.r.t. the pre-activation of output t+j, j = 0..W-1
        g0 = _grad_at(dout_base, t, 0, xs, ss, taps, L, mask_d, stride_ol, KPAD, SILU, HAS_SEQ)
        g1 = _grad_at(dout_base, t, 1, xs, ss, taps, L, mask_d, stride_ol, KPAD, SILU, HAS_SEQ)
        dx = g0 * taps[3][None, :] + _masked_tap(g1, Sp1, S0, taps[2], HAS_SEQ)
        for j in tl.static_range(2, WIDTH):  # dx(t) = sum_j w[3-j] g_j (taps[k] = w[k - KPAD])
            g = _grad_at(dout_base, t, j, xs, ss, taps, L, mask_d, stride_ol, KPAD, SILU, HAS_SEQ)
            dx += _masked_tap(g, ss[j + 3], S0, taps[3 - j], HAS_SEQ)
        if HAS_DFIN:
            f = t - L + (WIDTH - 1)
            in_final = (f >= 0) & (f < WIDTH - 1)
            dx += tl.load(dfin_base + f[:, None] * stride_fl,
                          mask=in_final[:, None] & mask_d[None, :], other=0.0).to(tl.float32)
        tl.store(dx_base + t[:, None] * stride_dxl, dx.to(DX.dtype.element_ty),
                 mask=((t >= 0) & (t < L))[:, None] & mask_d[None, :])
        if FRONT > 0:
            tl.store(dinit_base + (t + WIDTH - 1)[:, None] * stride_gl,
                     dx.to(DINIT.dtype.element_ty),
                     mask=(t < 0)[:, None] & mask_d[None, :])

        # weight / bias partials (g0 is already 0 outside [0, L) and on padding)
        acc_b += g0
        acc_w3 += g0 * X0
        acc_w2 += _same_seq(Xm1, Sm1, S0, HAS_SEQ) * g0
        if WIDTH >= 3:
            acc_w1 += _same_seq(Xm2, Sm2, S0, HAS_SEQ) * g0
        if WIDTH >= 4:
            acc_w0 += _same_seq(Xm3, Sm3, S0, HAS_SEQ) * g0

    store_dw_partials(DW_PART, DB_PART, pid_b * n_chunks + pid_c, offs_d, mask_d, D,
                      acc_w0, acc_w1, acc_w2, acc_w3, acc_b, WIDTH, HAS_BIAS, True)


def bwd_config(x: torch.Tensor) -> dict:
    """Tile shape (see fwd_config) with fewer rows: the kernel keeps ~12 tiles live."""
    _, dim, seqlen = x.shape
    if x.stride(1) == 1 or x.stride(2) != 1:
        block_d = min(128, next_pow2(dim))
        block_l = min(16, next_pow2(seqlen))
    else:
        block_l = min(128, next_pow2(seqlen))
        block_d = min(16, next_pow2(dim))
    return {"BLOCK_L": block_l, "BLOCK_D": block_d, "num_warps": 4, "TARGET_PROGRAMS": 2048}


def _plan(x: torch.Tensor, width: int, has_dinit: bool, config: dict | None) -> Plan:
    """Chunks of positions so that about TARGET_PROGRAMS programs run; with initial states the
    walk starts FRONT = W-1 rows early."""
    batch, dim, seqlen = x.shape
    cfg = config or bwd_config(x)
    block_l, block_d = cfg["BLOCK_L"], cfg["BLOCK_D"]
    target = cfg.get("TARGET_PROGRAMS", 2048)
    front = width - 1 if has_dinit else 0
    rows = seqlen + front
    n_d = triton.cdiv(dim, block_d)
    max_chunks = max(1, triton.cdiv(rows, block_l))
    n_chunks = min(max_chunks, max(1, triton.cdiv(target, n_d * batch)))
    n_iters = max(1, triton.cdiv(triton.cdiv(rows, n_chunks), block_l))
    n_chunks = max(1, triton.cdiv(rows, n_iters * block_l))
    return (n_d, n_chunks, batch), (n_iters,), (front, block_l, block_d), cfg.get("num_warps", 4)


causal_conv1d_bwd_triton = backward_launcher(
    _causal_conv1d_bwd_kernel, ("FRONT", "BLOCK_L", "BLOCK_D"), _plan
)
