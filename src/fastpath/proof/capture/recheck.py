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


def recheck_row(parts: DecoderParts, ids: Any, captured: dict[str, Any], capture_ids: list[int],
                tol: Any, on_fast_path: bool, enable_kwargs: dict[str, Any]) -> list[Any]:
    """TensorDiffs (verify.compare) of every captured state of one row against the reference.

    captured: "layer {i}" -> [T, H] for each capture id, plus "final norm" -> [T, H].
    fastpath is disabled for the reference run and re-enabled afterwards when it was on."""
    import fastpath
    from fastpath.proof.compare import compare

    if on_fast_path:
        fastpath.disable()
    try:
        states, post = forward_states(parts, ids.unsqueeze(0), capture_ids)
    finally:
        if on_fast_path:
            fastpath.enable(**enable_kwargs)
    reference = {f"layer {i}": states[i][0] for i in capture_ids}
    reference["final norm"] = post[0]
    return [compare(name, captured[name].unsqueeze(0).to(ref.device), ref.unsqueeze(0), tol)
            for name, ref in reference.items()]
