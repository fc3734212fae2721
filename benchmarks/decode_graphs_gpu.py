"""Decode under CUDA graphs on the GPU, side by side: torch fallback, FLA alone, fastpath.

A thin wrapper over `fastpath bench --phases decode,decode-graph` (no second implementation: the
CUDA-graph decode is bench's `decode-graph` phase, fastpath.proof.decode_graphs.bench_phase). Each
configuration runs in its own bench worker process on the same model (default: the 8-layer
Qwen3.5-27B-shaped preset, bf16, random weights, B=1): the eager DynamicCache decode (`decode`)
and the StaticCache decode replayed from one CUDA graph (`decode-graph`, capture timed apart,
tokens checked against the eager StaticCache loop and recorded against the DynamicCache decode).

usage: python benchmarks/decode_graphs_gpu.py --out DIR [--layers 8] [--prompt 512] [--tokens 64]
       [--configs reference,fla,fastpath] [--repeats 3] [--warmup 1]
Writes DIR/bench/ (bench.json, bench.md) and DIR/decode_graphs.json (one row per config, with
graph_x_eager_fallback: graph tok/s over the reference's eager decode); prints one line per config.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any


def rows_of(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """One summary row per configuration of a bench document with decode and decode-graph."""
    versus = doc.get("speedup_versus", {})
    rows = []
    for r in doc["configs"]:
        phases = r.get("phases", {})
        eager, graph = phases.get("decode", {}), phases.get("decode-graph", {})
        reason = r.get("skipped") or r.get("error") or graph.get("skipped") or graph.get("error")
        rows.append({
            "config": r["config"], "label": r.get("label"), "ok": "tokens_per_s" in graph, "reason": reason,
            "eager_tokens_per_s": eager.get("tokens_per_s"),
            "graph_tokens_per_s": graph.get("tokens_per_s"),
            "eager_static_tokens_per_s": graph.get("eager_static_tokens_per_s"),
            "capture_s": graph.get("capture_s"),
            "tokens_match_eager": graph.get("tokens_match_eager"),
            "tokens_match_dynamic_cache": graph.get("tokens_match_dynamic_cache"),
            "graph_x_eager_fallback": versus.get(r["config"], {}).get("decode-graph/decode"),
        })
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", default="qwen3.5-27b")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--configs", default="reference,fla,fastpath")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bf16")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "fastpath", "bench", args.model, "--layers", str(args.layers),
           "--dtype", args.dtype, "--device", args.device, "--seq-len", str(args.prompt), "--batch", "1",
           "--decode-tokens", str(args.tokens), "--repeats", str(args.repeats), "--warmup", str(args.warmup),
           "--phases", "decode,decode-graph", "--configs", args.configs, "--out", str(out / "bench"), "--json"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ))
    sys.stderr.write(proc.stderr)
    if proc.returncode != 0 or not proc.stdout.strip():
        print(f"fastpath bench exited {proc.returncode}", file=sys.stderr)
        return proc.returncode or 1
    doc = json.loads(proc.stdout)
    rows = rows_of(doc)
    for row in rows:
        print(json.dumps({k: row[k] for k in ("config", "ok", "reason", "eager_tokens_per_s", "graph_tokens_per_s",
                                              "capture_s", "tokens_match_eager", "graph_x_eager_fallback")}),
              flush=True)
    (out / "decode_graphs.json").write_text(json.dumps({"rows": rows, "bench": "bench/bench.json"}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
