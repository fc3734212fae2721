"""Re-run a captured row on the reference path (transformers' torch fallbacks, same weights)
and compare with what the fast path captured, within `fastpath verify`'s tolerances.

The row runs alone (batch of one, no padding), so the check also covers the batching and
padding the capture used.
"""

from __future__ import annotations

import contextlib
from typing import Any

from fastpath.capture.layers import DecoderParts, capture_hooks


def forward_states(parts: DecoderParts, ids: Any, capture_ids: list[int]) -> tuple[dict[int, Any], Any]:
    """Capture-before states and the post-norm output of one forward of `ids` [B, T]."""
    import torch

    with torch.no_grad(), capture_hooks(parts, capture_ids) as box:
        parts.base(input_ids=ids, use_cache=False)
    return dict(box.states), box.final_post


def recheck_rows(parts: DecoderParts, rows: list[tuple[Any, dict[str, Any]]], capture_ids: list[int],
                 tol: Any, on_fast_path: bool) -> list[list[Any]]:
    """TensorDiffs (verify.compare) of every captured state of each row against the reference.

    rows: (ids [T], captured) with captured "layer {i}" -> [T, H] for each capture id, plus
    "final norm" -> [T, H]. The rows run with fastpath suspended (routing.engine.suspended:
    every patch undone, then re-applied as it was). A disable() + enable() per re-check would
    repeat enable()'s discovery, a scan of every live object: 0.3 s on a small CPU process."""
    from fastpath.models.compare import compare
    from fastpath.routing.engine import suspended

    if not rows:
        return []
    with suspended() if on_fast_path else contextlib.nullcontext():
        references = [forward_states(parts, ids.unsqueeze(0), capture_ids) for ids, _ in rows]
    out = []
    for (_, captured), (states, post) in zip(rows, references, strict=True):
        reference = {f"layer {i}": states[i][0] for i in capture_ids}
        reference["final norm"] = post[0]
        out.append([compare(name, captured[name].unsqueeze(0).to(ref.device), ref.unsqueeze(0), tol)
                    for name, ref in reference.items()])
    return out
