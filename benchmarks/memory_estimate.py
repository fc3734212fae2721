"""How close is the job-size estimate of `fastpath verify` / `fastpath bench` (models/sizing.py) to
what the job really uses? Each case runs in a fresh process: estimate first (which also imports
the modeling module), then the process's RSS (CPU) or CUDA allocator peak is reset as the
baseline, then the real job; the measured peak is the growth above that baseline.

    python benchmarks/memory_estimate.py --device cpu  --out benchmarks/results
    python benchmarks/memory_estimate.py --device cuda --out benchmarks/results   # on a GPU host

Writes memory_estimate_<device>.json (one row per case: estimate, measured peak, ratio) and
prints a markdown table. CPU runs take ~1-3 min on 2 cores; the CUDA cases ~1 min on one H200.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

# A mid-size Qwen3.5 text model: GatedDeltaNet + attention, small enough for a CPU forward+backward.
MID_QWEN35 = {
    "model_type": "qwen3_5_text", "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 4,
    "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 128, "linear_num_key_heads": 8,
    "linear_num_value_heads": 16, "linear_key_head_dim": 64, "linear_value_head_dim": 64,
    "linear_conv_kernel_dim": 4, "vocab_size": 32000,
    "layer_types": ["linear_attention", "linear_attention", "linear_attention", "full_attention"],
}

# Small Mamba-2 models whose peak is the torch reference path's chunked scan (on the H200
# the estimate missed Granite-4.0-H / Bamba's reference path by 2x): one 256-token chunk,
# 8 heads x 64, state 128, so C x B alone is B x 512 x 8 x 256 x 128 x 4 bytes.
SMALL_MAMBA2 = {
    "model_type": "mamba2", "hidden_size": 256, "num_heads": 8, "head_dim": 64, "state_size": 128,
    "n_groups": 1, "chunk_size": 256, "expand": 2, "num_hidden_layers": 2, "vocab_size": 1000,
}
SMALL_BAMBA = {
    "model_type": "bamba", "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "mamba_n_heads": 8, "mamba_d_head": 64,
    "mamba_d_state": 128, "mamba_n_groups": 1, "mamba_chunk_size": 256, "mamba_expand": 2,
    "attn_layer_indices": [1], "vocab_size": 1000,
}

# (name, source, job settings). The job is `verify` (two paths kept alive), `bench` (one), or
# `reference` (transformers' reference path alone, once: what bench's reference configuration runs).
CASES: dict[str, list[tuple[str, Any, dict[str, Any]]]] = {
    "cpu": [
        ("lfm2-1.2b, 4 layers, fp32, verify fwd", "lfm2-1.2b",
         {"job": "verify", "layers": 4, "dtype": "fp32", "batch": 1, "seq_len": 128, "backward": False}),
        ("qwen3.5 mid (1024 wide), fp32, verify fwd+bwd", MID_QWEN35,
         {"job": "verify", "layers": None, "dtype": "fp32", "batch": 2, "seq_len": 256, "backward": True}),
        ("lfm2-1.2b, 4 layers, bf16, verify fwd+bwd", "lfm2-1.2b",
         {"job": "verify", "layers": 4, "dtype": "bf16", "batch": 1, "seq_len": 64, "backward": True}),
        ("mamba2 small, fp32, reference path fwd, B=2 L=512", SMALL_MAMBA2,
         {"job": "reference", "layers": None, "dtype": "fp32", "batch": 2, "seq_len": 512, "backward": False}),
        ("mamba2 small, fp32, reference path fwd+bwd, B=2 L=512", SMALL_MAMBA2,
         {"job": "reference", "layers": None, "dtype": "fp32", "batch": 2, "seq_len": 512, "backward": True}),
        ("bamba small, bf16, reference path fwd+bwd, B=1 L=1024", SMALL_BAMBA,
         {"job": "reference", "layers": None, "dtype": "bf16", "batch": 1, "seq_len": 1024, "backward": True}),
    ],
    "cuda": [
        ("qwen3.5-27b, 4 layers, bf16, verify fwd+bwd", "qwen3.5-27b",
         {"job": "verify", "layers": 4, "dtype": "bf16", "batch": 1, "seq_len": 2048, "backward": True}),
        ("lfm2-1.2b, bf16, verify fwd", "lfm2-1.2b",
         {"job": "verify", "layers": None, "dtype": "bf16", "batch": 2, "seq_len": 4096, "backward": False}),
        ("nemotron-h-8b, 4 layers, bf16, verify fwd+bwd", "nemotron-h-8b",
         {"job": "verify", "layers": 4, "dtype": "bf16", "batch": 1, "seq_len": 2048, "backward": True}),
        # The configurations that ran out of memory on the H200 (BENCHMARKS.md, Session 5: batch 2) and passed at
        # batch 1: the torch scan on the reference path sets their peak.
        ("granite-4.0-h-small, 4 layers, bf16, verify fwd+bwd, B=1 L=1024", "granite-4.0-h-small",
         {"job": "verify", "layers": 4, "dtype": "bf16", "batch": 1, "seq_len": 1024, "backward": True}),
        ("bamba-9b, 3 layers, bf16, verify fwd+bwd, B=2 L=1024", "bamba-9b",
         {"job": "verify", "layers": 3, "dtype": "bf16", "batch": 2, "seq_len": 1024, "backward": True}),
        ("granite-4.0-h-small, 4 layers, bf16, reference path fwd+bwd, B=2 L=1024", "granite-4.0-h-small",
         {"job": "reference", "layers": 4, "dtype": "bf16", "batch": 2, "seq_len": 1024, "backward": True}),
    ],
}


def _rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def child(case_path: str) -> None:
    """Run one case in this process; print one JSON line."""
    case = json.loads(Path(case_path).read_text())
    os.environ.setdefault("USE_HUB_KERNELS", "0")
    import torch

    from fastpath.models.build import build_model
    from fastpath.models.paths import hidden_compiled_peers
    from fastpath.models.resolve import resolve_model
    from fastpath.models.sizing import estimate
    from fastpath.proof.run_paths import make_inputs, run_path, verify_model

    s = case["settings"]
    device = case["device"]
    if s["job"] == "reference":  # the modeling module binds its kernels at import: peers hidden first
        hidden_compiled_peers().__enter__()
    plan = resolve_model(case["source"], layers=s["layers"], dtype=s["dtype"], device=device)
    size = estimate(plan.config, plan.source.decoder, dtype=s["dtype"], device=device, batch=s["batch"],
                    seq_len=s["seq_len"], backward=s["backward"], paths=2 if s["job"] == "verify" else 1)
    if device == "cuda":
        torch.cuda.init()
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        baseline = torch.cuda.memory_allocated()
    else:
        baseline = _rss_bytes()
    begin = time.perf_counter()
    if s["job"] == "reference":
        built = build_model(case["source"], layers=s["layers"], dtype=s["dtype"], device=device)
        if s["backward"]:
            built.model.requires_grad_(True)
        inputs = make_inputs(built.vocab_size, s["batch"], s["seq_len"], False, 0, built.device)
        run_path(built.model, inputs, packed_reference=True, backward=s["backward"])
    else:
        verify_model(case["source"], dtype=s["dtype"], seq_len=s["seq_len"], batch=s["batch"], layers=s["layers"],
                     backward=s["backward"], decode_tokens=4, device=device, check_memory=False)
    seconds = time.perf_counter() - begin
    if device == "cuda":
        peak = torch.cuda.max_memory_allocated() - baseline
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - baseline
    print(json.dumps({"parameters": size.parameters, "estimate_bytes": size.peak_bytes,
                      "estimate_weights_bytes": size.weight_bytes, "estimate_activation_bytes": size.activation_bytes,
                      "measured_peak_bytes": peak, "baseline_bytes": baseline, "seconds": seconds}))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=sorted(CASES), default="cpu")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results"), help="directory for the JSON")
    parser.add_argument("--only", default=None, help="run only the cases whose name contains this text")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child)
        return 0
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT / "src"), os.environ.get("PYTHONPATH")) if p))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, (name, source, settings) in enumerate(CASES[args.device]):
            if args.only and args.only not in name:
                continue
            if isinstance(source, dict):
                path = Path(tmp) / f"case{i}.json"
                path.write_text(json.dumps(source))
                source = str(path)
            case = Path(tmp) / f"case{i}.job.json"
            case.write_text(json.dumps({"source": source, "settings": settings, "device": args.device}))
            proc = subprocess.run([sys.executable, __file__, "--child", str(case)], capture_output=True,
                                  text=True, env=env, timeout=900)
            if proc.returncode != 0:
                rows.append({"case": name, "error": (proc.stderr.strip().splitlines() or ["?"])[-1]})
                print(f"{name}: error: {rows[-1]['error']}", file=sys.stderr)
                continue
            row = {"case": name, **settings, **json.loads(proc.stdout.strip().splitlines()[-1])}
            row["ratio"] = row["estimate_bytes"] / max(row["measured_peak_bytes"], 1)
            rows.append(row)
            print(f"{name}: estimate {row['estimate_bytes'] / 1e9:.3f} GB, measured {row['measured_peak_bytes'] / 1e9:.3f} GB "
                  f"(x{row['ratio']:.2f}), {row['seconds']:.0f} s", file=sys.stderr)
    doc: dict[str, Any] = {"device": args.device, "python": platform.python_version(), "host": platform.node(),
                           "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "rows": rows}
    try:
        import torch
        import transformers

        doc.update(torch=torch.__version__, transformers=transformers.__version__,
                   gpu=torch.cuda.get_device_name() if args.device == "cuda" else None)
    except ImportError:
        pass
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"memory_estimate_{args.device}.json"
    path.write_text(json.dumps(doc, indent=1) + "\n")
    print("| case | parameters | estimate GB | measured peak GB | estimate / measured |")
    print("|---|---|---|---|---|")
    for r in rows:
        if "error" in r:
            print(f"| {r['case']} | error: {r['error']} | | | |")
        else:
            print(f"| {r['case']} | {r['parameters'] / 1e6:.0f} M | {r['estimate_bytes'] / 1e9:.3f} | "
                  f"{r['measured_peak_bytes'] / 1e9:.3f} | {r['ratio']:.2f} |")
    print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
