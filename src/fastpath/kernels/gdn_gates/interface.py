"""The GatedDeltaNet gates as torch custom ops, one kernel each way.

    g, beta = gdn_gates(a, b, A_log, dt_bias)
    g    = -exp(A_log) * softplus(a + dt_bias)   float32, a's shape (..., heads)
    beta = sigmoid(b)                            b's dtype and shape

Ops (namespace "fastpath"): gdn_gates_fwd(a, b, a_log, dt_bias) -> (g, beta) and
gdn_gates_bwd(a, b, a_log, dt_bias, dg, dbeta) -> (da, db, da_log, ddt_bias), each with a fake
implementation, the forward with registered autograd, so `torch.compile` traces one op each way
without a graph break. Eager callers skip the dispatcher (a plain autograd.Function over the same
implementations), as causal_conv1d/interface.py does. Where the Triton kernel cannot run (CPU
without TRITON_INTERPRET=1, an odd dtype, too many heads) the float32 reference in naive.py runs,
with a one-time warning when a kernel could otherwise have run.
"""

from __future__ import annotations

import torch
from torch import Tensor

from fastpath.kernels.counters import CALLS
from fastpath.kernels.dispatch import dtypes_fit, use_triton, warn_fallback
from fastpath.kernels.gdn_gates import naive
from fastpath.kernels.layout import as_rows as _rows

MAX_HEADS = 2048  # one program holds a row block across every head
FAMILY = "gdn_gates"




def _check(a: Tensor, b: Tensor, a_log: Tensor, dt_bias: Tensor) -> None:
    heads = a.shape[-1] if a.dim() else 1
    if a.shape != b.shape or a_log.shape != (heads,) or dt_bias.shape != (heads,):
        raise ValueError(f"gdn_gates: a {tuple(a.shape)} and b {tuple(b.shape)} must match, A_log "
                         f"{tuple(a_log.shape)} and dt_bias {tuple(dt_bias.shape)} must be ({heads},)")
    if not a.dtype.is_floating_point or not b.dtype.is_floating_point:
        raise ValueError(f"gdn_gates: a and b must be floating point, got {a.dtype} and {b.dtype}")


def _triton_ok(op: str, *tensors: Tensor | None) -> bool:
    a = tensors[0]
    assert a is not None
    if not use_triton(a):
        return False
    if not dtypes_fit(op, FAMILY, *tensors):
        return False
    if a.shape[-1] > MAX_HEADS:
        warn_fallback(op, f"more than {MAX_HEADS} heads", FAMILY)
        return False
    return True


def fwd_impl(a: Tensor, b: Tensor, a_log: Tensor, dt_bias: Tensor) -> tuple[Tensor, Tensor]:
    """(g float32, beta in b's dtype), both contiguous with a's shape."""
    _check(a, b, a_log, dt_bias)
    if _triton_ok("fwd", a, b, a_log, dt_bias):
        from fastpath.kernels.gdn_gates.fwd_bwd import gates_fwd

        CALLS["gdn_gates_fwd:triton"] += 1
        g, beta = gates_fwd(_rows(a), _rows(b), a_log, dt_bias)
        return g.view(a.shape), beta.view(b.shape)
    CALLS["gdn_gates_fwd:reference"] += 1
    g, beta = naive.gdn_gates_ref(a, b, a_log, dt_bias, compute=torch.float32)
    return g.contiguous(), beta.to(b.dtype).contiguous()


def bwd_impl(a: Tensor, b: Tensor, a_log: Tensor, dt_bias: Tensor, dg: Tensor | None,
             dbeta: Tensor | None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(da, db, dA_log, ddt_bias) in the dtypes of (a, b, A_log, dt_bias); None grads are zeros."""
    if _triton_ok("bwd", a, b, a_log, dt_bias, dg, dbeta):
        from fastpath.kernels.gdn_gates.fwd_bwd import gates_bwd

        CALLS["gdn_gates_bwd:triton"] += 1
        da, db, d_a_log, d_dt_bias = gates_bwd(
            _rows(a), _rows(b), a_log, dt_bias, None if dg is None else _rows(dg),
            None if dbeta is None else _rows(dbeta))
        return da.view(a.shape), db.view(b.shape), d_a_log, d_dt_bias
    CALLS["gdn_gates_bwd:reference"] += 1
    da, db, d_a_log, d_dt_bias = naive.gdn_gates_bwd_ref(a, b, a_log, dt_bias, dg, dbeta, compute=torch.float32)
    return (da.to(a.dtype).contiguous(), db.to(b.dtype).contiguous(), d_a_log.to(a_log.dtype),
            d_dt_bias.to(dt_bias.dtype))


class _GatesFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, b, a_log, dt_bias):  # type: ignore[override]
        ctx.save_for_backward(a, b, a_log, dt_bias)
        return fwd_impl(a, b, a_log, dt_bias)

    @staticmethod
    def backward(ctx, dg, dbeta):  # type: ignore[override]
        return bwd_impl(*ctx.saved_tensors, dg, dbeta)


def gdn_gates(a: Tensor, b: Tensor, a_log: Tensor, dt_bias: Tensor) -> tuple[Tensor, Tensor]:
    """(g, beta) of a GatedDeltaNet layer: the custom op while torch.compile traces, otherwise
    the implementation directly, under autograd only when a gradient is wanted."""
    if torch.compiler.is_compiling():
        return gdn_gates_fwd(a, b, a_log, dt_bias)
    if torch.is_grad_enabled() and any(t.requires_grad for t in (a, b, a_log, dt_bias)):
        return _GatesFunction.apply(a, b, a_log, dt_bias)
    return fwd_impl(a, b, a_log, dt_bias)


gdn_gates_fwd = torch.library.custom_op("fastpath::gdn_gates_fwd", fwd_impl, mutates_args=())


@gdn_gates_fwd.register_fake
def _fwd_fake(a, b, a_log, dt_bias):
    return a.new_empty(a.shape, dtype=torch.float32), torch.empty_like(b, memory_format=torch.contiguous_format)


def _setup_context(ctx, inputs, output) -> None:
    ctx.save_for_backward(*inputs)


def _backward(ctx, dg, dbeta):
    return gdn_gates_bwd(*ctx.saved_tensors, dg, dbeta)


gdn_gates_fwd.register_autograd(_backward, setup_context=_setup_context)

gdn_gates_bwd = torch.library.custom_op("fastpath::gdn_gates_bwd", bwd_impl, mutates_args=())


@gdn_gates_bwd.register_fake
def _bwd_fake(a, b, a_log, dt_bias, dg, dbeta):
    return (torch.empty_like(a, memory_format=torch.contiguous_format),
            torch.empty_like(b, memory_format=torch.contiguous_format),
            torch.empty_like(a_log), torch.empty_like(dt_bias))
