"""The token ids `fastpath verify` runs both paths on: random ids from the run's seed, or the
same tokens packed into one row of unequal sequences (the flattened batch transformers'
DataCollatorWithFlattening makes), with the arguments a packed forward takes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fastpath.shared.errors import UsageError


@dataclass
class Inputs:
    """Token ids for one verify run; packed runs keep the per-sequence split."""

    ids: Any  # [B, L]
    packed_ids: Any | None = None  # [1, total]
    segments: list[int] = field(default_factory=list)
    packed_kwargs: dict[str, Any] = field(default_factory=dict)  # packed_arguments(segments)


def packed_arguments(packed_ids: Any, segments: list[int]) -> dict[str, Any]:
    """The flattened-batch arguments DataCollatorWithFlattening would produce."""
    import torch

    device = packed_ids.device
    lengths = torch.tensor(segments, device=device)
    starts = torch.cumsum(lengths, 0) - lengths
    total = int(lengths.sum())
    position_ids = torch.arange(total, device=device) - torch.repeat_interleave(starts, lengths)
    seq_idx = torch.repeat_interleave(torch.arange(len(segments), device=device), lengths)
    cu = torch.cat([torch.zeros(1, dtype=torch.long, device=device), torch.cumsum(lengths, 0)])
    cu = cu.to(torch.int32)
    return {
        "position_ids": position_ids[None],
        "seq_idx": seq_idx.to(torch.int32)[None],
        "cu_seq_lens_q": cu,
        "cu_seq_lens_k": cu,
        "max_length_q": int(lengths.max()),
        "max_length_k": int(lengths.max()),
    }


def make_inputs(vocab: int, batch: int, seq_len: int, packed: bool, seed: int, device: Any,
                min_segment: int = 4) -> Inputs:
    """Random ids; with `packed`, the B*L tokens split into max(B, 2) sequences of unequal length."""
    import torch

    gen = torch.Generator().manual_seed(seed + 1)
    ids = torch.randint(0, vocab, (batch, seq_len), generator=gen).to(device)
    if not packed:
        return Inputs(ids)
    total = batch * seq_len
    count = max(batch, 2)
    if total < count * min_segment:
        raise UsageError(f"--packed needs at least {count * min_segment} tokens (batch x seq-len)")
    # Cut points drawn at random, but every piece keeps >= min_segment tokens (longer than the
    # conv window, so a leak across a boundary shows up inside the next sequence).
    free = total - count * min_segment
    weights = torch.rand(count, generator=gen) + 0.25
    extra = (weights / weights.sum() * free).floor().long()
    extra[-1] += free - int(extra.sum())
    segments = [int(min_segment + e) for e in extra]
    packed_ids = ids.reshape(1, total)
    return Inputs(ids, packed_ids, segments, packed_arguments(packed_ids, segments))
