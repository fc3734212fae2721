"""The spec of the sigmoid output gate, forward and backward, in a chosen float precision.

Qwen3.5 / Qwen3-Next gated attention (transformers models/qwen3_5/modeling_qwen3_5.py,
`attn_output * torch.sigmoid(gate)` before o_proj): out = x * s, s = sigmoid(gate);
dx = dout * s, dgate = dout * x * s * (1 - s). Tests call these in float64 (the oracle); the op
calls them in float32 where its Triton kernel cannot run (the fallback).
"""

from __future__ import annotations

import torch
from torch import Tensor


def sigmoid_gate_ref(x: Tensor, gate: Tensor, compute: torch.dtype = torch.float64) -> Tensor:
    return x.to(compute) * torch.sigmoid(gate.to(compute))


def sigmoid_gate_bwd_ref(x: Tensor, gate: Tensor, dout: Tensor,
                         compute: torch.dtype = torch.float64) -> tuple[Tensor, Tensor]:
    s = torch.sigmoid(gate.to(compute))
    d = dout.to(compute)
    return d * s, d * x.to(compute) * s * torch.sigmoid(-gate.to(compute))
