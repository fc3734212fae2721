"""Triton backward of Mamba-1's selective scan: recompute per chunk, then the adjoint scan in
reverse, our own kernels.

Two launches:
1. the forward kernel (fwd_chunked.py) with SAVE_STATES: the float32 state entering each chunk,
   (batch, n_chunks, dim, N) -- nothing else of the forward is kept.
2. `_bwd_kernel`: per (batch row, BLOCK_D channels of one group), the chunks from last to first.
   For a chunk it reloads u, delta, z, B, C, dout, re-forms a_t, x_t and re-runs the forward scan
   from the saved entering state (h_t for every step, float32), recomputes y_t (for dz), and runs
   the adjoint recurrence
       g_t = dL/dh_t = C_t dy_t + a_{t+1} g_{t+1}         (g after the last step: dlast_state)
   as a forward associative scan over the time-reversed chunk (tl.flip; FLIP_SCAN=False asks
   for tl.associative_scan(reverse=True) instead), with the g of the following chunk's first
   step carried in: g_t = g_t(local) + prod_{k=t..T-1} a_{k+1} * g_next. a_{t+1} comes from
   delta' of the next step (a second exp2 per element; masked steps give a = 1).
   Then, with w_t = g_t * a_t h_{t-1} = g_t * (h_t - x_t) (no division, no shifted tile):
       d(delta')_t = sum_n (w_t A + g_t u_t B_t)      du_t = delta'_t sum_n g_t B_t + D dy_t
       dA += sum_t w_t delta'_t                       dD += sum_t dy_t u_t
       dB_t (this block) = sum_d g_t delta'_t u_t     dC_t (this block) = sum_d h_t dy_t
       ddelta = d(delta') * sigmoid(delta + bias) under softplus (1 above 20); ddelta_bias = sum.
   dy = dout * silu(z) and dz = dout * y * silu'(z) with z; dy = dout without.
Per-program partial sums (dA, dD, ddelta_bias per batch row; a time-varying dB/dC per channel
block, (batch, program groups, blocks, N, L); a time-invariant dB/dC summed over the row's steps
in registers, (batch, dim, N)) are float32 buffers reduced by torch afterwards, in float32, and
cast to the input's dtype once: deterministic, no atomics, nothing rounded before it is summed.
Memory: the chunk states (1/T of the state size per step) plus those partials.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from fastpath.kernels.dispatch import triton_interpreter_on
from fastpath.kernels.selective_scan.fwd_chunked import (
    LOG2E,
    BCLayout,
    bc_fixed,
    bc_layout,
    bc_programs,
    bc_row,
    bc_tile,
    channel_block,
    chunk_states,
    default_config,
    first_order,
    load_delta,
    per_channel,
    store_rounded,
)

# (BLOCK_D, T, num_warps, flip): the chunk length is a power of two (tl.flip); flip=False runs
# the adjoint with tl.associative_scan(reverse=True), which has had miscompiles on GPUs
# (triton-lang/triton#4362, #8412), hence flips by default (tests/kernels/selective_scan/test_selective_scan_gpu.py
# checks both).
BWD_CONFIG = (8, 16, 4, True)  # about a dozen tiles live at once: smaller than the forward's
# Tile configs the GPU tests check and benchmarks/selective_scan.py times (fwd uses the first 3).
SWEEP_CONFIGS = ((8, 32, 4, True), (8, 16, 4, True), (4, 32, 4, True), (16, 32, 4, True),
                 (16, 16, 4, True), (32, 16, 8, True), (16, 64, 8, True), (8, 16, 4, False))


@triton.jit
def reverse_first_order(a, x, FLIP: tl.constexpr):
    """Scan of g_t = x_t + a_t g_{t+1} along axis 2, from the end: (prod_{k>=t} a_k, g_t)."""
    if FLIP:
        pa, gx = tl.associative_scan((tl.flip(a, 2), tl.flip(x, 2)), axis=2,
                                     combine_fn=first_order)
        return tl.flip(pa, 2), tl.flip(gx, 2)
    else:
        return tl.associative_scan((a, x), axis=2, combine_fn=first_order, reverse=True)


@triton.jit
def _bwd_kernel(
    U, DELTA, A, B, C, D, Z, DBIAS, DOUT, DLAST, STATES,
    DU, DDELTA, DZ, DA, DDV, DDB, DB, DC,
    L, dim, N, dim_per_group, dpg_B, dpg_C, n_blocks, n_chunks,
    s_ub, s_ud, s_ul,
    s_db, s_dd, s_dl,
    s_ad, s_an,
    s_Bb, s_Bg, s_Bn, s_Bl,
    s_Cb, s_Cg, s_Cn, s_Cl,
    s_zb, s_zd, s_zl,
    s_gb, s_gd, s_gl,
    s_ob, s_od, s_ol,
    HAS_D: tl.constexpr,
    HAS_Z: tl.constexpr,
    HAS_DBIAS: tl.constexpr,
    HAS_DLAST: tl.constexpr,
    SOFTPLUS: tl.constexpr,
    FLIP: tl.constexpr,
    B_VAR: tl.constexpr,
    C_VAR: tl.constexpr,
    RNE: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    T: tl.constexpr,
):
    pid = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    g, offs_d, md = channel_block(pid, dim_per_group, n_blocks, BLOCK_D)
    blk = pid % n_blocks
    offs_n = tl.arange(0, BLOCK_N)
    mn = offs_n < N
    mdn = md[:, None] & mn[None, :]
    Areal = tl.load(A + offs_d[:, None] * s_ad + offs_n[None, :] * s_an, mask=mdn,
                    other=0.0).to(tl.float32)
    A2 = Areal * LOG2E
    if HAS_D:
        Dv = tl.load(D + offs_d, mask=md, other=0.0).to(tl.float32)
    Bfix = bc_fixed(B, offs_d, offs_n, mdn, s_Bg, s_Bn, B_VAR)
    Cfix = bc_fixed(C, offs_d, offs_n, mdn, s_Cg, s_Cn, C_VAR)
    B_row = bc_row(b, g, dim_per_group, dpg_B, s_Bb, s_Bg)
    C_row = bc_row(b, g, dim_per_group, dpg_C, s_Cb, s_Cg)
    state_rows = (b * dim + offs_d[:, None]) * N + offs_n[None, :]
    if HAS_DLAST:
        gnext = tl.load(DLAST + state_rows, mask=mdn, other=0.0).to(tl.float32)
    else:
        gnext = tl.zeros((BLOCK_D, BLOCK_N), dtype=tl.float32)
    dA = tl.zeros((BLOCK_D, BLOCK_N), dtype=tl.float32)
    # time-invariant B / C: their gradients summed over this row's steps here (float32)
    dBfix = tl.zeros((BLOCK_D, BLOCK_N), dtype=tl.float32)
    dCfix = tl.zeros((BLOCK_D, BLOCK_N), dtype=tl.float32)
    dD = tl.zeros((BLOCK_D,), dtype=tl.float32)
    dbias = tl.zeros((BLOCK_D,), dtype=tl.float32)
    first = (tl.arange(0, T) == 0)[None, None, :]
    part = ((b * (dim // dim_per_group) + g) * n_blocks + blk) * N  # this block's dB/dC rows
    for i in range(n_chunks):
        c = n_chunks - 1 - i
        offs_t = c * T + tl.arange(0, T)
        mt = offs_t < L
        mdt = md[:, None] & mt[None, :]
        mnt = mn[:, None] & mt[None, :]
        dt = load_delta(DELTA, DBIAS, b * s_db, offs_d, md, offs_t, mt, s_dd, s_dl,
                        HAS_DBIAS, SOFTPLUS)
        dtn = load_delta(DELTA, DBIAS, b * s_db, offs_d, md, offs_t + 1, offs_t + 1 < L,
                         s_dd, s_dl, HAS_DBIAS, SOFTPLUS)
        u = tl.load(U + b * s_ub + offs_d[:, None] * s_ud + offs_t[None, :] * s_ul, mask=mdt,
                    other=0.0).to(tl.float32)
        Bt = bc_tile(B, Bfix, B_row, offs_n, offs_t, mnt, s_Bn, s_Bl, B_VAR)
        Ct = bc_tile(C, Cfix, C_row, offs_n, offs_t, mnt, s_Cn, s_Cl, C_VAR)
        dout = tl.load(DOUT + b * s_gb + offs_d[:, None] * s_gd + offs_t[None, :] * s_gl,
                       mask=mdt, other=0.0).to(tl.float32)
        h_in = tl.load(STATES + ((b * n_chunks + c) * dim + offs_d[:, None]) * N
                       + offs_n[None, :], mask=mdn, other=0.0)
        a = tl.exp2(dt[:, None, :] * A2[:, :, None])
        dtu = dt * u
        x = dtu[:, None, :] * Bt
        acum, xs = tl.associative_scan((a, x), axis=2, combine_fn=first_order)
        hs = acum * h_in[:, :, None] + xs
        dy = dout
        if HAS_Z:
            zv = tl.load(Z + b * s_zb + offs_d[:, None] * s_zd + offs_t[None, :] * s_zl,
                         mask=mdt, other=0.0).to(tl.float32)
            y = tl.sum(hs * Ct, axis=1)
            if HAS_D:
                y += Dv[:, None] * u
            sz = tl.sigmoid(zv)
            dz = dout * y * sz * (1.0 + zv * (1.0 - sz))
            store_rounded(DZ + b * s_ob + offs_d[:, None] * s_od + offs_t[None, :] * s_ol, dz,
                          mdt, RNE)
            dy = dout * zv * sz
        an = tl.exp2(dtn[:, None, :] * A2[:, :, None])
        pa, gl = reverse_first_order(an, Ct * dy[:, None, :], FLIP)
        gs = gl + pa * gnext[:, :, None]
        gnext = tl.sum(tl.where(first, gs, 0.0), axis=2)
        w = gs * (hs - x)
        dA += tl.sum(w * dt[:, None, :], axis=2)
        gB = tl.sum(gs * Bt, axis=1)
        ddt = tl.sum(w * Areal[:, :, None], axis=1) + u * gB
        du = dt * gB
        if HAS_D:
            du += Dv[:, None] * dy
            dD += tl.sum(tl.where(mdt, dy * u, 0.0), axis=1)
        # dy and dtu are 0 at masked steps and channels: nothing past L or dim is summed
        if B_VAR:
            tl.store(DB + (part + offs_n[:, None]) * L + offs_t[None, :],
                     tl.sum(gs * dtu[:, None, :], axis=0), mask=mnt)
        else:
            dBfix += tl.sum(gs * dtu[:, None, :], axis=2)
        if C_VAR:
            tl.store(DC + (part + offs_n[:, None]) * L + offs_t[None, :],
                     tl.sum(hs * dy[:, None, :], axis=0), mask=mnt)
        else:
            dCfix += tl.sum(hs * dy[:, None, :], axis=2)
        if SOFTPLUS:
            v = tl.load(DELTA + b * s_db + offs_d[:, None] * s_dd + offs_t[None, :] * s_dl,
                        mask=mdt, other=0.0).to(tl.float32)
            if HAS_DBIAS:
                v += tl.load(DBIAS + offs_d, mask=md, other=0.0).to(tl.float32)[:, None]
            ddt = tl.where(v <= 20.0, ddt * tl.sigmoid(v), ddt)
        ddt = tl.where(mdt, ddt, 0.0)
        dbias += tl.sum(ddt, axis=1)
        store_rounded(DU + b * s_ob + offs_d[:, None] * s_od + offs_t[None, :] * s_ol, du, mdt,
                      RNE)
        store_rounded(DDELTA + b * s_ob + offs_d[:, None] * s_od + offs_t[None, :] * s_ol, ddt,
                      mdt, RNE)
    tl.store(DA + state_rows, dA, mask=mdn)
    if not B_VAR:
        tl.store(DB + state_rows, dBfix, mask=mdn)
    if not C_VAR:
        tl.store(DC + state_rows, dCfix, mask=mdn)
    tl.store(DDV + b * dim + offs_d, dD, mask=md)
    tl.store(DDB + b * dim + offs_d, dbias, mask=md)


def _bc_grad_buffer(layout: BCLayout, batch: int, dim: int, nstate: int, length: int,
                    n_blocks: int, prog_groups: int) -> Tensor:
    """float32 partials of dB or dC: per (batch, program group, block) rows of (N, L) when
    time-varying, (batch, dim, N) sums when time-invariant."""
    f32 = dict(dtype=torch.float32, device=layout.tensor.device)
    if layout.variable:
        return torch.empty((batch, prog_groups, n_blocks, nstate, length), **f32)
    return torch.empty((batch, dim, nstate), **f32)


def _bc_grad(part: Tensor, layout: BCLayout, given: Tensor) -> Tensor:
    """The partials reduced (float32, one sum each) to the given B or C's shape."""
    if not layout.variable:
        return part.sum(0)
    batch, _, _, nstate, length = part.shape
    grad = part.view(batch, layout.groups, -1, nstate, length).sum(2)
    return grad.view(given.shape)


def selective_scan_bwd_triton(
    dout: Tensor, dlast: Tensor | None, u: Tensor, delta: Tensor, A: Tensor, B: Tensor,
    C: Tensor, D: Tensor | None, z: Tensor | None, delta_bias: Tensor | None,
    delta_softplus: bool, config: tuple[int, int, int, bool] | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor | None, Tensor | None, Tensor | None]:
    """Gradients (du, ddelta, dA, dB, dC, dD, dz, ddelta_bias); du, ddelta, dz in u's dtype
    (contiguous (batch, dim, L)), dB/dC float32 in B's/C's shape, dA/dD/ddelta_bias float32.
    B/C each (dim, N), (batch, N, L) or (batch, G, N, L), any strides."""
    block_d, chunk, warps, flip = config or default_config(BWD_CONFIG)
    batch, dim, length = u.shape
    nstate = A.shape[1]
    Bl, Cl = bc_layout(B), bc_layout(C)
    prog_groups, dim_per_group, block_d = bc_programs(dim, Bl, Cl, block_d)
    D, delta_bias = per_channel(D), per_channel(delta_bias)
    n_blocks = triton.cdiv(dim_per_group, block_d)
    n_chunks = triton.cdiv(length, chunk)
    states = chunk_states(u, delta, A, B, C, delta_bias, delta_softplus, chunk,
                          (block_d, chunk, warps))
    f32 = dict(dtype=torch.float32, device=u.device)
    du = torch.empty(u.shape, dtype=u.dtype, device=u.device)
    ddelta = torch.empty(u.shape, dtype=u.dtype, device=u.device)
    dz = torch.empty(u.shape, dtype=u.dtype, device=u.device) if z is not None else None
    dA = torch.empty((batch, dim, nstate), **f32)
    dD = torch.empty((batch, dim), **f32)
    dbias = torch.empty((batch, dim), **f32)
    dB = _bc_grad_buffer(Bl, batch, dim, nstate, length, n_blocks, prog_groups)
    dC = _bc_grad_buffer(Cl, batch, dim, nstate, length, n_blocks, prog_groups)
    zs = z.stride() if z is not None else (0, 0, 0)
    dummy = u
    _bwd_kernel[(prog_groups * n_blocks, batch)](
        u, delta, A, Bl.tensor, Cl.tensor, dummy if D is None else D, dummy if z is None else z,
        dummy if delta_bias is None else delta_bias, dout,
        dummy if dlast is None else dlast.contiguous(),
        states, du, ddelta, du if dz is None else dz, dA, dD, dbias, dB, dC,
        length, dim, nstate, dim_per_group, dim // Bl.groups, dim // Cl.groups, n_blocks,
        n_chunks,
        *u.stride(), *delta.stride(), *A.stride(), *Bl.strides, *Cl.strides, *zs,
        *dout.stride(), *du.stride(),
        HAS_D=D is not None, HAS_Z=z is not None, HAS_DBIAS=delta_bias is not None,
        HAS_DLAST=dlast is not None, SOFTPLUS=bool(delta_softplus), FLIP=bool(flip),
        B_VAR=Bl.variable, C_VAR=Cl.variable, RNE=triton_interpreter_on(),
        BLOCK_D=block_d, BLOCK_N=triton.next_power_of_2(nstate), T=chunk, num_warps=warps,
    )
    return (
        du, ddelta, dA.sum(0), _bc_grad(dB, Bl, B), _bc_grad(dC, Cl, C),
        dD.sum(0) if D is not None else None, dz,
        dbias.sum(0) if delta_bias is not None else None,
    )
