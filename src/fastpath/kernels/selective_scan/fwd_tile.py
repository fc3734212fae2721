"""Triton forward of Mamba-1's selective scan: time walked in registers, inputs moved as tiles.

Why. The time-sequential forward (fwd_seq.py) loads u, delta, z and stores out one step at
a time: for a tensor contiguous along L that is one element per 128-byte line per lane, 32 lines
a warp instruction, every step (the load/store unit, not the SFU, then bounds it). Here each
program still owns (one batch row, BLOCK_D channels of one B/C group) and carries its float32
state h (N, BLOCK_D) through all L steps, but the sequence goes in chunks of T steps:

- a tensor contiguous along L (delta in transformers' prefill; out always) moves as a
  (BLOCK_D, T) tile, coalesced along L: with T = 16 bytes / element size (8 for bf16) Triton's
  coalescing gives each lane one channel's T steps as one 16-byte vector, the same lane that
  owns that channel's state, so taking step k's column is a register pick (`_column`: a
  one-hot reduction whose mask is a compile-time constant per register) and the T outputs are
  assembled the same way and stored as one vector per lane;
- a tensor contiguous along channels (u and z in transformers' prefill are channel-last views)
  is read one step at a time as a (BLOCK_D,) row, which is already coalesced (`*_TILE` False:
  chosen per tensor from its strides by `tile_along_time`);
- the T steps of a chunk are unrolled (tl.static_range), so the loads of B_t / C_t and the
  next steps' exponentials are independent of the one-FMA recurrence and can be interleaved.

softplus(delta + bias) is taken once per (channel, step), on the tile when delta is one, with
its logarithm on the SFU. Per state element and step: one exp2 (the SFU's, or with POLY_N > 0 a
degree-5 polynomial on the FMA pipe for the first POLY_N states of each channel: `exp2_poly`),
an FMUL, two FMAs. B and C are read as a float32 copy (converted once, not in every lane).

Time segments (config SEGMENTS; batch 1 gives too few programs to hide a walk's load latency:
one warp per SM sub-partition on an H100 at D = 8192): a states pass walks segments 0 .. S-2
from a zero state (end state s_k, decay product P_k = exp(A * sum delta')), a small combine
forms the state entering each segment (H_0 = 0, H_{k+1} = P_k H_k + s_k), and the outputs pass
walks every segment from H_k: about (2S - 1) / S times the exponentials, S times the programs.

Numerics equal the chunked and seq kernels' (float32 state and sums; masked steps past L have
delta' = 0: a = 1, x = 0). Only (out, last_state) are produced; the backward recomputes its own
chunk states (fwd_chunked.chunk_states), so this serves training too. The default forward
(FASTPATH_SSCAN_FWD unset or tile; tile-poly takes the SFU's exponentials: interface.py).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from torch import Tensor

from fastpath.kernels.dispatch import triton_interpreter_on
from fastpath.kernels.selective_scan.common_carry import carry_walk
from fastpath.kernels.selective_scan.fwd_chunked import (
    LN2,
    LOG2E,
    LOG2E_LO,
    MAGIC_BITS,
    ROUND_MAGIC,
    bc_row,
    blocking,
    channel_block,
    exp_precise,
    exp_split,
    per_channel,
    softplus,
    store_rounded,
)

# (BLOCK_D, T, num_warps, POLY_N, AUX_POLY, STAGES): channels per program (0: `auto_block_d`), steps per
# tile (0: 16 bytes of the input dtype, one vector a lane; a longer tile spreads T over lanes
# and its columns then need shuffles), warps, states per channel whose exp2 is the FMA
# polynomial, and which per-(channel, step) exponentials take it too (0 none, 1 softplus', 2
# softplus' and SiLU's), and the chunk loop's software-pipelining depth (0: a plain loop; k >= 2:
# `tl.range(num_stages=k)`, so Triton may issue the loads of later chunks while this one's steps
# run), and optionally SEGMENTS: time cut into that many segments walked by their own programs
# (1, the default when left out: none; 0: `time_segments` picks; see selective_scan_fwd_tile_triton)
# and PRECISE (0, the default when left out: exponentials on the SFU as below; 1: the chunked
# kernel's numerics, softplus and every decay by fwd_chunked.exp_precise on the FMA pipe: with the
# SFU's exp2, mamba_ssm's own test_selective_scan found a float32 last state 2-3.4x further from
# float64 than its reference's in 12 of 4,516 cases, each with time-invariant B and C, softplus
# and float32 weights, on an H100; 2: that softplus, the decays by `exp_split`, the SFU's exp2
# with the argument's rounding error put back by two FMAs: faster (4.7 against 7.2 ms at (8, 4096)
# on an H200) but it fails that bar, up to 6.3x at L = 1134: likely ex2.approx's own error, which
# the two FMAs do not touch, compounding over a long decay; 3: PRECISE 2, and at the end of each
# chunk of T steps the entering state's share put back with one exp_precise(A sum delta') in
# place of the product of the T fast decays: an approximation's error then acts over T steps,
# not the sequence; ~1 FMA a state and step plus one exp_precise a state per chunk. Not yet run
# on a GPU). POLY_N rows take the polynomial in place of the SFU's exp2 under PRECISE 2 and 3 too.
# BLOCK_D = 32 * num_warps puts one channel (all N states) on each lane;
# 16 per warp splits N over two lanes (twice the programs, for batch 1; a shuffle per step for
# the sum over N).
# Static count of the chunk loop in sm_90 SASS (Triton 3.9, bf16, transformers' layouts, N = 16,
# no spills), per step and warp of 32 channels: issued instructions vs SFU cycles (8 a warp
# instruction: 16 state exp2, softplus' exp2 and lg2, SiLU's exp2 and rcp):
#   AUX_POLY 0: 139 vs 160 (SFU-bound: ~1.3 ms at (8, 4096) at the H200's full SFU rate)
#   AUX_POLY 1: 149 vs 152 (balanced: the "tile-poly" default)
#   AUX_POLY 2: 162 vs 144;  POLY_N 2 with AUX_POLY 2: 182 vs 128 (issue-bound: worse)
# The defaults: one channel a lane, the chunk loop staged 3 deep, time segments picked by
# `time_segments` (none at (8, 4096), 8 at (1, 4096) on 132 SMs): the fastest layout measured on
# an H100 at both sizes; and PRECISE 1, the accuracy mamba_ssm's tests ask for, at about twice
# the SFU exponentials' time (7.2 against 3.5 ms at (8, 4096) on an H200; BENCHMARKS.md).
TILE_CONFIG = (32, 0, 1, 0, 0, 3, 0, 1)
TILE_POLY_CONFIG = (32, 0, 1, 0, 1, 3, 0)
# alternatives timed by benchmarks/selective_scan.py --fwd-variants tile,tile-poly --fwd-configs
TILE_SWEEP = ((32, 0, 1, 0, 0, 0), (16, 0, 1, 0, 0, 0), (64, 0, 2, 0, 0, 0),
              (128, 0, 4, 0, 0, 0), (8, 0, 1, 0, 0, 0), (32, 16, 1, 0, 0, 0),
              (0, 0, 1, 0, 0, 2), (0, 0, 1, 0, 0, 3), (8, 0, 1, 0, 0, 2), (0, 16, 1, 0, 0, 2),
              (0, 0, 1, 0, 0, 3, 0), (32, 0, 1, 0, 0, 3, 0), (0, 0, 1, 0, 0, 3, 4),
              (32, 0, 1, 0, 0, 2, 8), (32, 0, 1, 0, 0, 3, 0, 1), (32, 0, 1, 0, 0, 3, 0, 2),
              (32, 0, 1, 0, 0, 3, 0, 3), (16, 0, 1, 4, 0, 0, 3, 3))
TILE_POLY_SWEEP = ((32, 0, 1, 0, 1, 0), (16, 0, 1, 0, 1, 0), (32, 0, 1, 0, 2, 0),
                   (32, 0, 1, 2, 1, 0), (32, 0, 1, 4, 0, 0), (0, 0, 1, 0, 1, 2),
                   (8, 0, 1, 0, 1, 2))

# 2^f on [-1/2, 1/2], degree 5, constant term 1 (exact at integers), the rest fitted for minimax
# relative error (max 1.9e-7 evaluated in float32: about MUFU.EX2's ~2 ulp); lowest degree first.
P1 = tl.constexpr(0.6931470036506653)
P2 = tl.constexpr(0.24022242426872253)
P3 = tl.constexpr(0.05550733581185341)
P4 = tl.constexpr(0.009671512991189957)
P5 = tl.constexpr(0.001326472731307149)


@triton.jit
def exp2_poly(x):
    """2^x on the FMA/ALU pipes, for float32 x: x = j + f (j = round(x), |f| <= 1/2), 2^f by
    the polynomial, j added to the exponent bits. x is clamped to [-127, 128] (2^-127 -> 0,
    2^128 -> inf, as the SFU's flush-to-zero exp2 gives); NaN stays NaN."""
    xc = tl.minimum(tl.maximum(x, -127.0), 128.0)
    r = xc + ROUND_MAGIC
    j = r.to(tl.int32, bitcast=True) - MAGIC_BITS
    f = xc - (r - ROUND_MAGIC)
    p = P5 * f + P4
    p = p * f + P3
    p = p * f + P2
    p = p * f + P1
    p = p * f + 1.0
    y = (p.to(tl.int32, bitcast=True) + (j << 23)).to(tl.float32, bitcast=True)
    return tl.where(x == x, y, x)


@triton.jit
def _exp2_mix(x, offs_n, POLY_N: tl.constexpr):
    """exp2 of an (N, BLOCK_D) tile: the first POLY_N state rows by exp2_poly, the rest on the
    SFU (when a lane holds all N rows of its channel the row index is a constant per register,
    so each register computes only its branch)."""
    if POLY_N == 0:
        return tl.exp2(x)
    else:
        return tl.where((offs_n < POLY_N)[:, None], exp2_poly(x), tl.exp2(x))


@triton.jit
def _exp_split_mix(x, offs_n, POLY_N: tl.constexpr):
    """fwd_chunked.exp_split (e^x as 2^th (1 + tlo ln 2), th = x log2 e rounded, tlo its
    rounding error) with the first POLY_N state rows' 2^th by exp2_poly: POLY_N 0 is exp_split.
    The polynomial's error is deterministic, as ex2.approx's is on a GPU, so under the CPU
    interpreter (whose exp2 is numpy's) the rows it takes show what compounding does."""
    if POLY_N == 0:
        return exp_split(x)
    else:
        th = x * LOG2E
        tlo = tl.fma(x, LOG2E_LO, tl.fma(x, LOG2E, -th))
        tlo = tl.where(tl.abs(th) < 256.0, tlo, 0.0)
        return _exp2_mix(th, offs_n, POLY_N) * tl.fma(tlo, LN2, 1.0)


@triton.jit
def _exp2_aux(x, POLY: tl.constexpr):
    """exp2 of a per-(channel, step) value: on the SFU (flush-to-zero) or the FMA polynomial."""
    if POLY:
        return exp2_poly(x)
    else:
        return tl.exp2(x)


@triton.jit
def _log2_fast(x, ASM: tl.constexpr):
    """log2 of x >= 1 on the SFU (lg2.approx: |error| < 2^-22 relative) on the GPU; Triton's
    (a 12-term polynomial) under the interpreter, which runs no PTX."""
    if ASM:
        return tl.inline_asm_elementwise("lg2.approx.ftz.f32 $0, $1;", "=f,f", [x],
                                         dtype=tl.float32, is_pure=True, pack=1)
    else:
        return tl.log2(x)


@triton.jit
def softplus_fast(v, ASM: tl.constexpr, AUX_POLY: tl.constexpr):
    """softplus(v) = log(1 + e^v) in float32, the same branches as fwd_chunked.softplus (identity
    above 20; log1p's series below e^v = 1/16, where 1 + e would drop e's low bits), with the
    exponential by exp2 and the logarithm on the SFU: about a third of its instructions."""
    # NaN propagated through the clamp (a plain minimum returns 20 for NaN: delta' would be 20)
    e = _exp2_aux(tl.minimum(v, 20.0, propagate_nan=tl.PropagateNan.ALL) * LOG2E, AUX_POLY >= 1)
    series = e * (1.0 - e * (0.5 - e * (0.3333333333333333 - e * (0.25 - e * (
        0.2 - e * 0.16666666666666666)))))
    logged = _log2_fast(1.0 + e, ASM) * LN2
    return tl.where(v > 20.0, v, tl.where(e < 0.0625, series, logged))


@triton.jit
def silu_fast(z, AUX_POLY: tl.constexpr):
    """z * sigmoid(z) = z / (1 + 2^(-z log2 e)) (an approximate division: div.full)."""
    return tl.fdiv(z, 1.0 + _exp2_aux(-z * LOG2E, AUX_POLY >= 2))


@triton.jit
def _column(tile, sel):
    """Column k of a (BLOCK_D, T) float32 tile, sel = (arange(T) == k)[None, :]: exact (adding
    -0.0 changes nothing) and, with T in-thread, folded by the compiler to a register pick."""
    return tl.sum(tl.where(sel, tile, -0.0), axis=1)


@triton.jit
def _tile(P, row, offs_d, md, offs_t, L, s_d, s_l, MASK_D: tl.constexpr, MASK_T: tl.constexpr):
    """(BLOCK_D, T) float32 tile of a (batch, dim, L) tensor (0 where masked: only a partial
    channel block, MASK_D, or the last partial chunk, MASK_T, carries a mask)."""
    ptrs = P + row + offs_d[:, None] * s_d + offs_t[None, :] * s_l
    if MASK_T:
        return tl.load(ptrs, mask=md[:, None] & (offs_t < L)[None, :], other=0.0).to(tl.float32)
    elif MASK_D:
        return tl.load(ptrs, mask=md[:, None], other=0.0).to(tl.float32)
    else:
        return tl.load(ptrs).to(tl.float32)


@triton.jit
def _row(P, row, offs_d, md, t, L, s_d, s_l, MASK_D: tl.constexpr, MASK_T: tl.constexpr):
    """(BLOCK_D,) float32 values of step t of a (batch, dim, L) tensor (0 where masked)."""
    ptrs = P + row + offs_d * s_d + t * s_l
    if MASK_T:  # a tensor mask: the interpreter's t is a Python int
        return tl.load(ptrs, mask=md & ((offs_d * 0 + t) < L), other=0.0).to(tl.float32)
    elif MASK_D:
        return tl.load(ptrs, mask=md, other=0.0).to(tl.float32)
    else:
        return tl.load(ptrs).to(tl.float32)


@triton.jit
def _bc_vec(M, row, offs_n, fixed, t, L, VAR: tl.constexpr, BLOCK_N: tl.constexpr,
            MASK_T: tl.constexpr):
    """B_t or C_t as an (N, BLOCK_D)-broadcastable float32 tile: the group's BLOCK_N values of
    step t (n_fastest_f32's padded float32 copy: L stride BLOCK_N, no N mask; 0 past L) when
    time-varying, else the time-invariant (N, BLOCK_D) tile."""
    if VAR:
        ptrs = M + row + t * BLOCK_N + offs_n
        if MASK_T:
            return tl.load(ptrs, mask=(offs_n * 0 + t) < L, other=0.0)[:, None]
        else:
            return tl.load(ptrs)[:, None]
    else:
        return fixed


@triton.jit
def _bc_fixed(M, offs_d, offs_n, mdn, s_d, s_n, VAR: tl.constexpr):
    """A time-invariant (dim, N) B or C as an (N, BLOCK_D) float32 tile (0.0 when varying)."""
    if VAR:
        return 0.0
    else:
        return tl.load(M + offs_n[:, None] * s_n + offs_d[None, :] * s_d, mask=mdn,
                       other=0.0).to(tl.float32)


@triton.jit
def _delta_prime(dt, bias, keep, HAS_DBIAS: tl.constexpr, SOFTPLUS: tl.constexpr,
                 ASM: tl.constexpr, AUX_POLY: tl.constexpr, MASK_T: tl.constexpr,
                 PRECISE: tl.constexpr):
    """softplus(delta + bias) in float32 (or delta + bias); in the last partial chunk 0 past L
    (a = 1, x = 0: the state passes unchanged). PRECISE 1, 2 or 3: the chunked kernel's ~1 ulp
    softplus (once per channel and step: cheap beside the N decays)."""
    if HAS_DBIAS:
        dt += bias
    if SOFTPLUS:
        if PRECISE:
            dt = softplus(dt)
        else:
            dt = softplus_fast(dt, ASM, AUX_POLY)
    if MASK_T:
        dt = tl.where(keep, dt, 0.0)
    return dt


@triton.jit
def _decay(x, offs_n, POLY_N: tl.constexpr, PRECISE: tl.constexpr):
    """exp(delta' A) of an (N, BLOCK_D) tile from x = delta' A2: PRECISE 1 exp_precise, 2 and 3
    exp_split (A2 = A for these), 0 exp2 (A2 = A log2 e; the SFU's); POLY_N rows by the
    polynomial in place of the SFU's exp2, for 0, 2 and 3."""
    if PRECISE == 1:
        return exp_precise(x)
    elif PRECISE >= 2:
        return _exp_split_mix(x, offs_n, POLY_N)
    else:
        return _exp2_mix(x, offs_n, POLY_N)


@triton.jit
def _chunk(h, t0, U, DELTA, Z, B, C, OUT, L, u_row, d_row, z_row, o_row, B_row, C_row,
           offs_d, md, offs_n, A2, Dv, bias, Bfix, Cfix,
           s_ud, s_ul, s_dd, s_dl, s_zd, s_zl, s_od, s_ol,
           HAS_D: tl.constexpr, HAS_Z: tl.constexpr, HAS_DBIAS: tl.constexpr,
           SOFTPLUS: tl.constexpr, B_VAR: tl.constexpr, C_VAR: tl.constexpr,
           U_TILE: tl.constexpr, DT_TILE: tl.constexpr, Z_TILE: tl.constexpr, RNE: tl.constexpr,
           BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, T: tl.constexpr, POLY_N: tl.constexpr,
           AUX_POLY: tl.constexpr, ASM: tl.constexpr, MASK_D: tl.constexpr,
           MASK_T: tl.constexpr, OUTPUT: tl.constexpr, PRECISE: tl.constexpr):
    """Steps t0 .. t0 + T - 1: h carried through them, their outputs stored as one tile (not
    computed without OUTPUT); returns (h, the chunk's sum of delta' per channel)."""
    offs_k = tl.arange(0, T)
    offs_t = t0 + offs_k
    mdt = md[:, None] & (offs_t < L)[None, :]
    if U_TILE:
        u_tile = _tile(U, u_row, offs_d, md, offs_t, L, s_ud, s_ul, MASK_D, MASK_T)
    if DT_TILE:
        bias_col = 0.0
        if HAS_DBIAS:
            bias_col = bias[:, None]
        d_tile = _delta_prime(_tile(DELTA, d_row, offs_d, md, offs_t, L, s_dd, s_dl, MASK_D,
                                    MASK_T), bias_col, mdt, HAS_DBIAS, SOFTPLUS, ASM, AUX_POLY,
                              MASK_T, PRECISE)
    if HAS_Z and Z_TILE and OUTPUT:
        gate_tile = silu_fast(_tile(Z, z_row, offs_d, md, offs_t, L, s_zd, s_zl, MASK_D, MASK_T),
                              AUX_POLY)
    o = tl.zeros((BLOCK_D, T), dtype=tl.float32)
    dsum = tl.zeros((BLOCK_D,), dtype=tl.float32)
    if PRECISE == 3:  # the state entering the chunk and the product of the chunk's fast decays
        h_in = h
        prod = tl.full(h.shape, 1.0, tl.float32)
    for k in tl.static_range(T):
        sel = (offs_k == k)[None, :]
        t = t0 + k
        if U_TILE:
            uk = _column(u_tile, sel)
        else:
            uk = _row(U, u_row, offs_d, md, t, L, s_ud, s_ul, MASK_D, MASK_T)
        if DT_TILE:
            dk = _column(d_tile, sel)
        else:
            dk = _delta_prime(_row(DELTA, d_row, offs_d, md, t, L, s_dd, s_dl, MASK_D, MASK_T),
                              bias, md & ((offs_d * 0 + t) < L), HAS_DBIAS, SOFTPLUS, ASM,
                              AUX_POLY, MASK_T, PRECISE)
        Bt = _bc_vec(B, B_row, offs_n, Bfix, t, L, B_VAR, BLOCK_N, MASK_T)
        Ct = _bc_vec(C, C_row, offs_n, Cfix, t, L, C_VAR, BLOCK_N, MASK_T)
        dA = _decay(dk[None, :] * A2, offs_n, POLY_N, PRECISE)
        h = dA * h + (dk * uk)[None, :] * Bt
        dsum += dk
        if PRECISE == 3:
            prod = dA * prod
        if OUTPUT:
            y = tl.sum(h * Ct, axis=0)
            if HAS_D:
                y += Dv * uk
            if HAS_Z:
                if Z_TILE:
                    y = y * _column(gate_tile, sel)
                else:
                    y = y * silu_fast(_row(Z, z_row, offs_d, md, t, L, s_zd, s_zl, MASK_D,
                                           MASK_T), AUX_POLY)
            o = tl.where(sel, y[:, None], o)
    if PRECISE == 3:
        # what the entering state carries out of the chunk: the product of the fast decays put
        # back by one precise exp(A sum delta'), so a decay's approximation error acts over T
        # steps only, never compounding over the sequence (the chunk's outputs keep it)
        h += (exp_precise(dsum[None, :] * A2) - prod) * h_in
    if OUTPUT:
        ptrs = OUT + o_row + offs_d[:, None] * s_od + offs_t[None, :] * s_ol
        if MASK_T:
            store_rounded(ptrs, o, mdt, RNE)
        elif MASK_D:
            store_rounded(ptrs, o, md[:, None], RNE)
        else:
            store_rounded(ptrs, o, None, RNE)
    return h, dsum


# A and LAST unspecialised (no 16-byte alignment promise), as in fwd_seq: a vectorised
# access would make Triton spread N across lanes and shuffle the sum over N every step.
@triton.jit(do_not_specialize=["A", "LAST"])
def _fwd_tile_kernel(
    U, DELTA, A, B, C, D, Z, DBIAS, OUT, LAST, SBUF, PBUF,
    L, dim, N, dim_per_group, dpg_B, dpg_C, n_blocks, n_seg, seg_chunks, grid_seg,
    s_ub, s_ud, s_ul, s_db, s_dd, s_dl, s_ad, s_an, s_Bb, s_Bg, s_Bn, s_Cb, s_Cg, s_Cn,
    s_zb, s_zd, s_zl, s_ob, s_od, s_ol,
    HAS_D: tl.constexpr, HAS_Z: tl.constexpr, HAS_DBIAS: tl.constexpr, SOFTPLUS: tl.constexpr,
    B_VAR: tl.constexpr, C_VAR: tl.constexpr, U_TILE: tl.constexpr, DT_TILE: tl.constexpr,
    Z_TILE: tl.constexpr, RNE: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
    T: tl.constexpr, POLY_N: tl.constexpr, AUX_POLY: tl.constexpr, ASM: tl.constexpr,
    MASK_D: tl.constexpr, STAGES: tl.constexpr, MODE: tl.constexpr, PRECISE: tl.constexpr,
):
    """One program: (BLOCK_D channels of one group, batch row b, time segment seg of seg_chunks
    chunks; axis 1 is b * grid_seg + seg). MODE 0: the whole sequence from a zero state (one
    segment), outputs and the last state. MODE 1 (states pass, segments 0 .. n_seg - 2): from a
    zero state, no outputs; the segment's end state to SBUF[b, seg] and its decay product
    exp(A * sum delta') to PBUF[b, seg]. MODE 2 (outputs pass): from the state entering the
    segment (SBUF[b, seg], written by _seg_combine_kernel), outputs; the last segment writes the
    last state. Buffers are float32 (batch, n_seg, N, dim)."""
    b = (tl.program_id(1) // grid_seg).to(tl.int64)
    seg = tl.program_id(1) % grid_seg
    g, offs_d, md = channel_block(tl.program_id(0), dim_per_group, n_blocks, BLOCK_D)
    offs_n = tl.arange(0, BLOCK_N)
    mdn = (offs_n < N)[:, None] & md[None, :]
    A2 = tl.load(A + offs_n[:, None] * s_an + offs_d[None, :] * s_ad, mask=mdn,
                 other=0.0).to(tl.float32)
    if not PRECISE:
        A2 = A2 * LOG2E  # for exp2
    Dv = 0.0
    if HAS_D:
        Dv = tl.load(D + offs_d, mask=md, other=0.0).to(tl.float32)
    bias = 0.0
    if HAS_DBIAS:
        bias = tl.load(DBIAS + offs_d, mask=md, other=0.0).to(tl.float32)
    Bfix = _bc_fixed(B, offs_d, offs_n, mdn, s_Bg, s_Bn, B_VAR)
    Cfix = _bc_fixed(C, offs_d, offs_n, mdn, s_Cg, s_Cn, C_VAR)
    u_row = b * s_ub
    d_row = b * s_db
    z_row = b * s_zb
    o_row = b * s_ob
    B_row = bc_row(b, g, dim_per_group, dpg_B, s_Bb, s_Bg)
    C_row = bc_row(b, g, dim_per_group, dpg_C, s_Cb, s_Cg)
    state = ((b * n_seg + seg) * N + offs_n[:, None]) * dim + offs_d[None, :]
    if MODE == 2:
        h = tl.load(SBUF + state, mask=mdn, other=0.0)
    else:
        h = tl.zeros((BLOCK_N, BLOCK_D), dtype=tl.float32)
    dsum = tl.zeros((BLOCK_D,), dtype=tl.float32)
    n_full = L // T
    c_end = tl.minimum((seg + 1) * seg_chunks, n_full)
    # whole chunks without time masks, then (last segment only) the partial one with them
    for c in tl.range(seg * seg_chunks, c_end, num_stages=STAGES if STAGES >= 2 else None):
        h, ds = _chunk(h, c * T, U, DELTA, Z, B, C, OUT, L, u_row, d_row, z_row, o_row, B_row,
                       C_row, offs_d, md, offs_n, A2, Dv, bias, Bfix, Cfix,
                       s_ud, s_ul, s_dd, s_dl, s_zd, s_zl, s_od, s_ol,
                       HAS_D, HAS_Z, HAS_DBIAS, SOFTPLUS, B_VAR, C_VAR, U_TILE, DT_TILE, Z_TILE,
                       RNE, BLOCK_D, BLOCK_N, T, POLY_N, AUX_POLY, ASM, MASK_D, False, MODE != 1,
                       PRECISE)
        dsum += ds
    last_seg = seg == n_seg - 1
    if MODE != 1:  # the states pass never runs the last segment
        if last_seg & (n_full * T < L):
            h, ds = _chunk(h, n_full * T, U, DELTA, Z, B, C, OUT, L, u_row, d_row, z_row, o_row,
                           B_row, C_row, offs_d, md, offs_n, A2, Dv, bias, Bfix, Cfix,
                           s_ud, s_ul, s_dd, s_dl, s_zd, s_zl, s_od, s_ol,
                           HAS_D, HAS_Z, HAS_DBIAS, SOFTPLUS, B_VAR, C_VAR, U_TILE, DT_TILE,
                           Z_TILE, RNE, BLOCK_D, BLOCK_N, T, POLY_N, AUX_POLY, ASM, MASK_D, True,
                           True, PRECISE)
        on_last = (offs_n[:, None] * 0 + seg) == n_seg - 1  # a tensor mask (the interpreter)
        tl.store(LAST + (b * N + offs_n[:, None]) * dim + offs_d[None, :], h, mask=mdn & on_last)
    else:
        tl.store(SBUF + state, h, mask=mdn)
        if PRECISE == 3:
            carry = exp_precise(dsum[None, :] * A2)
        else:
            carry = _decay(dsum[None, :] * A2, offs_n, 0, PRECISE)
        tl.store(PBUF + state, carry, mask=mdn)


@triton.jit
def _seg_combine_kernel(SBUF, PBUF, n_seg, n_elems, BLOCK: tl.constexpr, K: tl.constexpr):
    """Between the two passes, per (block of N x dim state elements, batch row): H_0 = 0,
    H_{s+1} = P_s H_s + S_s, written over S (the state entering each segment; the last segment
    has no states-pass entry to read): common_carry.carry_walk."""
    b = tl.program_id(1).to(tl.int64)
    e = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    h = tl.zeros((BLOCK,), dtype=tl.float32)
    carry_walk(PBUF, SBUF, b * n_seg * n_elems, e, e < n_elems, h, 0, 1, n_seg - 1, n_seg,
               n_elems, K)


def n_fastest_f32(M: Tensor, block_n: int) -> Tensor:
    """A time-varying B or C, (batch, G, N, L), as a float32 (batch, G, L, block_n) copy, N
    zero-padded to block_n: each lane reads step t's values as unmasked 16-byte vectors at a
    compile-time stride, converted once here instead of in every lane at every step
    (batch*G*L*block_n floats: 2 MB at (8, 4096), N = 16). Time-invariant (dim, N) stays."""
    if M.dim() == 2:
        return M
    if M.dim() == 3:
        M = M.unsqueeze(1)
    nstate = M.shape[-2]
    shape = (*M.shape[:-2], M.shape[-1], block_n)
    out = (torch.empty if nstate == block_n else torch.zeros)(shape, dtype=torch.float32,
                                                             device=M.device)
    out[..., :nstate].copy_(M.transpose(-2, -1))
    return out


def bc_args(M: Tensor, block_n: int) -> tuple[Tensor, bool, int, tuple[int, int, int]]:
    """(tensor, time-varying, groups, (batch, group, N) strides) of B or C for the kernel: a
    time-varying one as n_fastest_f32's copy (L stride block_n, N stride 1: constexprs in the
    kernel), a time-invariant (dim, N) one as given (the group stride is its channel stride)."""
    if M.dim() == 2:
        return M, False, 1, (0, M.stride(0), M.stride(1))
    M = n_fastest_f32(M, block_n)
    return M, True, M.shape[1], (M.stride(0), M.stride(1), 1)


def auto_block_d(batch: int, dim: int, device: torch.device) -> int:
    """32 channels a warp (one lane per channel) when that gives every SM sub-partition (4 an SM)
    at least two warps; else 16 (N over two lanes: twice the warps, e.g. batch 1 at D = 8192 has
    256 warps of 32 channels for an H200's 528 sub-partitions)."""
    sms = torch.cuda.get_device_properties(device).multi_processor_count if (
        device.type == "cuda") else 132
    return 32 if batch * dim // 32 >= 2 * 4 * sms else 16


def full_config(cfg: tuple[int, ...]) -> tuple[int, ...]:
    """A config of 5 to 8 numbers with the optional ones filled in: STAGES 0 (a plain loop),
    SEGMENTS 1 (none), PRECISE 0 (the SFU's exponentials)."""
    return tuple(cfg) + (0, 1, 0)[len(cfg) - 5:]


def tile_along_time(t: Tensor) -> bool:
    """Whether a (batch, dim, L) input is read as (channels, T) tiles (its L stride is the
    smaller: contiguous along time) or one step at a time (channel-last views, whose rows of
    channels are the contiguous ones)."""
    _, dim, length = t.shape
    s_d, s_l = abs(t.stride(1)) if dim > 1 else 2**62, abs(t.stride(2)) if length > 1 else 2**62
    return s_l <= s_d


def steps_per_tile(tile: int, *tensors: Tensor | None) -> int:
    """T: as given, or 16 bytes of the widest of the tiled inputs' dtypes (one vector a lane)."""
    if tile:
        return tile
    size = max([t.element_size() for t in tensors if t is not None] or [2])
    return max(1, 16 // size)


def selective_scan_fwd_tile_triton(u: Tensor, delta: Tensor, A: Tensor, B: Tensor, C: Tensor,
                                   D: Tensor | None, z: Tensor | None,
                                   delta_bias: Tensor | None, delta_softplus: bool,
                                   config: tuple[int, ...] | None = None
                                   ) -> tuple[Tensor, Tensor]:
    """Same contract as fwd_chunked.selective_scan_fwd_triton: (out in u's dtype, contiguous
    (batch, dim, L); last_state float32 (batch, dim, N)); B/C each (dim, N), (batch, N, L) or
    (batch, G, N, L), any strides. config: (BLOCK_D, T, num_warps, POLY_N, AUX_POLY[, STAGES[,
    SEGMENTS[, PRECISE]]]); None: TILE_CONFIG."""
    batch, dim, length = u.shape
    nstate = A.shape[1]
    out = torch.empty(u.shape, dtype=u.dtype, device=u.device)
    if not out.numel():
        return out, torch.empty((batch, dim, nstate), dtype=torch.float32, device=u.device)
    cfg = tuple(config or TILE_CONFIG)
    if not 5 <= len(cfg) <= 8:
        raise ValueError(f"tile forward config {config}: expected (BLOCK_D, T, num_warps, "
                         "POLY_N, AUX_POLY[, STAGES[, SEGMENTS[, PRECISE]]])")
    block_d, tile, warps, poly_n, aux_poly, stages, segments, precise = full_config(cfg)
    if block_d == 0:
        block_d = auto_block_d(batch, dim, u.device) * warps
    if (block_d < 1 or warps < 1 or poly_n < 0 or tile < 0 or tile & (tile - 1)
            or aux_poly not in (0, 1, 2) or stages < 0 or segments < 0 or precise not in (0, 1, 2, 3)):
        raise ValueError(f"tile forward config {config}: expected (BLOCK_D >= 1, T a power of "
                         "two or 0, num_warps >= 1, POLY_N >= 0, AUX_POLY 0/1/2, STAGES >= 0, "
                         "SEGMENTS >= 0, PRECISE 0/1/2/3)")
    A = A.t().contiguous()  # (N, dim): channels fastest (see fwd_seq)
    D, delta_bias = per_channel(D), per_channel(delta_bias)
    block_n = triton.next_power_of_2(nstate)
    (Bt, B_var, B_groups, B_strides), (Ct, C_var, C_groups, C_strides) = (
        bc_args(M, block_n) for M in (B, C))
    last = torch.empty((batch, nstate, dim), dtype=torch.float32, device=u.device)
    groups = math.lcm(B_groups, C_groups)  # no program straddles a group of B or of C
    dim_per_group = dim // groups
    block_d = blocking(dim_per_group, block_d)
    n_blocks = triton.cdiv(dim_per_group, block_d)
    u_tile, dt_tile = tile_along_time(u), tile_along_time(delta)
    z_tile = z is not None and tile_along_time(z)
    chunk = steps_per_tile(tile, out, u if u_tile else None, delta if dt_tile else None,
                           z if z_tile else None)
    dummy = u
    zs = z.stride() if z is not None else (0, 0, 0)
    programs = groups * n_blocks
    n_full = length // chunk
    n_seg = time_segments(segments, n_full, programs * batch * warps, u.device)
    seg_chunks = triton.cdiv(n_full, n_seg) if n_seg > 1 else n_full
    n_seg = triton.cdiv(n_full, seg_chunks) if n_seg > 1 else 1  # no empty segment
    sbuf = pbuf = dummy
    if n_seg > 1:
        sbuf, pbuf = (torch.empty((batch, n_seg, nstate, dim), dtype=torch.float32,
                                  device=u.device) for _ in range(2))

    def launch(mode: int, grid_seg: int) -> None:
        _fwd_tile_kernel[(programs, batch * grid_seg)](
            u, delta, A, Bt, Ct, dummy if D is None else D, dummy if z is None else z,
            dummy if delta_bias is None else delta_bias, out, last, sbuf, pbuf,
            length, dim, nstate, dim_per_group, dim // B_groups, dim // C_groups, n_blocks,
            n_seg, seg_chunks, grid_seg,
            *u.stride(), *delta.stride(), A.stride(1), A.stride(0), *B_strides, *C_strides,
            *zs, *out.stride(),
            HAS_D=D is not None, HAS_Z=z is not None, HAS_DBIAS=delta_bias is not None,
            SOFTPLUS=bool(delta_softplus), B_VAR=B_var, C_VAR=C_var,
            U_TILE=u_tile, DT_TILE=dt_tile, Z_TILE=z_tile,
            RNE=triton_interpreter_on(), BLOCK_D=block_d, BLOCK_N=block_n, T=chunk,
            POLY_N=min(poly_n, nstate), AUX_POLY=int(aux_poly),
            ASM=not triton_interpreter_on(), MASK_D=dim_per_group % block_d != 0,
            STAGES=stages, MODE=mode, PRECISE=int(precise), num_warps=warps,
        )

    if n_seg == 1:
        launch(0, 1)
    else:  # segments' end states, the states entering each, then every segment's outputs
        launch(1, n_seg - 1)
        elems = nstate * dim
        _seg_combine_kernel[(triton.cdiv(elems, COMBINE_BLOCK), batch)](
            sbuf, pbuf, n_seg, elems, BLOCK=COMBINE_BLOCK, K=COMBINE_K, num_warps=4)
        launch(2, n_seg)
    return out, last.transpose(1, 2).contiguous()


# _seg_combine_kernel: state elements per program (4 warps), segments per tile (common_carry.py)
COMBINE_BLOCK = 256
COMBINE_K = 8
# time segments: at least this many chunks each (the states pass and the combine are overhead
# a segment amortises), and auto aims at this many warps per SM sub-partition, rounding down
# (an H100, D = 8192, bf16, 32 channels a warp, STAGES 2-3: at (1, 4096) 8 segments ran in 0.95 ms
# against 2.1-2.7 ms unsegmented, 1.3-2.8 ms with 2 or 4, 0.95-1.06 ms with 17; at (8, 4096)
# 3 segments ran 5.4 ms against 3.2-3.6 ms with none: BENCHMARKS.md)
MIN_SEG_CHUNKS = 8
TARGET_WARPS_PER_SCHEDULER = 4


def time_segments(segments: int, n_full: int, warps: int, device: torch.device) -> int:
    """How many time segments the sequence is cut into: SEGMENTS as given (1: none), or with 0
    as many as keep the grid within TARGET_WARPS_PER_SCHEDULER warps per SM sub-partition (4 an
    SM), each of at least MIN_SEG_CHUNKS chunks. Never more than the whole chunks (the partial
    one is the last segment's)."""
    if segments == 0:
        sms = torch.cuda.get_device_properties(device).multi_processor_count if (
            device.type == "cuda") else 132
        want = TARGET_WARPS_PER_SCHEDULER * 4 * sms // max(1, warps)
        return max(1, min(want, n_full // MIN_SEG_CHUNKS))
    return max(1, min(segments, n_full))
