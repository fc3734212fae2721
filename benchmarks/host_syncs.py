"""Host <- device synchronisations a piece of work makes on a GPU, by the Python line that asked.

A sync in the middle of a step leaves the GPU idle while the host launches the next kernels, so
a step whose kernels add up to less than its wall time usually has one. torch's sync debug mode
(`torch.cuda.set_sync_debug_mode`, https://pytorch.org/docs/stable/generated/torch.cuda.set_sync_debug_mode.html)
warns at each synchronising call; the warning's location is the Python line that made it.
"""

from __future__ import annotations

import collections
import warnings
from collections.abc import Callable
from typing import Any


def sync_points(run: Callable[[], Any], top: int = 30) -> list[dict[str, Any]]:
    """[{where: "file:line", what: first line of the warning, count}] of one `run()` (CUDA only)."""
    import torch

    seen: collections.Counter[tuple[str, str]] = collections.Counter()

    def note(message: Any, category: Any, filename: str, lineno: int, file: Any = None, line: Any = None) -> None:
        seen[(f"{filename}:{lineno}", str(message).splitlines()[0][:120])] += 1

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        previous, warnings.showwarning = warnings.showwarning, note
        torch.cuda.set_sync_debug_mode(1)
        try:
            run()
        finally:
            torch.cuda.set_sync_debug_mode(0)
            warnings.showwarning = previous
    return [{"where": where, "what": what, "count": n} for (where, what), n in seen.most_common(top)]


def main(argv: list[str] | None = None) -> int:
    """Every sync of bench's phases on a preset cut, fastpath enabled (CUDA only)."""
    import argparse
    import json

    ap = argparse.ArgumentParser(description="host syncs of fastpath bench's phases, by Python line (CUDA)")
    ap.add_argument("--model", default="qwen3.5-27b")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=4096)
    ap.add_argument("--phases", default="prefill,train")
    args = ap.parse_args(argv)
    from fastpath.proof.bench_spec import PHASE_REGISTRY, BenchSettings

    phases = args.phases.split(",")
    unknown = [p for p in phases if p not in PHASE_REGISTRY]
    if unknown:
        print(f"host_syncs: unknown phase {', '.join(unknown)} (known: {', '.join(PHASE_REGISTRY)})")
        return 2
    import torch

    if not torch.cuda.is_available():
        print("host_syncs: needs a CUDA GPU (torch's sync debug mode)")
        return 2
    from fastpath.models.build import build_model
    from fastpath.routing.engine import enable

    enable(warn=False)
    settings = BenchSettings(source=args.model, layers=args.layers, dtype="bf16", device="cuda",
                             seq_len=args.seq_len, batch=1)
    built = build_model(args.model, layers=args.layers, dtype="bf16", device="cuda", seed=0)
    ids = torch.randint(0, built.vocab_size, (1, args.seq_len), device="cuda")
    found = {}
    for name in phases:
        fn, _setup, _ = PHASE_REGISTRY[name].runner(built.model, ids, settings)
        fn()  # compiles and autotunes outside the scan
        torch.cuda.synchronize()
        found[name] = sync_points(fn)
    print(json.dumps(found, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
