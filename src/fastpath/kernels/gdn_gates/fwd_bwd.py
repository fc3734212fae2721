"""Triton kernels of the GatedDeltaNet gates: one pass over (rows, heads) each way.

Why: transformers computes g and beta with ~7 elementwise kernels forward (casts, add, softplus,
exp, neg, mul, sigmoid) and ~12 backward, each a launch plus a pass over the (B*L, H) gates;
here it is one launch forward and one backward (plus a tiny sum of per-block partials for the
two per-head parameter gradients: deterministic, no atomics).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor


@triton.jit
def _softplus(x):
    # log1p(e^x) accurately for small e^x (Goldberg: log(u) * y / (u - 1), u = 1 + y); x above 20
    # is returned as is (torch's threshold)
    y = tl.exp(tl.minimum(x, 20.0))
    u = 1.0 + y
    lp = tl.where(u == 1.0, y, tl.log(u) * y / tl.where(u == 1.0, 1.0, u - 1.0))
    return tl.where(x > 20.0, x, lp)


@triton.jit
def _gates_fwd_kernel(a_ptr, b_ptr, alog_ptr, dtb_ptr, g_ptr, beta_ptr, n_rows, n_heads,
                      stride_a, stride_b, BLOCK_N: tl.constexpr, BLOCK_H: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    cols = tl.arange(0, BLOCK_H)
    cmask = cols < n_heads
    mask = (rows < n_rows)[:, None] & cmask[None, :]
    r = rows.to(tl.int64)[:, None]
    a = tl.load(a_ptr + r * stride_a + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + r * stride_b + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    decay = tl.exp(tl.load(alog_ptr + cols, mask=cmask, other=0.0).to(tl.float32))
    dtb = tl.load(dtb_ptr + cols, mask=cmask, other=0.0).to(tl.float32)
    g = -decay[None, :] * _softplus(a + dtb[None, :])
    beta = tl.sigmoid(b)
    out = r * n_heads + cols[None, :]
    tl.store(g_ptr + out, g, mask=mask)
    tl.store(beta_ptr + out, beta.to(beta_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _gates_bwd_kernel(a_ptr, b_ptr, alog_ptr, dtb_ptr, dg_ptr, dbeta_ptr, da_ptr, db_ptr,
                      part_alog_ptr, part_dtb_ptr, n_rows, n_heads, stride_a, stride_b, stride_dg,
                      stride_dbeta, HAS_DG: tl.constexpr, HAS_DBETA: tl.constexpr,
                      BLOCK_N: tl.constexpr, BLOCK_H: tl.constexpr):
    pid = tl.program_id(0)
    rows = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    cols = tl.arange(0, BLOCK_H)
    cmask = cols < n_heads
    mask = (rows < n_rows)[:, None] & cmask[None, :]
    r = rows.to(tl.int64)[:, None]
    out = r * n_heads + cols[None, :]
    decay = tl.exp(tl.load(alog_ptr + cols, mask=cmask, other=0.0).to(tl.float32))
    if HAS_DG:
        a = tl.load(a_ptr + r * stride_a + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        dtb = tl.load(dtb_ptr + cols, mask=cmask, other=0.0).to(tl.float32)
        dg = tl.load(dg_ptr + r * stride_dg + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        x = a + dtb[None, :]
        slope = tl.where(x > 20.0, 1.0, tl.sigmoid(x))
        da = dg * -decay[None, :] * slope
        d_alog = tl.sum(dg * -decay[None, :] * _softplus(x), axis=0)
        d_dtb = tl.sum(da, axis=0)
    else:
        da = tl.zeros((BLOCK_N, BLOCK_H), tl.float32)
        d_alog = tl.zeros((BLOCK_H,), tl.float32)
        d_dtb = tl.zeros((BLOCK_H,), tl.float32)
    tl.store(da_ptr + out, da.to(da_ptr.dtype.element_ty), mask=mask)
    tl.store(part_alog_ptr + pid * n_heads + cols, d_alog, mask=cmask)
    tl.store(part_dtb_ptr + pid * n_heads + cols, d_dtb, mask=cmask)
    if HAS_DBETA:
        b = tl.load(b_ptr + r * stride_b + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        dbeta = tl.load(dbeta_ptr + r * stride_dbeta + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        db = dbeta * tl.sigmoid(b) * tl.sigmoid(-b)  # beta * (1 - beta), exact also near beta = 1
    else:
        db = tl.zeros((BLOCK_N, BLOCK_H), tl.float32)
    tl.store(db_ptr + out, db.to(db_ptr.dtype.element_ty), mask=mask)


def _blocks(n_heads: int) -> tuple[int, int]:
    block_h = triton.next_power_of_2(max(n_heads, 1))
    return max(1, min(64, 2048 // block_h)), block_h


def gates_fwd(a2: Tensor, b2: Tensor, a_log: Tensor, dt_bias: Tensor) -> tuple[Tensor, Tensor]:
    """a2, b2: (rows, heads) views with unit column stride. Returns contiguous (g float32, beta)."""
    n_rows, n_heads = a2.shape
    g = torch.empty((n_rows, n_heads), device=a2.device, dtype=torch.float32)
    beta = torch.empty((n_rows, n_heads), device=a2.device, dtype=b2.dtype)
    block_n, block_h = _blocks(n_heads)
    grid = (triton.cdiv(n_rows, block_n),)
    _gates_fwd_kernel[grid](a2, b2, a_log, dt_bias, g, beta, n_rows, n_heads, a2.stride(0), b2.stride(0),
                            BLOCK_N=block_n, BLOCK_H=block_h, num_warps=4)
    return g, beta


def gates_bwd(a2: Tensor, b2: Tensor, a_log: Tensor, dt_bias: Tensor, dg2: Tensor | None,
              dbeta2: Tensor | None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(da, db, dA_log, ddt_bias): da/db contiguous (rows, heads) in a's / b's dtype, the
    parameter gradients in the parameters' dtypes."""
    n_rows, n_heads = a2.shape
    block_n, block_h = _blocks(n_heads)
    n_blocks = triton.cdiv(n_rows, block_n)
    da = torch.empty((n_rows, n_heads), device=a2.device, dtype=a2.dtype)
    db = torch.empty((n_rows, n_heads), device=a2.device, dtype=b2.dtype)
    part_alog = torch.empty((n_blocks, n_heads), device=a2.device, dtype=torch.float32)
    part_dtb = torch.empty((n_blocks, n_heads), device=a2.device, dtype=torch.float32)
    _gates_bwd_kernel[(n_blocks,)](
        a2, b2, a_log, dt_bias, dg2 if dg2 is not None else a2, dbeta2 if dbeta2 is not None else b2,
        da, db, part_alog, part_dtb, n_rows, n_heads, a2.stride(0), b2.stride(0),
        dg2.stride(0) if dg2 is not None else 0, dbeta2.stride(0) if dbeta2 is not None else 0,
        HAS_DG=dg2 is not None, HAS_DBETA=dbeta2 is not None, BLOCK_N=block_n, BLOCK_H=block_h,
        num_warps=4)
    return da, db, part_alog.sum(0).to(a_log.dtype), part_dtb.sum(0).to(dt_bias.dtype)
