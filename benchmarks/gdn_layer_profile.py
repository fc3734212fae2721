"""Profile one Qwen3.5 GatedDeltaNet layer, forward + backward, and list where the time goes.

The layer (Qwen3.5-27B shapes: hidden 5120, 16 key heads / 48 value heads of 128, conv width 4)
runs at B=1, L=4096 in bf16 on the GPU under torch.profiler, once per route:

* transformers: what transformers picks by itself (FLA when importable, else its torch code);
* fastpath: after fastpath.enable() (fastpath conv, FLA's gated delta rule when importable).

For each route: wall ms per fwd+bwd (CUDA events, median of --iters after warm-up), and the top
CUDA kernels and top CPU-side operators by self time, so the next eager cost to take (gated
RMSNorm, q/k l2-norm, beta sigmoid, repeat_interleave of q/k heads, ...) is read off, not guessed.

usage: python benchmarks/gdn_layer_profile.py --out DIR [--iters 10] [--top 25] [--routes transformers,fastpath]
Writes DIR/gdn_layer_profile.json (and a Chrome trace per route with --trace). ~1 minute.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


def build_layer(device: str = "cuda") -> Any:
    """The first GatedDeltaNet layer of the Qwen3.5-27B preset, random weights, bf16."""
    import torch

    from fastpath.models.build import build_model

    # two layers: a cut model keeps one of each layer type (GatedDeltaNet and full attention)
    built = build_model("qwen3.5-27b", layers=2, dtype="bf16", device=device, seed=0)
    layer = next(m.linear_attn for m in built.model.model.layers if hasattr(m, "linear_attn"))
    layer.train()
    del built
    torch.cuda.empty_cache()
    return layer


def run_route(route: str, iters: int, top: int, trace_dir: Path | None) -> dict[str, Any]:
    import torch
    from torch.profiler import ProfilerActivity, profile

    import fastpath

    if route == "fastpath":
        fastpath.enable(warn=False)
    try:
        layer = build_layer()  # built after enable(): built layers get the routes either way
        hidden = layer.in_proj_qkv.in_features
        gen = torch.Generator(device="cuda").manual_seed(0)
        x = torch.randn(1, 4096, hidden, device="cuda", dtype=torch.bfloat16, generator=gen)
        x.requires_grad_()
        dy = torch.randn(1, 4096, hidden, device="cuda", dtype=torch.bfloat16, generator=gen)

        def step() -> None:
            layer(x).backward(dy)
            x.grad = None
            for p in layer.parameters():
                p.grad = None

        for _ in range(3):
            step()
        torch.cuda.synchronize()
        times = cuda_times(step, iters)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(3):
                step()
            torch.cuda.synchronize()
        if trace_dir is not None:
            prof.export_chrome_trace(str(trace_dir / f"gdn_{route}_trace.json"))
        events = prof.key_averages()
        cuda_rows = sorted((e for e in events if _device_self_us(e) > 0),
                           key=_device_self_us, reverse=True)[:top]
        cpu_rows = sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)[:top]
        return {
            "route": route,
            "fwd_bwd_ms_median": sorted(times)[len(times) // 2],
            "fwd_bwd_ms_all": times,
            "top_cuda_kernels": [{"name": e.key[:160], "calls": e.count // 3,
                                  "self_us_per_step": _device_self_us(e) / 3} for e in cuda_rows],
            "top_cpu_ops": [{"name": e.key[:160], "calls": e.count // 3,
                             "self_cpu_us_per_step": e.self_cpu_time_total / 3} for e in cpu_rows],
            "routes": str(fastpath.explain(torch.nn.ModuleList([layer]))) if route == "fastpath" else None,
        }
    finally:
        if route == "fastpath":
            fastpath.disable()


def cuda_times(fn: Any, n: int) -> list[float]:
    """n calls of fn, each timed alone with CUDA events (ms)."""
    import torch

    times = []
    for _ in range(n):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return times


def _device_self_us(event: Any) -> float:
    for name in ("self_device_time_total", "self_cuda_time_total"):
        value = getattr(event, name, None)
        if value is not None:
            return float(value)
    return 0.0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="output directory")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--routes", default="transformers,fastpath")
    ap.add_argument("--trace", action="store_true", help="also write Chrome traces")
    args = ap.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("gdn_layer_profile: error: needs a CUDA device", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    doc: dict[str, Any] = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                           "shape": {"B": 1, "L": 4096, "dtype": "bf16"}, "routes": []}
    for route in args.routes.split(","):
        try:
            row = run_route(route, args.iters, args.top, out if args.trace else None)
        except Exception as exc:  # one route failing (an FLA refusal) must not hide the other
            row = {"route": route, "error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"}
        doc["routes"].append(row)
        print(json.dumps({k: row.get(k) for k in ("route", "fwd_bwd_ms_median", "error")}), flush=True)
        for k in row.get("top_cuda_kernels", [])[:10]:
            print(f"  {k['self_us_per_step']:9.1f} us  x{k['calls']:<3d} {k['name'][:100]}")
    (out / "gdn_layer_profile.json").write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
