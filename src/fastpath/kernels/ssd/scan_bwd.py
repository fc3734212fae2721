"""Triton backward of the chunked state-space scan: the forward's decomposition in reverse.

Recompute dt', cum and the states entering each chunk (scan_fwd), then:
1. `_dstates_kernel` (per batch, head, P/N tile; sequential over chunks, newest first, float32):
   R_c = dL/d(state leaving chunk c);  R_{c-1} = gate_c R_c + sum_t exp(cum_t) dy_t^T C_t,
   and dinitial_states = the gradient entering chunk 0.
2. `_dx_kernel` (per batch, chunk, head): dx, d(dt') (through the decay's cumulative sum, then
   the dt_limit clamp, softplus and bias), per-chunk partial sums of dA and dD.
3. `_dbc_kernel` (per batch, chunk, group, N tile): dB and dC summed over the group's heads in
   registers (never expanded to heads): W = sum_h (dy_h (dt' x_h)^T) * decay_h, dC = W B + ...,
   dB = W^T C + ...
z gating (dz and dy = dout * silu(z)) is elementwise torch around the kernels; y before the gate
is recomputed by the forward's output kernel.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from fastpath.kernels.ssd import scan_fwd as fwd
from fastpath.kernels.ssd.scan_fwd import (
    _carry,
    _chunk_bounds,
    chunk_outputs,
    chunk_states,
    contiguous_inputs,
    dot_precision,
    heads_per_program,
    light_autotune,
    mm,
    needs_upcast,
    pow2,
    prepare_dt,
    row_layout,
)

# Tile knobs (benchmarks/ssd.py --sweep times alternatives): heads of a group per dx program,
# the N tile of the dB/dC programs.
DX_HEADS_CAP = 2
DBC_BLOCK_N = 64


@light_autotune(["Q", "P", "N", "BP", "BN"], loop=True)
@triton.jit
def _dstates_kernel(
    dy_ptr, C_ptr, cum_ptr, seq_ptr, dfinal_ptr, dstates_ptr, dinit_ptr,
    L, H, G, P, N, NC, Q, SDY, SC,
    HAS_SEQ: tl.constexpr, HAS_DFINAL: tl.constexpr, PREC: tl.constexpr,
    UPCAST: tl.constexpr, BQ: tl.constexpr, BP: tl.constexpr, BN: tl.constexpr,
):
    n_nb = tl.cdiv(N, BN)
    pid_pn = tl.program_id(0)
    offs_p = (pid_pn // n_nb) * BP + tl.arange(0, BP)
    offs_n = (pid_pn % n_nb) * BN + tl.arange(0, BN)
    pid_bh = tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    g = h // (H // G)
    pn_mask = (offs_p[:, None] < P) & (offs_n[None, :] < N)
    pn_off = offs_p[:, None] * N + offs_n[None, :]
    bh = b.to(tl.int64) * H + h
    if HAS_DFINAL:
        dh = tl.load(dfinal_ptr + bh * P * N + pn_off, mask=pn_mask, other=0.0).to(tl.float32)
    else:
        dh = tl.zeros((BP, BN), dtype=tl.float32)
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
        scale = tl.where(keep, tl.exp(tl.where(keep, cum, 0.0)), 0.0)
        rows = b.to(tl.int64) * L + c * Q + offs_t
        dy = tl.load(dy_ptr + rows[:, None] * SDY + h * P + offs_p[None, :],
                     mask=valid[:, None] & (offs_p[None, :] < P), other=0.0)
        Ct = tl.load(C_ptr + rows[:, None] * SC + g * N + offs_n[None, :],
                     mask=valid[:, None] & (offs_n[None, :] < N), other=0.0)
        dys = (dy.to(tl.float32) * scale[:, None]).to(dy.dtype)
        gate = _carry(seq_last, seq_prev, cum_last, HAS_SEQ)
        dh = dh * gate + mm(tl.trans(dys), Ct, PREC, UPCAST)
    tl.store(dinit_ptr + bh * P * N + pn_off, dh, mask=pn_mask)


@light_autotune(["Q", "P", "N", "HPP"])
@triton.jit
def _dx_kernel(
    x_ptr, dy_ptr, B_ptr, C_ptr, D_ptr, A_ptr, dt_ptr, bias_ptr, dtp_ptr, cum_ptr, seq_ptr,
    states_ptr, dstates_ptr,
    dx_ptr, ddt_ptr, dA_ptr, dD_ptr,
    L, H, G, P, N, NC, Q, SX, SDY, SB, SC, dt_min, dt_max,
    HAS_SEQ: tl.constexpr, HAS_D: tl.constexpr, D_PER_CHANNEL: tl.constexpr,
    HAS_BIAS: tl.constexpr, SOFTPLUS: tl.constexpr, HAS_LIMIT: tl.constexpr,
    PREC: tl.constexpr, UPCAST: tl.constexpr, HPP: tl.constexpr,
    BQ: tl.constexpr, BP: tl.constexpr, BN: tl.constexpr,
):
    """One program: a chunk of HPP heads of one group, sharing one C B^T tile."""
    pid_bc = tl.program_id(0)
    b = pid_bc // NC
    c = pid_bc % NC
    ratio = H // G
    n_hb = ratio // HPP
    g = tl.program_id(1) // n_hb
    h0 = g * ratio + (tl.program_id(1) % n_hb) * HPP
    offs_t = tl.arange(0, BQ)
    offs_p = tl.arange(0, BP)
    offs_n = tl.arange(0, BN)
    valid, n_valid, seq_t, seq_last, seq_prev = _chunk_bounds(seq_ptr, b, c, L, Q, offs_t, HAS_SEQ)
    rows = b.to(tl.int64) * L + c * Q + offs_t
    tn_mask = valid[:, None] & (offs_n[None, :] < N)
    tp_mask = valid[:, None] & (offs_p[None, :] < P)
    pn_mask = (offs_p[:, None] < P) & (offs_n[None, :] < N)
    pn_off = offs_p[:, None] * N + offs_n[None, :]
    Ct = tl.load(C_ptr + rows[:, None] * SC + g * N + offs_n[None, :], mask=tn_mask, other=0.0)
    Bt = tl.load(B_ptr + rows[:, None] * SB + g * N + offs_n[None, :], mask=tn_mask, other=0.0)
    cb = mm(Ct, tl.trans(Bt), PREC, UPCAST)
    # intra-chunk pairs (t attends u <= t of its own sequence)
    pair = (offs_t[:, None] >= offs_t[None, :]) & (seq_t[:, None] == seq_t[None, :])
    pair = pair & valid[:, None] & valid[None, :]
    keep_last = valid & (seq_t == seq_last)
    prev_ok = valid & (seq_t == seq_prev)
    for j in range(HPP):
        h = h0 + j
        bh = b.to(tl.int64) * H + h
        cbase = bh * NC * Q + c * Q
        dtp = tl.load(dtp_ptr + cbase + offs_t, mask=valid, other=0.0)
        cum = tl.load(cum_ptr + cbase + offs_t, mask=valid, other=0.0)
        cum_last = tl.load(cum_ptr + cbase + n_valid - 1)
        hp = h * P + offs_p[None, :]
        x = tl.load(x_ptr + rows[:, None] * SX + hp, mask=tp_mask, other=0.0)
        dy = tl.load(dy_ptr + rows[:, None] * SDY + hp, mask=tp_mask, other=0.0)
        st_off = ((b.to(tl.int64) * NC + c) * H + h) * P * N
        h_in = tl.load(states_ptr + st_off + pn_off, mask=pn_mask, other=0.0)
        R = tl.load(dstates_ptr + st_off + pn_off, mask=pn_mask, other=0.0)

        decay = tl.exp(tl.where(pair, cum[:, None] - cum[None, :], -float("inf")))
        cbd = cb * decay
        xf = x.to(tl.float32)
        v = xf * dtp[:, None]
        dv = mm(tl.trans(cbd.to(dy.dtype)), dy, PREC, UPCAST)
        # through the state leaving the chunk
        to_end = tl.where(keep_last, tl.exp(tl.where(keep_last, cum_last - cum, 0.0)), 0.0)
        br = mm(Bt, tl.trans(R.to(Bt.dtype)), PREC, UPCAST)  # (Q, P): B_u R^T
        dv += br * to_end[:, None]
        dx = dv * dtp[:, None]
        dyf = dy.to(tl.float32)
        if HAS_D:
            if D_PER_CHANNEL:
                d = tl.load(D_ptr + h * P + offs_p, mask=offs_p < P, other=0.0).to(tl.float32)
                dx += dyf * d[None, :]
                tl.store(dD_ptr + ((b.to(tl.int64) * NC + c) * H + h) * P + offs_p,
                         tl.sum(dyf * xf, axis=0), mask=offs_p < P)
            else:
                dx += dyf * tl.load(D_ptr + h).to(tl.float32)
                tl.store(dD_ptr + (b.to(tl.int64) * NC + c) * H + h, tl.sum(dyf * xf))
        tl.store(dx_ptr + rows[:, None] * (H * P) + hp, dx.to(dx_ptr.dtype.element_ty),
                 mask=tp_mask)
        ddtp = tl.sum(xf * dv, axis=1)

        # gradient of the cumulative log-decay cum_t
        dyv = mm(dy, tl.trans(v.to(dy.dtype)), PREC, UPCAST)  # (t, u): dy_t . v_u
        tt = cbd * dyv
        ds = tl.sum(tt, axis=1) - tl.sum(tt, axis=0)
        from_start = tl.where(prev_ok, tl.exp(tl.where(prev_ok, cum, 0.0)), 0.0)
        inter = mm(Ct, tl.trans(h_in.to(Ct.dtype)), PREC, UPCAST)  # (Q, P): C_t h_in^T
        ds += from_start * tl.sum(dyf * inter, axis=1)
        q = to_end * tl.sum(v * br, axis=1)
        gate = _carry(seq_last, seq_prev, cum_last, HAS_SEQ)
        rh = tl.sum(tl.sum(R.to(tl.float32) * h_in.to(tl.float32), axis=1))
        ds = ds - q + tl.where(offs_t == n_valid - 1, tl.sum(q) + gate * rh, 0.0)
        ds = tl.where(valid, ds, 0.0)
        da = tl.sum(ds) - tl.cumsum(ds, axis=0) + ds  # reverse cumulative sum
        ddtp += da * tl.load(A_ptr + h).to(tl.float32)
        tl.store(dA_ptr + (b.to(tl.int64) * NC + c) * H + h, tl.sum(da * dtp))

        # through dt' = clamp(softplus(dt + bias))
        raw = tl.load(dt_ptr + rows * H + h, mask=valid, other=0.0).to(tl.float32)
        if HAS_BIAS:
            raw += tl.load(bias_ptr + h).to(tl.float32)
        if SOFTPLUS:
            sp = tl.where(raw <= 20.0, tl.log(1.0 + tl.exp(tl.minimum(raw, 20.0))), raw)
            ddtp = ddtp * tl.where(raw <= 20.0, tl.sigmoid(raw), 1.0)
        else:
            sp = raw
        if HAS_LIMIT:
            ddtp = tl.where((sp >= dt_min) & (sp <= dt_max), ddtp, 0.0)
        tl.store(ddt_ptr + rows * H + h, ddtp, mask=valid)


@light_autotune(["Q", "P", "N", "BN"], loop=True)
@triton.jit
def _dbc_kernel(
    x_ptr, dy_ptr, B_ptr, C_ptr, dtp_ptr, cum_ptr, seq_ptr, states_ptr, dstates_ptr,
    dB_ptr, dC_ptr,
    L, H, G, P, N, NC, Q, SX, SDY, SB, SC,
    HAS_SEQ: tl.constexpr, PREC: tl.constexpr, UPCAST: tl.constexpr,
    BQ: tl.constexpr, BP: tl.constexpr, BN: tl.constexpr,
):
    offs_n = tl.program_id(0) * BN + tl.arange(0, BN)
    pid_bc = tl.program_id(1)
    b = pid_bc // NC
    c = pid_bc % NC
    g = tl.program_id(2)
    ratio = H // G
    offs_t = tl.arange(0, BQ)
    offs_p = tl.arange(0, BP)
    valid, n_valid, seq_t, seq_last, seq_prev = _chunk_bounds(seq_ptr, b, c, L, Q, offs_t, HAS_SEQ)
    rows = b.to(tl.int64) * L + c * Q + offs_t
    tn_mask = valid[:, None] & (offs_n[None, :] < N)
    tp_mask = valid[:, None] & (offs_p[None, :] < P)
    pn_mask = (offs_p[:, None] < P) & (offs_n[None, :] < N)
    pn_off = offs_p[:, None] * N + offs_n[None, :]
    pair = (offs_t[:, None] >= offs_t[None, :]) & (seq_t[:, None] == seq_t[None, :])
    pair = pair & valid[:, None] & valid[None, :]
    prev_ok = valid & (seq_t == seq_prev)
    keep_last = valid & (seq_t == seq_last)
    w_sum = tl.zeros((BQ, BQ), dtype=tl.float32)
    dC = tl.zeros((BQ, BN), dtype=tl.float32)
    dB = tl.zeros((BQ, BN), dtype=tl.float32)
    for j in range(ratio):
        h = g * ratio + j
        bh = b.to(tl.int64) * H + h
        cbase = bh * NC * Q + c * Q
        dtp = tl.load(dtp_ptr + cbase + offs_t, mask=valid, other=0.0)
        cum = tl.load(cum_ptr + cbase + offs_t, mask=valid, other=0.0)
        cum_last = tl.load(cum_ptr + cbase + n_valid - 1)
        hp = h * P + offs_p[None, :]
        x = tl.load(x_ptr + rows[:, None] * SX + hp, mask=tp_mask, other=0.0)
        dy = tl.load(dy_ptr + rows[:, None] * SDY + hp, mask=tp_mask, other=0.0)
        v = (x.to(tl.float32) * dtp[:, None]).to(x.dtype)
        decay = tl.exp(tl.where(pair, cum[:, None] - cum[None, :], -float("inf")))
        w_sum += mm(dy, tl.trans(v), PREC, UPCAST) * decay
        st_off = ((b.to(tl.int64) * NC + c) * H + h) * P * N
        h_in = tl.load(states_ptr + st_off + pn_off, mask=pn_mask, other=0.0)
        R = tl.load(dstates_ptr + st_off + pn_off, mask=pn_mask, other=0.0)
        from_start = tl.where(prev_ok, tl.exp(tl.where(prev_ok, cum, 0.0)), 0.0)
        to_end = tl.where(keep_last, tl.exp(tl.where(keep_last, cum_last - cum, 0.0)), 0.0)
        dC += mm(dy, h_in.to(dy.dtype), PREC, UPCAST) * from_start[:, None]
        dB += mm(v, R.to(v.dtype), PREC, UPCAST) * to_end[:, None]
    Ct = tl.load(C_ptr + rows[:, None] * SC + g * N + offs_n[None, :], mask=tn_mask, other=0.0)
    Bt = tl.load(B_ptr + rows[:, None] * SB + g * N + offs_n[None, :], mask=tn_mask, other=0.0)
    w = w_sum.to(Bt.dtype)
    dC += mm(w, Bt, PREC, UPCAST)
    dB += mm(tl.trans(w), Ct, PREC, UPCAST)
    bo = rows[:, None] * (G * N) + g * N + offs_n[None, :]
    tl.store(dC_ptr + bo, dC.to(dC_ptr.dtype.element_ty), mask=tn_mask)
    tl.store(dB_ptr + bo, dB.to(dB_ptr.dtype.element_ty), mask=tn_mask)


def ssd_scan_bwd_triton(dout, dfinal, x, dt, A, B, C, D, z, dt_bias, initial_states, seq_idx,
                        chunk_size, dt_softplus, dt_limit):
    """(dx, ddt, dA, dB, dC, dD, dz, ddt_bias, dinitial_states); None where not applicable."""
    x, B, C, z, seq_idx = contiguous_inputs(x, B, C, z, seq_idx)
    batch, seqlen, nheads, headdim = x.shape
    ngroups, dstate = B.shape[2:]
    nchunks = triton.cdiv(seqlen, chunk_size)
    dtp, cum = prepare_dt(dt, A, dt_bias, chunk_size, dt_softplus, dt_limit)
    states, _ = chunk_states(x, B, dtp, cum, seq_idx, initial_states, chunk_size)
    dz = None
    if z is not None:
        y = chunk_outputs(x, B, C, None, D, dtp, cum, seq_idx, states, chunk_size)
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
    grid = (triton.cdiv(headdim, bp) * triton.cdiv(dstate, bn), batch * nheads)
    _dstates_kernel[grid](
        dy, C, cum, seq_arg, dfinal.contiguous() if dfinal is not None else dtp, dstates, dinit,
        seqlen, nheads, ngroups, headdim, dstate, nchunks, chunk_size, dy.stride(1), C.stride(1),
        HAS_SEQ=seq_idx is not None, HAS_DFINAL=dfinal is not None, PREC=prec, UPCAST=up,
        BQ=bq, BP=bp, BN=bn,
    )

    dx = torch.empty(x.shape, device=x.device, dtype=x.dtype)
    ddt = torch.empty((batch, seqlen, nheads), device=x.device, dtype=torch.float32)
    dA_part = torch.empty((batch, nchunks, nheads), device=x.device, dtype=torch.float32)
    per_channel = D is not None and D.dim() == 2
    dD_part = torch.empty(
        (batch, nchunks, nheads, headdim if per_channel else 1) if D is not None else (0,),
        device=x.device, dtype=torch.float32,
    )
    hpp = heads_per_program(nheads // ngroups, DX_HEADS_CAP)
    _dx_kernel[(batch * nchunks, nheads // hpp)](
        x, dy, B, C, D.contiguous() if D is not None else x, A.contiguous(), dt.contiguous(),
        dt_bias.contiguous() if dt_bias is not None else dtp, dtp, cum, seq_arg,
        states, dstates, dx, ddt, dA_part, dD_part,
        seqlen, nheads, ngroups, headdim, dstate, nchunks, chunk_size,
        x.stride(1), dy.stride(1), B.stride(1), C.stride(1),
        float(dt_limit[0]), float(dt_limit[1]),
        HAS_SEQ=seq_idx is not None, HAS_D=D is not None, D_PER_CHANNEL=per_channel,
        HAS_BIAS=dt_bias is not None, SOFTPLUS=dt_softplus,
        HAS_LIMIT=tuple(dt_limit) != (0.0, float("inf")),
        PREC=prec, UPCAST=up, HPP=hpp, BQ=bq, BP=bp_full, BN=bn_full,
    )

    dB = torch.empty(B.shape, device=x.device, dtype=B.dtype)
    dC = torch.empty(C.shape, device=x.device, dtype=C.dtype)
    bn_bc = min(bn_full, DBC_BLOCK_N)
    _dbc_kernel[(triton.cdiv(dstate, bn_bc), batch * nchunks, ngroups)](
        x, dy, B, C, dtp, cum, seq_arg, states, dstates, dB, dC,
        seqlen, nheads, ngroups, headdim, dstate, nchunks, chunk_size,
        x.stride(1), dy.stride(1), B.stride(1), C.stride(1),
        HAS_SEQ=seq_idx is not None, PREC=prec, UPCAST=up,
        BQ=bq, BP=bp_full, BN=bn_bc,
    )
    dA = dA_part.sum(dim=(0, 1))
    dD = None
    if D is not None:
        dD = dD_part.sum(dim=(0, 1))
        dD = dD if per_channel else dD[:, 0]
    ddt_bias = ddt.sum(dim=(0, 1)) if dt_bias is not None else None
    return (dx, ddt, dA, dB, dC, dD, dz, ddt_bias,
            dinit if initial_states is not None else None)
