"""causal_conv1d as torch custom ops: one place that validates, dispatches (Triton or reference)
and defines autograd, so eager, autograd and `torch.compile(fullgraph=True)` all see the same op.

Ops (namespace "fastpath"):
- causal_conv1d_fwd(x, weight, bias, seq_idx, initial_states, return_final_states, silu)
      -> (out, final_states)      final_states is an empty tensor when not requested
- causal_conv1d_bwd(x, weight, bias, dout, seq_idx, initial_states, dfinal_states, dx, silu,
      return_dinitial_states) -> (dweight, dbias, dinitial_states); writes dx in place
      (mamba_ssm hands in a preallocated dx). Missing results are empty tensors.
- causal_conv1d_update(x, conv_state, weight, bias, silu, cache_seqlens, conv_state_indices)
      -> out; conv_state is updated in place.
Custom-op schemas cannot return None, hence the empty-tensor convention (the face maps back).

Eager callers skip the custom-op dispatcher (it costs more host time than a small conv takes on
the GPU): `conv_fwd` runs `fwd_impl` directly when no input needs a gradient and otherwise goes
through a plain autograd.Function whose backward is `bwd_impl`; under torch.compile it calls the
custom op, so traced graphs see one op with a fake implementation and registered autograd. Direct
callers of the backward and the update pick `bwd_impl` / `update_impl` or the op the same way.
Each op is built from its implementation (schema inferred from its signature), not a wrapper.
"""

from __future__ import annotations

from functools import cache

import torch
from torch import Tensor

from fastpath.kernels.causal_conv1d import naive as reference
from fastpath.kernels.counters import CALLS
from fastpath.kernels.dispatch import TRITON_DTYPES, use_triton, warn_fallback

MAX_TRITON_WIDTH = 4
_INT32_SPAN = 2**31


@cache
def kernel_limit(width: int, dtype: torch.dtype) -> str | None:
    """Why the Triton kernels cannot take a conv of this width and dtype, None when they can: the
    one answer the dispatcher here and `explain()` share."""
    if not 2 <= width <= MAX_TRITON_WIDTH:
        return f"width {width} is outside the kernel's 2..{MAX_TRITON_WIDTH}"
    if dtype not in TRITON_DTYPES:
        return f"dtype {dtype} is not one the kernel takes (float32, float16, bfloat16)"
    return None


def _empty(like: Tensor) -> Tensor:
    return like.new_empty(0)


def _triton_ok(op: str, width: int, *tensors: Tensor | None) -> bool:
    """Triton takes the call when the device can run it, `kernel_limit` has no objection for any
    tensor, and a batch row's offsets fit int32; any other combination warns once and goes to
    the reference."""
    x = tensors[0]
    if not use_triton(x):
        return False
    for t in tensors:
        if t is not None:
            why = kernel_limit(width, t.dtype)
            if why is not None:
                warn_fallback(op, why)
                return False
    _, dim, seqlen = x.shape
    sd, sl = x.stride(1), x.stride(2)
    if (dim - 1) * abs(sd) + (seqlen - 1) * abs(sl) >= _INT32_SPAN:
        warn_fallback(op, "a batch row spans >= 2**31 elements (kernel offsets are int32)")
        return False
    return True


def final_states_of(x: Tensor, initial_states: Tensor | None, width: int) -> Tensor:
    """The last W-1 inputs (initial state / zeros in front when L < W-1), channel-last like Dao."""
    batch, dim, seqlen = x.shape
    final = x.new_empty((batch, width - 1, dim)).transpose(1, 2)
    if seqlen >= width - 1:
        final.copy_(x[..., seqlen - (width - 1) :])
    else:
        if initial_states is None:
            front = x.new_zeros((batch, dim, width - 1))
        else:
            front = initial_states.to(x.dtype)
        final.copy_(torch.cat([front, x], dim=-1)[..., seqlen:])
    return final


# ---------------------------------------------------------------- implementations
def fwd_impl(
    x: Tensor, weight: Tensor, bias: Tensor | None, seq_idx: Tensor | None,
    initial_states: Tensor | None, return_final_states: bool, silu: bool,
) -> tuple[Tensor, Tensor]:
    """The forward itself (out, final_states or empty), whoever calls it; its signature is the
    fastpath::causal_conv1d_fwd schema."""
    width = weight.shape[-1]
    out = fwd_into(x, weight, bias, seq_idx, initial_states, silu, torch.empty_like(x))
    final = final_states_of(x, initial_states, width) if return_final_states else _empty(x)
    return out, final


def fwd_into(x: Tensor, weight: Tensor, bias: Tensor | None, seq_idx: Tensor | None,
             initial_states: Tensor | None, silu: bool, out: Tensor) -> Tensor:
    """act(conv(x)) written into `out` (x's shape, any strides), Triton or the reference."""
    if _triton_ok("fwd", weight.shape[-1], x, weight, bias, initial_states):
        CALLS["fwd:triton"] += 1
        if x.stride(1) == 1:  # channel-last: sliding-row kernel, 16-byte vectors along D
            return _kernels().fwd_rows(x, weight, bias, seq_idx, initial_states, silu, out=out)
        # contiguous: 2D tiles vectorized along L
        return _kernels().fwd_tile(x, weight, bias, seq_idx, initial_states, silu, out=out)
    CALLS["fwd:reference"] += 1
    return out.copy_(
        reference.causal_conv1d_ref(
            x, weight, bias, initial_states, activation="silu" if silu else None, seq_idx=seq_idx,
        )
    )


def bwd_impl(
    x: Tensor, weight: Tensor, bias: Tensor | None, dout: Tensor, seq_idx: Tensor | None,
    initial_states: Tensor | None, dfinal_states: Tensor | None, dx: Tensor, silu: bool,
    return_dinitial_states: bool,
) -> tuple[Tensor, Tensor, Tensor]:
    """The backward itself: writes dx, returns (dweight, dbias or empty, dinit or empty); its
    signature is the fastpath::causal_conv1d_bwd schema."""
    width = weight.shape[-1]
    if _triton_ok("bwd", width, x, weight, bias, initial_states, dout, dfinal_states, dx):
        CALLS["bwd:triton"] += 1
        if x.stride(1) == 1:
            kernel = _kernels().bwd_rows
            if dout.stride(1) != 1:  # one copy beats strided row loads
                dout = dout.transpose(1, 2).contiguous().transpose(1, 2)
        else:
            kernel = _kernels().bwd_tile
        dweight, dbias, dinit = kernel(
            x, weight, bias, dout, seq_idx, initial_states, dfinal_states, dx, silu,
            return_dinitial_states,
        )
    else:
        CALLS["bwd:reference"] += 1
        gx, dweight, dbias, dinit = reference.causal_conv1d_bwd_ref(
            x, weight, bias, dout, seq_idx, initial_states, dfinal_states, silu
        )
        dx.copy_(gx)
    if not return_dinitial_states:
        dinit = None
    return (
        dweight,
        _empty(weight) if dbias is None else dbias,
        _empty(x) if dinit is None else dinit,
    )


class _Kernels:
    """The Triton launchers, imported on first use (importing them imports triton)."""

    def __init__(self) -> None:
        from fastpath.kernels.causal_conv1d import bwd_tile, fwd_bwd_rows, fwd_tile

        self.fwd_rows = fwd_bwd_rows.causal_conv1d_fwd_rows
        self.bwd_rows = fwd_bwd_rows.causal_conv1d_bwd_rows
        self.fwd_tile = fwd_tile.causal_conv1d_fwd_triton
        self.bwd_tile = bwd_tile.causal_conv1d_bwd_triton


@cache
def _kernels() -> _Kernels:
    return _Kernels()


# ---------------------------------------------------------------- eager entry
class _ConvFunction(torch.autograd.Function):
    """Eager autograd for the forward: the same saved tensors and backward as the custom op's
    registered autograd, without the dispatcher round trips."""

    @staticmethod
    def forward(ctx, x, weight, bias, seq_idx, initial_states, return_final_states, silu):  # type: ignore[override]
        out, final = fwd_impl(x, weight, bias, seq_idx, initial_states, return_final_states, silu)
        ctx.save_for_backward(x, weight, bias, seq_idx, initial_states)
        ctx.silu = silu
        ctx.return_final_states = return_final_states
        if not return_final_states:
            ctx.mark_non_differentiable(final)
        return out, final

    @staticmethod
    def backward(ctx, dout, dfinal):  # type: ignore[override]
        x, weight, bias, seq_idx, initial_states = ctx.saved_tensors
        return _backward_of(ctx, x, weight, bias, seq_idx, initial_states, dout, dfinal, bwd_impl)


def _backward_of(ctx, x, weight, bias, seq_idx, initial_states, dout, dfinal, bwd) -> tuple:
    """Gradients of the forward's 7 inputs, `bwd` being the custom op or its implementation."""
    if not ctx.return_final_states:
        dfinal = None
    if dout is None:
        dout = torch.zeros_like(x)
    dx = torch.empty_like(x)
    dweight, dbias, dinit = bwd(
        x, weight, bias, dout, seq_idx, initial_states, dfinal, dx, ctx.silu,
        initial_states is not None,
    )
    return (
        dx,
        dweight,
        dbias if bias is not None else None,
        None,
        dinit if initial_states is not None else None,
        None,
        None,
    )


def conv_fwd(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    seq_idx: Tensor | None,
    initial_states: Tensor | None,
    return_final_states: bool,
    silu: bool,
) -> tuple[Tensor, Tensor]:
    """The forward as callers should reach it: the custom op while torch.compile traces,
    otherwise the implementation directly, under autograd only when a gradient is wanted."""
    if torch.compiler.is_compiling():
        return causal_conv1d_fwd(x, weight, bias, seq_idx, initial_states, return_final_states,
                                 silu)
    if torch.is_grad_enabled() and (
        x.requires_grad or weight.requires_grad
        or (bias is not None and bias.requires_grad)
        or (initial_states is not None and initial_states.requires_grad)
    ):
        return _ConvFunction.apply(x, weight, bias, seq_idx, initial_states, return_final_states,
                                   silu)
    return fwd_impl(x, weight, bias, seq_idx, initial_states, return_final_states, silu)


# ---------------------------------------------------------------- forward op
causal_conv1d_fwd = torch.library.custom_op("fastpath::causal_conv1d_fwd", fwd_impl, mutates_args=())


@causal_conv1d_fwd.register_fake
def _fwd_fake(x, weight, bias, seq_idx, initial_states, return_final_states, silu):
    out = torch.empty_like(x)
    if not return_final_states:
        return out, x.new_empty(0)
    batch, dim, _ = x.shape
    return out, x.new_empty((batch, weight.shape[-1] - 1, dim)).transpose(1, 2)


def _fwd_setup_context(ctx, inputs, output) -> None:
    x, weight, bias, seq_idx, initial_states, return_final_states, silu = inputs
    ctx.save_for_backward(x, weight, bias, seq_idx, initial_states)
    ctx.silu = silu
    ctx.return_final_states = return_final_states


def _fwd_backward(ctx, dout, dfinal):
    x, weight, bias, seq_idx, initial_states = ctx.saved_tensors
    return _backward_of(ctx, x, weight, bias, seq_idx, initial_states, dout, dfinal,
                        causal_conv1d_bwd)


causal_conv1d_fwd.register_autograd(_fwd_backward, setup_context=_fwd_setup_context)


# ---------------------------------------------------------------- backward op
causal_conv1d_bwd = torch.library.custom_op("fastpath::causal_conv1d_bwd", bwd_impl,
                                            mutates_args={"dx"})


@causal_conv1d_bwd.register_fake
def _bwd_fake(
    x, weight, bias, dout, seq_idx, initial_states, dfinal_states, dx, silu, return_dinit
):
    dbias = torch.empty_like(bias) if bias is not None else weight.new_empty(0)
    if return_dinit and initial_states is not None:
        batch, dim, _ = x.shape
        dinit = initial_states.new_empty((batch, weight.shape[-1] - 1, dim)).transpose(1, 2)
    else:
        dinit = x.new_empty(0)
    return torch.empty_like(weight), dbias, dinit


# ---------------------------------------------------------------- decode update
_UPDATE_KERNEL = None


def update_impl(
    x: Tensor,
    conv_state: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    silu: bool,
    cache_seqlens: Tensor | None,
    conv_state_indices: Tensor | None,
) -> Tensor:
    """The update itself, (B, D, L) x only. Eager callers come here directly, skipping the
    custom-op dispatcher, and the checks are flat: at decode the host time is the cost."""
    global _UPDATE_KERNEL
    width = weight.shape[-1]
    if (
        (x.is_cuda or use_triton(x))
        and kernel_limit(width, x.dtype) is None
        and kernel_limit(width, weight.dtype) is None
        and kernel_limit(width, conv_state.dtype) is None
        and (bias is None or kernel_limit(width, bias.dtype) is None)
        and x.numel() < _INT32_SPAN
        and conv_state.numel() < _INT32_SPAN
    ):
        if _UPDATE_KERNEL is None:
            from fastpath.kernels.causal_conv1d.update import causal_conv1d_update_triton

            _UPDATE_KERNEL = causal_conv1d_update_triton
        CALLS["update:triton"] += 1
        return _UPDATE_KERNEL(x, conv_state, weight, bias, silu, cache_seqlens, conv_state_indices)
    _triton_ok("update", width, x, weight, bias, conv_state)  # warns when a kernel could run
    CALLS["update:reference"] += 1
    return reference.causal_conv1d_update_ref(
        x, conv_state, weight, bias, "silu" if silu else None, cache_seqlens, conv_state_indices
    )


causal_conv1d_update_op = torch.library.custom_op("fastpath::causal_conv1d_update", update_impl,
                                                  mutates_args={"conv_state"})


@causal_conv1d_update_op.register_fake
def _update_fake(x, conv_state, weight, bias, silu, cache_seqlens, conv_state_indices):
    return torch.empty_like(x)


# ---------------------------------------------------------------- varlen states
def varlen_states(x: Tensor, cu_seqlens: Tensor, state_len: int) -> Tensor:
    """Last state_len tokens of each packed sequence: (B, D, state_len), channel-last."""
    if use_triton(x) and x.dtype in TRITON_DTYPES:  # varlen states copy: any width
        from fastpath.kernels.causal_conv1d.varlen import causal_conv1d_varlen_states_triton

        CALLS["varlen_states:triton"] += 1
        return causal_conv1d_varlen_states_triton(x, cu_seqlens, state_len)
    CALLS["varlen_states:reference"] += 1
    return reference.causal_conv1d_varlen_states_ref(x, cu_seqlens, state_len)
