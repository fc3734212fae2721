"""The spec of the GatedDeltaNet gates, forward and backward, in a chosen float precision.

Forward (Qwen3.5 / Qwen3-Next GatedDeltaNet, transformers models/qwen3_5/modeling_qwen3_5.py):
    g    = -exp(A_log) * softplus(a + dt_bias)        (float32 in transformers)
    beta = sigmoid(b)                                 (b's dtype in transformers)
softplus as torch defines it (threshold 20: x itself above it). Backward, with x = a + dt_bias:
    da = dg * -exp(A_log) * softplus'(x)              softplus'(x) = sigmoid(x), 1 above 20
    ddt_bias = sum over rows of da;  dA_log = sum over rows of dg * g
    db = dbeta * beta * (1 - beta)
Tests call these in float64 (the oracle); the op calls them in float32 where its Triton kernel
cannot run (the fallback).
"""

from __future__ import annotations

import torch
from torch import Tensor

SOFTPLUS_THRESHOLD = 20.0


def _softplus(x: Tensor) -> Tensor:
    return torch.where(x > SOFTPLUS_THRESHOLD, x, torch.log1p(torch.exp(torch.clamp(x, max=SOFTPLUS_THRESHOLD))))


def gdn_gates_ref(a: Tensor, b: Tensor, a_log: Tensor, dt_bias: Tensor,
                  compute: torch.dtype = torch.float64) -> tuple[Tensor, Tensor]:
    """(g, beta) computed in `compute` precision (returned in it)."""
    x = a.to(compute) + dt_bias.to(compute)
    g = -torch.exp(a_log.to(compute)) * _softplus(x)
    return g, torch.sigmoid(b.to(compute))


def gdn_gates_bwd_ref(a: Tensor, b: Tensor, a_log: Tensor, dt_bias: Tensor, dg: Tensor | None,
                      dbeta: Tensor | None, compute: torch.dtype = torch.float64
                      ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(da, db, dA_log, ddt_bias) in `compute` precision; a missing dg / dbeta counts as zeros."""
    x = a.to(compute) + dt_bias.to(compute)
    decay = torch.exp(a_log.to(compute))
    dg = torch.zeros_like(x) if dg is None else dg.to(compute)
    slope = torch.where(x > SOFTPLUS_THRESHOLD, torch.ones_like(x), torch.sigmoid(x))
    da = dg * -decay * slope
    rows = tuple(range(a.dim() - 1))
    d_a_log = (dg * (-decay * _softplus(x))).sum(rows) if rows else dg * -decay * _softplus(x)
    d_dt_bias = da.sum(rows) if rows else da
    beta = torch.sigmoid(b.to(compute))
    db = torch.zeros_like(beta) if dbeta is None else dbeta.to(compute) * beta * torch.sigmoid(-b.to(compute))
    return da, db, d_a_log, d_dt_bias
