"""The SwiGLU gated product as torch custom ops: out = silu(gate) * up, one kernel each way.

gate and up have one shape and a floating dtype each (any strides: a non-contiguous input is
copied first, so the kernels only ever index flat contiguous buffers); out is contiguous in their
promoted dtype. Ops (namespace "fastpath"): silu_mul_fwd(gate, up) -> out and
silu_mul_bwd(gate, up, dout) -> (dgate, dup), with fake implementations and registered autograd (no
graph break under torch.compile); eager callers skip the dispatcher, as in
causal_conv1d/interface.py. Autograd keeps gate and up only (eager keeps silu(gate) as well).
Where the Triton kernel cannot run, the float32 reference in naive.py does (a one-time warning
says why when a kernel could otherwise have run).
"""

from __future__ import annotations

import torch
from torch import Tensor

from fastpath.kernels.counters import CALLS
from fastpath.kernels.dispatch import dtypes_fit, use_triton
from fastpath.kernels.swiglu import naive

FAMILY = "swiglu"


def _check(gate: Tensor, up: Tensor) -> None:
    if gate.shape != up.shape:
        raise ValueError(f"silu_mul: gate {tuple(gate.shape)} and up {tuple(up.shape)} must have one shape")
    if not gate.dtype.is_floating_point or not up.dtype.is_floating_point:
        raise ValueError(f"silu_mul: gate and up must be floating point, got {gate.dtype} and {up.dtype}")


def _use_kernel(op: str, *tensors: Tensor) -> bool:
    return bool(tensors[0].numel()) and use_triton(tensors[0]) and dtypes_fit(op, FAMILY, *tensors)


def fwd_impl(gate: Tensor, up: Tensor) -> Tensor:
    _check(gate, up)
    dtype = torch.promote_types(gate.dtype, up.dtype)
    if _use_kernel("fwd", gate, up):
        from fastpath.kernels.swiglu.fwd_bwd import silu_mul_fwd

        CALLS["swiglu_fwd:triton"] += 1
        return silu_mul_fwd(gate.contiguous(), up.contiguous(), dtype)
    CALLS["swiglu_fwd:reference"] += 1
    return naive.silu_mul_ref(gate, up, compute=torch.float32).to(dtype).contiguous()


def bwd_impl(gate: Tensor, up: Tensor, dout: Tensor) -> tuple[Tensor, Tensor]:
    if dout.shape != gate.shape:
        raise ValueError(f"silu_mul: dout {tuple(dout.shape)} must have gate's shape {tuple(gate.shape)}")
    if _use_kernel("bwd", gate, up, dout):
        from fastpath.kernels.swiglu.fwd_bwd import silu_mul_bwd

        CALLS["swiglu_bwd:triton"] += 1
        return silu_mul_bwd(gate.contiguous(), up.contiguous(), dout.contiguous())
    CALLS["swiglu_bwd:reference"] += 1
    dg, du = naive.silu_mul_bwd_ref(gate, up, dout, compute=torch.float32)
    return dg.to(gate.dtype).contiguous(), du.to(up.dtype).contiguous()


class _SiluMulFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, gate, up):  # type: ignore[override]
        ctx.save_for_backward(gate, up)
        return fwd_impl(gate, up)

    @staticmethod
    def backward(ctx, dout):  # type: ignore[override]
        return bwd_impl(*ctx.saved_tensors, dout)


def silu_mul(gate: Tensor, up: Tensor) -> Tensor:
    """silu(gate) * up: the custom op while torch.compile traces, otherwise the implementation
    directly, under autograd only when a gradient is wanted."""
    if torch.compiler.is_compiling():
        return silu_mul_fwd(gate, up)
    if torch.is_grad_enabled() and (gate.requires_grad or up.requires_grad):
        return _SiluMulFunction.apply(gate, up)
    return fwd_impl(gate, up)


silu_mul_fwd = torch.library.custom_op("fastpath::silu_mul_fwd", fwd_impl, mutates_args=())


@silu_mul_fwd.register_fake
def _fwd_fake(gate, up):
    return gate.new_empty(gate.shape, dtype=torch.promote_types(gate.dtype, up.dtype))


def _save_inputs(ctx, inputs, output) -> None:
    ctx.save_for_backward(*inputs)


def _grads(ctx, dout):
    return silu_mul_bwd(*ctx.saved_tensors, dout)


silu_mul_fwd.register_autograd(_grads, setup_context=_save_inputs)

silu_mul_bwd = torch.library.custom_op("fastpath::silu_mul_bwd", bwd_impl, mutates_args=())


@silu_mul_bwd.register_fake
def _bwd_fake(gate, up, dout):
    return gate.new_empty(gate.shape), up.new_empty(up.shape)
