"""Rows -> batches of similar length, each under a token budget (padded tokens count).

Why sorted and right-padded rather than packed into one sequence: a packed row is only exact
where every op keeps sequences apart (cu_seqlens), and transformers' torch gated-delta-rule
fallback ignores them, so the reference re-check would compare two different functions.
Right padding is exact for causal layers (a valid position never sees the padding after it).
Batches depend only on the data and the budget, never on the number of processes, so a
row's numbers are the same for any `--nproc-per-node` and after a resume.
"""

from __future__ import annotations

from collections.abc import Sequence


def make_batches(lengths: Sequence[int], batch_tokens: int) -> list[list[int]]:
    """Row indices grouped into batches: longest first, each batch's rows x longest <= budget
    (a row longer than the budget gets a batch of its own). Rows inside a batch keep index order."""
    if batch_tokens < 1:
        raise ValueError("batch_tokens must be positive")
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    batches: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for i in order:
        width = max(longest, lengths[i])
        if current and width * (len(current) + 1) > batch_tokens:
            batches.append(sorted(current))
            current, width = [], lengths[i]
        current.append(i)
        longest = width
    if current:
        batches.append(sorted(current))
    return batches


def batches_for_rank(batches: list[list[int]], rank: int, world: int) -> list[tuple[int, list[int]]]:
    """(batch number, rows) for one rank: batch b goes to rank b % world."""
    return [(b, rows) for b, rows in enumerate(batches) if b % world == rank]
