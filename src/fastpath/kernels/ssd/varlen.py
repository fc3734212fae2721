"""Triton kernel for `return_varlen_states`: the final state of each sequence packed along the
length of a batch-1 input (cu_seqlens), each from zeros (sequence 0 from initial_states[0]).

One program per (sequence, head, P/N tile) walks its sequence in blocks of BQ tokens:
h <- exp(sum a) h + sum_u exp(sum_{k>u} a_k) dt'_u x_u B_u^T, float32 in registers.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from fastpath.kernels.ssd import shared_memory
from fastpath.kernels.ssd.fwd import (
    _chunk_rows,
    _decay,
    _state_tile,
    contiguous_inputs,
    cum_dtype,
    dot_precision,
    mm,
    needs_upcast,
    pow2,
    prepare_dt,
)


@triton.jit
def _varlen_states_kernel(
    x_ptr, B_ptr, dtp_ptr, A_ptr, cu_ptr, init_ptr, out_ptr,
    H, G, P, N, LP, SX, SB,
    HAS_INIT: tl.constexpr, CUM64: tl.constexpr, PREC: tl.constexpr, UPCAST: tl.constexpr,
    BQ: tl.constexpr, BP: tl.constexpr, BN: tl.constexpr,
):
    offs_p, offs_n, s, h, g, pn_mask, pn_off, _ = _state_tile(H, G, P, N, BP, BN)  # s: sequence
    start = tl.load(cu_ptr + s)  # int32 bounds: one loop-variable type for range()
    end = tl.load(cu_ptr + s + 1)
    if HAS_INIT:
        state = tl.load(init_ptr + h * P * N + pn_off, mask=pn_mask, other=0.0)
        state = state.to(tl.float32) * (s == 0).to(tl.float32)  # only sequence 0 continues it
    else:
        state = tl.zeros((BP, BN), dtype=tl.float32)
    a_h = tl.load(A_ptr + h).to(tl.float32)
    offs_t = tl.arange(0, BQ)
    for blk in range(start, end, BQ):
        tok = (blk + offs_t).to(tl.int64)
        valid = tok < end
        dtp = tl.load(dtp_ptr + h * LP + tok, mask=valid, other=0.0)
        a = dtp * a_h
        if CUM64:  # float32 inputs: exact differences of the running sum (fwd.cum_dtype)
            a = a.to(tl.float64)
        cum = tl.cumsum(a, axis=0)
        total = tl.sum(a)
        w = _decay(total, cum, valid) * dtp
        x, Bt = _chunk_rows(x_ptr, B_ptr, tok, valid, SX, SB, h, g, P, N, offs_p, offs_n)
        xw = (x.to(tl.float32) * w[:, None]).to(x.dtype)
        state = state * tl.exp(total.to(tl.float32)) + mm(tl.trans(xw), Bt, PREC, UPCAST)
    o = (s.to(tl.int64) * H + h) * P * N + pn_off
    tl.store(out_ptr + o, state.to(out_ptr.dtype.element_ty), mask=pn_mask)


def varlen_states_triton(x: Tensor, dt: Tensor, A: Tensor, B: Tensor, cu_seqlens: Tensor,
                         initial_states: Tensor | None, dt_bias: Tensor | None,
                         dt_softplus: bool, dt_limit: tuple[float, float], chunk_size: int,
                         out_dtype: torch.dtype) -> Tensor:
    """(S, H, P, N) in out_dtype; x etc. have batch 1."""
    x, B, _, _, _ = contiguous_inputs(x, B, B, None, None)
    nheads, headdim = x.shape[2:]
    ngroups, dstate = B.shape[2:]
    dtp, _ = prepare_dt(dt, A, dt_bias, chunk_size, dt_softplus, dt_limit)
    nseq = cu_seqlens.numel() - 1
    out = torch.empty((nseq, nheads, headdim, dstate), device=x.device, dtype=out_dtype)
    bp, bn = min(pow2(headdim), 64), min(pow2(dstate), 64)
    # Triton's default 3 pipeline stages; the token block shrinks where they would not fit
    bq = shared_memory.varlen_block(x.device, x.dtype, pow2(min(chunk_size, 128)), bp, bn, 3)
    grid = (triton.cdiv(headdim, bp) * triton.cdiv(dstate, bn), nseq * nheads)
    _varlen_states_kernel[grid](
        x, B, dtp, A.contiguous(), cu_seqlens.to(device=x.device, dtype=torch.int32).contiguous(),
        initial_states.contiguous() if initial_states is not None else dtp, out,
        nheads, ngroups, headdim, dstate, dtp.shape[-1], x.stride(1), B.stride(1),
        HAS_INIT=initial_states is not None, CUM64=cum_dtype(x.dtype) == torch.float64,
        PREC=dot_precision(x.dtype),
        UPCAST=needs_upcast(x.dtype), BQ=bq, BP=bp, BN=bn,
    )
    return out
