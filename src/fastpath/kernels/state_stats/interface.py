"""state_stats(state) -> float32 [5] on the state's device: [all finite, any non-zero, max == min,
same at every position, mean per-token L2 norm] (1.0 = true), with no host sync, so a caller can
stack many states' facts and read them back in one transfer. states_stats(states) -> float32
[n, 5]: the same for many states at once (capture/checks.py: a batch's), one kernel launch per
state into one buffer and a fixed number of other launches for all of them, where state_stats
takes about a dozen small launches per state: host time between a capture's forwards.

state: [T, H] in float32 / float16 / bfloat16 with any row stride (a column stride other than 1 is
copied first). The Triton kernel (fwd.py) reads it once; where it cannot run (CPU without
TRITON_INTERPRET=1, other dtypes) the float32 reference in naive.py computes the same facts.
Not differentiable: it judges captured activations, it is no layer.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from fastpath.kernels.counters import CALLS
from fastpath.kernels.dispatch import TRITON_DTYPES, use_triton
from fastpath.kernels.state_stats import naive


def _check(state: Tensor) -> Tensor:
    if state.dim() != 2:
        raise ValueError(f"state_stats: state must be [T, H], got shape {tuple(state.shape)}")
    return state.detach()


def _kernel_takes(x: Tensor) -> bool:
    return bool(x.numel()) and use_triton(x) and x.dtype in TRITON_DTYPES


def _unit_columns(x: Tensor) -> Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


def _facts(sums: Tensor, high: Tensor, low: Tensor, n_tok: Tensor | int) -> Tensor:
    """[..., 5] from reduced partials: sums [..., FIELDS] in float64 (the counts only matter where
    they are 0: exact), the max / min over every element [...], positions per state."""
    flags = torch.stack([sums[..., 0] == 0, sums[..., 1] > 0, high == low, (sums[..., 4] == 0) & (n_tok > 1)], -1)
    return torch.cat([flags.float(), (sums[..., 5] / n_tok).float().unsqueeze(-1)], -1)


def state_stats(state: Tensor) -> Tensor:
    x = _check(state)
    if _kernel_takes(x):
        from fastpath.kernels.state_stats.fwd import state_partials

        CALLS["state_stats:triton"] += 1
        p = state_partials(_unit_columns(x)).double()
        return _facts(p.sum(0), p[:, 2].max(), p[:, 3].min(), x.shape[0])
    CALLS["state_stats:reference"] += 1
    return naive.state_stats_ref(x, compute=torch.float32)


def states_stats(states: Sequence[Tensor]) -> Tensor:
    """state_stats of each state, stacked [n, 5] on their device (n >= 1, one device)."""
    xs = [_check(s) for s in states]
    if not xs:
        raise ValueError("states_stats: no states")
    device = xs[0].device
    if any(x.device != device for x in xs):
        raise ValueError(f"states_stats: states on several devices: {sorted({str(x.device) for x in xs})}")
    if not all(_kernel_takes(x) for x in xs):
        return torch.stack([state_stats(x) for x in xs])
    from fastpath.kernels.state_stats.fwd import FIELDS, programs_for, state_partials

    programs = [programs_for(x.shape[0]) for x in xs]
    # one buffer, padded per state with what changes no reduction: 0 for the sums, -inf / +inf
    # for the max / min
    buf = torch.zeros((len(xs), max(programs), FIELDS), device=device, dtype=torch.float32)
    buf[:, :, 2] = float("-inf")
    buf[:, :, 3] = float("inf")
    for i, x in enumerate(xs):
        state_partials(_unit_columns(x), out=buf[i, :programs[i]])
    CALLS["state_stats:triton"] += len(xs)
    n_tok = torch.tensor([x.shape[0] for x in xs], dtype=torch.float64)
    n_tok = n_tok.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else n_tok.to(device)
    p = buf.double()
    return _facts(p.sum(1), p[:, :, 2].amax(1), p[:, :, 3].amin(1), n_tok)
