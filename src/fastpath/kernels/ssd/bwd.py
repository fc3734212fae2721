"""Triton backward of the chunked state-space scan: the forward's decomposition in reverse.

Recompute dt', cum and the states entering each chunk (fwd.py), then:
1. `_dstates_kernel` (per batch, head, P/N tile; sequential over chunks, newest first, float32):
   R_c = dL/d(state leaving chunk c);  R_{c-1} = gate_c R_c + sum_t exp(cum_t) dy_t^T C_t,
   and dinitial_states = the gradient entering chunk 0.
2. CB[t, u] = C_t . B_u once per group (fwd.chunk_cb); every head of the group reads it
   instead of recomputing the dot.
3. `_dx_kernel` (per batch, chunk, block of positions, head; heads of a group adjacent in the
   launch order so CB and B tiles are reused from L2): dx, the direct part of d(dt'), partial
   sums of dD and the chunk-end share of ds (the gradient of the cumulative log-decay).
4. `_dcb_kernel` (per batch, chunk, group, block pair): dCB[t, u] = sum over the group's heads of
   (dy_t . dt'_u x_u) exp(cum_t - cum_u), the gradient of CB (the intra-chunk parts of dC and dB
   are then dCB B and dCB^T C, once per group rather than once per head), and per head the
   intra-chunk shares of ds.
5. `_dbc_kernel` (per batch, chunk, block of rows, group, N tile): dC and dB together: the
   state terms summed over the group's heads in registers (never expanded to heads), plus the
   dCB products; per head the state-entry share of ds and the chunk-carry term.
Then `dt_chain` (small torch tensors) turns ds into ddt and dA through the reverse cumulative
sum within each chunk, the dt_limit clamp, softplus and bias.
z gating (dz and dy = dout * silu(z)) is elementwise torch around the kernels; y before the gate
is recomputed by the forward's output kernel.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from fastpath.kernels.ssd import fwd, shared_memory
from fastpath.kernels.ssd.fwd import (
    _carry,
    _chunk_bounds,
    _chunk_rows,
    _decay,
    _head_block,
    _pair_block,
    _start_tile,
    _state_tile,
    chunk_cb,
    chunk_outputs,
    chunk_states,
    contiguous_inputs,
    cum_dtype,
    dot_precision,
    light_autotune,
    mm,
    needs_upcast,
    pow2,
    prepare_dt,
    row_layout,
)

# Tile knobs (benchmarks/ssd.py --sweep times alternatives): the row blocks of the dx and
# dB/dC programs, the N tile of the dB/dC programs (fwd.PAIR_BLOCK_M: CB / dCB blocks).
DX_BLOCK_M = 64
DBC_BLOCK_M = 64
DBC_BLOCK_N = 64


@light_autotune(["Q", "P", "N", "BP", "BN"], loop=True,
                prune=shared_memory.prune(shared_memory.state_pass_estimate))
@triton.jit
def _dstates_kernel(
    dy_ptr, C_ptr, cum_ptr, seq_ptr, dfinal_ptr, dstates_ptr, dinit_ptr,
    L, H, G, P, N, NC, Q, SDY, SC,
    HAS_SEQ: tl.constexpr, HAS_DFINAL: tl.constexpr, PREC: tl.constexpr,
    UPCAST: tl.constexpr, BQ: tl.constexpr, BP: tl.constexpr, BN: tl.constexpr,
):
    offs_p, offs_n, b, h, g, pn_mask, pn_off, bh = _state_tile(H, G, P, N, BP, BN)
    dh = _start_tile(dfinal_ptr, bh, P, N, pn_off, pn_mask, HAS_DFINAL, BP, BN)
    offs_t = tl.arange(0, BQ)
    for i in range(NC):
        c = NC - 1 - i
        valid, n_valid, seq_t, seq_last, seq_prev = _chunk_bounds(
            seq_ptr, b, c, L, Q, offs_t, HAS_SEQ
        )
        st_off = ((b.to(tl.int64) * NC + c) * H + h) * P * N
        tl.store(dstates_ptr + st_off + pn_off, dh.to(dstates_ptr.dtype.element_ty),
                 mask=pn_mask)
        cbase = bh * NC * Q + c * Q
        cum = tl.load(cum_ptr + cbase + offs_t, mask=valid, other=0.0)
        cum_last = tl.load(cum_ptr + cbase + n_valid - 1)
        keep = valid & (seq_t == seq_prev)
        scale = _decay(cum, 0.0, keep)
        rows = b.to(tl.int64) * L + c * Q + offs_t
        dy, Ct = _chunk_rows(dy_ptr, C_ptr, rows, valid, SDY, SC, h, g, P, N, offs_p, offs_n)
        dys = (dy.to(tl.float32) * scale[:, None]).to(dy.dtype)
        gate = _carry(seq_last, seq_prev, cum_last, HAS_SEQ)
        dh = dh * gate + mm(tl.trans(dys), Ct, PREC, UPCAST)
    tl.store(dinit_ptr + bh * P * N + pn_off, dh, mask=pn_mask)


@light_autotune(["Q", "P", "N", "BM"], loop=True)
@triton.jit
def _dx_kernel(
    x_ptr, dy_ptr, B_ptr, D_ptr, dtp_ptr, cum_ptr, seq_ptr, dstates_ptr, cb_ptr,
    dx_ptr, ddtd_ptr, ds_ptr, extra_ptr, dD_ptr,
    L, H, G, P, N, NC, Q, SX, SDY, SB,
    HAS_SEQ: tl.constexpr, HAS_D: tl.constexpr, D_PER_CHANNEL: tl.constexpr,
    PREC: tl.constexpr, UPCAST: tl.constexpr,
    BM: tl.constexpr, BP: tl.constexpr, BN: tl.constexpr,
):
    """BM positions u of one chunk and head: dv_u = sum_{t >= u} CB[t, u] exp(cum_t - cum_u) dy_t
    + exp(cum_last - cum_u) B_u R^T (R = gradient of the state leaving the chunk), hence dx_u,
    the direct part of d dt'_u and partial sums of dD; and the chunk-end share of ds (the
    gradient of the log-decay cum), -q_u with q_u = exp(cum_last - cum_u) v_u . (B_u R^T).
    The other shares of ds come from the dCB and dB/dC kernels. The head is the fastest launch
    axis: the group's heads run side by side and share CB and B tiles in L2."""
    n_m = tl.cdiv(Q, BM)
    b, c, h, g, m, offs_m, cbb, cbase, rows_m = _head_block(L, H, G, NC, Q, BM)
    valid_m, n_valid, seq_m, seq_last, _ = _chunk_bounds(seq_ptr, b, c, L, Q, offs_m, HAS_SEQ)
    cum_m = tl.load(cum_ptr + cbase + offs_m, mask=valid_m, other=0.0)
    offs_p = tl.arange(0, BP)
    offs_n = tl.arange(0, BN)
    p_ok = offs_p[None, :] < P
    hp = h * P + offs_p[None, :]
    dv = tl.zeros((BM, BP), dtype=tl.float32)
    for tb in range(m * BM, Q, BM):  # the rows t >= u of the chunk
        offs_k = tb + tl.arange(0, BM)
        valid_k, _, seq_k, _, _ = _chunk_bounds(seq_ptr, b, c, L, Q, offs_k, HAS_SEQ)
        cum_k = tl.load(cum_ptr + cbase + offs_k, mask=valid_k, other=0.0)
        rows_k = b.to(tl.int64) * L + c * Q + offs_k
        dy_k = tl.load(dy_ptr + rows_k[:, None] * SDY + hp, mask=valid_k[:, None] & p_ok,
                       other=0.0)
        pair = (offs_k[None, :] >= offs_m[:, None]) & (seq_m[:, None] == seq_k[None, :])
        pair = pair & valid_m[:, None] & valid_k[None, :]
        decay = _decay(cum_k[None, :], cum_m[:, None], pair)
        cb_ut = tl.load(cb_ptr + cbb + offs_k[None, :] * Q + offs_m[:, None],
                        mask=(offs_m[:, None] < Q) & (offs_k[None, :] < Q), other=0.0)
        dv += mm((cb_ut * decay).to(dy_k.dtype), dy_k, PREC, UPCAST)
    # through the state leaving the chunk
    st_off = ((b.to(tl.int64) * NC + c) * H + h) * P * N
    R = tl.load(dstates_ptr + st_off + offs_p[:, None] * N + offs_n[None, :],
                mask=(offs_p[:, None] < P) & (offs_n[None, :] < N), other=0.0)
    B_m = tl.load(B_ptr + rows_m[:, None] * SB + g * N + offs_n[None, :],
                  mask=valid_m[:, None] & (offs_n[None, :] < N), other=0.0)
    cum_last = tl.load(cum_ptr + cbase + n_valid - 1)
    keep_last = valid_m & (seq_m == seq_last)
    to_end = _decay(cum_last, cum_m, keep_last)
    br = mm(B_m, tl.trans(R.to(B_m.dtype)), PREC, UPCAST)  # (BM, P): B_u R^T
    dv += br * to_end[:, None]
    dtp_m = tl.load(dtp_ptr + cbase + offs_m, mask=valid_m, other=0.0)
    x_m = tl.load(x_ptr + rows_m[:, None] * SX + hp, mask=valid_m[:, None] & p_ok, other=0.0)
    xf = x_m.to(tl.float32)
    v_m = (xf * dtp_m[:, None]).to(x_m.dtype)
    q = to_end * tl.sum(v_m.to(tl.float32) * br, axis=1)
    tl.store(extra_ptr + ((b.to(tl.int64) * NC + c) * H + h) * n_m + m, tl.sum(q))
    tl.store(ds_ptr + cbase + offs_m, -q, mask=valid_m)
    tl.store(ddtd_ptr + cbase + offs_m, tl.sum(xf * dv, axis=1), mask=valid_m)
    dx = dv * dtp_m[:, None]
    if HAS_D:
        dyf = tl.load(dy_ptr + rows_m[:, None] * SDY + hp, mask=valid_m[:, None] & p_ok,
                      other=0.0).to(tl.float32)
        blk = ((b.to(tl.int64) * NC + c) * n_m + m) * H + h
        if D_PER_CHANNEL:
            d = tl.load(D_ptr + h * P + offs_p, mask=offs_p < P, other=0.0).to(tl.float32)
            dx += dyf * d[None, :]
            tl.store(dD_ptr + blk * P + offs_p, tl.sum(dyf * xf, axis=0), mask=offs_p < P)
        else:
            dx += dyf * tl.load(D_ptr + h).to(tl.float32)
            tl.store(dD_ptr + blk, tl.sum(dyf * xf))
    tl.store(dx_ptr + rows_m[:, None] * (H * P) + hp, dx.to(dx_ptr.dtype.element_ty),
             mask=valid_m[:, None] & p_ok)


def dt_chain(ds: Tensor, extra: Tensor, ddtd: Tensor, dtp: Tensor, dt: Tensor, A: Tensor,
             dt_bias: Tensor | None, dt_softplus: bool, dt_limit: tuple[float, float],
             chunk_size: int) -> tuple[Tensor, Tensor]:
    """From the per-position pieces to (ddt (B, L, H) float32, dA (H,)): d cum -> d(A dt') by a
    reverse cumulative sum within each chunk (plus the chunk-end extra), then back through the
    dt_limit clamp, softplus and bias. Small (B, H, L) float32 tensors: plain torch."""
    batch, seqlen, nheads = dt.shape
    nchunks = extra.shape[1]
    shape = (batch, nheads, nchunks, chunk_size)
    da = ds.view(shape).flip(-1).cumsum(-1).flip(-1)
    da = da + extra.sum(-1).permute(0, 2, 1)[..., None]  # (B, NC, H, nM) -> (B, H, NC, 1)
    da = da.reshape(batch, nheads, -1)[..., :seqlen]
    dtp = dtp[..., :seqlen]
    A32 = A.float()[None, :, None]
    dA = (da * dtp).sum(dim=(0, 2))
    ddtp = ddtd[..., :seqlen] + A32 * da
    raw = dt.float().permute(0, 2, 1)
    if dt_bias is not None:
        raw = raw + dt_bias.float()[None, :, None]
    if dt_softplus:
        sp = torch.where(raw <= 20.0, torch.nn.functional.softplus(raw), raw)
        ddtp = ddtp * torch.where(raw <= 20.0, torch.sigmoid(raw), torch.ones_like(raw))
    else:
        sp = raw
    if tuple(dt_limit) != (0.0, float("inf")):
        ddtp = ddtp * ((sp >= dt_limit[0]) & (sp <= dt_limit[1]))
    return ddtp.permute(0, 2, 1), dA


@light_autotune(["Q", "P", "BM"], loop=True)
@triton.jit
def _dcb_kernel(
    x_ptr, dy_ptr, dtp_ptr, cum_ptr, seq_ptr, cb_ptr, dcb_ptr, dsw_ptr,
    L, H, G, P, NC, Q, SX, SDY, SW,
    HAS_SEQ: tl.constexpr, PREC: tl.constexpr, UPCAST: tl.constexpr,
    BM: tl.constexpr, BP: tl.constexpr,
):
    """One BM x BM block (rows t, columns u) of chunk c and group g, with
    W_h[t, u] = (dy_t . dt'_u x_u) exp(cum_t - cum_u) for u <= t of one sequence:
    dCB[t, u] = sum over the group's heads of W_h (float32; 0 above the diagonal); per head, the
    row sums (into dsw[0, block u]) and column sums (into dsw[1, block t]) of T_h = CB * W_h, the
    intra-chunk shares of ds."""
    b, c, g, mt, mu, offs_t, offs_u = _pair_block(G, NC, Q, BM)
    n_m = tl.cdiv(Q, BM)
    offs_p = tl.arange(0, BP)
    p_ok = offs_p[None, :] < P
    valid_t, _, seq_t, _, _ = _chunk_bounds(seq_ptr, b, c, L, Q, offs_t, HAS_SEQ)
    valid_u, _, seq_u, _, _ = _chunk_bounds(seq_ptr, b, c, L, Q, offs_u, HAS_SEQ)
    rows_t = b.to(tl.int64) * L + c * Q + offs_t
    rows_u = b.to(tl.int64) * L + c * Q + offs_u
    pair = (offs_t[:, None] >= offs_u[None, :]) & (seq_t[:, None] == seq_u[None, :])
    pair = pair & valid_t[:, None] & valid_u[None, :]
    ratio = H // G
    base = ((b.to(tl.int64) * NC + c) * G + g) * Q * Q
    blk = base + offs_t[:, None] * Q + offs_u[None, :]
    blk_ok = (offs_t[:, None] < Q) & (offs_u[None, :] < Q)
    cb = tl.load(cb_ptr + blk, mask=blk_ok, other=0.0)
    acc = tl.zeros((BM, BM), dtype=tl.float32)
    for j in range(0, tl.where(mu <= mt, ratio, 0)):  # nothing to sum above the diagonal
        h = g * ratio + j
        cbase = (b.to(tl.int64) * H + h) * NC * Q + c * Q
        cum_t = tl.load(cum_ptr + cbase + offs_t, mask=valid_t, other=0.0)
        cum_u = tl.load(cum_ptr + cbase + offs_u, mask=valid_u, other=0.0)
        dtp_u = tl.load(dtp_ptr + cbase + offs_u, mask=valid_u, other=0.0)
        dy_t = tl.load(dy_ptr + rows_t[:, None] * SDY + h * P + offs_p[None, :],
                       mask=valid_t[:, None] & p_ok, other=0.0)
        x_u = tl.load(x_ptr + rows_u[:, None] * SX + h * P + offs_p[None, :],
                      mask=valid_u[:, None] & p_ok, other=0.0)
        v_u = (x_u.to(tl.float32) * dtp_u[:, None]).to(x_u.dtype)
        decay = _decay(cum_t[:, None], cum_u[None, :], pair)
        w = mm(dy_t, tl.trans(v_u), PREC, UPCAST) * decay
        acc += w
        t_hu = cb * w
        tl.store(dsw_ptr + mu * SW + cbase + offs_t, tl.sum(t_hu, axis=1), mask=valid_t)
        tl.store(dsw_ptr + (n_m + mt) * SW + cbase + offs_u, tl.sum(t_hu, axis=0), mask=valid_u)
    tl.store(dcb_ptr + blk, acc, mask=blk_ok)


@light_autotune(["Q", "P", "N", "BM", "BN"], loop=True,
                prune=shared_memory.prune(shared_memory.dbc_estimate))
@triton.jit
def _dbc_kernel(
    x_ptr, dy_ptr, B_ptr, C_ptr, dtp_ptr, cum_ptr, seq_ptr, states_ptr, dstates_ptr, dcb_ptr,
    dB_ptr, dC_ptr, dsi_ptr, rh_ptr,
    L, H, G, P, N, NC, Q, SX, SDY, SB, SC, SI,
    HAS_SEQ: tl.constexpr, PREC: tl.constexpr, UPCAST: tl.constexpr,
    BM: tl.constexpr, BP: tl.constexpr, BN: tl.constexpr,
):
    """dC and dB for BM rows of one chunk and an N tile of one group.

    State terms, summed over the group's heads: dC_t += exp(cum_t) dy_t h_in (the state
    entering the chunk), dB_u += exp(cum_last - cum_u) (dt'_u x_u) R (R = gradient of the state
    leaving it). Intra-chunk terms, once per group: dC_t += sum_u dCB[t, u] B_u over the blocks
    up to the diagonal, dB_u += sum_t dCB[t, u] C_t over the blocks from it to the chunk's end.
    Per head, for ds: exp(cum_t) C_t . (dy_t h_in) over this N tile (into dsi[tile]), and from
    the first row block, the chunk-carry term carry * sum(R * h_in) over the tile (into rh).
    """
    offs_n = tl.program_id(0) * BN + tl.arange(0, BN)
    n_m = tl.cdiv(Q, BM)
    pid = tl.program_id(1)
    m = pid % n_m
    b = (pid // n_m) // NC
    c = (pid // n_m) % NC
    g = tl.program_id(2)
    ratio = H // G
    offs_m = m * BM + tl.arange(0, BM)
    offs_p = tl.arange(0, BP)
    valid_m, n_valid, seq_m, seq_last, seq_prev = _chunk_bounds(
        seq_ptr, b, c, L, Q, offs_m, HAS_SEQ
    )
    rows_m = b.to(tl.int64) * L + c * Q + offs_m
    n_ok = offs_n[None, :] < N
    mp_mask = valid_m[:, None] & (offs_p[None, :] < P)
    pn_mask = (offs_p[:, None] < P) & n_ok
    pn_off = offs_p[:, None] * N + offs_n[None, :]
    prev_ok = valid_m & (seq_m == seq_prev)
    keep_last = valid_m & (seq_m == seq_last)
    C_m = tl.load(C_ptr + rows_m[:, None] * SC + g * N + offs_n[None, :],
                  mask=valid_m[:, None] & n_ok, other=0.0).to(tl.float32)
    acc_c = tl.zeros((BM, BN), dtype=tl.float32)
    acc_b = tl.zeros((BM, BN), dtype=tl.float32)
    for j in range(ratio):
        h = g * ratio + j
        cbase = (b.to(tl.int64) * H + h) * NC * Q + c * Q
        cum_m = tl.load(cum_ptr + cbase + offs_m, mask=valid_m, other=0.0)
        dtp_m = tl.load(dtp_ptr + cbase + offs_m, mask=valid_m, other=0.0)
        cum_last = tl.load(cum_ptr + cbase + n_valid - 1)
        hp = h * P + offs_p[None, :]
        st_off = ((b.to(tl.int64) * NC + c) * H + h) * P * N
        dy_m = tl.load(dy_ptr + rows_m[:, None] * SDY + hp, mask=mp_mask, other=0.0)
        x_m = tl.load(x_ptr + rows_m[:, None] * SX + hp, mask=mp_mask, other=0.0)
        v_m = (x_m.to(tl.float32) * dtp_m[:, None]).to(x_m.dtype)
        h_in = tl.load(states_ptr + st_off + pn_off, mask=pn_mask, other=0.0)
        R = tl.load(dstates_ptr + st_off + pn_off, mask=pn_mask, other=0.0)
        from_start = _decay(cum_m, 0.0, prev_ok)
        to_end = _decay(cum_last, cum_m, keep_last)
        dyh = mm(dy_m, h_in.to(dy_m.dtype), PREC, UPCAST) * from_start[:, None]
        acc_c += dyh
        tl.store(dsi_ptr + tl.program_id(0) * SI + cbase + offs_m, tl.sum(C_m * dyh, axis=1),
                 mask=valid_m)
        acc_b += mm(v_m, R.to(v_m.dtype), PREC, UPCAST) * to_end[:, None]
        if m == 0:  # the state carried across the whole chunk, once per chunk and N tile
            rh = tl.sum(tl.sum(R.to(tl.float32) * h_in.to(tl.float32), axis=1))
            carry = _carry(seq_last, seq_prev, cum_last, HAS_SEQ)
            tl.store(rh_ptr + ((b.to(tl.int64) * NC + c) * H + h) * tl.num_programs(0)
                     + tl.program_id(0), carry * rh)
    dbase = ((b.to(tl.int64) * NC + c) * G + g) * Q * Q
    m_ok = offs_m < Q
    for kb in range(0, (m + 1) * BM, BM):  # dC: source blocks up to the diagonal
        offs_k = kb + tl.arange(0, BM)
        valid_k = (offs_k < Q) & (c * Q + offs_k < L)
        rows_k = b.to(tl.int64) * L + c * Q + offs_k
        B_k = tl.load(B_ptr + rows_k[:, None] * SB + g * N + offs_n[None, :],
                      mask=valid_k[:, None] & n_ok, other=0.0)
        d_tu = tl.load(dcb_ptr + dbase + offs_m[:, None] * Q + offs_k[None, :],
                       mask=m_ok[:, None] & (offs_k[None, :] < Q), other=0.0)
        acc_c += mm(d_tu.to(B_k.dtype), B_k, PREC, UPCAST)
    for tb in range(m * BM, Q, BM):  # dB: row blocks from the diagonal to the chunk's end
        offs_k = tb + tl.arange(0, BM)
        valid_k = (offs_k < Q) & (c * Q + offs_k < L)
        rows_k = b.to(tl.int64) * L + c * Q + offs_k
        C_k = tl.load(C_ptr + rows_k[:, None] * SC + g * N + offs_n[None, :],
                      mask=valid_k[:, None] & n_ok, other=0.0)
        d_ut = tl.load(dcb_ptr + dbase + offs_k[None, :] * Q + offs_m[:, None],
                       mask=m_ok[:, None] & (offs_k[None, :] < Q), other=0.0)
        acc_b += mm(d_ut.to(C_k.dtype), C_k, PREC, UPCAST)
    bo = rows_m[:, None] * (G * N) + g * N + offs_n[None, :]
    out_mask = valid_m[:, None] & n_ok
    tl.store(dC_ptr + bo, acc_c.to(dC_ptr.dtype.element_ty), mask=out_mask)
    tl.store(dB_ptr + bo, acc_b.to(dB_ptr.dtype.element_ty), mask=out_mask)


def ssd_scan_bwd_triton(dout, dfinal, x, dt, A, B, C, D, z, dt_bias, initial_states, seq_idx,
                        chunk_size, dt_softplus, dt_limit):
    """(dx, ddt, dA, dB, dC, dD, dz, ddt_bias, dinitial_states); None where not applicable."""
    x, B, C, z, seq_idx = contiguous_inputs(x, B, C, z, seq_idx)
    batch, seqlen, nheads, headdim = x.shape
    ngroups, dstate = B.shape[2:]
    nchunks = triton.cdiv(seqlen, chunk_size)
    dtp, cum = prepare_dt(dt, A, dt_bias, chunk_size, dt_softplus, dt_limit, cum_dtype(x.dtype))
    states, _ = chunk_states(x, B, dtp, cum, seq_idx, initial_states, chunk_size)
    cb = chunk_cb(B, C, chunk_size)
    dz = None
    if z is not None:
        y = chunk_outputs(x, B, C, None, D, dtp, cum, seq_idx, states, chunk_size, cb)
        zf = z.float()
        sig = torch.sigmoid(zf)
        dz = (dout.float() * y.float() * sig * (1 + zf * (1 - sig))).to(z.dtype)
        dy = (dout.float() * zf * sig).to(x.dtype)
    else:
        dy = dout.to(x.dtype)
    dy = row_layout(dy)  # elementwise results keep dout's strides, whatever they are
    prec, up = dot_precision(x.dtype), needs_upcast(x.dtype)
    bq, bp_full, bn_full = pow2(chunk_size), pow2(headdim), pow2(dstate)
    seq_arg = seq_idx if seq_idx is not None else dtp

    dstates = torch.empty_like(states)
    dinit = torch.empty((batch, nheads, headdim, dstate), device=x.device, dtype=torch.float32)
    bp, bn = min(bp_full, fwd.STATE_BLOCK), min(bn_full, fwd.STATE_BLOCK)
    bp, bn = shared_memory.state_tile(x.device, x.dtype, bq, bp, bn)
    grid = (triton.cdiv(headdim, bp) * triton.cdiv(dstate, bn), batch * nheads)
    _dstates_kernel[grid](
        dy, C, cum, seq_arg, dfinal.contiguous() if dfinal is not None else dtp, dstates, dinit,
        seqlen, nheads, ngroups, headdim, dstate, nchunks, chunk_size, dy.stride(1), C.stride(1),
        HAS_SEQ=seq_idx is not None, HAS_DFINAL=dfinal is not None, PREC=prec, UPCAST=up,
        BQ=bq, BP=bp, BN=bn,
    )

    dx = torch.empty(x.shape, device=x.device, dtype=x.dtype)
    bm = min(DX_BLOCK_M, bq)
    n_m = triton.cdiv(chunk_size, bm)
    ds = torch.zeros_like(dtp)  # padding positions must add nothing to the reverse sums
    ddtd = torch.empty_like(dtp)
    extra = torch.empty((batch, nchunks, nheads, n_m), device=x.device, dtype=torch.float32)
    per_channel = D is not None and D.dim() == 2
    dD_part = torch.empty(
        (batch, nchunks, n_m, nheads, headdim if per_channel else 1) if D is not None else (0,),
        device=x.device, dtype=torch.float32,
    )
    _dx_kernel[(nheads, batch * nchunks * n_m)](
        x, dy, B, D.contiguous() if D is not None else x, dtp, cum, seq_arg, dstates, cb,
        dx, ddtd, ds, extra, dD_part,
        seqlen, nheads, ngroups, headdim, dstate, nchunks, chunk_size,
        x.stride(1), dy.stride(1), B.stride(1),
        HAS_SEQ=seq_idx is not None, HAS_D=D is not None, D_PER_CHANNEL=per_channel,
        PREC=prec, UPCAST=up, BM=bm, BP=bp_full, BN=bn_full,
    )

    # dCB and the intra-chunk shares of ds. Its own buffer, never CB's: the autotuner runs a
    # kernel several times on the same arguments, so a kernel must not read what it writes.
    dcb = torch.empty_like(cb)
    bm_pair = min(fwd.PAIR_BLOCK_M, bq)
    n_pair = triton.cdiv(chunk_size, bm_pair)
    dsw = torch.zeros((2 * n_pair, *dtp.shape), device=x.device, dtype=torch.float32)
    _dcb_kernel[(n_pair * n_pair, batch * nchunks * ngroups)](
        x, dy, dtp, cum, seq_arg, cb, dcb, dsw, seqlen, nheads, ngroups, headdim, nchunks, chunk_size,
        x.stride(1), dy.stride(1), dtp.numel(),
        HAS_SEQ=seq_idx is not None, PREC=prec, UPCAST=up, BM=bm_pair, BP=bp_full,
    )
    dB = torch.empty(B.shape, device=x.device, dtype=B.dtype)
    dC = torch.empty(C.shape, device=x.device, dtype=C.dtype)
    bm_bc = min(DBC_BLOCK_M, bq)
    bn_bc = shared_memory.dbc_tile(x.device, x.dtype, bm_bc, min(bn_full, DBC_BLOCK_N))
    n_nt = triton.cdiv(dstate, bn_bc)
    dsi = torch.zeros((n_nt, *dtp.shape), device=x.device, dtype=torch.float32)
    rh = torch.empty((batch, nchunks, nheads, n_nt), device=x.device, dtype=torch.float32)
    grid = (n_nt, batch * nchunks * triton.cdiv(chunk_size, bm_bc), ngroups)
    _dbc_kernel[grid](
        x, dy, B, C, dtp, cum, seq_arg, states, dstates, dcb, dB, dC, dsi, rh,
        seqlen, nheads, ngroups, headdim, dstate, nchunks, chunk_size,
        x.stride(1), dy.stride(1), B.stride(1), C.stride(1), dtp.numel(),
        HAS_SEQ=seq_idx is not None, PREC=prec, UPCAST=up, BM=bm_bc, BP=bp_full, BN=bn_bc,
    )
    ds += dsi.sum(0) + dsw[:n_pair].sum(0) - dsw[n_pair:].sum(0)
    ddt, dA = dt_chain(ds, torch.cat([extra, rh], -1), ddtd, dtp, dt, A, dt_bias, dt_softplus,
                       dt_limit, chunk_size)
    dD = None
    if D is not None:
        dD = dD_part.sum(dim=(0, 1, 2))
        dD = dD if per_channel else dD[:, 0]
    ddt_bias = ddt.sum(dim=(0, 1)) if dt_bias is not None else None
    return (dx, ddt, dA, dB, dC, dD, dz, ddt_bias,
            dinit if initial_states is not None else None)
