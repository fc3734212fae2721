"""Triton kernels of the zero-centred RMSNorm over (rows, H) views with any row stride.

Why: in eager torch transformers' Qwen3_5RMSNorm is a cast, pow, mean, add, rsqrt, two multiplies
and a cast forward and about twice that backward (ToCopy, PowBackward, MeanBackward, MulBackward:
~20 ms per training step of an 8-layer Qwen3.5-27B cut on an H200), each a full pass over the
activations. Here each way is one pass: the forward reads x once and writes y; the backward reads
x and dy once, writes dx, and recomputes rstd in registers instead of saving it.

Rounding follows transformers on the GPU: everything in float32 (x.float(), 1 + w.float(), the
mean as sum * fl32(1/H) as torch's CUDA mean does (`float factor = float(num_output_elements) /
numel` in mean_kernel_impl,
https://github.com/pytorch/pytorch/blob/main/aten/src/ATen/native/cuda/ReduceMomentKernel.cu;
for every H <= 16384 the host's 1.0 / H rounds to that same float32),
rsqrt as libdevice's, as torch's CUDA rsqrt, `(x * r) * (1 + w)` in that order) and one cast to
the output dtype at the end (round to nearest even, by hand under the CPU interpreter, which
truncates: kernels/rounding.py). Only the order of the row sum differs from torch's.

With a residual (the decoder's `s = residual + x` just before its post-attention norm, in
transformers' order: the sum rounded once to x's dtype, the norm computed from that rounded sum)
the forward also reads r and writes s, and the backward also reads ds (the gradient reaching s
from its other use, the decoder's last residual add) and writes dx = ds + dnorm rounded once: the
add before the norm and the sum autograd would otherwise form of the two gradients of s (each a
full pass) vanish into the norm's own passes.

dw: each backward program owns a contiguous range of rows, accumulates dy * xhat in float32
registers and writes one partial row; torch sums the (programs, H) partials in float32. No atomics,
so dw is deterministic run to run (float atomics add in arrival order), and the partial buffer is
small (programs ~ SM count). The same scheme as Liger-Kernel's RMSNorm backward
(https://github.com/linkedin/Liger-Kernel/blob/main/src/liger_kernel/ops/rms_norm.py).
"""

from __future__ import annotations

from functools import cache

import torch
import triton
import triton.language as tl
from torch import Tensor

from fastpath.kernels.dispatch import triton_interpreter_on
from fastpath.kernels.rounding import rounded_like, store_rounded

_TILE = 4096  # elements per program tile: short rows (q_norm / k_norm, H = head_dim) share a program


@triton.jit
def _zc_rmsnorm_fwd_kernel(x_ptr, w_ptr, y_ptr, res_ptr, s_ptr, n_rows, width, stride_x, stride_w, stride_res,
                           inv_width, eps, HAS_RES: tl.constexpr,
                           RNE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_H: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_H)
    col_ok = cols < width
    mask = (rows < n_rows)[:, None] & col_ok[None, :]
    r = rows.to(tl.int64)[:, None]
    x = tl.load(x_ptr + r * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    if HAS_RES:  # s = res + x, rounded once; the norm reads the rounded s, as transformers' does
        x += tl.load(res_ptr + r * stride_res + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        store_rounded(s_ptr + r * width + cols[None, :], x, mask, RNE)
        x = rounded_like(x, s_ptr, RNE)
    g = 1.0 + tl.load(w_ptr + cols * stride_w, mask=col_ok, other=0.0).to(tl.float32)
    rstd = tl.math.rsqrt(tl.sum(x * x, axis=1) * inv_width + eps)
    y = (x * rstd[:, None]) * g[None, :]
    store_rounded(y_ptr + r * width + cols[None, :], y, mask, RNE)


@triton.jit
def _zc_rmsnorm_bwd_kernel(x_ptr, w_ptr, dy_ptr, dx_ptr, dw_part_ptr, ds_ptr, n_rows, width, stride_x, stride_w,
                           stride_dy, stride_ds, inv_width, eps, rows_per_program, HAS_DS: tl.constexpr,
                           RNE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_H: tl.constexpr):
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_H)
    col_ok = cols < width
    g = 1.0 + tl.load(w_ptr + cols * stride_w, mask=col_ok, other=0.0).to(tl.float32)
    dw_acc = tl.zeros((BLOCK_M, BLOCK_H), dtype=tl.float32)
    row_start = pid * rows_per_program
    row_end = tl.minimum(row_start + rows_per_program, n_rows)
    for start in range(row_start, row_end, BLOCK_M):
        rows = start + tl.arange(0, BLOCK_M)
        mask = (rows < row_end)[:, None] & col_ok[None, :]
        r = rows.to(tl.int64)[:, None]
        x = tl.load(x_ptr + r * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + r * stride_dy + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        rstd = tl.math.rsqrt(tl.sum(x * x, axis=1) * inv_width + eps)
        xh = x * rstd[:, None]
        dxh = dy * g[None, :]
        c = tl.sum(dxh * xh, axis=1) * inv_width
        dx = (dxh - xh * c[:, None]) * rstd[:, None]
        if HAS_DS:
            dx += tl.load(ds_ptr + r * stride_ds + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        store_rounded(dx_ptr + r * width + cols[None, :], dx, mask, RNE)
        dw_acc += dy * xh
    tl.store(dw_part_ptr + pid.to(tl.int64) * width + cols, tl.sum(dw_acc, axis=0), mask=col_ok)


def _blocks(n_rows: int, width: int) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_H, num_warps): whole rows per program, about _TILE elements per tile."""
    block_h = triton.next_power_of_2(max(width, 1))
    block_m = max(1, min(_TILE // block_h, triton.next_power_of_2(max(n_rows, 1))))
    tile = block_m * block_h
    num_warps = 16 if tile >= 8192 else 8 if tile >= 2048 else 4
    return block_m, block_h, num_warps


@cache
def _programs(device: torch.device) -> int:
    """Backward programs: a couple per SM on a GPU (each loops over its rows), a few under the interpreter."""
    if device.type == "cuda":
        return 2 * torch.cuda.get_device_properties(device).multi_processor_count
    return 4


def norm_fwd(x2: Tensor, weight: Tensor, eps: float, res2: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
    """x2 (and res2, same shape and dtype): (rows, H) with unit column stride, weight: (H,) any
    stride; returns (y, s = res2 + x2 or None), contiguous in x2's dtype, y the norm of s if given."""
    n_rows, width = x2.shape
    y = torch.empty((n_rows, width), device=x2.device, dtype=x2.dtype)
    s = None if res2 is None else torch.empty_like(y)
    block_m, block_h, num_warps = _blocks(n_rows, width)
    _zc_rmsnorm_fwd_kernel[(triton.cdiv(n_rows, block_m),)](
        x2, weight, y, x2 if res2 is None else res2, y if s is None else s, n_rows, width, x2.stride(0),
        weight.stride(0), 0 if res2 is None else res2.stride(0), 1.0 / width, eps, HAS_RES=res2 is not None,
        RNE=triton_interpreter_on(), BLOCK_M=block_m, BLOCK_H=block_h,
        num_warps=num_warps)
    return y, s


def norm_bwd(x2: Tensor, weight: Tensor, dy2: Tensor, eps: float,
             ds2: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """(dx contiguous (rows, H) in x2's dtype, plus ds2 where given, dw (H,) float32)."""
    n_rows, width = x2.shape
    dx = torch.empty((n_rows, width), device=x2.device, dtype=x2.dtype)
    block_m, block_h, num_warps = _blocks(n_rows, width)
    programs = max(1, min(_programs(x2.device), triton.cdiv(n_rows, block_m)))
    rows_per_program = triton.cdiv(triton.cdiv(n_rows, programs), block_m) * block_m
    programs = triton.cdiv(n_rows, rows_per_program)
    dw_part = torch.empty((programs, width), device=x2.device, dtype=torch.float32)
    _zc_rmsnorm_bwd_kernel[(programs,)](
        x2, weight, dy2, dx, dw_part, dy2 if ds2 is None else ds2, n_rows, width, x2.stride(0), weight.stride(0),
        dy2.stride(0), 0 if ds2 is None else ds2.stride(0), 1.0 / width, eps, rows_per_program,
        HAS_DS=ds2 is not None, RNE=triton_interpreter_on(), BLOCK_M=block_m, BLOCK_H=block_h,
        num_warps=num_warps)
    return dx, dw_part[0] if programs == 1 else dw_part.sum(0)
