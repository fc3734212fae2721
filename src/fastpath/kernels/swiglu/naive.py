"""The spec of the SwiGLU gated product, forward and backward, in a chosen float precision.

transformers' gated MLPs (Qwen3.5 / Qwen3-Next / OLMo-hybrid / Bamba / Jamba ``*MLP.forward``:
``down_proj(act_fn(gate_proj(x)) * up_proj(x))`` with ``hidden_act="silu"``):
out = silu(g) * u, silu(g) = g * s, s = sigmoid(g);
dup = dout * silu(g), dgate = dout * u * s * (1 + g * (1 - s)).
Tests call these in float64 (the oracle); the op calls them in float32 where its Triton kernel
cannot run (the fallback).
"""

from __future__ import annotations

import torch
from torch import Tensor


def silu_mul_ref(gate: Tensor, up: Tensor, compute: torch.dtype = torch.float64) -> Tensor:
    g = gate.to(compute)
    return g * torch.sigmoid(g) * up.to(compute)


def silu_mul_bwd_ref(gate: Tensor, up: Tensor, dout: Tensor,
                     compute: torch.dtype = torch.float64) -> tuple[Tensor, Tensor]:
    """(dgate, dup); 1 - s as sigmoid(-g), exact where s rounds to 1."""
    g, u, d = gate.to(compute), up.to(compute), dout.to(compute)
    s = torch.sigmoid(g)
    return d * u * s * (1 + g * torch.sigmoid(-g)), d * g * s
