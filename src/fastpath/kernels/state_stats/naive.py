"""The spec of state_stats: the facts capture checks on every state [T, H] before it is written.

[all finite, any non-zero, max == min, every position equal to position 0 (T > 1 only), mean over
positions of the per-token L2 norm] as float64 (1.0 = true for the four facts). The first four are
models/compare.tensor_stats' facts; the norm is what capture/checks.NORM_BAND judges against the
embeddings. Tests call this in float64 (the oracle); the op calls it in float32 where its Triton
kernel cannot run.
"""

from __future__ import annotations

import torch
from torch import Tensor


def state_stats_ref(state: Tensor, compute: torch.dtype = torch.float64) -> Tensor:
    x = state.detach().to(compute)
    if x.numel() == 0:
        return torch.tensor([1.0, 0.0, 0.0, 0.0, 0.0], dtype=compute, device=x.device)
    same = bool((x == x[:1]).all()) if x.shape[0] > 1 else False
    facts = [bool(torch.isfinite(x).all()), bool(x.any()), bool(x.max() == x.min()), same]
    norm = torch.linalg.vector_norm(x, dim=-1).mean()
    return torch.cat([torch.tensor(facts, dtype=compute, device=x.device), norm.reshape(1)])
