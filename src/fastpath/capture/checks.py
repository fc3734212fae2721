"""Checks on every captured row before it is written, and on written rows when resuming.

A state passes when it is finite, not all zero, not constant, not the same at every position
(verify's `tensor_flags`: the failure modes that have shipped drafters trained on garbage), and
its mean per-token norm lies within NORM_BAND of the embeddings' mean per-token norm. The band is
wide on purpose: residual streams grow through depth (real checkpoints carry "massive
activations" of 10^3 x the embedding scale) while a dead or exploded capture is off by many more
orders of magnitude.

Why batched: the checks run where the states are (the GPU during a capture) and every number
of a batch comes back in one transfer, instead of a host sync per fact per state per row; each
state is read once for all its facts (kernels/state_stats), not once per fact, and the batch's
states are reduced together in a fixed number of launches (host time between forwards).
The embeddings' scale comes from a per-vocabulary-entry norm table computed once before the
run (`token_norms`), so no embedding lookup is needed per row, and none of a sharded
(FSDP) embedding, whose weight a rank only holds a slice of outside a forward.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

# mean token norm of a captured state / mean token norm of the embeddings
NORM_BAND = (1e-3, 1e5)


def token_norms(embedding: Any, chunk: int = 8192) -> Any:
    """Norm of every row of an embedding weight [V, H] as float32 [V], chunked so the float
    copy of a large vocabulary never exists at once."""
    import torch

    weight = embedding.weight.detach()
    with torch.no_grad():
        return torch.cat([torch.linalg.vector_norm(weight[i:i + chunk].float(), dim=-1)
                          for i in range(0, weight.shape[0], chunk)])


def _problem(name: str, stats: Sequence[float]) -> str | None:
    from fastpath.models.compare import flags_from_stats

    flags = flags_from_stats(stats[:4])
    if flags:
        return f"{name}: {', '.join(flags)}"
    ratio = stats[4] / max(stats[5], 1e-30)
    low, high = NORM_BAND
    if not low <= ratio <= high:
        return f"{name}: mean token norm {ratio:.3g} x the embeddings' (outside {low:g} .. {high:g})"
    return None


def batch_stats(rows: Sequence[Mapping[str, Any]], embed_norms: Any) -> tuple[list[list[str]], Any]:
    """(state names per row, their numbers [states, 6] where the states are: state_stats' five
    facts and the row's mean embedding token norm): queued on the device, nothing read yet, so the
    caller decides when to wait for them (`batch_problems` at once; the capture loop after the
    next batch's forward is queued). kernels/state_stats reads every state once, all the batch's
    states in one go (states_stats). embed_norms: per row, a float or 0-d tensor each, or one
    tensor [rows]."""
    import torch

    from fastpath.kernels.state_stats.interface import states_stats

    names = [list(states) for states in rows]
    states = [state.reshape(-1, state.shape[-1]) for row in rows for state in row.values()]
    if not states:
        return names, None
    device = states[0].device
    if isinstance(embed_norms, torch.Tensor):  # one per row already where the states are
        embed = embed_norms.to(device=device, dtype=torch.float32).reshape(-1)
    else:
        embed = torch.stack([torch.as_tensor(e, dtype=torch.float32, device=device).reshape(()) for e in embed_norms])
    per_row = {len(row) for row in rows}
    if len(per_row) == 1:  # a capture's rows hold the same states: one launch spreads the norms
        embed = embed.repeat_interleave(per_row.pop())
    else:
        embed = torch.stack([embed[r] for r, row in enumerate(rows) for _ in row])
    return names, torch.cat([states_stats(states), embed.unsqueeze(1)], dim=1)


def problems_from(names: Sequence[Sequence[str]], values: Sequence[Sequence[float]]) -> list[list[str]]:
    """What is wrong with each row, from batch_stats' names and its numbers read on the host."""
    out: list[list[str]] = []
    k = 0
    for row_names in names:
        problems = []
        for name in row_names:
            problem = _problem(name, values[k])
            k += 1
            if problem:
                problems.append(problem)
        out.append(problems)
    return out


def batch_problems(rows: Sequence[Mapping[str, Any]], embed_norms: Sequence[Any]) -> list[list[str]]:
    """What is wrong with each row's states (name -> [T, H]); embed_norms[r] is row r's mean
    embedding token norm (a float or a 0-d tensor). One host transfer for the whole batch."""
    names, stats = batch_stats(rows, embed_norms)
    return problems_from(names, [] if stats is None else stats.tolist())


def row_problems(states: Mapping[str, Any], embed_norm: Any) -> list[str]:
    return batch_problems([states], [embed_norm])[0]
