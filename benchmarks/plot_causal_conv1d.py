"""Plot a causal_conv1d benchmark JSON (from benchmarks/conv_kernels.py) as bar charts.

usage: python benchmarks/plot_causal_conv1d.py results.json [--out plot.png]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("json", type=Path)
    ap.add_argument("--out", type=Path, default=None, help="PNG path (default: next to the JSON)")
    args = ap.parse_args(argv)
    try:
        result = json.loads(args.json.read_text())
        fn_rows = [r for r in result["fn"] if "error" not in r]
        upd_rows = [r for r in result["update"] if "error" not in r]
    except (OSError, ValueError, KeyError) as exc:
        print(f"plot_causal_conv1d: error: cannot read {args.json}: {exc}", file=sys.stderr)
        return 2
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    impls = list(dict.fromkeys(r["impl"] for r in fn_rows))
    shapes = list(dict.fromkeys((r["B"], r["L"]) for r in fn_rows))
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    width = 0.8 / max(len(impls), 1)
    for ax, key, label in ((axes[0], "fwd_GBps", "forward GB/s (read x + write y)"),
                           (axes[1], "fwd_bwd_ms", "forward+backward ms")):
        for i, impl in enumerate(impls):
            vals = [next((r[key] for r in fn_rows if r["impl"] == impl and (r["B"], r["L"]) == s),
                         0.0) for s in shapes]
            ax.bar([j + i * width for j in range(len(shapes))], vals, width, label=impl)
        ax.set_xticks([j + width * (len(impls) - 1) / 2 for j in range(len(shapes))])
        ax.set_xticklabels([f"B={b}, L={seqlen}" for b, seqlen in shapes])
        ax.set_title(label)
        if key == "fwd_bwd_ms":
            ax.set_yscale("log")
    copy = [v["GBps"] for v in result.get("copy", {}).values()]
    if copy:
        axes[0].axhline(max(copy), color="k", linestyle="--", label="device copy")
    axes[0].legend()
    names = [r["impl"] for r in upd_rows]
    xs = range(len(names))
    axes[2].bar([x - 0.2 for x in xs], [r["us_do_bench"] for r in upd_rows], 0.4, label="do_bench")
    axes[2].bar([x + 0.2 for x in xs], [r["us_cuda_graph"] for r in upd_rows], 0.4,
                label="CUDA-graph replay")
    axes[2].set_xticks(list(xs))
    axes[2].set_xticklabels(names)
    axes[2].set_title(f"decode update us (B={upd_rows[0]['B'] if upd_rows else '?'})")
    axes[2].legend()
    env = result.get("env", {})
    fig.suptitle(f"causal_conv1d D={result.get('D')} W={result.get('W')} {result.get('dtype')} "
                 f"channel-last - {env.get('device', '?')}, torch {env.get('torch', '?')}, "
                 f"triton {env.get('triton', '?')}")
    fig.tight_layout()
    out = args.out or args.json.with_suffix(".png")
    fig.savefig(out, dpi=110)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
