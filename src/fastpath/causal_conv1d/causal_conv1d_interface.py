"""Dao 1.7.0 `causal_conv1d_interface`: causal_conv1d_fn / causal_conv1d_update and the *_ref spec.

Validation lives here (cheap shape/arg checks with one-line messages); the numbers come from
fastpath's custom ops (Triton on GPU, float reference elsewhere).
"""

from __future__ import annotations

import torch
from torch import Tensor

from fastpath.kernels.causal_conv1d.interface import (
    causal_conv1d_update_op,
    conv_fwd,
    update_impl,
)
from fastpath.kernels.causal_conv1d.naive import (
    causal_conv1d_ref,
    causal_conv1d_update_ref,
    check_activation,
)

__all__ = [
    "causal_conv1d_fn",
    "causal_conv1d_ref",
    "causal_conv1d_update",
    "causal_conv1d_update_ref",
]


def _fail(msg: str) -> None:
    raise ValueError(f"causal_conv1d: {msg}")


def causal_conv1d_fn(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    seq_idx: Tensor | None = None,
    initial_states: Tensor | None = None,
    return_final_states: bool = False,
    final_states_out: Tensor | None = None,
    activation: str | None = None,
):
    """y = act(causal depthwise conv1d(x)); x (B, D, L), weight (D, W), bias (D,),
    seq_idx (B, L) int (negative = padding -> 0), initial_states (B, D, W-1).
    Returns y (strides of x), or (y, final_states) with return_final_states."""
    silu = check_activation(activation)
    if x.dim() != 3:
        _fail(f"x must be (batch, dim, seqlen), got shape {tuple(x.shape)}")
    batch, dim, seqlen = x.shape
    if weight.dim() != 2 or weight.shape[0] != dim:
        _fail(f"weight must be (dim={dim}, width), got shape {tuple(weight.shape)}")
    width = weight.shape[1]
    if width < 2:
        _fail(f"width must be >= 2, got {width}")
    if bias is not None and tuple(bias.shape) != (dim,):
        _fail(f"bias must be (dim={dim},), got shape {tuple(bias.shape)}")
    if x.stride(2) != 1 and x.stride(1) != 1:
        x = x.contiguous()
    if seq_idx is not None:
        if return_final_states:
            raise NotImplementedError("causal_conv1d: seq_idx does not support return_final_states")
        if tuple(seq_idx.shape) != (batch, seqlen):
            _fail(f"seq_idx must be (batch={batch}, seqlen={seqlen}), got {tuple(seq_idx.shape)}")
        if seq_idx.dtype.is_floating_point or seq_idx.dtype == torch.bool:
            _fail(f"seq_idx must be an integer tensor, got {seq_idx.dtype}")
        if seq_idx.dtype != torch.int32 or not seq_idx.is_contiguous():
            seq_idx = seq_idx.to(torch.int32).contiguous()
    if initial_states is not None and tuple(initial_states.shape) != (batch, dim, width - 1):
        _fail(
            f"initial_states must be (batch, dim, width-1) = {(batch, dim, width - 1)}, "
            f"got {tuple(initial_states.shape)}"
        )
    if final_states_out is not None and tuple(final_states_out.shape) != (batch, dim, width - 1):
        _fail(f"final_states_out must be {(batch, dim, width - 1)}, got {tuple(final_states_out.shape)}")
    out, final = conv_fwd(x, weight, bias, seq_idx, initial_states, bool(return_final_states), silu)
    if not return_final_states:
        return out
    if final_states_out is not None:
        with torch.no_grad():
            final_states_out.copy_(final)
    return out, final


def causal_conv1d_update(
    x: Tensor,
    conv_state: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    activation: str | None = None,
    cache_seqlens: Tensor | None = None,
    conv_state_indices: Tensor | None = None,
) -> Tensor:
    """Decode step: x (B, D) or (B, D, L); conv_state (B or pool, D, state_len >= W-1) updated in
    place; cache_seqlens (B,) makes it a circular buffer; conv_state_indices (B,) picks pool rows
    (negative = padding row: output 0, state untouched)."""
    silu = check_activation(activation)
    squeeze = x.dim() == 2
    if squeeze:
        x = x.unsqueeze(-1)
    if x.dim() != 3:
        _fail(f"update: x must be (batch, dim) or (batch, dim, seqlen), got {tuple(x.shape)}")
    batch, dim, _ = x.shape
    width = weight.shape[-1]
    if weight.dim() != 2 or weight.shape[0] != dim or width < 2:
        _fail(f"update: weight must be (dim={dim}, width >= 2), got {tuple(weight.shape)}")
    if conv_state.dim() != 3 or conv_state.shape[1] != dim or conv_state.shape[2] < width - 1:
        _fail(
            f"update: conv_state must be (batch, dim={dim}, state_len >= {width - 1}), "
            f"got {tuple(conv_state.shape)}"
        )
    if conv_state_indices is None and conv_state.shape[0] != batch:
        _fail(f"update: conv_state batch {conv_state.shape[0]} != x batch {batch}")
    if conv_state_indices is not None and tuple(conv_state_indices.shape) != (batch,):
        _fail(f"update: conv_state_indices must be (batch={batch},)")
    if cache_seqlens is not None and tuple(cache_seqlens.shape) != (batch,):
        _fail(f"update: cache_seqlens must be (batch={batch},)")
    if torch.compiler.is_compiling():
        out = causal_conv1d_update_op(
            x, conv_state, weight, bias, silu, cache_seqlens, conv_state_indices
        )
    else:
        out = update_impl(x, conv_state, weight, bias, silu, cache_seqlens, conv_state_indices)
    return out.squeeze(-1) if squeeze else out
