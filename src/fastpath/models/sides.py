"""The two sides of `fastpath verify`'s comparison, run on one model and one set of inputs: the
reference path, then the fast path. Each side is one pass (models/forward.py), an optional greedy
decode (models/greedy.py), both under the MoE top-k pins (models/moe_pin.py), and the kernel calls
it made (counted at the kernels' own entry points, kernels/counters.py).

Which path is active is the caller's business (routing sits above this floor): it runs the
reference side on the model as it finds it, and hands the model back through `to_fast` between
the sides.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fastpath.models.forward import FusedLoss, PathRun, fp32_oracle_grads, run_path
from fastpath.models.greedy import greedy_decode
from fastpath.models.inputs import Inputs
from fastpath.models.moe_pin import SidePins

# Each side's name in the progress lines, and whether it is the reference (packed sequences run
# one at a time; its top-k choices recorded) or the fast path (packed in one call; replayed).
SIDES = (("reference path", True), ("fast path", False))


@dataclass
class SideRuns:
    """Both sides of verify's comparison as they ran (run_sides)."""

    ref: PathRun
    ref_calls: dict[str, int]  # the kernel calls the reference side made
    fast: PathRun
    fast_calls: dict[str, int]
    oracle_grads: dict[str, Any] | None  # an fp32 copy's gradients on the reference path
    pins: SidePins  # the reference's MoE top-k choices, replayed by the fast side


def run_sides(model: Any, inputs: Inputs, *, backward: bool, decode_tokens: int, oracle_grads: bool,
              say: Callable[[str], None], to_fast: Callable[[Any], None],
              fused_loss: FusedLoss | None = None) -> SideRuns:
    """verify's runs of one model, in the order memory allows: with `oracle_grads` (bf16/fp16
    backward) an fp32 copy's gradients first, while no gradients are held, so the copy is never
    alive together with both paths' gradients (models/sizing.py peak_bytes); the reference side
    on the active path; `to_fast(model)`, where the caller switches to the fast path; the fast
    side. Each side: forward (+ backward), an optional greedy decode (the run's `decode`), and
    the kernel calls it made."""
    from collections import Counter

    from fastpath.kernels.counters import CALLS

    pins = SidePins(pieces=len(inputs.segments))
    grads = None
    if oracle_grads:
        say("reference path in fp32: gradient oracle")
        grads = fp32_oracle_grads(model, inputs, fused_loss)
    runs: list[tuple[PathRun, dict[str, int]]] = []
    for name, reference in SIDES:
        if not reference:
            to_fast(model)
        say(f"{name}: forward" + (" + backward" if backward else ""))
        before = Counter(CALLS)
        with pins.around_pass(reference):
            run = run_path(model, inputs, packed_reference=reference, backward=backward, fused_loss=fused_loss)
        if decode_tokens:
            say(f"{name}: greedy decode")
            with pins.around_decode(reference):
                run.decode = greedy_decode(model, inputs.ids, decode_tokens)
        after = Counter(CALLS)
        calls = {k: after[k] - before.get(k, 0) for k in sorted(after) if after[k] - before.get(k, 0) > 0}
        runs.append((run, calls))
    (ref, ref_calls), (fast, fast_calls) = runs
    return SideRuns(ref, ref_calls, fast, fast_calls, grads, pins)
