"""`fastpath capture` throughput, fast path vs transformers' fallback in the same call (GPU).

Usage (one GPU, FLA installed for the gated delta rule's fast path):
    python benchmarks/capture_speed.py --out benchmarks/results/capture_speed
Runs the 8-layer Qwen3.5-27B-shaped preset (random weights, bf16) over synthetic rows of
--max-len tokens, with verification on as `fastpath capture` runs it (every row's tensor checks,
the first row and every --check-every-th row re-run on the reference path; the default is
capture's own, 256), writing the speculators layout to a scratch
directory (/dev/shm when present, so the disk does not set the pace) that is deleted afterwards.

Fixed costs and the steady state are measured apart. Per path:
  warm-up  an untimed-in-the-loop capture of one batch (Triton compiles and autotunes here on a
           cold cache): its wall seconds are the first batch's fixed cost (`fixed_s.first_batch`);
  short    a capture of --short-rows rows;
  long     a capture of --rows rows (the headline tokens/s, as before);
  forward  the plain forward of the long run's batches: the same decoder, the same routing, no
           hooks, checks, copies or writes (`plain_forward`): the capture's "own forward".
The steady state is the difference long - short, per row: every per-run fixed cost (the staging
slots page-locked before the loop, `staging_alloc`; the first row's re-check; the last batch's
writes drained at the end) appears in both runs and cancels, so the window of rows - short-rows
rows gives the per-row cost of the loop. The capture overhead at steady state is (loop per row) /
(plain forward per row) - 1; the loop's host time per row by key (forward, checks, recheck,
stage, write_wait, sync, other; see fastpath.capture.run) says where the host spent it. The target
is <= 3 % on the fast path. Only the long run's rows are on disk at a time (4 states per token:
128 rows x 4096 tokens of the 27B shape are ~21 GB; more --rows need that much scratch space).
Also reported: tokens/s of each run, the GPU memory peak, fast/fallback against the 1.8x target,
also for the forwards alone. JSON to --out/capture_speed.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from model_profile import sync_points  # same folder: sys.path[0]

TARGET_RATIO = 1.8
OVERHEAD_TARGET_PCT = 3.0  # capture over the fast forward alone, same run, verification on


def _versions() -> dict[str, Any]:
    from importlib.metadata import PackageNotFoundError, version

    out: dict[str, Any] = {"python": platform.python_version()}
    for name in ("torch", "triton", "transformers", "fla-core", "flash-linear-attention", "causal-conv1d",
                 "safetensors"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = None
    import torch

    out["gpu"] = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    return out


def write_rows(path: Path, rows: int, length: int, vocab: int, seed: int) -> None:
    """Synthetic rows: random ids, loss mask on the last three quarters (a long 'answer')."""
    rng = random.Random(seed)
    with path.open("w") as fh:
        for _ in range(rows):
            ids = [rng.randrange(vocab) for _ in range(length)]
            mask = [0] * (length // 4) + [1] * (length - length // 4)
            fh.write(json.dumps({"input_ids": ids, "loss_mask": mask}) + "\n")


def _run_summary(done: Any) -> dict[str, Any]:
    return {"rows": done.rows, "tokens": done.tokens, "seconds": round(done.seconds, 4),
            "tokens_per_s": round(done.tokens_per_s, 1), "timings_s": dict(done.timings)}


def steady_state(short: dict[str, Any], long: dict[str, Any], forward_s_per_row: float | None) -> dict[str, Any] | None:
    """Per-row cost of the loop over the rows the long run has beyond the short one (long -
    short: the fixed costs both runs pay cancel), against the plain forward's per-row time
    (`plain_forward`). None when the window is empty or the forward was not timed."""
    rows = long["rows"] - short["rows"]
    if rows <= 0 or not forward_s_per_row:
        return None
    loop = (long["seconds"] - short["seconds"]) / rows
    per_key = {k: (long["timings_s"].get(k, 0.0) - short["timings_s"].get(k, 0.0)) / rows
               for k in long["timings_s"] if k != "staging_alloc"}
    tokens = (long["tokens"] - short["tokens"]) / rows
    return {
        "window_rows": rows,
        "loop_ms_per_row": round(1e3 * loop, 3),
        "forward_ms_per_row": round(1e3 * forward_s_per_row, 3),
        "overhead_ms_per_row": round(1e3 * (loop - forward_s_per_row), 3),
        # the loop's host time per row by key (capture.run's module doc); adds up to loop_ms_per_row
        "host_split_ms_per_row": {k: round(1e3 * v, 3) for k, v in per_key.items()},
        "tokens_per_s": round(tokens / loop, 1) if loop > 0 else None,
        "forward_tokens_per_s": round(tokens / forward_s_per_row, 1),
        "overhead_over_forward_pct": round(100 * (loop / forward_s_per_row - 1), 2),
    }


def plain_forward(built: Any, rows_file: Path, batch_tokens: int, fast: bool) -> dict[str, Any]:
    """The capture's own forward without the capture: the same batches of the same rows through
    the same decoder (fastpath enabled as capture enables it, or not), no hooks, no checks, no
    copies, the device synchronised once at the end. A first batch runs untimed."""
    import torch

    import fastpath
    from fastpath.capture.layers import decoder_parts
    from fastpath.capture.packing import make_batches

    rows = [json.loads(line)["input_ids"] for line in rows_file.read_text().splitlines() if line.strip()]
    batches = make_batches([len(r) for r in rows], batch_tokens)
    base = decoder_parts(built.model).base
    device = next(built.model.parameters()).device
    inputs = [torch.tensor([rows[i] for i in batch], device=device) for batch in batches]  # equal lengths: no padding
    if fast:
        fastpath.enable(warn=False)
    try:
        with torch.no_grad():
            base(input_ids=inputs[0], use_cache=False)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            began = time.perf_counter()
            for ids in inputs:
                base(input_ids=ids, use_cache=False)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            seconds = time.perf_counter() - began
    finally:
        fastpath.disable()
    return {"rows": len(rows), "batches": len(batches), "seconds": round(seconds, 4),
            "s_per_row": seconds / len(rows), "tokens_per_s": round(sum(len(r) for r in rows) / seconds, 1)}


def _device_profile(run: Any, cuda: bool, trace: Path | None = None) -> dict[str, Any]:
    """Wall time of run() and the device time by kernel (torch.profiler): which kernels the
    capture adds to the forward, and how much of the wall the device was busy computing. With
    `trace`, the timeline too (Chrome trace format, gzipped): where the device's gaps sit."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        began = time.perf_counter()
        run()
        if cuda:
            torch.cuda.synchronize()
        wall = time.perf_counter() - began
    if trace is not None:
        import gzip

        raw = trace.with_suffix("")
        prof.export_chrome_trace(str(raw))
        with raw.open("rb") as src, gzip.open(trace, "wb") as dst:
            shutil.copyfileobj(src, dst)
        raw.unlink()
    kernels = _device_ms_by_kernel(prof)
    compute = sum(v for k, v in kernels.items() if not k.startswith(("Memcpy", "Memset")))
    copies = sum(v for k, v in kernels.items() if k.startswith(("Memcpy", "Memset")))
    return {"wall_ms": round(1e3 * wall, 3), "device_compute_ms": round(compute, 3), "device_copy_ms": round(copies, 3),
            "device_idle_ms": round(max(0.0, 1e3 * wall - compute), 3),
            "top": [{"name": k[:100], "ms": round(v, 3)} for k, v in sorted(kernels.items(), key=lambda kv: -kv[1])[:20]],
            "kernels": kernels}


def _device_ms_by_kernel(prof: Any) -> dict[str, float]:
    """Device milliseconds per kernel / copy name (self time, so nothing counts twice)."""
    out: dict[str, float] = {}
    for event in prof.key_averages():
        us = getattr(event, "self_device_time_total", None)
        if us is None:
            us = getattr(event, "self_cuda_time_total", 0)
        if us and getattr(event, "device_type", None) is not None and "CUDA" in str(event.device_type):
            out[event.key] = out.get(event.key, 0.0) + us / 1e3
    return out


def _without_file_writes(capture: Any) -> Any:
    """capture() with every row file reduced to an empty one (an experiment, never a product
    setting): the loop's cost of writing, the host threads' share included, is the difference."""
    from fastpath.capture.writers import SpecForgeWriter, SpeculatorsWriter

    def touch(self: Any, idx: int, *_args: Any, **_kwargs: Any) -> None:
        path = self.row_paths(idx)[0]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()

    saved = {cls: cls.write_row for cls in (SpeculatorsWriter, SpecForgeWriter)}
    for cls in saved:
        cls.write_row = touch
    try:
        return capture()
    finally:
        for cls, write_row in saved.items():
            cls.write_row = write_row


def diagnose(capture: Any, forward: Any, cuda: bool, trace: Path | None = None) -> dict[str, Any]:
    """Where a capture's time goes beyond its forward, on the --short-rows rows: the loop with and
    without its file writes, the sync points inside the loop, and device profiles of the capture
    and of the plain forward side by side, with the kernels only the capture runs."""
    with_writes, without = capture(), _without_file_writes(capture)
    out: dict[str, Any] = {
        "loop_ms_per_row": {"with_writes": round(1e3 * with_writes.seconds / with_writes.rows, 3),
                            "without_file_writes": round(1e3 * without.seconds / without.rows, 3)},
        "sync_points": sync_points(capture) if cuda else None,
    }
    cap, fwd = _device_profile(capture, cuda, trace), _device_profile(forward, cuda)
    extra = {k: round(v - fwd["kernels"].get(k, 0.0), 3) for k, v in cap["kernels"].items()}
    out["capture"] = {k: v for k, v in cap.items() if k != "kernels"}
    out["plain_forward"] = {k: v for k, v in fwd.items() if k != "kernels"}
    out["capture_trace"] = str(trace) if trace is not None else None
    out["capture_minus_forward_ms"] = dict(sorted(((k, v) for k, v in extra.items() if abs(v) >= 0.05),
                                                  key=lambda kv: -kv[1])[:25])
    return out


def run_path(name: str, args: argparse.Namespace, data: Path, short: Path | None, warm: Path, scratch: Path,
             built: Any) -> dict[str, Any]:
    import torch

    import fastpath
    from fastpath.capture.options import CaptureOptions
    from fastpath.capture.run import run_capture
    from fastpath.shared.errors import FastpathError

    def opts(rows_file: Path, out: Path) -> CaptureOptions:
        return CaptureOptions(
            model=args.model, data=str(rows_file), out=str(out), format="speculators", max_len=args.max_len,
            batch_tokens=args.batch_tokens, dtype=args.dtype, device=args.device, model_layers=args.layers,
            allow_slow=name == "fallback" or args.allow_slow_fast_path, reference_path=name == "fallback",
            check_every=args.check_every, recheck_tokens=args.recheck_tokens, write_threads=args.write_threads,
            progress=False, prebuilt=built,
        )

    cuda = args.device == "cuda"

    written: dict[str, int] = {}

    def capture(rows_file: Path, label: str) -> Any:
        out = scratch / f"{name}-{label}"
        try:
            done = run_capture(opts(rows_file, out))
            written[label] = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
            return done
        finally:
            shutil.rmtree(out, ignore_errors=True)  # one run's rows on disk at a time

    result: dict[str, Any] = {"path": name}
    try:
        began = time.perf_counter()
        first = capture(warm, "warm")
        if cuda:
            torch.cuda.synchronize()
        warm_wall = time.perf_counter() - began
        short_run = _run_summary(capture(short, "short")) if short is not None else None
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        done = capture(data, "long")
        if cuda:
            torch.cuda.synchronize()
        long_run = _run_summary(done)
        forward = plain_forward(built, data, args.batch_tokens, fast=name == "fast")
        steady = steady_state(short_run, long_run, forward["s_per_row"]) if short_run is not None else None
        if args.diagnose and short is not None:
            result["diagnosis"] = diagnose(lambda: capture(short, "diagnose"),
                                           lambda: plain_forward(built, short, args.batch_tokens, fast=name == "fast"),
                                           cuda, Path(args.out) / f"capture_trace_{name}.json.gz")
        result.update({
            "ok": True, "rows": done.rows, "tokens": done.tokens, "seconds": round(done.seconds, 3),
            "tokens_per_s": round(done.tokens_per_s, 1),
            "timings_s": done.timings,
            "plain_forward": forward,
            "forward_tokens_per_s": forward["tokens_per_s"],
            # the long run whole (fixed costs in) against the plain forward of the same rows
            "overhead_over_forward_pct": round(100 * (done.seconds / (forward["s_per_row"] * done.rows) - 1), 2),
            "steady_state": steady,
            "fixed_s": {
                # the warm-up capture of one batch: compiles, autotunes and first-use allocations
                "first_batch": round(warm_wall, 3),
                "first_batch_loop": round(first.seconds, 3),
                "staging_alloc": done.timings.get("staging_alloc"),
                # what the long run spent beyond its rows at the steady rate (first re-check, drain)
                "long_run_beyond_steady": (round(done.seconds - done.rows * steady["loop_ms_per_row"] / 1e3, 3)
                                           if steady else None),
            },
            "runs": {"warmup": _run_summary(first), "short": short_run, "long": long_run},
            "peak_gpu_memory_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2) if cuda else None,
            "rows_rechecked": len(done.checked),
            "recheck_worst_rel": max((c["rel"] for c in done.checked), default=None),
            "capture_path": done.path,
            "bytes_written": written.get("long"),
        })
    except FastpathError as exc:
        result.update({"ok": False, "error": str(exc).splitlines()[0]})
    finally:
        fastpath.disable()
        if cuda:
            torch.cuda.empty_cache()
    return result


def overhead_line(paths: dict[str, dict[str, Any]]) -> str:
    """The one sentence the benchmark is for: the fast path's capture overhead at steady state."""
    fast = paths.get("fast", {})
    steady = fast.get("steady_state")
    if steady is not None:
        return (f"capture overhead at steady state: {steady['overhead_over_forward_pct']:.2f} % "
                f"(target <= {OVERHEAD_TARGET_PCT:g} %; {steady['overhead_ms_per_row']:.2f} ms per row over a "
                f"{steady['forward_ms_per_row']:.2f} ms forward, window of {steady['window_rows']} rows)")
    if fast.get("overhead_over_forward_pct") is not None:
        return (f"capture overhead at steady state: not measured (--short-rows 0 or an empty window); whole run, "
                f"fixed costs included: {fast['overhead_over_forward_pct']:.2f} % (target <= {OVERHEAD_TARGET_PCT:g} %)")
    return f"capture overhead at steady state: not measured (fast path: {fast.get('error', 'not run')})"


def main() -> int:
    from fastpath.capture.options import CaptureOptions

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="directory for capture_speed.json")
    parser.add_argument("--model", default="qwen3.5-27b", help="preset/config (random weights)")
    parser.add_argument("--layers", type=int, default=8, help="cut the preset to N layers (8)")
    parser.add_argument("--max-len", type=int, default=4096)
    parser.add_argument("--rows", type=int, default=128, help="rows of the long timed capture per path (128)")
    parser.add_argument("--short-rows", type=int, default=32,
                        help="rows of the short capture; the steady state is long - short (32; 0: skip it)")
    parser.add_argument("--batch-tokens", type=int, default=16384)
    parser.add_argument("--dtype", default="bf16")
    parser.add_argument("--check-every", type=int, default=CaptureOptions.check_every,
                        help="reference re-check every Nth row (`fastpath capture`'s own default, "
                             f"{CaptureOptions.check_every}: the verification users run)")
    parser.add_argument("--recheck-tokens", type=int, default=1024,
                        help="leading tokens of a re-checked row run on the reference path (1024; 0: all)")
    parser.add_argument("--write-threads", type=int, default=4, help="background row writers (4)")
    parser.add_argument("--paths", default="fast,fallback", help="which paths to time (fast,fallback)")
    parser.add_argument("--device", default="cuda", help="cuda; cpu only to smoke-test the script (tiny configs)")
    parser.add_argument("--allow-slow-fast-path", action="store_true",
                        help="smoke tests on CPU: let the 'fast' run proceed where an op has no fast path")
    parser.add_argument("--diagnose", action="store_true",
                        help="also profile the --short-rows capture and its plain forward (device time by "
                             "kernel, idle time; the capture's timeline to --out/capture_trace_PATH.json.gz), "
                             "time it without file writes and list the loop's host<-device sync points")
    parser.add_argument("--scratch", default=None, help="where rows are written (default /dev/shm or tmp)")
    args = parser.parse_args()
    names = [n for n in args.paths.split(",") if n]
    if not names or any(n not in ("fast", "fallback") for n in names):
        print(f"capture_speed: --paths takes fast and/or fallback, got {args.paths!r}", file=sys.stderr)
        return 2
    if args.rows < 1 or not 0 <= args.short_rows < args.rows:
        print(f"capture_speed: need --rows >= 1 and 0 <= --short-rows < --rows, got {args.rows} and "
              f"{args.short_rows}", file=sys.stderr)
        return 2

    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("capture_speed: needs a CUDA GPU (--device cpu only smoke-tests the script)", file=sys.stderr)
        return 2
    from fastpath.models.resolve import resolve_source, transformers_config

    config = transformers_config(resolve_source(args.model).config, args.layers)
    vocab = int(config.vocab_size)
    # 4 states per token in bf16/fp16 (fp32: twice), one path's rows on disk at a time, +25%
    need = int(args.rows * args.max_len * 4 * int(config.hidden_size) * (4 if args.dtype in ("fp32", "float32") else 2) * 1.25)
    base = args.scratch
    if base is None and os.path.isdir("/dev/shm") and shutil.disk_usage("/dev/shm").free > need:
        base = "/dev/shm"  # a container's /dev/shm is often 64 MB: then the default temp dir
    scratch = Path(tempfile.mkdtemp(prefix="fastpath-capture-", dir=base))
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    try:
        data, warm = scratch / "rows.jsonl", scratch / "warm.jsonl"
        short = scratch / "short.jsonl" if args.short_rows else None
        write_rows(data, args.rows, args.max_len, vocab, seed=0)
        if short is not None:
            write_rows(short, args.short_rows, args.max_len, vocab, seed=0)
        write_rows(warm, max(1, args.batch_tokens // args.max_len), args.max_len, vocab, seed=1)
        from fastpath.capture.options import CaptureOptions
        from fastpath.capture.target import load_target

        built = load_target(CaptureOptions(model=args.model, data="", out="", dtype=args.dtype,
                                           model_layers=args.layers), torch.device(args.device))
        paths = {}
        for name in names:
            paths[name] = run_path(name, args, data, short, warm, scratch, built)
            print(f"capture_speed: {name}: {json.dumps(paths[name])}", file=sys.stderr, flush=True)
            if paths[name].get("ok"):
                split = ", ".join(f"{k} {v:.3f}" for k, v in paths[name]["timings_s"].items())
                print(f"capture_speed: {name}: {paths[name]['tokens_per_s']:,.0f} tok/s over "
                      f"{paths[name]['seconds']:.2f} s; seconds: {split}", file=sys.stderr, flush=True)
                fixed = paths[name]["fixed_s"]
                print(f"capture_speed: {name}: fixed costs: first batch {fixed['first_batch']:.2f} s (compiles, "
                      f"autotuning, first-use allocations), staging allocation {fixed['staging_alloc']} s",
                      file=sys.stderr, flush=True)
                steady = paths[name]["steady_state"]
                if steady:
                    print(f"capture_speed: {name}: steady state over {steady['window_rows']} rows: "
                          f"{steady['loop_ms_per_row']:.2f} ms/row, forward {steady['forward_ms_per_row']:.2f} "
                          f"ms/row, overhead {steady['overhead_over_forward_pct']:.2f} %", file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    fast, slow = paths.get("fast", {}), paths.get("fallback", {})
    both = fast.get("ok") and slow.get("ok")
    ratio = (fast["tokens_per_s"] / slow["tokens_per_s"]) if both else None
    forward_ratio = (fast["forward_tokens_per_s"] / slow["forward_tokens_per_s"]
                     if both and fast["forward_tokens_per_s"] and slow["forward_tokens_per_s"] else None)
    steady_pct = (fast.get("steady_state") or {}).get("overhead_over_forward_pct")
    window = args.rows - args.short_rows
    notes = []
    if args.short_rows and args.check_every and window % args.check_every:
        notes.append(f"the window of {window} rows is not a multiple of --check-every {args.check_every}: the "
                     "re-checks it holds are not exactly the steady rate of one per --check-every rows")
    if args.device != "cuda" or os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        notes.append("CPU / Triton interpreter: a smoke test of the script, not timing data")
    judged = steady_pct if steady_pct is not None else fast.get("overhead_over_forward_pct")
    report = {
        "benchmark": "capture_speed",
        "when": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "versions": _versions(),
        "config": {k: getattr(args, k) for k in ("model", "layers", "max_len", "rows", "short_rows", "batch_tokens", "dtype",
                                                  "check_every", "recheck_tokens", "write_threads", "device")},
        "scratch_dir": str(base or tempfile.gettempdir()),
        "scratch_bytes_needed": need,
        "paths": paths,
        "fast_over_fallback": round(ratio, 3) if ratio else None,
        "fast_over_fallback_forward_only": round(forward_ratio, 3) if forward_ratio else None,
        "target": TARGET_RATIO,
        "met": bool(ratio and ratio >= TARGET_RATIO),
        "fast_capture_overhead_pct": fast.get("overhead_over_forward_pct"),  # the long run whole, fixed costs in
        "fast_capture_overhead_steady_pct": steady_pct,
        "overhead_target_pct": OVERHEAD_TARGET_PCT,
        # judged at steady state where measured, else on the whole long run
        "overhead_met": judged is not None and judged <= OVERHEAD_TARGET_PCT,
        "overhead_statement": overhead_line(paths),
        "wall_s": round(time.perf_counter() - started, 1),
        "notes": notes,
    }
    (out_dir / "capture_speed.json").write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({k: report[k] for k in ("fast_over_fallback", "fast_over_fallback_forward_only", "target",
                                              "met", "fast_capture_overhead_pct", "fast_capture_overhead_steady_pct",
                                              "overhead_met", "wall_s")}))
    print(report["overhead_statement"])
    return 0 if all(p.get("ok") for p in paths.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
