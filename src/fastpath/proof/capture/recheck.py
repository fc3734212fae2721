"""Re-run a captured row on the reference path (transformers' torch fallbacks, same weights)
and compare with what the fast path captured, within `fastpath verify`'s tolerances.

The row runs alone (batch of one, no padding), so the check also covers the batching and
padding the capture used.
"""

from __future__ import annotations

from typing import Any

from fastpath.proof.capture.layers import DecoderParts, capture_hooks


def forward_states(parts: DecoderParts, ids: Any, capture_ids: list[int]) -> tuple[dict[int, Any], Any]:
    """Capture-before states and the post-norm output of one forward of `ids` [B, T]."""
    import torch

    with torch.no_grad(), capture_hooks(parts, capture_ids) as box:
        parts.base(input_ids=ids, use_cache=False)
    return dict(box.states), box.final_post


def recheck_rows(parts: DecoderParts, rows: list[tuple[Any, dict[str, Any]]], capture_ids: list[int],
                 tol: Any, on_fast_path: bool, enable_kwargs: dict[str, Any]) -> list[list[Any]]:
    """TensorDiffs (verify.compare) of every captured state of each row against the reference.

    rows: (ids [T], captured) with captured "layer {i}" -> [T, H] for each capture id, plus
    "final norm" -> [T, H]. fastpath is disabled once for all the rows and re-enabled afterwards
    when it was on: enable() rediscovers what to patch (a scan of the process's objects), so a
    toggle per row would cost more than the rows' forwards on small models."""
    import fastpath
    from fastpath.proof.compare import compare

    if not rows:
        return []
    if on_fast_path:
        fastpath.disable()
    try:
        references = [forward_states(parts, ids.unsqueeze(0), capture_ids) for ids, _ in rows]
    finally:
        if on_fast_path:
            fastpath.enable(**enable_kwargs)
    out = []
    for (_, captured), (states, post) in zip(rows, references, strict=True):
        reference = {f"layer {i}": states[i][0] for i in capture_ids}
        reference["final norm"] = post[0]
        out.append([compare(name, captured[name].unsqueeze(0).to(ref.device), ref.unsqueeze(0), tol)
                    for name, ref in reference.items()])
    return out
