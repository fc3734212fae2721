"""Dao 1.7.0 `causal_conv1d_varlen` module: conv states of packed (varlen) sequences."""

from __future__ import annotations

from torch import Tensor

from fastpath.kernels.causal_conv1d.interface import varlen_states
from fastpath.kernels.causal_conv1d.naive import causal_conv1d_varlen_states_ref

__all__ = ["causal_conv1d_varlen_states", "causal_conv1d_varlen_states_ref"]


def causal_conv1d_varlen_states(x: Tensor, cu_seqlens: Tensor, state_len: int) -> Tensor:
    """x (total_tokens, D), cu_seqlens (B+1,) sorted from 0 -> (B, D, state_len); positions of a
    shorter sequence are zero. Forward only (like Dao's)."""
    if x.dim() != 2:
        raise ValueError(f"causal_conv1d_varlen_states: x must be (total_tokens, dim), got {tuple(x.shape)}")
    if cu_seqlens.dim() != 1 or cu_seqlens.shape[0] < 1:
        raise ValueError("causal_conv1d_varlen_states: cu_seqlens must be a 1-D (batch + 1,) tensor")
    if state_len < 0:
        raise ValueError(f"causal_conv1d_varlen_states: state_len must be >= 0, got {state_len}")
    return varlen_states(x, cu_seqlens, int(state_len))
