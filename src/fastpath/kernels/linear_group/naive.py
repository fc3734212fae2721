"""The spec of several Linear layers of one input, forward and backward, in a chosen precision.

out_i = x @ W_i^T + b_i; dx = sum_i dout_i @ W_i, dW_i = dout_i^T @ x, db_i = sum over rows of
dout_i (x flattened to rows). Tests call these in float64 (the oracle).
"""

from __future__ import annotations

import torch
from torch import Tensor


def linears_ref(x: Tensor, weights: list[Tensor], biases: list[Tensor | None],
                compute: torch.dtype = torch.float64) -> list[Tensor]:
    xc = x.to(compute)
    return [torch.nn.functional.linear(xc, w.to(compute), None if b is None else b.to(compute))
            for w, b in zip(weights, biases, strict=True)]


def linears_bwd_ref(x: Tensor, weights: list[Tensor], grads: list[Tensor | None], has_bias: list[bool],
                    compute: torch.dtype = torch.float64
                    ) -> tuple[Tensor, list[Tensor | None], list[Tensor | None]]:
    """(dx, [dW_i], [db_i]); a None gradient (an output nobody used) contributes nothing."""
    rows = x.reshape(-1, x.shape[-1]).to(compute)
    dx = torch.zeros_like(rows)
    dws: list[Tensor | None] = []
    dbs: list[Tensor | None] = []
    for w, g, bias in zip(weights, grads, has_bias, strict=True):
        if g is None:
            dws.append(None)
            dbs.append(None)
            continue
        g2 = g.reshape(-1, g.shape[-1]).to(compute)
        dx = dx + g2 @ w.to(compute)
        dws.append(g2.t() @ rows)
        dbs.append(g2.sum(0) if bias else None)
    return dx.reshape(x.shape), dws, dbs
