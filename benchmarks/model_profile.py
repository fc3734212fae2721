"""Where a whole model's step goes: GPU time per kernel family, and the matmul-bound ceiling.

Issue 14 asks for model forward+backward >= 3.5x the torch fallback and prefill >= 1.05x FLA+Dao.
Whether such a ratio is reachable depends on how much of a step is dense matmul work that every
configuration shares (cuBLAS runs the projections and MLPs the same way whatever runs the
GatedDeltaNet core). This script runs `fastpath bench`'s own prefill and forward+backward phases
(bench_spec: same inputs, same loss) under torch.profiler, one configuration per process (the
same package hiding as bench), and reports for each phase:

* GPU time by kernel family (gemm, attention, gated delta rule (FLA), causal conv, SSD, norm,
  elementwise/other) with the top kernels, so the classification can be checked by eye;
* the analytic matmul FLOPs of the step (2 x tokens x linear weights forward, 6x for
  forward+backward; prefill's lm_head runs on the last token only) and the GEMM rate reached;
* the ceiling: the step's tokens/s if everything but the GEMMs took no time at that rate.

usage: python benchmarks/model_profile.py --out DIR [--configs fastpath,fla+dao,reference]
                                          [--layers 8] [--seq-len 4096] [--steps 3]
Writes DIR/model_profile.json. Needs CUDA. ~1 minute per configuration after compiles.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from gdn_layer_profile import _device_self_us, cuda_times  # same folder: sys.path[0]

# Ordered: the first family whose pattern matches a kernel's name takes it.
FAMILIES: tuple[tuple[str, str], ...] = (
    ("attention", r"flash|fmha|attention|sdpa|softmax_warp"),
    ("gated delta rule (FLA)", r"chunk_|gated_delta|delta_rule|fused_recurrent|solve_tril|kkt|"
                               r"recompute_w_u|prepare_wy|wy_fast|l2norm|merge_16x16|dqkwg|dhu|dv_local"),
    ("causal conv", r"causal_conv1d"),
    ("ssd", r"_states_kernel|_dstates_kernel|_out_kernel|_cb_kernel|_dcb_kernel|_dbc_kernel|"
            r"_dx_kernel|_state_update_kernel"),
    ("norm", r"rms|layer_norm|layernorm|group_norm|_norm_"),
    ("gemm", r"gemm|gemv|xmma|cutlass|nvjet|cublas|sm90_|splitk|matmul"),
)
MATCHERS = [(name, re.compile(pat, re.I)) for name, pat in FAMILIES]


def family(kernel: str) -> str:
    for name, pat in MATCHERS:
        if pat.search(kernel):
            return name
    return "elementwise/other"


def linear_params(model: Any) -> tuple[int, int]:
    """(weights of every nn.Linear except lm_head, lm_head's weights)."""
    import torch

    head = model.get_output_embeddings()
    body = sum(m.weight.numel() for m in model.modules()
               if isinstance(m, torch.nn.Linear) and m is not head)
    return body, (head.weight.numel() if head is not None else 0)


def child(config: str, args: argparse.Namespace) -> dict[str, Any]:
    """One configuration in this process (bench's package hiding), both phases profiled."""
    from torch.profiler import ProfilerActivity, profile

    from fastpath.proof.bench_spec import CONFIGS, PHASE_REGISTRY, BenchSettings
    from fastpath.proof.bench_worker import _hide_modules, _importable

    spec = CONFIGS[config]
    _hide_modules(spec.hide)
    missing = [m for m in spec.requires if not _importable(m)]
    if missing:
        return {"config": config, "skipped": f"not importable: {', '.join(missing)}"}
    import torch

    import fastpath
    from fastpath.models.build import build_model

    if spec.enable:
        fastpath.enable(warn=False)
    settings = BenchSettings(source=args.model, layers=args.layers, dtype="bf16", device="cuda",
                             seq_len=args.seq_len, batch=1)
    built = build_model(settings.source, layers=settings.layers, dtype="bf16", device="cuda", seed=0)
    model = built.model
    body, head = linear_params(model)
    if spec.compile:  # fastpath+compile: the eager model-wide work compiled too
        model.forward = torch.compile(model.forward)
    ids = torch.randint(0, built.vocab_size, (1, args.seq_len), generator=torch.Generator().manual_seed(1)).cuda()
    tokens = ids.numel()
    out: dict[str, Any] = {"config": config, "label": spec.label, "linear_params": body, "lm_head_params": head,
                           "phases": {}}
    for name, flops in (("prefill", 2 * tokens * body + 2 * head),
                        ("train", 6 * tokens * (body + head))):
        fn, _setup, _ = PHASE_REGISTRY[name].runner(model, ids, settings)
        try:
            for _ in range(2):
                fn()
            torch.cuda.synchronize()
            times = cuda_times(fn, args.steps)
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(args.steps):
                    fn()
                torch.cuda.synchronize()
        except Exception as exc:  # an FLA refusal in one phase must not hide the other
            out["phases"][name] = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"}
            continue
        finally:
            model.zero_grad(set_to_none=True)
        out["phases"][name] = summarise(prof, args.steps, sorted(times)[len(times) // 2], flops, tokens)
    return out


def summarise(prof: Any, steps: int, step_ms: float, flops: int, tokens: int) -> dict[str, Any]:
    kernels: dict[str, list[float]] = {}
    for e in prof.key_averages():
        us = _device_self_us(e)
        if us > 0:
            row = kernels.setdefault(e.key, [0.0, 0])
            row[0] += us / steps / 1e3
            row[1] += e.count // steps
    by_family: dict[str, float] = {}
    for name, (ms, _calls) in kernels.items():
        by_family[family(name)] = by_family.get(family(name), 0.0) + ms
    gemm_ms = by_family.get("gemm", 0.0)
    gpu_ms = sum(by_family.values())
    top = sorted(kernels.items(), key=lambda kv: kv[1][0], reverse=True)[:30]
    return {
        "step_ms": step_ms,
        "tokens_per_s": tokens / step_ms * 1e3,
        "gpu_busy_ms": gpu_ms,
        "ms_by_family": dict(sorted(by_family.items(), key=lambda kv: kv[1], reverse=True)),
        "matmul_tflop": flops / 1e12,
        "gemm_tflops_reached": flops / gemm_ms / 1e9 if gemm_ms else None,
        "ceiling_tokens_per_s": tokens / gemm_ms * 1e3 if gemm_ms else None,
        "top_kernels": [{"name": k[:140], "family": family(k), "ms": v[0], "calls": v[1]} for k, v in top],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="output directory")
    ap.add_argument("--model", default="qwen3.5-27b")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=4096)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--configs", default="fastpath,fla+dao,reference")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args)))
        return 0
    import torch

    if not torch.cuda.is_available():
        print("model_profile: error: needs a CUDA device", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for config in args.configs.split(","):
        cmd = [sys.executable, __file__, "--out", str(out), "--model", args.model, "--layers", str(args.layers),
               "--seq-len", str(args.seq_len), "--steps", str(args.steps), "--child", config]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        lines = proc.stdout.strip().splitlines()
        try:
            row = json.loads(lines[-1])
        except (IndexError, json.JSONDecodeError):
            row = {"config": config, "error": f"exit {proc.returncode}: {proc.stderr.strip()[-400:]}"}
        rows.append(row)
        for phase, p in row.get("phases", {}).items():
            if "error" in p:
                print(f"{config:10s} {phase:8s} error: {p['error']}")
                continue
            fams = ", ".join(f"{k} {v:.1f}" for k, v in p["ms_by_family"].items())
            print(f"{config:10s} {phase:8s} {p['step_ms']:7.1f} ms ({p['tokens_per_s'] / 1e3:.1f}k tok/s), "
                  f"GEMM {p['gemm_tflops_reached'] or 0:.0f} TFLOP/s, ceiling "
                  f"{(p['ceiling_tokens_per_s'] or 0) / 1e3:.1f}k tok/s | {fams}", flush=True)
        if "error" in row or "skipped" in row:
            print(f"{config:10s} {row.get('error') or row.get('skipped')}", flush=True)
    doc = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "model": args.model,
           "layers": args.layers, "seq_len": args.seq_len, "batch": 1, "dtype": "bf16", "configs": rows}
    (out / "model_profile.json").write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
