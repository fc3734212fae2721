"""Triton kernels of partial rotate-half RoPE over (B, H, L, D) views with any strides.

Why: transformers slices x into its rotated and passed parts, runs rotate_half (a negation and a
cat), two multiplies, an add and a final cat forward, and as many slice / cat backward kernels
again; these read x (typically a transpose view of the projection's (B, L, H, D) output) in place
and write the contiguous (B, H, L, D) result in one pass each way, in float32 with one rounding.
Each element's rotate-half partner (c + R/2 or c - R/2) is a second, cached load of the same row,
so columns tile freely and any head width runs. Rows are walked (b, l, h) with the head fastest:
the heads of one position share their cos / sin row while it is in cache.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from fastpath.kernels.dispatch import triton_interpreter_on
from fastpath.kernels.rounding import store_rounded


@triton.jit
def _rotary_rows(src_ptr, cos_ptr, sin_ptr, out_ptr, n_rows, heads, length, width, half,
                 s_b, s_h, s_l, s_d, c_b, c_l, c_r, n_b, n_l, n_r,
                 TRANSPOSE: tl.constexpr, RNE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """out = src * cos + rotate_half(src) * sin on the first 2 * half columns, src elsewhere; with
    TRANSPOSE the adjoint, src * cos + rotate_half^T(src * sin) (sin read at the partner)."""
    rows = (tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    h = rows % heads
    bl = rows // heads
    pos = bl % length
    b = bl // length
    valid = (rows < n_rows)[:, None]
    first = cols < half
    rotated = cols < 2 * half
    partner = tl.where(first, cols + half, cols - half)
    mask = valid & (cols < width)[None, :]
    mask_rot = valid & rotated[None, :]
    src = src_ptr + (b * s_b + h * s_h + pos * s_l)[:, None]
    v = tl.load(src + cols[None, :] * s_d, mask=mask, other=0.0).to(tl.float32)
    vp = tl.load(src + partner[None, :] * s_d, mask=mask_rot, other=0.0).to(tl.float32)
    c = tl.load(cos_ptr + (b * c_b + pos * c_l)[:, None] + cols[None, :] * c_r,
                mask=mask_rot, other=0.0).to(tl.float32)
    sin_row = sin_ptr + (b * n_b + pos * n_l)[:, None]
    if TRANSPOSE:
        s = tl.load(sin_row + partner[None, :] * n_r, mask=mask_rot, other=0.0).to(tl.float32)
        sign = tl.where(first, 1.0, -1.0)
    else:
        s = tl.load(sin_row + cols[None, :] * n_r, mask=mask_rot, other=0.0).to(tl.float32)
        sign = tl.where(first, -1.0, 1.0)
    y = tl.where(rotated[None, :], v * c + sign[None, :] * vp * s, v)
    out = out_ptr + ((b * heads + h) * length + pos)[:, None] * width + cols[None, :]
    store_rounded(out, y, mask, RNE)


def _launch(src: Tensor, cos: Tensor, sin: Tensor, out_dtype: torch.dtype, transpose: bool) -> Tensor:
    batch, heads, length, width = src.shape
    out = torch.empty((batch, heads, length, width), device=src.device, dtype=out_dtype)
    n_rows = batch * heads * length
    block_d = min(triton.next_power_of_2(max(width, 1)), 1024)
    block_n = max(1, 4096 // block_d)
    grid = (triton.cdiv(n_rows, block_n), triton.cdiv(width, block_d))
    # 8 warps: a 4096-element tile holds x, its partner, cos, sin and int64 offsets; with 4 warps
    # float32 needs ~168 registers a thread and bf16 spilled on sm_90 (kernel_compile_check.py)
    _rotary_rows[grid](src, cos, sin, out, n_rows, heads, length, width, cos.shape[-1] // 2,
                       src.stride(0), src.stride(1), src.stride(2), src.stride(3),
                       cos.stride(0), cos.stride(1), cos.stride(2), sin.stride(0), sin.stride(1), sin.stride(2),
                       TRANSPOSE=transpose, RNE=triton_interpreter_on(), BLOCK_N=block_n, BLOCK_D=block_d,
                       num_warps=8)
    return out


def rotary_fwd(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x: (B, H, L, D) any strides; cos, sin: (B, L, R) any strides. Contiguous out in x's dtype."""
    return _launch(x, cos, sin, x.dtype, transpose=False)


def rotary_bwd(dout: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """dx, contiguous (B, H, L, D) in dout's dtype (the forward output's, x's)."""
    return _launch(dout, cos, sin, dout.dtype, transpose=True)
