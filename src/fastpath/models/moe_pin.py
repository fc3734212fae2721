"""Pin a mixture-of-experts model's top-k choices to the reference path's, so verify compares
one function on both paths.

Why: an MoE router picks its experts with a discrete top-k. Two correct paths whose hidden states
differ by bf16 rounding (~1e-2 relative after a few layers) pick a different expert set for the
few tokens whose k-th and (k+1)-th scores are that close, and such a token's MoE output then
differs by O(1) of itself. Measured on a tiny Kimi-Linear (CPU, bf16, 256 tokens, 32 experts top
8): 6 tokens flipped; their layer-output error averaged 3.2e-2 (worst 3.9e-2) against 4.0e-3 for
every other token (worst 6.4e-3); with the reference's choices pinned the worst token was 6.4e-3,
the same as a dense copy of the model (6.6e-3). On the H200 (Kimi-Linear 48B shapes, 2 layers)
that flip noise alone failed verify: worst token 0.188, and a decode step 0.13 off in logits.
An fp32 oracle does not settle it: fp32 makes its own choices at the same near ties.

How: every `torch.topk` (function or method) goes through a TorchFunctionMode. On the reference
path it records the indices; on the fast path each call still runs (so the fast path's own choice
is known and counted), then returns the reference's indices with the values gathered at them
(`input.gather`, whose gradient is topk's). A call whose shape does not match the recording is
left alone and counted. Everything the router computes before top-k (its logits, scores, the
weights it gathers) stays the fast path's own, and so do the experts: a wrong kernel still shows
everywhere, in every token, as before. Packed runs: the reference runs each sequence alone, so
its calls are regrouped (concatenated along the token dimension) per layer.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any


@dataclass
class PinReport:
    """What pinning did on one path: calls pinned, router rows whose own top-k set differed."""

    calls: int = 0
    rows: int = 0
    flipped_rows: int = 0
    unpinned: list[str] = field(default_factory=list)  # why a call kept its own choice

    def line(self) -> str | None:
        if not self.calls and not self.unpinned:
            return None
        text = (f"top-k (MoE routing) pinned to the reference's choices at {self.calls} calls: "
                f"{self.flipped_rows} of {self.rows} rows would have chosen another set on the "
                "fast path (bf16 rounding at near ties; everything else is the fast path's own)")
        if self.unpinned:
            text += f"; not pinned: {'; '.join(self.unpinned[:3])}"
        return text


def _is_topk(func: Any) -> bool:
    import torch

    return func is torch.topk or func is torch.Tensor.topk


def _topk_dim(args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
    dim = kwargs.get("dim", args[2] if len(args) > 2 else -1)
    return int(dim)


class TopkPin:
    """Records the reference's top-k indices (`recording()`), replays them (`replaying()`)."""

    def __init__(self) -> None:
        self.calls: list[Any] = []

    @contextlib.contextmanager
    def recording(self) -> Iterator[None]:
        from torch.overrides import TorchFunctionMode

        calls = self.calls

        class _Record(TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[override]
                out = func(*args, **(kwargs or {}))
                if _is_topk(func):
                    calls.append(out[1].detach().clone())
                return out

        with _Record():
            yield

    def regrouped(self, pieces: int) -> TopkPin:
        """The calls of `pieces` runs made one after the other (one per packed sequence, each
        making the same calls in the same order) as the calls of one run over all of them."""
        pin = TopkPin()
        if pieces <= 1 or len(self.calls) % pieces:
            pin.calls = list(self.calls)
            return pin
        per = len(self.calls) // pieces
        import torch

        for j in range(per):
            parts = [self.calls[p * per + j] for p in range(pieces)]
            if all(p.shape[1:] == parts[0].shape[1:] for p in parts):
                pin.calls.append(torch.cat(parts, dim=0))
            else:
                pin.calls.append(parts[0])  # cannot join: the shape check below refuses it
        return pin

    @contextlib.contextmanager
    def replaying(self, report: PinReport) -> Iterator[None]:
        import torch
        from torch.overrides import TorchFunctionMode

        recorded = iter(self.calls)

        class _Replay(TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[override]
                kwargs = kwargs or {}
                out = func(*args, **kwargs)
                if not _is_topk(func):
                    return out
                own = out[1]
                ref = next(recorded, None)
                if ref is None or ref.shape != own.shape or ref.device != own.device:
                    why = "no recorded call" if ref is None else f"shape {tuple(own.shape)} vs {tuple(ref.shape)}"
                    report.unpinned.append(why)
                    return out
                dim = _topk_dim(args, kwargs)
                values = args[0].gather(dim, ref)
                same = (own.sort(dim=dim).values == ref.sort(dim=dim).values).all(dim=dim)
                report.calls += 1
                report.rows += same.numel()
                report.flipped_rows += int((~same).sum())
                return torch.return_types.topk((values, ref))

        with _Replay():
            yield


@dataclass
class SidePins:
    """A comparison's pins: the reference side records its top-k choices (forward and decode
    apart), the fast side replays them and reports what pinning did. `pieces`: the packed
    sequences the reference runs one at a time (1 unpacked); the decode runs unpacked on both."""

    pieces: int = 1
    forward: TopkPin = field(default_factory=TopkPin)
    decode: TopkPin = field(default_factory=TopkPin)
    report: PinReport = field(default_factory=PinReport)

    def around_pass(self, recording: bool) -> contextlib.AbstractContextManager[None]:
        """Record the forward's choices (the reference side) or replay them regrouped into one run."""
        if recording:
            return self.forward.recording()
        return self.forward.regrouped(self.pieces).replaying(self.report)

    def around_decode(self, recording: bool) -> contextlib.AbstractContextManager[None]:
        """Record the greedy decode's choices (the reference side) or replay them."""
        return self.decode.recording() if recording else self.decode.replaying(self.report)
