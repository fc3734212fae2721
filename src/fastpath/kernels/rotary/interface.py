"""Partial rotate-half RoPE as torch custom ops: one kernel each way for what transformers'
`apply_rotary_pos_emb` does to one of q / k (slices, rotate_half, multiplies and two cats).

    out = rotary(x, cos, sin)    out[..., :R] = x[..., :R] * cos + rotate_half(x[..., :R]) * sin
                                 out[..., R:] = x[..., R:]

x: (B, H, L, D) float32/float16/bfloat16 with any strides (typically a transpose view of a
(B, L, H, D) projection output); cos, sin: (B, L, R), R even and <= D, the same for every head,
any strides (stride 0 too), any float dtype. out is a new contiguous (B, H, L, D) tensor in x's
dtype (the layout transformers' cat gives), computed in float32 and rounded once. Only x gets a
gradient: cos / sin are position tables, and a call where either wants a gradient is refused
(ValueError), never answered with a silently missing gradient.
Ops (namespace "fastpath"): rotary_fwd(x, cos, sin) -> out and rotary_bwd(dout, cos, sin) -> dx
(contiguous), with fake implementations and registered autograd (no graph break under
torch.compile); eager callers skip the dispatcher, as in causal_conv1d/interface.py. Autograd
keeps cos and sin only. Where the Triton kernel cannot run, the float32 reference in naive.py
does (a one-time warning says why when a kernel could otherwise have run).
"""

from __future__ import annotations

import torch
from torch import Tensor

from fastpath.kernels.counters import CALLS
from fastpath.kernels.dispatch import dtypes_fit, use_triton
from fastpath.kernels.rotary import naive

FAMILY = "rotary"


def check_args(x: Tensor, cos: Tensor, sin: Tensor) -> None:
    """The inputs' contract, as one-line errors."""
    if x.dim() != 4:
        raise ValueError(f"rotary: x {tuple(x.shape)} must be (B, H, L, D)")
    if cos.dim() != 3 or sin.shape != cos.shape:
        raise ValueError(f"rotary: cos {tuple(cos.shape)} and sin {tuple(sin.shape)} must both be (B, L, R)")
    batch, _, length, width = x.shape
    rot = cos.shape[-1]
    if cos.shape[:2] != (batch, length) or rot % 2 or rot > width:
        raise ValueError(f"rotary: cos/sin {tuple(cos.shape)} must be (B, L, R) = ({batch}, {length}, R) with R even "
                         f"and <= D = {width} for x {tuple(x.shape)}")
    if not (x.dtype.is_floating_point and cos.dtype.is_floating_point and sin.dtype.is_floating_point):
        raise ValueError(f"rotary: x, cos and sin must be floating point, got {x.dtype}, {cos.dtype}, {sin.dtype}")
    if not (x.device == cos.device == sin.device):
        raise ValueError(f"rotary: x, cos and sin must be on one device, got {x.device}, {cos.device}, {sin.device}")


def _use_kernel(op: str, x: Tensor, cos: Tensor, sin: Tensor) -> bool:
    return bool(x.numel()) and use_triton(x) and dtypes_fit(op, FAMILY, x, cos, sin)


def _apply(direction: str, t: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """One pass ("fwd": x -> out, "bwd": dout -> dx): the Triton kernel where it runs, else the
    float32 reference rounded once to t's dtype."""
    check_args(t, cos, sin)
    if _use_kernel(direction, t, cos, sin):
        from fastpath.kernels.rotary import fwd_bwd

        CALLS[f"rotary_{direction}:triton"] += 1
        return getattr(fwd_bwd, f"rotary_{direction}")(t, cos, sin)
    CALLS[f"rotary_{direction}:reference"] += 1
    reference = naive.rotary_ref if direction == "fwd" else naive.rotary_bwd_ref
    return reference(t, cos, sin, compute=torch.float32).to(t.dtype).contiguous()


def fwd_impl(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    return _apply("fwd", x, cos, sin)


def bwd_impl(dout: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    return _apply("bwd", dout, cos, sin)


class _RotaryFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, cos, sin):  # type: ignore[override]
        ctx.save_for_backward(cos, sin)
        return fwd_impl(x, cos, sin)

    @staticmethod
    def backward(ctx, dout):  # type: ignore[override]
        return bwd_impl(dout, *ctx.saved_tensors), None, None


def rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate-half RoPE on x's first R = cos.shape[-1] features: the custom op while torch.compile
    traces, otherwise the implementation directly, under autograd only when x wants a gradient."""
    if torch.is_grad_enabled() and (cos.requires_grad or sin.requires_grad):
        raise ValueError("rotary: cos and sin must not require grad (the op gives x's gradient only)")
    if torch.compiler.is_compiling():
        return rotary_fwd(x, cos, sin)
    if torch.is_grad_enabled() and x.requires_grad:
        return _RotaryFunction.apply(x, cos, sin)
    return fwd_impl(x, cos, sin)


rotary_fwd = torch.library.custom_op("fastpath::rotary_fwd", fwd_impl, mutates_args=())
rotary_bwd = torch.library.custom_op("fastpath::rotary_bwd", bwd_impl, mutates_args=())


@rotary_fwd.register_fake
def _fwd_fake(x, cos, sin):
    check_args(x, cos, sin)
    return x.new_empty(x.shape)


@rotary_bwd.register_fake
def _bwd_fake(dout, cos, sin):
    check_args(dout, cos, sin)
    return dout.new_empty(dout.shape)


def _setup_context(ctx, inputs, output) -> None:
    _, cos, sin = inputs
    ctx.save_for_backward(cos, sin)


def _backward(ctx, dout):
    return rotary_bwd(dout, *ctx.saved_tensors), None, None


rotary_fwd.register_autograd(_backward, setup_context=_setup_context)
