"""The token embedding's weight gradient on the GPU: torch's backward (a zero fill of the whole
table, then sort + scatter) against fastpath's one-pass kernel (kernels/embedding), at
Qwen3.5-27B's table (vocab 248,320 x hidden 5,120 from fastpath's qwen3.5-27b preset), bf16.

Rows, for each token count of --tokens: `torch` (F.embedding's backward through autograd, the
table's gradient only), `fastpath RxB` (kernels/embedding/bwd.weight_grad with R rows a program
and a column block of B, each of --launches), and `fill` (zeros_ of the table: the write
bandwidth every one-pass writer is held to). Each: median / min ms (CUDA events), GB/s over the
table's bytes, and for fastpath whether its gradient is within one rounding of torch's (max
difference over the looked-up rows, in units of the largest value) and bit for bit the first
launch's (every launch must give the same bits).

usage: python benchmarks/embedding_gpu.py [--tokens 4096,32768] [--launches 8x1024,4x2048,16x1024,1x4096]
                                          [--iters 20] [--warmup 3] [--out FILE]
Needs a CUDA GPU (exit 3 without one). Prints one JSON document (and writes it to --out).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

DEFAULT_LAUNCHES = "8x1024,4x2048,16x1024,1x4096,32x512"


def parse_launches(spec: str) -> list[tuple[int, int]]:
    """'RxB,...' -> [(rows a program, column block)]; B a power of two; argparse's type."""
    out = []
    for item in (x.strip() for x in spec.split(",")):
        rows, _, block = item.partition("x")
        if not (rows.isdigit() and block.isdigit() and int(rows) > 0 and int(block) > 0
                and int(block) & (int(block) - 1) == 0):
            raise argparse.ArgumentTypeError(f"--launches: {item!r} is not ROWSxBLOCK (e.g. 8x1024, BLOCK a power of two)")
        out.append((int(rows), int(block)))
    return out


def parse_tokens(spec: str) -> list[int]:
    try:
        values = [int(x) for x in spec.split(",")]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"--tokens: {spec!r} is not a comma list of positive integers")
    return values


def _stats(times: list[float], nbytes: int) -> dict[str, Any]:
    med = statistics.median(times)
    return {"median_ms": round(med, 4), "min_ms": round(min(times), 4), "gb_per_s": round(nbytes / med / 1e6, 1)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=parse_tokens, default=[4096, 32768])
    ap.add_argument("--launches", type=parse_launches, default=parse_launches(DEFAULT_LAUNCHES))
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)

    import torch

    if not torch.cuda.is_available():
        print("embedding_gpu.py: needs a CUDA GPU", file=sys.stderr)
        return 3
    from gdn_layer_profile import cuda_times  # same folder: sys.path[0]

    from fastpath.kernels.embedding.bwd import weight_grad
    from fastpath.shared.model_source import load_preset_with_source

    cfg = load_preset_with_source("qwen3.5-27b")
    text = cfg.get("text_config", cfg)
    vocab, hidden = int(text["vocab_size"]), int(text["hidden_size"])
    dtype = torch.bfloat16
    table_bytes = vocab * hidden * 2
    doc: dict[str, Any] = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                           "vocab": vocab, "hidden": hidden, "dtype": "bf16", "rows": []}
    gen = torch.Generator(device="cuda").manual_seed(0)
    weight = torch.randn(vocab, hidden, device="cuda", dtype=dtype, generator=gen).requires_grad_(True)
    for n in args.tokens:
        ids = torch.randint(0, vocab, (1, n), device="cuda", generator=gen)
        dout = torch.randn(1, n, hidden, device="cuda", dtype=dtype, generator=gen)

        def torch_bwd(ids: torch.Tensor = ids, dout: torch.Tensor = dout) -> torch.Tensor:
            weight.grad = None
            torch.nn.functional.embedding(ids, weight).backward(dout)
            return weight.grad

        for _ in range(args.warmup):
            theirs = torch_bwd()
        # the forward gather is in torch's time too: time it alone and take it off
        gather = cuda_times(lambda ids=ids: torch.nn.functional.embedding(ids, weight.detach()), args.iters)
        times = cuda_times(torch_bwd, args.iters)
        row = {"config": "torch", "tokens": n, **_stats(times, table_bytes),
               "gather_median_ms": round(statistics.median(gather), 4)}
        doc["rows"].append(row)
        print(json.dumps(row), flush=True)
        theirs = torch_bwd().clone()
        looked_up = torch.unique(ids)
        scale = theirs[looked_up].float().abs().max().item() or 1.0
        first = None
        for rows_pp, block in args.launches:
            def ours(rows_pp: int = rows_pp, block: int = block, ids: torch.Tensor = ids,
                     dout: torch.Tensor = dout) -> torch.Tensor:
                return weight_grad(ids, dout, vocab, None, False, dtype, rows_per_program=rows_pp, block_h=block)

            for _ in range(args.warmup):
                got = ours()
            times = cuda_times(ours, args.iters)
            got = ours()
            first = got if first is None else first
            diff = (got[looked_up].float() - theirs[looked_up].float()).abs().max().item() / scale
            row = {"config": f"fastpath {rows_pp}x{block}", "tokens": n, **_stats(times, table_bytes),
                   "max_diff_vs_torch": diff, "within_one_rounding": diff <= 2.0 ** -7,
                   "others_zero": not bool(got.index_fill(0, looked_up, 0).any()),
                   "same_bits_as_first": bool(torch.equal(got, first))}
            doc["rows"].append(row)
            print(json.dumps(row), flush=True)
        fill = torch.empty_like(weight, requires_grad=False)
        times = cuda_times(fill.zero_, args.iters)
        row = {"config": "fill", "tokens": n, **_stats(times, table_bytes)}
        doc["rows"].append(row)
        print(json.dumps(row), flush=True)
        del fill, theirs, first
        torch.cuda.empty_cache()
    text_out = json.dumps(doc, indent=1)
    if args.out:
        args.out.write_text(text_out + "\n")
    print(text_out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
