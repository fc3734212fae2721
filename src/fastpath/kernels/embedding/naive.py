"""The spec of the token embedding's weight gradient, in a chosen float precision.

torch.nn.functional.embedding(ids, weight, padding_idx, scale_grad_by_freq=...) gathers rows of
weight; its weight gradient sums, for each vocabulary row v, the output gradients of the tokens
whose id is v; the row `padding_idx` gets no gradient; with scale_grad_by_freq each row's sum is
divided by how often v occurs in ids. Tests call this in float64 (the oracle); the op calls it in
float32 where its Triton kernel cannot run (the fallback).
"""

from __future__ import annotations

import torch
from torch import Tensor


def embedding_bwd_ref(ids: Tensor, dout: Tensor, num_rows: int, padding_idx: int | None = None,
                      scale_grad_by_freq: bool = False, compute: torch.dtype = torch.float64) -> Tensor:
    """[num_rows, H] in `compute`; dout is ids.shape + (H,)."""
    flat = ids.reshape(-1)
    rows = dout.reshape(flat.numel(), dout.shape[-1]).to(compute)
    dw = torch.zeros(num_rows, rows.shape[1], dtype=compute, device=dout.device)
    dw.index_add_(0, flat, rows)
    if scale_grad_by_freq:
        counts = torch.bincount(flat, minlength=num_rows).to(compute)
        dw /= counts.clamp(min=1)[:, None]
    if padding_idx is not None:
        dw[padding_idx] = 0
    return dw
