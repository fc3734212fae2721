"""The zero-centred RMSNorm of Qwen3.5 / Qwen3-Next as torch custom ops, one kernel each way.

    y = zc_rmsnorm(x, weight, eps)    y = (x * rsqrt(mean(x^2, -1) + eps)) * (1 + weight)

x: (..., H) float32/float16/bfloat16, any strides (a view with unit last stride and uniform row
stride, such as q_norm's slice of q_proj's output, is read in place; anything else is copied
first); weight: (H,) in float32 or any of those dtypes, any stride (a stride-0 broadcast too).
y is contiguous in x's dtype, rounded once from float32 as transformers' Qwen3_5RMSNorm does.
Ops (namespace "fastpath"): zc_rmsnorm_fwd(x, weight, eps) -> y and
zc_rmsnorm_bwd(x, weight, dy, eps) -> (dx in x's dtype, dw in weight's dtype), with fake
implementations and registered autograd (no graph break under torch.compile); eager callers skip
the dispatcher, as in causal_conv1d/interface.py.

    s, y = add_zc_rmsnorm(x, residual, weight, eps)    s = residual + x,  y = zc_rmsnorm(s, weight, eps)

the decoder's residual add fused with the post-attention norm that reads its result, in
transformers' rounding (s rounded once to x's dtype, y computed from that s): x and residual of
the same shape and dtype, any strides as above. Ops add_zc_rmsnorm_fwd(x, residual, weight, eps)
-> (s, y) and add_zc_rmsnorm_bwd(s, weight, dy, ds, eps) -> (dx, dw), where ds is the gradient
reaching s from its other use and dx (= ds + the norm's input gradient, rounded once) is the
gradient of both x and residual. Where the Triton kernel cannot run (CPU without
TRITON_INTERPRET=1, float64, rows wider than MAX_WIDTH) the float32 reference in naive.py runs,
with a one-time warning when a kernel could otherwise have run.
"""

from __future__ import annotations

import torch
from torch import Tensor

from fastpath.kernels.counters import CALLS
from fastpath.kernels.dispatch import dtypes_fit, use_triton, warn_fallback
from fastpath.kernels.layout import as_rows as _rows
from fastpath.kernels.zc_rmsnorm import naive

FAMILY = "zc_rmsnorm"
MAX_WIDTH = 16384  # fwd_bwd.py holds whole rows in registers; wider rows spill, then run out


def _check(x: Tensor, weight: Tensor) -> None:
    if x.dim() < 1 or weight.shape != x.shape[-1:]:
        raise ValueError(f"zc_rmsnorm: weight {tuple(weight.shape)} must be (H,) for x {tuple(x.shape)} of (..., H)")
    if not x.dtype.is_floating_point or not weight.dtype.is_floating_point:
        raise ValueError(f"zc_rmsnorm: x and weight must be floating point, got {x.dtype} and {weight.dtype}")


def _triton_ok(op: str, x: Tensor, *tensors: Tensor) -> bool:
    if not x.numel() or not use_triton(x):
        return False
    if not dtypes_fit(op, FAMILY, x, *tensors):
        return False
    if x.shape[-1] > MAX_WIDTH:
        warn_fallback(op, f"rows wider than {MAX_WIDTH}", FAMILY)
        return False
    return True


def fwd_impl(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    _check(x, weight)
    if _triton_ok("fwd", x, weight):
        from fastpath.kernels.zc_rmsnorm.fwd_bwd import norm_fwd

        CALLS["zc_rmsnorm_fwd:triton"] += 1
        return norm_fwd(_rows(x), weight, eps)[0].view(x.shape)
    CALLS["zc_rmsnorm_fwd:reference"] += 1
    return naive.zc_rmsnorm_ref(x, weight, eps, compute=torch.float32).to(x.dtype).contiguous()


def bwd_impl(x: Tensor, weight: Tensor, dy: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    if dy.shape != x.shape:
        raise ValueError(f"zc_rmsnorm: dy {tuple(dy.shape)} must have x's shape {tuple(x.shape)}")
    if _triton_ok("bwd", x, weight, dy):
        from fastpath.kernels.zc_rmsnorm.fwd_bwd import norm_bwd

        CALLS["zc_rmsnorm_bwd:triton"] += 1
        dx, dw = norm_bwd(_rows(x), weight, _rows(dy), eps)
        return dx.view(x.shape), dw.to(weight.dtype)
    CALLS["zc_rmsnorm_bwd:reference"] += 1
    dx, dw = naive.zc_rmsnorm_bwd_ref(x, weight, dy, eps, compute=torch.float32)
    return dx.to(x.dtype).contiguous(), dw.to(weight.dtype)


class _NormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, eps):  # type: ignore[override]
        ctx.save_for_backward(x, weight)
        ctx.eps = eps
        return fwd_impl(x, weight, eps)

    @staticmethod
    def backward(ctx, dy):  # type: ignore[override]
        dx, dw = bwd_impl(*ctx.saved_tensors, dy, ctx.eps)
        return dx, dw, None


def zc_rmsnorm(x: Tensor, weight: Tensor, eps: float = 1e-6) -> Tensor:
    """(x * rsqrt(mean(x^2) + eps)) * (1 + weight) in x's dtype: the custom op while torch.compile
    traces, otherwise the implementation directly, under autograd only when a gradient is wanted."""
    eps = float(eps)
    if torch.compiler.is_compiling():
        return zc_rmsnorm_fwd(x, weight, eps)
    if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad):
        return _NormFunction.apply(x, weight, eps)
    return fwd_impl(x, weight, eps)


zc_rmsnorm_fwd = torch.library.custom_op("fastpath::zc_rmsnorm_fwd", fwd_impl, mutates_args=())


@zc_rmsnorm_fwd.register_fake
def _fwd_fake(x, weight, eps):
    return x.new_empty(x.shape)


def _setup_context(ctx, inputs, output) -> None:
    x, weight, eps = inputs
    ctx.save_for_backward(x, weight)
    ctx.eps = eps


def _backward(ctx, dy):
    dx, dw = zc_rmsnorm_bwd(*ctx.saved_tensors, dy, ctx.eps)
    return dx, dw, None


zc_rmsnorm_fwd.register_autograd(_backward, setup_context=_setup_context)

zc_rmsnorm_bwd = torch.library.custom_op("fastpath::zc_rmsnorm_bwd", bwd_impl, mutates_args=())


@zc_rmsnorm_bwd.register_fake
def _bwd_fake(x, weight, dy, eps):
    return x.new_empty(x.shape), weight.new_empty(weight.shape)


def _check_residual(x: Tensor, residual: Tensor) -> None:
    if residual.shape != x.shape or residual.dtype != x.dtype or residual.device != x.device:
        raise ValueError(f"add_zc_rmsnorm: residual {tuple(residual.shape)} {residual.dtype} must match "
                         f"x {tuple(x.shape)} {x.dtype} on the same device")


def add_fwd_impl(x: Tensor, residual: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    _check(x, weight)
    _check_residual(x, residual)
    if _triton_ok("fwd", x, residual, weight):
        from fastpath.kernels.zc_rmsnorm.fwd_bwd import norm_fwd

        CALLS["add_zc_rmsnorm_fwd:triton"] += 1
        y, s = norm_fwd(_rows(x), weight, eps, _rows(residual))
        assert s is not None
        return s.view(x.shape), y.view(x.shape)
    CALLS["add_zc_rmsnorm_fwd:reference"] += 1
    s = (residual + x).contiguous()  # torch's own add: what transformers' decoder computes
    return s, naive.zc_rmsnorm_ref(s, weight, eps, compute=torch.float32).to(x.dtype).contiguous()


def add_bwd_impl(s: Tensor, weight: Tensor, dy: Tensor, ds: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    if dy.shape != s.shape or ds.shape != s.shape:
        raise ValueError(f"add_zc_rmsnorm: dy {tuple(dy.shape)} and ds {tuple(ds.shape)} must have s's shape "
                         f"{tuple(s.shape)}")
    if _triton_ok("bwd", s, weight, dy, ds):
        from fastpath.kernels.zc_rmsnorm.fwd_bwd import norm_bwd

        CALLS["add_zc_rmsnorm_bwd:triton"] += 1
        dx, dw = norm_bwd(_rows(s), weight, _rows(dy), eps, _rows(ds))
        return dx.view(s.shape), dw.to(weight.dtype)
    CALLS["add_zc_rmsnorm_bwd:reference"] += 1
    dx, dw = naive.zc_rmsnorm_bwd_ref(s, weight, dy, eps, compute=torch.float32)
    return (dx + ds.float()).to(s.dtype).contiguous(), dw.to(weight.dtype)


def _add_grads(ctx, ds, dy, bwd) -> tuple:  # type: ignore[no-untyped-def]
    """Gradients of (x, residual, weight, eps), `bwd` being the custom op or its implementation."""
    s, weight = ctx.saved_tensors
    dx, dw = bwd(s, weight, dy, torch.zeros_like(s) if ds is None else ds, ctx.eps)
    return dx, dx, dw, None


class _AddNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, residual, weight, eps):  # type: ignore[override]
        s, y = add_fwd_impl(x, residual, weight, eps)
        ctx.save_for_backward(s, weight)
        ctx.eps = eps
        return s, y

    @staticmethod
    def backward(ctx, ds, dy):  # type: ignore[override]
        return _add_grads(ctx, ds, dy, add_bwd_impl)


def add_zc_rmsnorm(x: Tensor, residual: Tensor, weight: Tensor, eps: float = 1e-6) -> tuple[Tensor, Tensor]:
    """(s, y): s = residual + x and y = zc_rmsnorm(s, weight, eps), both in x's dtype, in one
    kernel each way; dispatched as zc_rmsnorm is."""
    eps = float(eps)
    if torch.compiler.is_compiling():
        return add_zc_rmsnorm_fwd(x, residual, weight, eps)
    if torch.is_grad_enabled() and (x.requires_grad or residual.requires_grad or weight.requires_grad):
        return _AddNormFunction.apply(x, residual, weight, eps)
    return add_fwd_impl(x, residual, weight, eps)


add_zc_rmsnorm_fwd = torch.library.custom_op("fastpath::add_zc_rmsnorm_fwd", add_fwd_impl, mutates_args=())


@add_zc_rmsnorm_fwd.register_fake
def _add_fwd_fake(x, residual, weight, eps):
    return x.new_empty(x.shape), x.new_empty(x.shape)


def _add_setup_context(ctx, inputs, output) -> None:
    ctx.save_for_backward(output[0], inputs[2])
    ctx.eps = inputs[3]


def _add_backward(ctx, ds, dy):
    return _add_grads(ctx, ds, dy, add_zc_rmsnorm_bwd)


add_zc_rmsnorm_fwd.register_autograd(_add_backward, setup_context=_add_setup_context)

add_zc_rmsnorm_bwd = torch.library.custom_op("fastpath::add_zc_rmsnorm_bwd", add_bwd_impl, mutates_args=())


@add_zc_rmsnorm_bwd.register_fake
def _add_bwd_fake(s, weight, dy, ds, eps):
    return s.new_empty(s.shape), weight.new_empty(weight.shape)
