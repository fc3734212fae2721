"""Triton backward of Mamba-1's selective scan that walks time step by step: our own kernels.

Why. The chunked backward (bwd.py) runs tl.associative_scan over (BLOCK_D, N, T) tiles twice per
chunk, one program per (batch row, channel block) walking every chunk: on an H100/H200 it moves
about 54 G (channel, state, step) elements a second and scales linearly with batch. A first-order
recurrence needs no parallel prefix when enough independent programs exist: here every pass walks
time one step at a time (one exp2 and a few FMAs per state element and step, no shuffles along
time), and the parallelism comes from cutting L into chunks of T steps walked by independent
programs, joined by a cheap sequential combine.

Maths (naive.py is the spec). Per step t: delta'_t = softplus?(delta + bias), a_t = exp(delta'_t A),
x_t = delta'_t u_t B_t, h_t = a_t h_{t-1} + x_t, y_t = sum_n h_t C_t + D u_t, out = y_t silu(z_t).
With dy_t = dout_t silu(z_t) (dout without z) the adjoint of the state is
    g_t = C_t dy_t + a_{t+1} g_{t+1},       g after the last step: dlast_state (or 0),
and, with p_t = a_t h_{t-1},
    d(delta')_t = sum_n g_t (A p_t + u_t B_t)     du_t = delta'_t sum_n g_t B_t + D dy_t
    dA = sum_t delta'_t g_t p_t                   dD = sum_t dy_t u_t
    dB_t = g_t delta'_t u_t                       dC_t = h_t dy_t      (summed over channels
                                                  that share a B/C row, or over time if fixed)
    dz_t = dout_t y_t silu'(z_t)                  ddelta = d(delta') sigmoid(delta + bias) under
                                                  softplus (1 above 20); ddelta_bias its sum.

Three phases, chunks of T steps (c = 0 .. n_chunks - 1), every state tile (N, BLOCK_D) float32:
1. `_chunk_local_kernel`, one program per (batch row, BLOCK_D channels of one B/C group, chunk):
   one forward walk over the chunk from a zero state gives its local end state s_c, the product
   of its decays P_c = prod a_t, and its local adjoint carry r_c = sum_t (prod_{k<=t} a_k) C_t dy_t
   (the adjoint a_first g_first leaving the chunk's first step when nothing enters its last one:
   the backward recurrence q_t = a_t (C_t dy_t + q_{t+1}) unrolled, so no reverse walk is needed).
2. `_combine_kernel`, per (batch row, block of state elements), sequential over the chunks:
   H_0 = 0, H_{c+1} = P_c H_c + s_c (the true state entering chunk c) and, from the end,
   G_{last} = dlast, G_{c-1} = P_c G_c + r_c (the true adjoint a_{t+1} g_{t+1} carried into chunk
   c's last step, i.e. the carry out of chunk c + 1's first step). Written over s and r in place.
3. `_grad_kernel`, a persistent grid of `programs` programs looping over the (batch row, channel
   block, chunk) work items. Per item: a forward walk from H_c recomputes h_t, stores the state
   entering each step (h_{t-1}) in the program's own float32 scratch slot (T, BLOCK_N, BLOCK_D),
   and emits what needs only the forward (dC_t, y_t for dz_t, dD); then a reverse walk from G_c
   reads h_{t-1} back, re-forms a_t (the same exp2 as the forward walk: the same decays) and runs
   the adjoint, emitting du_t, ddelta_t, dB_t and accumulating dA and ddelta_bias. p_t = a_t h_{t-1}
   is formed as in the forward (no h_t - x_t difference, no division). The loads of a step (and
   its scratch row) never depend on the carried state; the next step's are issued before this
   step's arithmetic, as fwd_seq.py does.

Memory (float32): phase 1's P, s, r: 3 x (batch, n_chunks, N, dim), i.e. 3/T of a state per step (3
x 537 MB at (8, 4096), D = 8192, N = 16, T = 32); phase 3 writes its partial sums over them once an
item has read its H_c and G_c (dA over P, a time-invariant dC over s, dB over r: each slot is read
and rewritten by one item only). Scratch: programs x T x BLOCK_N x BLOCK_D x 4 bytes, programs =
min(work items, SMs x per_sm): about 34 MB at the default on a 132-SM H100, meant to stay in L2.
Time-varying dB/dC partials per channel block, (batch, program groups, blocks, N, L), as bwd.py; dD
and ddelta_bias per chunk, (batch, n_chunks, dim). All partials are reduced by torch in float32
afterwards: deterministic, no atomics. Internal buffers are indexed from int64 bases; the inputs in
int32 under the interface's element_span rule, as the other kernels.

Numerics: float32 throughout; masked steps past L have delta' = 0 (a = 1, x = 0, dy = 0) and
masked channels / states carry zeros. The decay is fwd_chunked.exp_precise (the chunked forward's,
~1 ulp, unbiased) by default; configs without `precise` take exp2(delta' A log2 e) on the SFU, as
fwd_seq.py does; every walk of one call takes the same one. The default backward
(interface.bwd_kernel; FASTPATH_SSCAN_BWD=chunked picks bwd.py instead).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from fastpath.kernels.dispatch import triton_interpreter_on
from fastpath.kernels.selective_scan.bwd import _bc_grad, _bc_grad_buffer
from fastpath.kernels.selective_scan.common_carry import carry_walk
from fastpath.kernels.selective_scan.fwd_chunked import (
    INTERPRETER_CHUNK,
    LN2,
    LOG2E,
    bc_layout,
    bc_programs,
    bc_row,
    channel_block,
    exp_precise,
    exp_split,
    per_channel,
    softplus,
    store_rounded,
)
from fastpath.kernels.selective_scan.fwd_seq import _bc_fixed_t, _bc_step, _step_loads, n_fastest

# (BLOCK_D, T, num_warps, per_sm, precise, vector): channels per program (32 * num_warps: one
# channel, all N states, per thread), chunk length, warps, persistent gradient programs per SM
# (scratch: per_sm x SMs x T x BLOCK_N x BLOCK_D x 4 bytes), precise: the decays by exp_precise (1 or
# True), by fwd_chunked.exp_split (2: the SFU's exp2 with its argument's rounding put back; 5 %
# faster on an H200, but the tile forward's exp_split decays failed mamba_ssm's bar) or by the
# SFU's exp2 (0 or False),
# and whether phase 3's buffers may be accessed as 16-byte vectors (Triton then spreads a tile's N
# over 4 lanes and 4 channels per thread: the per-step sums over channels (dB_t, dC_t) take 3
# shuffle rounds on 4 values instead of 5 on 16, those over N 2 on 4 instead of none). Vector is
# the default on static counts only (sm_90 SASS, Triton 3.9, bf16, N = 16, transformers' layouts,
# not timed): the gradient kernel then has 48 shuffles, no spills and 1,640 instructions, against
# 160 shuffles, 72 bytes of stack spills and 2,624 instructions with lanes on channels.
# Decays by exp_precise by default: the forwards (the tile default, the chunked one) take them so, and
# exp2(delta' A log2 e) rounds with a bias that compounds over a long decay (the chunked forward
# once ended 2-4x further from float64 than mamba_ssm's reference on long float32 states, the
# interpreter reproducing it: BENCHMARKS.md, Session 10). The exp2 variants are in the sweep for
# their time.
BWD_SEQ_CONFIG = (32, 32, 1, 4, True, True)
# alternatives timed by benchmarks/selective_scan.py (sweep phase); each needs <= 35 MB of
# scratch on a 132-SM H100 at (8, 4096), but the one with 8 programs an SM (69 MB)
BWD_SEQ_SWEEP = ((32, 32, 1, 4, True, True), (32, 32, 1, 4, 2, True), (32, 32, 1, 4, False, True),
                 (32, 32, 1, 4, False, False), (32, 16, 1, 8, False, True),
                 (32, 32, 1, 8, False, True), (32, 64, 1, 2, False, True),
                 (64, 32, 2, 2, False, True), (16, 32, 1, 8, False, True))
# the combine: state elements per program (4 warps) and chunks per tile (common_carry.py)
COMBINE_BLOCK = 128
COMBINE_K = 16


def default_seq_config() -> tuple:
    """BWD_SEQ_CONFIG; under the interpreter with INTERPRETER_CHUNK steps a chunk (tiny test
    sequences pad less)."""
    if triton_interpreter_on():
        return (BWD_SEQ_CONFIG[0], INTERPRETER_CHUNK, *BWD_SEQ_CONFIG[2:])
    return BWD_SEQ_CONFIG


@triton.jit
def _decay(d, A2, PRECISE: tl.constexpr):
    """a = exp(delta' A) of an (N, BLOCK_D) tile; A2 is A (PRECISE 1: exp_precise, 2: exp_split)
    or A log2(e) (0: the SFU's exp2)."""
    if PRECISE == 1:
        return exp_precise(d[None, :] * A2)
    elif PRECISE == 2:
        return exp_split(d[None, :] * A2)
    else:
        return tl.exp2(d[None, :] * A2)


@triton.jit
def _channel_terms(u, dt, z, dout, bias, keep, HAS_Z: tl.constexpr, HAS_DBIAS: tl.constexpr,
                   SOFTPLUS: tl.constexpr):
    """One step's per-channel float32 terms: (u, delta' (0 where not kept), v = delta + bias,
    dout, dy, sigmoid(z)) (z's two unused without z)."""
    uf = u.to(tl.float32)
    v = dt.to(tl.float32)
    if HAS_DBIAS:
        v += bias
    if SOFTPLUS:
        d = softplus(v)
    else:
        d = v
    d = tl.where(keep, d, 0.0)
    go = dout.to(tl.float32)
    if HAS_Z:
        zf = z.to(tl.float32)
        sz = tl.sigmoid(zf)
        dy = go * zf * sz
    else:
        zf = uf
        sz = uf
        dy = go
    return uf, d, v, go, dy, zf, sz


@triton.jit
def _loads(U, DELTA, Z, DOUT, B, C, t, L, u_row, d_row, z_row, g_row, B_row, C_row, offs_d, md,
           offs_n, mn, s_ud, s_ul, s_dd, s_dl, s_zd, s_zl, s_gd, s_gl, s_Bn, s_Bl, s_Cn, s_Cl,
           HAS_Z: tl.constexpr, B_VAR: tl.constexpr, C_VAR: tl.constexpr):
    """The raw inputs of step t (zeros past L): fwd_seq's (u, delta, z, B_t, C_t), and dout."""
    u, dt, z, Bt, Ct = _step_loads(U, DELTA, Z, B, C, t, L, u_row, d_row, z_row, B_row, C_row,
                                   offs_d, md, offs_n, mn, s_ud, s_ul, s_dd, s_dl, s_zd, s_zl,
                                   s_Bn, s_Bl, s_Cn, s_Cl, HAS_Z, B_VAR, C_VAR)
    keep = md & ((offs_d * 0 + t) < L)
    go = tl.load(DOUT + g_row + offs_d * s_gd + t * s_gl, mask=keep, other=0.0)
    return u, dt, z, Bt, Ct, go


@triton.jit
def _item_setup(A, D, DBIAS, B, C, offs_d, offs_n, md, mn, s_ad, s_an, s_Bg, s_Bn, s_Cg, s_Cn,
                HAS_D: tl.constexpr, HAS_DBIAS: tl.constexpr, B_VAR: tl.constexpr,
                C_VAR: tl.constexpr, PRECISE: tl.constexpr):
    """The channel block's constants: A2 (N, BLOCK_D) (A, or A log2(e) for exp2: A itself is
    A2 * A_SCALE), D, bias, and the time-invariant B / C tiles (0.0 when time-varying)."""
    mdn = mn[:, None] & md[None, :]
    Af = tl.load(A + offs_n[:, None] * s_an + offs_d[None, :] * s_ad, mask=mdn,
                 other=0.0).to(tl.float32)
    if not PRECISE:
        Af = Af * LOG2E
    if HAS_D:
        Dv = tl.load(D + offs_d, mask=md, other=0.0).to(tl.float32)
    else:
        Dv = offs_d.to(tl.float32) * 0.0
    if HAS_DBIAS:
        bias = tl.load(DBIAS + offs_d, mask=md, other=0.0).to(tl.float32)
    else:
        bias = offs_d.to(tl.float32) * 0.0
    Bfix = _bc_fixed_t(B, offs_d, offs_n, mdn, s_Bg, s_Bn, B_VAR)
    Cfix = _bc_fixed_t(C, offs_d, offs_n, mdn, s_Cg, s_Cn, C_VAR)
    return Af, Dv, bias, Bfix, Cfix


@triton.jit(do_not_specialize=["PBUF", "SBUF", "RBUF"])
def _chunk_local_kernel(
    U, DELTA, A, B, C, Z, DBIAS, DOUT, PBUF, SBUF, RBUF,
    L, dim, N, dim_per_group, dpg_B, dpg_C, n_blocks, n_chunks,
    s_ub, s_ud, s_ul, s_db, s_dd, s_dl, s_ad, s_an, s_Bb, s_Bg, s_Bn, s_Bl, s_Cb, s_Cg, s_Cn, s_Cl,
    s_zb, s_zd, s_zl, s_gb, s_gd, s_gl,
    HAS_Z: tl.constexpr, HAS_DBIAS: tl.constexpr, SOFTPLUS: tl.constexpr, B_VAR: tl.constexpr,
    C_VAR: tl.constexpr, PRECISE: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
    T: tl.constexpr,
):
    """Phase 1: per (channel block, chunk: axis 0, block fastest; batch row: axis 1) the chunk's
    (P, s, r) from a zero state."""
    blocks = (dim // dim_per_group) * n_blocks
    c = tl.program_id(0) // blocks
    b = tl.program_id(1).to(tl.int64)
    g, offs_d, md = channel_block(tl.program_id(0) % blocks, dim_per_group, n_blocks, BLOCK_D)
    offs_n = tl.arange(0, BLOCK_N)
    mn = offs_n < N
    A2, _, bias, Bfix, Cfix = _item_setup(A, A, DBIAS, B, C, offs_d, offs_n, md, mn, s_ad, s_an,
                                          s_Bg, s_Bn, s_Cg, s_Cn, False, HAS_DBIAS, B_VAR, C_VAR,
                                          PRECISE)
    u_row = b * s_ub
    d_row = b * s_db
    z_row = b * s_zb
    g_row = b * s_gb
    B_row = bc_row(b, g, dim_per_group, dpg_B, s_Bb, s_Bg)
    C_row = bc_row(b, g, dim_per_group, dpg_C, s_Cb, s_Cg)
    s = tl.zeros((BLOCK_N, BLOCK_D), dtype=tl.float32)
    P = tl.full((BLOCK_N, BLOCK_D), 1.0, dtype=tl.float32)
    r = tl.zeros((BLOCK_N, BLOCK_D), dtype=tl.float32)
    t0 = c * T
    u, dt, z, Bt, Ct, go = _loads(U, DELTA, Z, DOUT, B, C, t0, L, u_row, d_row, z_row, g_row, B_row,
                                  C_row, offs_d, md, offs_n, mn, s_ud, s_ul, s_dd, s_dl, s_zd, s_zl,
                                  s_gd, s_gl, s_Bn, s_Bl, s_Cn, s_Cl, HAS_Z, B_VAR, C_VAR)
    for k in range(T):
        t = t0 + k
        u_n, dt_n, z_n, B_n, C_n, go_n = _loads(U, DELTA, Z, DOUT, B, C, t + 1, L, u_row, d_row,
                                                z_row, g_row, B_row, C_row, offs_d, md, offs_n, mn,
                                                s_ud, s_ul, s_dd, s_dl, s_zd, s_zl, s_gd, s_gl,
                                                s_Bn, s_Bl, s_Cn, s_Cl, HAS_Z, B_VAR, C_VAR)
        keep = md & ((offs_d * 0 + t) < L)
        uf, d, _, _, dy, _, _ = _channel_terms(u, dt, z, go, bias, keep, HAS_Z, HAS_DBIAS,
                                               SOFTPLUS)
        a = _decay(d, A2, PRECISE)
        s = a * s + (d * uf)[None, :] * _bc_step(Bt, Bfix, B_VAR)
        P = P * a
        r += P * (_bc_step(Ct, Cfix, C_VAR) * dy[None, :])
        u, dt, z, Bt, Ct, go = u_n, dt_n, z_n, B_n, C_n, go_n
    mdn = mn[:, None] & md[None, :]
    buf = ((b * n_chunks + c) * N + offs_n[:, None]) * dim + offs_d[None, :]
    tl.store(PBUF + buf, P, mask=mdn)
    tl.store(SBUF + buf, s, mask=mdn)
    tl.store(RBUF + buf, r, mask=mdn)


@triton.jit
def _combine_kernel(PBUF, SBUF, RBUF, DLAST, n_chunks, n_elems, dim, s_lb, s_ld, s_ln,
                    HAS_DLAST: tl.constexpr, BLOCK: tl.constexpr, K: tl.constexpr):
    """Phase 2: over s, the state entering each chunk (walked forward from 0); over r, the adjoint
    carried into each chunk's last step (walked backward from dlast): common_carry.carry_walk, K chunks
    a tile."""
    b = tl.program_id(1).to(tl.int64)
    e = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = e < n_elems
    base = b * n_chunks * n_elems
    h = tl.zeros((BLOCK,), dtype=tl.float32)
    carry_walk(PBUF, SBUF, base, e, m, h, 0, 1, n_chunks, n_chunks, n_elems, K)
    if HAS_DLAST:
        G = tl.load(DLAST + b * s_lb + (e % dim) * s_ld + (e // dim) * s_ln, mask=m,
                    other=0.0).to(tl.float32)
    else:
        G = tl.zeros((BLOCK,), dtype=tl.float32)
    carry_walk(PBUF, RBUF, base, e, m, G, n_chunks - 1, -1, n_chunks, n_chunks, n_elems, K)


def _grad_body(
    U, DELTA, A, B, C, D, Z, DBIAS, DOUT, PBUF, SBUF, RBUF, SCRATCH,
    DU, DDELTA, DZ, DDV, DDB, DB, DC,
    L, dim, N, dim_per_group, dpg_B, dpg_C, n_blocks, n_chunks, n_items,
    s_ub, s_ud, s_ul, s_db, s_dd, s_dl, s_ad, s_an, s_Bb, s_Bg, s_Bn, s_Bl, s_Cb, s_Cg, s_Cn, s_Cl,
    s_zb, s_zd, s_zl, s_gb, s_gd, s_gl, s_ob, s_od, s_ol,
    HAS_D: tl.constexpr, HAS_Z: tl.constexpr, HAS_DBIAS: tl.constexpr, SOFTPLUS: tl.constexpr,
    B_VAR: tl.constexpr, C_VAR: tl.constexpr, PRECISE: tl.constexpr, RNE: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, T: tl.constexpr,
):
    """Phase 3 (module docstring): a persistent program over work items (block fastest, then
    chunk, then batch row), its scratch slot reused item after item."""
    prog = tl.program_id(0)
    n_progs = tl.num_programs(0)
    offs_n = tl.arange(0, BLOCK_N)
    mn = offs_n < N
    TILE: tl.constexpr = BLOCK_N * BLOCK_D
    A_SCALE: tl.constexpr = 1.0 if PRECISE else LN2  # A = A2 * A_SCALE (one tile fewer live)
    slot = (SCRATCH + prog.to(tl.int64) * (T * TILE) + offs_n[:, None] * BLOCK_D
            + tl.arange(0, BLOCK_D)[None, :])
    blocks = (dim // dim_per_group) * n_blocks
    for item in range(prog, n_items, n_progs):
        pid = item % blocks
        c = (item // blocks) % n_chunks
        b = (item // blocks // n_chunks).to(tl.int64)
        g, offs_d, md = channel_block(pid, dim_per_group, n_blocks, BLOCK_D)
        mdn = mn[:, None] & md[None, :]
        A2, Dv, bias, Bfix, Cfix = _item_setup(A, D, DBIAS, B, C, offs_d, offs_n, md, mn, s_ad,
                                               s_an, s_Bg, s_Bn, s_Cg, s_Cn, HAS_D, HAS_DBIAS,
                                               B_VAR, C_VAR, PRECISE)
        u_row = b * s_ub
        d_row = b * s_db
        z_row = b * s_zb
        g_row = b * s_gb
        o_row = b * s_ob
        B_row = bc_row(b, g, dim_per_group, dpg_B, s_Bb, s_Bg)
        C_row = bc_row(b, g, dim_per_group, dpg_C, s_Cb, s_Cg)
        part = ((b * (dim // dim_per_group) + g) * n_blocks + pid % n_blocks) * N  # dB/dC rows
        buf = ((b * n_chunks + c) * N + offs_n[:, None]) * dim + offs_d[None, :]
        h = tl.load(SBUF + buf, mask=mdn, other=0.0)
        q = tl.load(RBUF + buf, mask=mdn, other=0.0)
        t0 = c * T
        # ---- forward walk: h_{t-1} to scratch; dC_t, dz_t, dD
        dD = tl.zeros((BLOCK_D,), dtype=tl.float32)
        dCfix = tl.zeros((BLOCK_N, BLOCK_D), dtype=tl.float32)
        u, dt, z, Bt, Ct, go = _loads(U, DELTA, Z, DOUT, B, C, t0, L, u_row, d_row, z_row, g_row,
                                      B_row, C_row, offs_d, md, offs_n, mn, s_ud, s_ul, s_dd, s_dl,
                                      s_zd, s_zl, s_gd, s_gl, s_Bn, s_Bl, s_Cn, s_Cl, HAS_Z, B_VAR,
                                      C_VAR)
        for k in range(T):
            t = t0 + k
            u_n, dt_n, z_n, B_n, C_n, go_n = _loads(U, DELTA, Z, DOUT, B, C, t + 1, L, u_row, d_row,
                                                    z_row, g_row, B_row, C_row, offs_d, md, offs_n,
                                                    mn, s_ud, s_ul, s_dd, s_dl, s_zd, s_zl, s_gd,
                                                    s_gl, s_Bn, s_Bl, s_Cn, s_Cl, HAS_Z, B_VAR,
                                                    C_VAR)
            keep = md & ((offs_d * 0 + t) < L)
            uf, d, _, gof, dy, zf, sz = _channel_terms(u, dt, z, go, bias, keep, HAS_Z,
                                                       HAS_DBIAS, SOFTPLUS)
            a = _decay(d, A2, PRECISE)
            tl.store(slot + k * TILE, h)
            h = a * h + (d * uf)[None, :] * _bc_step(Bt, Bfix, B_VAR)
            hdy = h * dy[None, :]
            if C_VAR:
                tl.store(DC + (part + offs_n) * L + t, tl.sum(hdy, axis=1),
                         mask=mn & ((offs_n * 0 + t) < L))
            else:
                dCfix += hdy
            if HAS_Z:
                y = tl.sum(h * _bc_step(Ct, Cfix, C_VAR), axis=0) + Dv * uf
                store_rounded(DZ + o_row + offs_d * s_od + t * s_ol,
                              gof * y * sz * (1.0 + zf * (1.0 - sz)), keep, RNE)
            if HAS_D:
                dD += dy * uf  # 0 at masked steps and channels
            u, dt, z, Bt, Ct, go = u_n, dt_n, z_n, B_n, C_n, go_n
        tl.debug_barrier()  # the slot's rows, written above, are read back below
        # ---- reverse walk: the adjoint from G_c; du_t, ddelta_t, dB_t, dA, ddelta_bias
        dA = tl.zeros((BLOCK_N, BLOCK_D), dtype=tl.float32)
        dBfix = tl.zeros((BLOCK_N, BLOCK_D), dtype=tl.float32)
        dbias = tl.zeros((BLOCK_D,), dtype=tl.float32)
        t = t0 + (T - 1)
        u, dt, z, Bt, Ct, go = _loads(U, DELTA, Z, DOUT, B, C, t, L, u_row, d_row, z_row, g_row,
                                      B_row, C_row, offs_d, md, offs_n, mn, s_ud, s_ul, s_dd, s_dl,
                                      s_zd, s_zl, s_gd, s_gl, s_Bn, s_Bl, s_Cn, s_Cl, HAS_Z, B_VAR,
                                      C_VAR)
        hp = tl.load(slot + (T - 1) * TILE)
        for i in range(T):
            k = T - 1 - i
            t = t0 + k
            kn = k - 1 + (k == 0)  # the previous step's (step 0 reloads itself: in bounds)
            u_n, dt_n, z_n, B_n, C_n, go_n = _loads(U, DELTA, Z, DOUT, B, C, t0 + kn, L, u_row,
                                                    d_row, z_row, g_row, B_row, C_row, offs_d, md,
                                                    offs_n, mn, s_ud, s_ul, s_dd, s_dl, s_zd, s_zl,
                                                    s_gd, s_gl, s_Bn, s_Bl, s_Cn, s_Cl, HAS_Z,
                                                    B_VAR, C_VAR)
            hp_n = tl.load(slot + kn * TILE)
            keep = md & ((offs_d * 0 + t) < L)
            uf, d, v, _, dy, _, _ = _channel_terms(u, dt, z, go, bias, keep, HAS_Z, HAS_DBIAS,
                                                   SOFTPLUS)
            a = _decay(d, A2, PRECISE)
            gs = q + _bc_step(Ct, Cfix, C_VAR) * dy[None, :]
            w = gs * (a * hp)
            dA += w * d[None, :]
            gB = tl.sum(gs * _bc_step(Bt, Bfix, B_VAR), axis=0)
            ddt = tl.sum(w * A2, axis=0) * A_SCALE + uf * gB
            du = d * gB + Dv * dy
            gx = gs * (d * uf)[None, :]
            if B_VAR:
                tl.store(DB + (part + offs_n) * L + t, tl.sum(gx, axis=1),
                         mask=mn & ((offs_n * 0 + t) < L))
            else:
                dBfix += gx
            if SOFTPLUS:
                ddt = tl.where(v <= 20.0, ddt * tl.sigmoid(v), ddt)
            ddt = tl.where(keep, ddt, 0.0)
            dbias += ddt
            store_rounded(DU + o_row + offs_d * s_od + t * s_ol, du, keep, RNE)
            store_rounded(DDELTA + o_row + offs_d * s_od + t * s_ol, ddt, keep, RNE)
            q = a * gs
            u, dt, z, Bt, Ct, go, hp = u_n, dt_n, z_n, B_n, C_n, go_n, hp_n
        tl.debug_barrier()  # every read of the slot done before the next item rewrites it
        # partial sums over the slots this item alone owns (its H_c and G_c are read)
        tl.store(PBUF + buf, dA, mask=mdn)
        if not B_VAR:
            tl.store(RBUF + buf, dBfix, mask=mdn)
        if not C_VAR:
            tl.store(SBUF + buf, dCfix, mask=mdn)
        per_chunk = (b * n_chunks + c) * dim + offs_d
        tl.store(DDV + per_chunk, dD, mask=md)
        tl.store(DDB + per_chunk, dbias, mask=md)


# Two compilations of one body: buffers and scratch without a 16-byte alignment promise (as
# fwd_seq.py's A and LAST: lanes on channels, a thread holds all N states of its channel) or
# with it (Triton may vectorise them: 4 channels a thread, N over 4 lanes). Config `vector`.
_grad_kernel = triton.jit(do_not_specialize=["PBUF", "SBUF", "RBUF", "SCRATCH"])(_grad_body)
_grad_kernel_vec = triton.jit(_grad_body)


def _sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device; 1 elsewhere (the interpreter)."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 1


def _channels_fastest(M: Tensor) -> Tensor:
    """A time-invariant (dim, N) B or C with channels contiguous (dim x N elements copied, as
    fwd_seq.py does A: every 2-D access then runs along channels); a time-varying one with N
    contiguous (fwd_seq.n_fastest)."""
    if M.dim() == 2:
        return M.t().contiguous().t()
    return n_fastest(M)


def scratch_bytes(config: tuple, nstate: int, device: torch.device, n_items: int) -> int:
    """Phase 3's scratch: programs x T x BLOCK_N x BLOCK_D float32 values."""
    block_d, chunk, _, per_sm = config[:4]
    programs = min(n_items, per_sm * _sm_count(device))
    return programs * chunk * triton.next_power_of_2(nstate) * block_d * 4


def selective_scan_bwd_seq_triton(
    dout: Tensor, dlast: Tensor | None, u: Tensor, delta: Tensor, A: Tensor, B: Tensor,
    C: Tensor, D: Tensor | None, z: Tensor | None, delta_bias: Tensor | None,
    delta_softplus: bool, config: tuple | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor | None, Tensor | None, Tensor | None]:
    """Same contract as bwd.selective_scan_bwd_triton: (du, ddelta, dA, dB, dC, dD, dz,
    ddelta_bias); du, ddelta, dz in u's dtype (contiguous (batch, dim, L)); dA (dim, N), dB/dC in
    B's/C's shape, dD, ddelta_bias (dim,), all float32. B/C each (dim, N), (batch, N, L) or
    (batch, G, N, L), any strides (stride 0 included)."""
    block_d, chunk, warps, per_sm, precise, vector = config or default_seq_config()
    batch, dim, length = u.shape
    nstate = A.shape[1]
    dev = u.device
    f32 = dict(dtype=torch.float32, device=dev)
    Bl, Cl = bc_layout(_channels_fastest(B)), bc_layout(_channels_fastest(C))
    prog_groups, dim_per_group, block_d = bc_programs(dim, Bl, Cl, block_d)
    D, delta_bias = per_channel(D), per_channel(delta_bias)
    A_t = A.t().contiguous()  # (N, dim): channel-fastest, as fwd_seq.py
    n_blocks = triton.cdiv(dim_per_group, block_d)
    n_chunks = triton.cdiv(length, chunk)
    block_n = triton.next_power_of_2(nstate)
    du = torch.empty(u.shape, dtype=u.dtype, device=dev)
    ddelta = torch.empty(u.shape, dtype=u.dtype, device=dev)
    dz = torch.empty(u.shape, dtype=u.dtype, device=dev) if z is not None else None
    bufs = [torch.empty((batch, n_chunks, nstate, dim), **f32) for _ in range(3)]
    pbuf, sbuf, rbuf = bufs
    dD = torch.empty((batch, n_chunks, dim), **f32)
    dbias = torch.empty((batch, n_chunks, dim), **f32)
    dB = (_bc_grad_buffer(Bl, batch, dim, nstate, length, n_blocks, prog_groups)
          if Bl.variable else rbuf)
    dC = (_bc_grad_buffer(Cl, batch, dim, nstate, length, n_blocks, prog_groups)
          if Cl.variable else sbuf)
    n_items = batch * prog_groups * n_blocks * n_chunks
    if n_items:
        dummy = u
        zs = z.stride() if z is not None else (0, 0, 0)
        common = (length, dim, nstate, dim_per_group, dim // Bl.groups, dim // Cl.groups,
                  n_blocks, n_chunks)
        strides = (*u.stride(), *delta.stride(), A_t.stride(1), A_t.stride(0), *Bl.strides,
                   *Cl.strides, *zs, *dout.stride())
        flags = dict(HAS_Z=z is not None, HAS_DBIAS=delta_bias is not None,
                     SOFTPLUS=bool(delta_softplus), B_VAR=Bl.variable, C_VAR=Cl.variable,
                     PRECISE=int(precise), BLOCK_D=block_d, BLOCK_N=block_n, T=chunk,
                     num_warps=warps)
        z_arg = dummy if z is None else z
        bias_arg = dummy if delta_bias is None else delta_bias
        _chunk_local_kernel[(prog_groups * n_blocks * n_chunks, batch)](
            u, delta, A_t, Bl.tensor, Cl.tensor, z_arg, bias_arg, dout, pbuf, sbuf, rbuf,
            *common, *strides, **flags)
        n_elems = nstate * dim
        ls = dlast.stride() if dlast is not None else (0, 0, 0)
        _combine_kernel[(triton.cdiv(n_elems, COMBINE_BLOCK), batch)](
            pbuf, sbuf, rbuf, dummy if dlast is None else dlast, n_chunks, n_elems, dim, *ls,
            HAS_DLAST=dlast is not None, BLOCK=COMBINE_BLOCK, K=COMBINE_K, num_warps=4)
        programs = min(n_items, per_sm * _sm_count(dev))
        scratch = torch.empty((programs, chunk, block_n, block_d), **f32)
        kernel = _grad_kernel_vec if vector else _grad_kernel
        kernel[(programs,)](
            u, delta, A_t, Bl.tensor, Cl.tensor, dummy if D is None else D, z_arg, bias_arg,
            dout, pbuf, sbuf, rbuf, scratch, du, ddelta, du if dz is None else dz, dD, dbias,
            dB, dC, *common, n_items, *strides, *du.stride(),
            HAS_D=D is not None, RNE=triton_interpreter_on(), **flags)
    else:
        for t in (*bufs, dD, dbias, dB, dC):
            t.zero_()

    def fixed(part: Tensor) -> Tensor:  # (batch, n_chunks, N, dim) -> (dim, N)
        return part.sum((0, 1)).t().contiguous()

    return (
        du, ddelta, fixed(pbuf),
        _bc_grad(dB, Bl, B) if Bl.variable else fixed(rbuf),
        _bc_grad(dC, Cl, C) if Cl.variable else fixed(sbuf),
        dD.sum((0, 1)) if D is not None else None, dz,
        dbias.sum((0, 1)) if delta_bias is not None else None,
    )
