"""Checks on every captured row before it is written, and on written rows when resuming.

A state passes when it is finite, not all zero, not constant, not the same at every position
(verify's `tensor_flags`: the failure modes that have shipped drafters trained on garbage), and
its mean per-token norm lies within NORM_BAND of the embeddings' mean per-token norm. The band is
wide on purpose: residual streams grow through depth (real checkpoints carry "massive
activations" of 10^3 x the embedding scale) while a dead or exploded capture is off by many more
orders of magnitude.
"""

from __future__ import annotations

from typing import Any

# mean token norm of a captured state / mean token norm of the embeddings
NORM_BAND = (1e-3, 1e5)


def mean_token_norm(t: Any) -> float:
    import torch

    return float(torch.linalg.vector_norm(t.float(), dim=-1).mean())


def state_problems(name: str, state: Any, embed_norm: float) -> list[str]:
    """What is wrong with one stored state [seq, H] of a row (empty when nothing is)."""
    from fastpath.proof.compare import tensor_flags

    flags = tensor_flags(state.unsqueeze(0))
    if flags:
        return [f"{name}: {', '.join(flags)}"]
    ratio = mean_token_norm(state) / max(embed_norm, 1e-30)
    low, high = NORM_BAND
    if not low <= ratio <= high:
        return [f"{name}: mean token norm {ratio:.3g} x the embeddings' (outside {low:g} .. {high:g})"]
    return []


def row_problems(states: dict[str, Any], embed_norm: float) -> list[str]:
    problems: list[str] = []
    for name, state in states.items():
        problems.extend(state_problems(name, state, embed_norm))
    return problems
