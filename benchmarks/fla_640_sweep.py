"""Try to reproduce FLA #640 on this GPU: FLA's gated chunk_bwd_dqkwg against fastpath's reference.

https://github.com/fla-org/flash-linear-attention/issues/640 reports wrong dk (rel. error 14.65)
from FLA's gated `chunk_bwd_dqkwg` on Hopper with Triton >= 3.4 at key block BK=64 (H20, head dim
100); FLA now refuses the op on Hopper for Triton [3.4, 3.7.1). This script runs FLA's kernel with
the refusal switched off (fastpath.routing.fla_selfcheck.unguarded_fla_dqkwg) through the same
self-check the route uses (seeds x chunks, global + per-chunk errors, bitwise repeat) over:

* tiling 32 / 64 / 128: FLA picks BK = BV = min(next_pow2(head dim), tiling) from the GPU's
  shared memory (128 on Hopper); the sweep forces each tiling by answering FLA's
  `check_shared_mem` in a copy of its function's globals (FLA's module is not modified);
* head dims 64 / 100 / 128 / 256 (K = V), chunk size BT 64 (and 32 / 128 with --all);
* 4 and 32 chunks per sequence; bf16 and fp16.

FLA's autotuner picks num_warps / num_stages per configuration as it would in training; the chosen
launch config is recorded per row. Each case is a few hundred ms after compilation; compiling
costs most of the time, so --budget-s stops starting new cases and lists what was skipped.

usage: python benchmarks/fla_640_sweep.py --out DIR [--budget-s 150] [--all] [--tilings 128,64,32]
Writes DIR/fla_640_sweep.json (fla_640_sweep_t<T>.json for a subset of tilings) after every case;
exit 0 when it ran (failures are findings, not errors), 2 without CUDA or FLA.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
import types
from pathlib import Path
from typing import Any

TILINGS = (128, 64, 32)
HEAD_DIMS = (128, 100, 64, 256)
CHUNK_COUNTS = (32, 4)
DTYPES = ("bfloat16", "float16")


def with_tiling(fla_fn: Any, tiling: int) -> Any:
    """FLA's (unguarded) chunk_bwd_dqkwg whose `check_shared_mem` answers so that its CONST_TILING
    is `tiling` (fla/ops/common/chunk_o.py: hopper -> 128, ampere 16-bit -> 128, ada -> 64, else
    32; ampere with fp32 operands -> 64)."""
    arch = {128: "hopper", 64: "ada", 32: None}[tiling]

    def check_shared_mem(name: str = "none", *_args: Any, **_kw: Any) -> bool:
        return name == arch

    glb = {**fla_fn.__globals__, "check_shared_mem": check_shared_mem}
    clone = types.FunctionType(fla_fn.__code__, glb, fla_fn.__name__, fla_fn.__defaults__,
                               fla_fn.__closure__)
    clone.__kwdefaults__ = fla_fn.__kwdefaults__
    return clone


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="output directory")
    ap.add_argument("--budget-s", type=float, default=150.0,
                    help="stop starting new cases after this many seconds (default 150)")
    ap.add_argument("--all", action="store_true", help="also chunk sizes 32 and 128")
    ap.add_argument("--heads", default="2,6", help="H,HV (default 2,6: grouped like Qwen3.5)")
    ap.add_argument("--tilings", default=",".join(str(t) for t in TILINGS),
                    help="comma list of tilings to run (one process per tiling runs the 48 cases in "
                         "parallel: compiling and autotuning, on the CPU, is most of each case)")
    args = ap.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("fla_640_sweep: error: needs a CUDA device", file=sys.stderr)
        return 2
    from fastpath.kernels.gated_delta_rule.interface import chunk_bwd_dqkwg
    from fastpath.routing import fla_selfcheck
    from fastpath.shared.known_issues import fla_640

    fla_fn = fla_selfcheck.unguarded_fla_dqkwg()
    if fla_fn is None:
        print("fla_640_sweep: error: fla (fla-core) with chunk_bwd_dqkwg is not importable",
              file=sys.stderr)
        return 2
    import triton

    H, HV = (int(x) for x in args.heads.split(","))
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    cc = torch.cuda.get_device_capability()
    doc: dict[str, Any] = {
        "device": torch.cuda.get_device_name(), "capability": list(cc), "torch": torch.__version__,
        "triton": triton.__version__, "fla_640_affected_here": fla_640(cc, triton.__version__, False),
        "heads": [H, HV], "rows": [], "skipped": [],
    }
    chunk_sizes = (64, 32, 128) if args.all else (64,)
    tilings = tuple(int(t) for t in args.tilings.split(",") if t.strip())
    cases = list(itertools.product(chunk_sizes, tilings, HEAD_DIMS, DTYPES, CHUNK_COUNTS))
    name = "fla_640_sweep.json" if tilings == TILINGS else f"fla_640_sweep_t{'-'.join(map(str, tilings))}.json"
    start = time.perf_counter()
    for bt, tiling, dim, dtype, n_chunks in cases:
        case = {"BT": bt, "tiling": tiling, "K": dim, "V": dim, "dtype": dtype, "chunks": n_chunks,
                "BK": min(max(triton.next_power_of_2(dim), 16), tiling)}
        if time.perf_counter() - start > args.budget_s:
            doc["skipped"].append(case)
            continue
        config = fla_selfcheck.DqkwgConfig(H=H, HV=HV, K=dim, V=dim, BT=bt, dtype=dtype,
                                           state_dtype=dtype, use_w=True, state_v_first=False,
                                           varlen=False)
        t0 = time.perf_counter()
        res = fla_selfcheck.run_selfcheck(with_tiling(fla_fn, tiling), chunk_bwd_dqkwg, config,
                                          "cuda", n_chunks=n_chunks)
        torch.cuda.synchronize()
        row = dict(case, passed=res.passed, reason=res.reason, errors=res.errors,
                   chunk_errors=res.chunk_errors, deterministic=res.deterministic,
                   kernel_config=fla_selfcheck.fla_kernel_config(),
                   seconds=round(time.perf_counter() - t0, 2))
        doc["rows"].append(row)
        print(json.dumps(row), flush=True)
        (out_dir / name).write_text(json.dumps(doc, indent=1, default=str))  # kept if killed
    fails = [r for r in doc["rows"] if not r["passed"]]
    doc["summary"] = {"ran": len(doc["rows"]), "failed": len(fails), "skipped": len(doc["skipped"]),
                      "failing_cases": [{k: r[k] for k in ("BT", "tiling", "BK", "K", "dtype", "chunks",
                                                           "reason")} for r in fails]}
    (out_dir / name).write_text(json.dumps(doc, indent=1, default=str))
    print(json.dumps(doc["summary"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
