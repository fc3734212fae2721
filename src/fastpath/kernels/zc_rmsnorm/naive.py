"""The spec of the zero-centred RMSNorm, forward and backward, in a chosen float precision.

transformers' Qwen3_5RMSNorm / Qwen3NextRMSNorm (models/qwen3_5/modeling_qwen3_5.py,
https://github.com/huggingface/transformers/blob/main/src/transformers/models/qwen3_5/modeling_qwen3_5.py):
    y = (x * rsqrt(mean(x^2, -1) + eps)) * (1 + w),  all in float32, cast to x's dtype once.
With r = rsqrt(mean(x^2) + eps), xh = x * r, g = 1 + w and dy the output gradient:
    dx = r * (dy * g - xh * mean(dy * g * xh, -1)),   dw = sum over rows of dy * xh.
Tests call these in float64 (the oracle); the op calls them in float32 where its Triton kernel
cannot run (the fallback), where the forward is transformers' own sequence of torch ops.
"""

from __future__ import annotations

import torch
from torch import Tensor


def zc_rmsnorm_ref(x: Tensor, weight: Tensor, eps: float, compute: torch.dtype = torch.float64) -> Tensor:
    """y in `compute` (the caller casts); transformers' op order, so float32 is bit-identical to it."""
    xc = x.to(compute)
    out = xc * torch.rsqrt(xc.pow(2).mean(-1, keepdim=True) + eps)
    return out * (1.0 + weight.to(compute))


def zc_rmsnorm_bwd_ref(x: Tensor, weight: Tensor, dy: Tensor, eps: float,
                       compute: torch.dtype = torch.float64) -> tuple[Tensor, Tensor]:
    """(dx with x's shape, dw with weight's shape), both in `compute`."""
    xc, d = x.to(compute), dy.to(compute)
    r = torch.rsqrt(xc.pow(2).mean(-1, keepdim=True) + eps)
    xh = xc * r
    dxh = d * (1.0 + weight.to(compute))
    dx = r * (dxh - xh * (dxh * xh).mean(-1, keepdim=True))
    dw = (d * xh).reshape(-1, x.shape[-1]).sum(0)
    return dx, dw
