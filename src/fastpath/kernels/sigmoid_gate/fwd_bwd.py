"""Triton kernels of the sigmoid output gate over (rows, width) views with any row stride.

Why: transformers copies the gate out of the q_proj output (`gate.reshape`, a strided view),
then runs sigmoid and a multiply (two more passes) forward and three kernels backward; these read
the strided gate in place and do one pass each way, in float32 with one rounding at the end.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor


@triton.jit
def _gate_fwd_kernel(x_ptr, g_ptr, out_ptr, n_rows, width, stride_x, stride_g,
                     BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    cols = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    mask = (rows < n_rows)[:, None] & (cols < width)[None, :]
    r = rows.to(tl.int64)[:, None]
    x = tl.load(x_ptr + r * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    g = tl.load(g_ptr + r * stride_g + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + r * width + cols[None, :], (x * tl.sigmoid(g)).to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _gate_bwd_kernel(x_ptr, g_ptr, do_ptr, dx_ptr, dg_ptr, n_rows, width, stride_x, stride_g, stride_do,
                     BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    cols = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    mask = (rows < n_rows)[:, None] & (cols < width)[None, :]
    r = rows.to(tl.int64)[:, None]
    x = tl.load(x_ptr + r * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    g = tl.load(g_ptr + r * stride_g + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    do = tl.load(do_ptr + r * stride_do + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    s = tl.sigmoid(g)
    out = r * width + cols[None, :]
    tl.store(dx_ptr + out, (do * s).to(dx_ptr.dtype.element_ty), mask=mask)
    # s * (1 - s) as s * sigmoid(-g): exact also where s rounds to 1
    tl.store(dg_ptr + out, (do * x * s * tl.sigmoid(-g)).to(dg_ptr.dtype.element_ty), mask=mask)


def _grid(n_rows: int, width: int) -> tuple[tuple[int, int], int, int]:
    block_d = min(triton.next_power_of_2(max(width, 1)), 1024)
    block_n = max(1, 4096 // block_d)
    return (triton.cdiv(n_rows, block_n), triton.cdiv(width, block_d)), block_n, block_d


def gate_fwd(x2: Tensor, g2: Tensor, out_dtype: torch.dtype) -> Tensor:
    """x2, g2: (rows, width) views with unit column stride; returns contiguous x * sigmoid(g)."""
    n_rows, width = x2.shape
    out = torch.empty((n_rows, width), device=x2.device, dtype=out_dtype)
    grid, block_n, block_d = _grid(n_rows, width)
    _gate_fwd_kernel[grid](x2, g2, out, n_rows, width, x2.stride(0), g2.stride(0),
                           BLOCK_N=block_n, BLOCK_D=block_d, num_warps=4)
    return out


def gate_bwd(x2: Tensor, g2: Tensor, do2: Tensor) -> tuple[Tensor, Tensor]:
    """(dx in x's dtype, dgate in gate's dtype), contiguous (rows, width)."""
    n_rows, width = x2.shape
    dx = torch.empty((n_rows, width), device=x2.device, dtype=x2.dtype)
    dg = torch.empty((n_rows, width), device=x2.device, dtype=g2.dtype)
    grid, block_n, block_d = _grid(n_rows, width)
    _gate_bwd_kernel[grid](x2, g2, do2, dx, dg, n_rows, width, x2.stride(0), g2.stride(0), do2.stride(0),
                           BLOCK_N=block_n, BLOCK_D=block_d, num_warps=4)
    return dx, dg
