"""Dao 1.7.0 `cpp_functions` entry points (argument order as Dao's), on fastpath's causal_conv1d ops.

mamba_ssm calls `causal_conv1d_bwd_function(x, w, b, dout, seq_idx, None, None, dx, False, True)`
with a preallocated dx: it is written in place and returned.
"""

from __future__ import annotations

import torch
from torch import Tensor

from fastpath.kernels.causal_conv1d.interface import (
    bwd_impl,
    causal_conv1d_bwd,
    conv_fwd,
    update_impl,
)

__all__ = [
    "causal_conv1d_bwd_function",
    "causal_conv1d_fwd_function",
    "causal_conv1d_update_function",
]


def causal_conv1d_fwd_function(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    seq_idx: Tensor | None,
    initial_states: Tensor | None,
    final_states_out: Tensor | None,
    silu_activation: bool,
) -> Tensor:
    """Forward; writes final_states_out (B, D, W-1) when given."""
    out, final = conv_fwd(
        x, weight, bias, seq_idx, initial_states, final_states_out is not None,
        bool(silu_activation),
    )
    if final_states_out is not None:
        final_states_out.copy_(final)
    return out


def causal_conv1d_bwd_function(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    dout: Tensor,
    seq_idx: Tensor | None,
    initial_states: Tensor | None,
    dfinal_states: Tensor | None,
    dx: Tensor | None,
    return_dinitial_states: bool,
    silu_activation: bool,
) -> tuple[Tensor, Tensor, Tensor | None, Tensor | None]:
    """Backward -> (dx, dweight, dbias or None, dinitial_states or None)."""
    if dx is None:
        dx = torch.empty_like(x)
    want_dinit = bool(return_dinitial_states) and initial_states is not None
    bwd = causal_conv1d_bwd if torch.compiler.is_compiling() else bwd_impl  # op only when traced
    dweight, dbias, dinit = bwd(
        x, weight, bias, dout, seq_idx, initial_states, dfinal_states, dx,
        bool(silu_activation), want_dinit,
    )
    return dx, dweight, (dbias if bias is not None else None), (dinit if want_dinit else None)


def causal_conv1d_update_function(
    x: Tensor,
    conv_state: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    silu_activation: bool,
    cache_seqlens: Tensor | None,
    conv_state_indices: Tensor | None,
) -> Tensor:
    """Decode update of a (B, D, L) x; conv_state updated in place."""
    return update_impl(
        x, conv_state, weight, bias, bool(silu_activation), cache_seqlens, conv_state_indices
    )
