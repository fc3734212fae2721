"""One profiled call per Mamba-1 scan kernel, for Nsight Compute (`ncu --profile-from-start off`).

Why. The scan's forward sits far below both of its bounds on Hopper (BENCHMARKS.md: the SFU
bound at D = 8192, N = 16 is about 1.3 ms at (8, 4096), the tile forward took 4.6 ms; at
(1, 4096) 0.33 ms against 2.7 ms). Timing variants cannot say which stall costs the difference;
the hardware's warp-state counters can. This script warms every kernel (compiles outside the
profiled range), then runs each once between cudaProfilerStart/Stop, so ncu sees exactly one
launch per (kernel, case, layout) and nothing of the compiles.

    ncu --clock-control none --profile-from-start off --set full -o OUT/sscan \
        python3 benchmarks/sscan_ncu.py --variants tile,seq --cases 1x4096,8x4096 --bwd

Inputs are benchmarks/selective_scan.py's (transformers' layouts, Falcon-Mamba-7B's D and N,
bf16). --bwd adds one forward+backward of selective_scan_fn (the default backward) per case.
Runs without ncu too (then it only checks that every kernel runs).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import selective_scan as bench

from fastpath.kernels.selective_scan.interface import selective_scan_fn


def parse_variant(spec: str) -> tuple[str, str, tuple]:
    """VARIANT or VARIANT@A/B/C -> (spec, variant, config): the config given, else its default."""
    name, _, given = spec.partition("@")
    if name not in bench.FWD_KERNELS:
        raise ValueError(f"unknown variant {name!r} (expected one of {', '.join(bench.FWD_KERNELS)})")
    try:
        cfg = bench.parse_fwd_config(name, given) if given else None
    except ValueError as exc:
        raise ValueError(f"{spec!r}: {exc}") from None
    return spec, name, cfg or tuple(bench.fwd_variant_configs(name, False)[0])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variants", default="tile,seq",
                    help=f"some of {','.join(bench.FWD_KERNELS)}, each optionally @A/B/C (a config)")
    ap.add_argument("--cases", default="1x4096,8x4096", help="BxL list")
    ap.add_argument("--layout", default="tf", choices=bench.FWD_LAYOUTS)
    ap.add_argument("--bwd", action="store_true", help="also one forward+backward per case")
    args = ap.parse_args(argv)
    try:  # every argument checked before any GPU work
        variants = [parse_variant(v) for v in args.variants.split(",") if v]
        cases = [bench.parse_case(c) for c in args.cases.split(",") if c]
    except ValueError as exc:
        print(f"sscan_ncu: {exc}", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("sscan_ncu: needs a CUDA device", file=sys.stderr)
        return 2
    dev = torch.device("cuda")
    work = []
    for batch, length in cases:
        t = bench.fwd_inputs(batch, length, bench.DIM, dev, args.layout)
        fargs = (t["u"], t["delta"], t["A"], t["B"], t["C"], t["D"], t["z"], t["delta_bias"], True)
        for spec, v, cfg in variants:
            launch = bench.fwd_variant_launcher(v)
            work.append((f"fwd {spec} {batch}x{length}", lambda launch=launch, a=fargs, c=cfg:
                         launch(*a, config=c)))
        if args.bwd:
            g = bench.make_inputs(batch, length, bench.DIM, dev, grad=True)

            def step(g=g) -> None:
                out = selective_scan_fn(g["u"], g["delta"], g["A"], g["B"], g["C"], g["D"],
                                        g["z"], g["delta_bias"], True)
                out.backward(torch.ones_like(out))
            work.append((f"fwd+bwd selective_scan_fn {batch}x{length}", step))
    for _, fn in work:  # compiles and autotuning, outside the profiled range
        fn()
    torch.cuda.synchronize()
    for name, fn in work:
        torch.cuda.nvtx.range_push(name)
        torch.cuda.profiler.start()
        fn()
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()
        torch.cuda.nvtx.range_pop()
        print(f"profiled: {name}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
