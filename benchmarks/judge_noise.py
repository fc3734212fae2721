"""How often the peer suites' float64 judge flags a correct float32 evaluation of Mamba-1's last state,
and whether it still flags a wrong one.

The judge (tests/peer/float64_judge.py) passes a tensor when fastpath's distance from a float64
run is within RATIO x the same-dtype reference's distance, by max_abs and by rel_l2; a tensor
beyond that on its own draw is judged by its median ratio over RESAMPLES more draws. On the last
state of `test_selective_scan` with time-invariant B and C the single-draw bar failed 5 of 10,881
wide-grid cases on the GPU while every output and gradient passed. This script measures, over many
draws of that configuration (upstream's shapes: batch 2, dim 4, dstate 8; u, delta, z in
fp16/bf16; A, B, C, delta_bias float32; delta_softplus), the ratio distance / reference distance
for:
  fastpath         selective_scan_fn (the default chunked forward, or FASTPATH_SSCAN_FWD's);
  reordered        the reference's own loop with one product reordered ((delta' u) B for
                   (delta' B) u): a second correct float32 evaluation;
  reordered_fma    the same with each step's a h + x rounded once (a fused multiply-add);
  biased_exp       the reordered loop with every fourth decay one float32 step low (exp(.) times
                   1 - 2**-24): a wrong evaluation, a small systematic bias of the kind that once
                   made fastpath's last state 2-4x worse than the reference's (exp2 of a rounded
                   delta' A log2 e).
"flagged" is the single-draw bar; "flagged_resampled" the judge's rule: a draw beyond the bar is
judged by its median ratio over itself and the next RESAMPLES draws of the same configuration.
The correct candidates' rates are the rule's false alarms, biased_exp's its power.

    TRITON_INTERPRET=1 python benchmarks/judge_noise.py --out DIR      (CPU: kernels interpreted)
    python benchmarks/judge_noise.py --out DIR --device cuda            (GPU)
JSON to DIR/judge_noise.json; a table on stdout.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "peer"))  # the judge's own distance and bar

KINDS = ("fastpath", "reordered", "reordered_fma", "biased_exp")


def draw(seed: int, length: int, itype: Any, device: str) -> dict[str, Any]:
    """One input set as upstream's test draws it for time-invariant B and C (its RNG order)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    batch, dim, dstate = 2, 4, 8
    A = -0.5 * torch.rand(dim, dstate, generator=g)
    B = torch.randn(dim, dstate, generator=g)
    C = torch.randn(dim, dstate, generator=g)
    z = torch.randn(batch, dim, length, generator=g).to(itype)
    delta_bias = 0.5 * torch.rand(dim, generator=g)
    u = torch.randn(batch, dim, length, generator=g).to(itype)
    delta = (0.5 * torch.rand(batch, dim, length, generator=g)).to(itype)
    inputs = {"u": u, "delta": delta, "A": A, "B": B, "C": C, "D": None, "z": z, "delta_bias": delta_bias}
    return {k: v.to(device) if v is not None else None for k, v in inputs.items()}


def reordered_state(inputs: dict[str, Any], fma: bool, biased: bool = False) -> Any:
    """The reference's step loop in float32 with x = (delta' u) B; `fma`: a h + x rounded once;
    `biased`: every fourth decay one float32 step below 1 times exp (a wrong evaluation)."""
    import torch
    import torch.nn.functional as F

    u = inputs["u"].float()
    dt = F.softplus(inputs["delta"].float() + inputs["delta_bias"][:, None])
    A, B = inputs["A"], inputs["B"]
    state = torch.zeros(u.shape[0], u.shape[1], A.shape[1], device=u.device)
    for t in range(u.shape[-1]):
        d = dt[:, :, t, None]
        a = torch.exp(d * A)
        if biased and t % 4 == 0:
            a = a * (1 - 2**-24)
        x = (d * u[:, :, t, None]) * B
        state = (a.double() * state.double() + x.double()).float() if fma else a * state + x
    return state


def last_states(inputs: dict[str, Any]) -> dict[str, Any]:
    import torch

    from fastpath.kernels.selective_scan.interface import selective_scan_fn
    from fastpath.kernels.selective_scan.naive import selective_scan_ref

    kw = {"delta_softplus": True, "return_last_state": True}
    wide = {k: v.to(torch.float64) if v is not None else None for k, v in inputs.items()}
    return {
        "float64": selective_scan_ref(**wide, **kw)[1],
        "reference": selective_scan_ref(**inputs, **kw)[1],
        "fastpath": selective_scan_fn(**inputs, **kw)[1],
        "reordered": reordered_state(inputs, fma=False),
        "reordered_fma": reordered_state(inputs, fma=True),
        "biased_exp": reordered_state(inputs, fma=False, biased=True),
    }


def _percentiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)

    def at(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 3)

    return {"p50": at(0.5), "p90": at(0.9), "p99": at(0.99), "max": round(ordered[-1], 3),
            "mean": round(sum(values) / len(values), 3)}


def resampled_flags(pairs: list[tuple[float, float]], resamples: int) -> int:
    """How many draws the judge's rule flags: a draw beyond the bar is judged by the median of each
    metric over itself and the next `resamples` draws (cyclically), float64_judge.passes_by_median."""
    from float64_judge import RATIO, passes_by_median

    return sum(1 for i, pair in enumerate(pairs) if not max(pair) <= RATIO
               and not passes_by_median([pairs[(i + k) % len(pairs)] for k in range(resamples + 1)]))


def study(length: int, itype: Any, draws: int, device: str) -> dict[str, Any]:
    from float64_judge import RATIO, RESAMPLES, _within, bar_ratios, distance

    ratios: dict[str, dict[str, list[float]]] = {k: {"max_abs": [], "rel_l2": []} for k in KINDS}
    pairs: dict[str, list[tuple[float, float]]] = {k: [] for k in KINDS}
    flagged = dict.fromkeys(KINDS, 0)
    for seed in range(draws):
        states = last_states(draw(seed, length, itype, device))
        truth = states["float64"]
        ref = distance(states["reference"], truth)
        floor = distance(truth.float(), truth)
        for kind in KINDS:
            got = distance(states[kind], truth)
            ratios[kind]["max_abs"].append(got.max_abs / ref.max_abs)
            ratios[kind]["rel_l2"].append(got.rel_l2 / ref.rel_l2)
            pairs[kind].append(bar_ratios(got, ref, floor))
            flagged[kind] += not _within(got, ref, floor)
    resampled = {k: resampled_flags(pairs[k], min(RESAMPLES, draws - 1)) for k in KINDS}
    return {"length": length, "itype": str(itype).removeprefix("torch."), "draws": draws, "ratio_bar": RATIO,
            "resamples": min(RESAMPLES, draws - 1),
            "flagged": flagged, "flagged_rate": {k: round(v / draws, 3) for k, v in flagged.items()},
            "flagged_resampled": resampled,
            "ratios": {k: {m: _percentiles(v) for m, v in r.items()} for k, r in ratios.items()}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="directory for judge_noise.json")
    parser.add_argument("--draws", type=int, default=48, help="draws per configuration (48)")
    parser.add_argument("--lengths", default="128,512", help="sequence lengths (128,512)")
    parser.add_argument("--device", default="cpu", help="cpu (TRITON_INTERPRET=1) or cuda")
    args = parser.parse_args()
    try:
        lengths = [int(v) for v in args.lengths.split(",") if v]
    except ValueError:
        print(f"judge_noise: --lengths takes integers, got {args.lengths!r}", file=sys.stderr)
        return 2
    if args.draws < 1 or not lengths or min(lengths) < 1:
        print("judge_noise: need --draws >= 1 and positive --lengths", file=sys.stderr)
        return 2
    import torch

    from fastpath.kernels.dispatch import use_triton

    if not use_triton(torch.empty(0, device=args.device)):
        print("judge_noise: fastpath's kernels do not run here (a CUDA device, or TRITON_INTERPRET=1 on the CPU)",
              file=sys.stderr)
        return 2
    began = time.perf_counter()
    rows = [study(n, itype, args.draws, args.device) for n in lengths for itype in (torch.float16, torch.bfloat16)]
    report = {"benchmark": "judge_noise", "device": args.device, "torch": torch.__version__,
              "python": platform.python_version(), "rows": rows, "wall_s": round(time.perf_counter() - began, 1)}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "judge_noise.json").write_text(json.dumps(report, indent=1) + "\n")
    print(f"{'L':>5} {'dtype':>9} {'draws':>5}  flagged by one draw's bar / by the judge's rule "
          "(max_abs ratio p50 / max)")
    for row in rows:
        cells = [f"{k} {row['flagged'][k]} / {row['flagged_resampled'][k]} "
                 f"({row['ratios'][k]['max_abs']['p50']:.2f} / {row['ratios'][k]['max_abs']['max']:.2f})"
                 for k in KINDS]
        print(f"{row['length']:>5} {row['itype']:>9} {row['draws']:>5}  " + "; ".join(cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
