"""Triton forward of causal depthwise conv1d (+ optional SiLU), any strides, widths 2..4.

One program owns a (BLOCK_L x BLOCK_D) output tile, reads its W shifted input tiles (the W-1
halo rows mostly hit L1/L2), accumulates in fp32 and stores once: bytes ~= read x + write y.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from fastpath.kernels.causal_conv1d.common import (
    load_seq_tap,
    load_weight_tap,
    load_x_tap,
    next_pow2,
    silu_fp32,
)
from fastpath.kernels.causal_conv1d.launchers import Plan, forward_launcher


@triton.jit
def _causal_conv1d_fwd_kernel(
    X, WEIGHT, BIAS, SEQ, INIT, OUT,
    L, D,
    stride_xb, stride_xd, stride_xl,
    stride_ob, stride_od, stride_ol,
    stride_wd, stride_wk,
    stride_ib, stride_id, stride_il,
    stride_sb,
    WIDTH: tl.constexpr,
    SILU: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    HAS_SEQ: tl.constexpr,
    HAS_INIT: tl.constexpr,
    BLOCK_L: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    KPAD: tl.constexpr = 4 - WIDTH
    pid_l = tl.program_id(0)
    pid_d = tl.program_id(1)
    pid_b = tl.program_id(2).to(tl.int64)
    offs_l = pid_l * BLOCK_L + tl.arange(0, BLOCK_L)
    offs_d = pid_d * BLOCK_D + tl.arange(0, BLOCK_D)
    mask_d = offs_d < D
    x_base = X + pid_b * stride_xb + offs_d[None, :] * stride_xd
    init_base = INIT + pid_b * stride_ib + offs_d[None, :] * stride_id
    w_base = WEIGHT + offs_d * stride_wd
    seq_base = SEQ + pid_b * stride_sb

    acc = tl.zeros((BLOCK_L, BLOCK_D), dtype=tl.float32)
    if HAS_BIAS:
        acc += tl.load(BIAS + offs_d, mask=mask_d, other=0.0).to(tl.float32)[None, :]
    seq_t = offs_l  # placeholder, replaced when HAS_SEQ
    seq0 = 0
    if HAS_SEQ:
        seq_t = tl.load(seq_base + offs_l, mask=offs_l < L, other=-1)
        if HAS_INIT:
            seq0 = tl.load(seq_base)
    for k in tl.static_range(4):
        if k >= KPAD:
            pos = offs_l + (k - 3)
            xv = load_x_tap(x_base, init_base, pos[:, None], L, mask_d[None, :], stride_xl,
                            stride_il, WIDTH, HAS_INIT)
            if HAS_SEQ:
                if k < 3:
                    same = load_seq_tap(seq_base, pos, L, seq0, HAS_INIT) == seq_t
                    xv = tl.where(same[:, None], xv, 0.0)
            wk = load_weight_tap(w_base, offs_d, mask_d, k, stride_wk, KPAD)
            acc += xv * wk[None, :]
    if HAS_SEQ:
        acc = tl.where((seq_t >= 0)[:, None], acc, 0.0)
    if SILU:
        acc = silu_fp32(acc)
    out_ptrs = OUT + pid_b * stride_ob + offs_d[None, :] * stride_od + offs_l[:, None] * stride_ol
    tl.store(out_ptrs, acc.to(OUT.dtype.element_ty),
             mask=(offs_l < L)[:, None] & mask_d[None, :])


def fwd_config(x: torch.Tensor) -> dict:
    """Tile shape: 16-byte vectors along the unit-stride axis, ~4K elements per program."""
    _, dim, seqlen = x.shape
    if x.stride(1) == 1 or x.stride(2) != 1:  # channel-last (or odd strides): vectorize along D
        block_d = min(128, next_pow2(dim))
        block_l = min(32, next_pow2(seqlen))
    else:  # contiguous (B, D, L): vectorize along L
        block_l = min(256, next_pow2(seqlen))
        block_d = min(16, next_pow2(dim))
    return {"BLOCK_L": block_l, "BLOCK_D": block_d, "num_warps": 4}


def _plan(x: torch.Tensor, config: dict | None) -> Plan:
    batch, dim, seqlen = x.shape
    cfg = config or fwd_config(x)
    block_l, block_d = cfg["BLOCK_L"], cfg["BLOCK_D"]
    grid = (triton.cdiv(seqlen, block_l), triton.cdiv(dim, block_d), batch)
    return grid, (), (block_l, block_d), cfg.get("num_warps", 4)


causal_conv1d_fwd_triton = forward_launcher(_causal_conv1d_fwd_kernel, ("BLOCK_L", "BLOCK_D"), _plan)
