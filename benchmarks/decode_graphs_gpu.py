"""Decode under CUDA graphs on the GPU, side by side: torch fallback, FLA alone, fastpath.

Each configuration runs in its own process (the fallback hides fla and causal_conv1d the way
`fastpath bench` does), builds the same model (default: the 8-layer Qwen3.5-27B-shaped preset,
bf16, random weights), prefills a prompt and greedy-decodes N tokens twice with transformers'
StaticCache: eagerly, and with each step replayed from one CUDA graph
(fastpath.proof.decode_graphs.graph_greedy, which checks the two token streams are identical).
Also the ordinary eager DynamicCache decode of `fastpath bench` is NOT re-measured here.

usage: python benchmarks/decode_graphs_gpu.py --out DIR [--layers 8] [--prompt 512] [--tokens 64]
       [--configs reference,fla,fastpath]
Writes DIR/decode_graphs.json; prints one line per config. ~1-2 minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any


def run_one(config: str, layers: int, prompt: int, tokens: int) -> dict[str, Any]:
    """In this process: hide what the config hides, build, decode with and without the graph."""
    from fastpath.proof.bench_spec import CONFIGS
    from fastpath.proof.bench_worker import _hide_modules

    spec = CONFIGS[config]
    _hide_modules(spec.hide)
    import torch

    import fastpath
    from fastpath.proof.decode_graphs import graph_greedy
    from fastpath.proof.models import build_model

    row: dict[str, Any] = {"config": config, "label": spec.label}
    if spec.enable:
        row["enable"] = str(fastpath.enable(warn=False))
    built = build_model("qwen3.5-27b", layers=layers, dtype="bf16", device="cuda", seed=0)
    ids = torch.randint(0, built.vocab_size, (1, prompt),
                        generator=torch.Generator().manual_seed(1)).to("cuda")
    res = graph_greedy(built.model, ids, new_tokens=tokens)
    row.update(res.to_json())
    row["model"] = built.describe()
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--configs", default="reference,fla,fastpath")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        print("RESULT " + json.dumps(run_one(args.worker, args.layers, args.prompt, args.tokens)))
        return 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for config in args.configs.split(","):
        cmd = [sys.executable, __file__, "--out", str(out), "--layers", str(args.layers),
               "--prompt", str(args.prompt), "--tokens", str(args.tokens), "--worker", config]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ), timeout=300)
        found = [ln[7:] for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
        row = json.loads(found[-1]) if found else {
            "config": config, "ok": False,
            "reason": f"worker exit {proc.returncode}: {(proc.stderr or proc.stdout).strip()[-400:]}"}
        rows.append(row)
        print(json.dumps({k: row.get(k) for k in ("config", "ok", "reason", "eager_tokens_per_s",
                                                  "graph_tokens_per_s")}), flush=True)
    base = next((r.get("eager_tokens_per_s") for r in rows if r["config"] == "reference"), None)
    for r in rows:
        if base and r.get("graph_tokens_per_s"):
            r["graph_x_eager_fallback"] = r["graph_tokens_per_s"] / base
    (out / "decode_graphs.json").write_text(json.dumps({"rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
