"""GatedDeltaNet's gated RMSNorm on the GPU: transformers' eager class vs FLA's fused Triton op.

The shape one Qwen3.5-27B GatedDeltaNet layer hands its norm at B=1, L=4096 (dims read from
fastpath's qwen3.5-27b preset): B*L*linear_num_value_heads rows of linear_value_head_dim, bf16,
eps = rms_norm_eps; the weight is moved off its initial ones.

Implementations, each timed forward (no grad: prefill) and forward+backward (x, gate, weight
all require grad, as in training):
* eager:    transformers' `Qwen3_5RMSNormGated.forward` (what runs without fastpath);
* fastpath: the same module after fastpath.enable() (routing/norm_route.py: the probe, the
            per-call checks, then FLA's rms_norm_gated) - what users get;
* fla:      FLA's rms_norm_gated called directly (the route's overhead is fastpath - fla);
* compiled: torch.compile of the eager forward (with --compile; inductor's own fusion).
Each also reports its distance to float64 on the same inputs (output and the three gradients),
so every timing is of a correct computation, and the bytes it must move (x, gate, y forward;
x, gate, dy in and dx, dgate out backward) as an effective bandwidth.

usage: python benchmarks/gdn_norm_gpu.py [--iters 50] [--warmup 10] [--dtype bf16] [--compile]
                                         [--out FILE]
Needs a CUDA GPU and fla-core (scripts/setup_fla.sh puts it in .venvs/fla; add it to PYTHONPATH).
Prints one JSON document (and writes it to --out). Seconds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch
from gdn_layer_profile import cuda_times  # same folder: sys.path[0]

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def preset_dims(batch: int, seq_len: int) -> dict[str, Any]:
    """Rows, width and eps of the GatedDeltaNet norm in the qwen3.5-27b preset."""
    from fastpath.shared.model_source import load_preset_with_source

    cfg = load_preset_with_source("qwen3.5-27b")
    text = cfg.get("text_config", cfg)
    heads, width = int(text["linear_num_value_heads"]), int(text["linear_value_head_dim"])
    return {"batch": batch, "seq_len": seq_len, "value_heads": heads, "rows": batch * seq_len * heads,
            "width": width, "eps": float(text["rms_norm_eps"]), "hidden_act": text.get("hidden_act")}


def time_ms(fn: Any, iters: int, warmup: int) -> dict[str, float]:
    """Median / min milliseconds of fn() by CUDA events, one event pair per call (wall clock on
    CPU, where --device cpu is a smoke run of this script, not a measurement)."""
    for _ in range(warmup):
        fn()
    cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
    if cuda:
        torch.cuda.synchronize()
    if cuda:
        times = cuda_times(fn, iters)
    else:
        times = []
        for _ in range(iters):
            start_s = time.perf_counter()
            fn()
            times.append((time.perf_counter() - start_s) * 1e3)
    return {"median_ms": statistics.median(times), "min_ms": min(times)}


def accuracy(norm_fn: Any, weight: torch.nn.Parameter, x: torch.Tensor, gate: torch.Tensor,
             dy: torch.Tensor, eps: float) -> dict[str, float]:
    """Relative L2 distance to float64 of the output and of d(x, gate, weight)."""
    xs, gs = (t.detach().clone().requires_grad_() for t in (x, gate))
    weight.grad = None
    norm_fn(xs, gs).backward(dy)
    x64, g64, w64 = (t.detach().double().requires_grad_() for t in (x, gate, weight))
    want = x64 * torch.rsqrt(x64.square().mean(-1, keepdim=True) + eps) * w64 * torch.nn.functional.silu(g64)
    want.backward(dy.double())
    with torch.no_grad():
        y = norm_fn(x, gate)

    def rel(a: torch.Tensor, b: torch.Tensor) -> float:
        return float((a.double() - b).norm() / b.norm())

    out = {"y": rel(y, want.detach()), "dx": rel(xs.grad, x64.grad), "dgate": rel(gs.grad, g64.grad),
           "dweight": rel(weight.grad, w64.grad)}
    weight.grad = None
    return out


def bench(name: str, norm_fn: Any, weight: torch.nn.Parameter, x: torch.Tensor, gate: torch.Tensor,
          dy: torch.Tensor, eps: float, iters: int, warmup: int) -> dict[str, Any]:
    """norm_fn(x, gate) uses `weight` (a Parameter that needs grad) as its weight."""
    row: dict[str, Any] = {"impl": name, "error_vs_float64": accuracy(norm_fn, weight, x, gate, dy, eps)}
    with torch.no_grad():
        row["fwd"] = time_ms(lambda: norm_fn(x, gate), iters, warmup)
    xs, gs = (t.detach().clone().requires_grad_() for t in (x, gate))

    def step() -> None:
        norm_fn(xs, gs).backward(dy)
        xs.grad = gs.grad = weight.grad = None

    row["fwd_bwd"] = time_ms(step, iters, warmup)
    tensor_bytes = x.numel() * x.element_size()
    for phase, moved in (("fwd", 3 * tensor_bytes), ("fwd_bwd", 8 * tensor_bytes)):
        row[phase]["min_bytes"] = moved
        row[phase]["effective_GBps"] = moved / (row[phase]["median_ms"] * 1e-3) / 1e9
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seq-len", type=int, default=4096)
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--compile", action="store_true", help="also time torch.compile of the eager forward")
    ap.add_argument("--out", help="also write the JSON here")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                    help="cpu: a smoke run under TRITON_INTERPRET=1 (use --rows; timings mean nothing)")
    ap.add_argument("--rows", type=int, help="override the row count (smoke runs)")
    args = ap.parse_args(argv)
    device = args.device
    if device == "cuda" and not torch.cuda.is_available():
        print("gdn_norm_gpu: error: needs a CUDA device (or --device cpu with TRITON_INTERPRET=1)", file=sys.stderr)
        return 2
    import triton
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5RMSNormGated

    import fastpath
    from fastpath.routing import norm_route

    status = norm_route.detect_norm()
    if status.fn is None:
        print(f"gdn_norm_gpu: error: FLA's gated RMSNorm is not usable: {status.reason}", file=sys.stderr)
        return 2
    fla_fn = status.fn
    dims = preset_dims(args.batch, args.seq_len)
    if args.rows:
        dims["rows"] = args.rows
    dtype, eps = DTYPES[args.dtype], dims["eps"]
    gen = torch.Generator(device=device).manual_seed(0)
    x, gate, dy = (torch.randn(dims["rows"], dims["width"], device=device, generator=gen).to(dtype)
                   for _ in range(3))
    norm = Qwen3_5RMSNormGated(dims["width"], eps=eps).to(device, dtype)
    with torch.no_grad():
        norm.weight.copy_(1 + 0.3 * torch.randn(dims["width"], device=device, generator=gen))
    weight = norm.weight
    if device == "cpu":
        from fastpath.routing.patch_registry import PatchRegistry

        norm_route.interpreter_single_config(PatchRegistry())  # the interpreter cannot autotune
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu (smoke run, timings mean nothing)"
    doc: dict[str, Any] = {"device": name, "torch": torch.__version__,
                           "triton": triton.__version__, "dtype": args.dtype, "shape": dims, "rows": []}
    rows = doc["rows"]
    rows.append(bench("eager", norm, weight, x, gate, dy, eps, args.iters, args.warmup))
    report = fastpath.enable(warn=False)
    try:  # the class's forward is routed now; the same module object goes through it
        doc["enable"] = {"gated_norm": report.gated_norm, "reason": report.gated_norm_reason,
                         "routed": hasattr(Qwen3_5RMSNormGated.forward, norm_route.ROUTE_ATTR)}
        rows.append(bench("fastpath", norm, weight, x, gate, dy, eps, args.iters, args.warmup))
    finally:
        fastpath.disable()
    rows.append(bench("fla", lambda a, b: fla_fn(a, b, weight, None, activation="silu", eps=eps),
                      weight, x, gate, dy, eps, args.iters, args.warmup))
    if args.compile:
        rows.append(bench("compiled", torch.compile(norm), weight, x, gate, dy, eps, args.iters, args.warmup))
    for row in rows:
        for phase in ("fwd", "fwd_bwd"):
            row[phase]["speedup_vs_eager"] = rows[0][phase]["median_ms"] / row[phase]["median_ms"]
    text = json.dumps(doc, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
