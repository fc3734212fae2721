"""One elementwise op of two same-shaped inputs, out = f(a, b), as a pair of torch custom ops
with autograd: what sigmoid_gate and swiglu share.

binary_op(name, fwd_impl, bwd_impl) registers fastpath::<name>_fwd(a, b) -> out (contiguous, in a
and b's promoted dtype) and fastpath::<name>_bwd(a, b, dout) -> (da, db) (contiguous, in a's and
b's dtypes), with fake implementations and the backward registered as the forward's autograd, so
torch.compile traces them without a graph break. The returned call(a, b) uses the custom op only
while torch.compile traces; eager calls skip the dispatcher (as causal_conv1d/interface.py does)
and run under autograd only when a gradient is wanted. Autograd keeps a and b, nothing else.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import torch
from torch import Tensor


def check_pair(op: str, names: tuple[str, str], a: Tensor, b: Tensor) -> None:
    """The inputs' contract, as one-line errors: one shape, both floating point."""
    if a.shape != b.shape:
        raise ValueError(f"{op}: {names[0]} {tuple(a.shape)} and {names[1]} {tuple(b.shape)} must have one shape")
    if not a.dtype.is_floating_point or not b.dtype.is_floating_point:
        raise ValueError(f"{op}: {names[0]} and {names[1]} must be floating point, got {a.dtype} and {b.dtype}")


class BinaryOp(NamedTuple):
    call: Callable[[Tensor, Tensor], Tensor]
    fwd: Any  # the fastpath::<name>_fwd custom op
    bwd: Any  # the fastpath::<name>_bwd custom op


def binary_op(name: str, fwd_impl: Callable[[Tensor, Tensor], Tensor],
              bwd_impl: Callable[[Tensor, Tensor, Tensor], tuple[Tensor, Tensor]]) -> BinaryOp:
    class _Function(torch.autograd.Function):
        @staticmethod
        def forward(ctx, a, b):  # type: ignore[override]
            ctx.save_for_backward(a, b)
            return fwd_impl(a, b)

        @staticmethod
        def backward(ctx, dout):  # type: ignore[override]
            return bwd_impl(*ctx.saved_tensors, dout)

    _Function.__name__ = _Function.__qualname__ = f"_{name.title().replace('_', '')}Function"

    fwd_op = torch.library.custom_op(f"fastpath::{name}_fwd", fwd_impl, mutates_args=())
    bwd_op = torch.library.custom_op(f"fastpath::{name}_bwd", bwd_impl, mutates_args=())

    @fwd_op.register_fake
    def _fwd_fake(a, b):
        return a.new_empty(a.shape, dtype=torch.promote_types(a.dtype, b.dtype))

    @bwd_op.register_fake
    def _bwd_fake(a, b, dout):
        return (torch.empty_like(a, memory_format=torch.contiguous_format),
                torch.empty_like(b, memory_format=torch.contiguous_format))

    def _save_inputs(ctx, inputs, output) -> None:
        ctx.save_for_backward(*inputs)

    def _grads(ctx, dout):
        return bwd_op(*ctx.saved_tensors, dout)

    fwd_op.register_autograd(_grads, setup_context=_save_inputs)

    def call(a: Tensor, b: Tensor) -> Tensor:
        if torch.compiler.is_compiling():
            return fwd_op(a, b)
        if torch.is_grad_enabled() and (a.requires_grad or b.requires_grad):
            return _Function.apply(a, b)
        return fwd_impl(a, b)

    return BinaryOp(call, fwd_op, bwd_op)
