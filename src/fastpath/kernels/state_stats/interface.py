"""state_stats(state) -> float32 [5] on the state's device: [all finite, any non-zero, max == min,
same at every position, mean per-token L2 norm] (1.0 = true), with no host sync, so a caller can
stack many states' facts and read them back in one transfer (capture/checks.py does).

state: [T, H] in float32 / float16 / bfloat16 with any row stride (a column stride other than 1 is
copied first). The Triton kernel (fwd.py) reads it once; where it cannot run (CPU without
TRITON_INTERPRET=1, other dtypes) the float32 reference in naive.py computes the same facts.
Not differentiable: it judges captured activations, it is no layer.
"""

from __future__ import annotations

import torch
from torch import Tensor

from fastpath.kernels.counters import CALLS
from fastpath.kernels.dispatch import TRITON_DTYPES, use_triton
from fastpath.kernels.state_stats import naive


def state_stats(state: Tensor) -> Tensor:
    if state.dim() != 2:
        raise ValueError(f"state_stats: state must be [T, H], got shape {tuple(state.shape)}")
    x = state.detach()
    if x.numel() and use_triton(x) and x.dtype in TRITON_DTYPES:
        from fastpath.kernels.state_stats.fwd import state_partials

        CALLS["state_stats:triton"] += 1
        p = state_partials(x if x.stride(-1) == 1 else x.contiguous()).double()
        sums = p.sum(0)  # non-finite, non-zero and differing counts: only == 0 matters (exact)
        facts = torch.stack([sums[0] == 0, sums[1] > 0, p[:, 2].max() == p[:, 3].min(),
                             (sums[4] == 0) & (x.shape[0] > 1)]).float()
        return torch.cat([facts, (sums[5] / x.shape[0]).float().reshape(1)])
    CALLS["state_stats:reference"] += 1
    return naive.state_stats_ref(x, compute=torch.float32)
