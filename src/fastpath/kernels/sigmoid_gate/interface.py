"""The sigmoid output gate as torch custom ops: out = x * sigmoid(gate), one kernel each way.

x and gate have one shape (..., width) and may be strided views (the gated attention's gate is
the second half of each head of the q_proj output); out is contiguous in their promoted dtype.
Ops (namespace "fastpath"): sigmoid_gate_fwd(x, gate) -> out and sigmoid_gate_bwd(x, gate, dout)
-> (dx, dgate), with fake implementations and registered autograd (no graph break under
torch.compile); eager callers skip the dispatcher, as in causal_conv1d/interface.py. Where the
Triton kernel cannot run, the float32 reference in naive.py does (a one-time warning says why
when a kernel could otherwise have run).
"""

from __future__ import annotations

import torch
from torch import Tensor

from fastpath.kernels.counters import CALLS
from fastpath.kernels.dispatch import dtypes_fit, use_triton
from fastpath.kernels.layout import as_rows as _rows
from fastpath.kernels.sigmoid_gate import naive

FAMILY = "sigmoid_gate"




def _check(x: Tensor, gate: Tensor) -> None:
    if x.shape != gate.shape:
        raise ValueError(f"sigmoid_gate: x {tuple(x.shape)} and gate {tuple(gate.shape)} must have one shape")
    if not x.dtype.is_floating_point or not gate.dtype.is_floating_point:
        raise ValueError(f"sigmoid_gate: x and gate must be floating point, got {x.dtype} and {gate.dtype}")


def _triton_ok(op: str, *tensors: Tensor) -> bool:
    if not use_triton(tensors[0]):
        return False
    return dtypes_fit(op, FAMILY, *tensors)


def fwd_impl(x: Tensor, gate: Tensor) -> Tensor:
    _check(x, gate)
    dtype = torch.promote_types(x.dtype, gate.dtype)
    if x.numel() and _triton_ok("fwd", x, gate):
        from fastpath.kernels.sigmoid_gate.fwd_bwd import gate_fwd

        CALLS["sigmoid_gate_fwd:triton"] += 1
        return gate_fwd(_rows(x), _rows(gate), dtype).view(x.shape)
    CALLS["sigmoid_gate_fwd:reference"] += 1
    return naive.sigmoid_gate_ref(x, gate, compute=torch.float32).to(dtype).contiguous()


def bwd_impl(x: Tensor, gate: Tensor, dout: Tensor) -> tuple[Tensor, Tensor]:
    if x.numel() and _triton_ok("bwd", x, gate, dout):
        from fastpath.kernels.sigmoid_gate.fwd_bwd import gate_bwd

        CALLS["sigmoid_gate_bwd:triton"] += 1
        dx, dg = gate_bwd(_rows(x), _rows(gate), _rows(dout))
        return dx.view(x.shape), dg.view(gate.shape)
    CALLS["sigmoid_gate_bwd:reference"] += 1
    dx, dg = naive.sigmoid_gate_bwd_ref(x, gate, dout, compute=torch.float32)
    return dx.to(x.dtype).contiguous(), dg.to(gate.dtype).contiguous()


class _GateFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, gate):  # type: ignore[override]
        ctx.save_for_backward(x, gate)
        return fwd_impl(x, gate)

    @staticmethod
    def backward(ctx, dout):  # type: ignore[override]
        return bwd_impl(*ctx.saved_tensors, dout)


def sigmoid_gate(x: Tensor, gate: Tensor) -> Tensor:
    """x * sigmoid(gate): the custom op while torch.compile traces, otherwise the implementation
    directly, under autograd only when a gradient is wanted."""
    if torch.compiler.is_compiling():
        return sigmoid_gate_fwd(x, gate)
    if torch.is_grad_enabled() and (x.requires_grad or gate.requires_grad):
        return _GateFunction.apply(x, gate)
    return fwd_impl(x, gate)


sigmoid_gate_fwd = torch.library.custom_op("fastpath::sigmoid_gate_fwd", fwd_impl, mutates_args=())


@sigmoid_gate_fwd.register_fake
def _fwd_fake(x, gate):
    return x.new_empty(x.shape, dtype=torch.promote_types(x.dtype, gate.dtype))


def _setup_context(ctx, inputs, output) -> None:
    ctx.save_for_backward(*inputs)


def _backward(ctx, dout):
    return sigmoid_gate_bwd(*ctx.saved_tensors, dout)


sigmoid_gate_fwd.register_autograd(_backward, setup_context=_setup_context)

sigmoid_gate_bwd = torch.library.custom_op("fastpath::sigmoid_gate_bwd", bwd_impl, mutates_args=())


@sigmoid_gate_bwd.register_fake
def _bwd_fake(x, gate, dout):
    return (torch.empty_like(x, memory_format=torch.contiguous_format),
            torch.empty_like(gate, memory_format=torch.contiguous_format))
