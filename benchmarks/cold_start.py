"""Cold start: seconds from a process's start to its model built, its first prefill and its first
training step, on an empty Triton cache, on a warm one, and after `fastpath warmup`.

Usage (one GPU; FLA installed for the gated delta rule's fast path):
    python benchmarks/cold_start.py --model qwen3.5-27b --layers 8 --out DIR
CPU smoke test (tiny config; kernels in Triton's interpreter, the numbers mean nothing):
    TRITON_INTERPRET=1 python benchmarks/cold_start.py --model tiny.json --device cpu \\
        --batch 1 --seq 16 --dtype fp32 --out DIR

Each measurement is one fresh process (`--child`), with TRITON_CACHE_DIR set to a folder this
script makes (tempfile), so "cold" means what a new machine sees: nothing compiled, nothing
autotuned. Per configuration (`--configs`, bench's names: reference = transformers' torch
fallbacks with Dao causal-conv1d and FLA hidden, fastpath = enable()):
  shipped a new empty cache folder, FASTPATH_AUTOTUNE_DECISIONS unset: enable() seeds the
          decisions fastpath ships for this GPU's compute capability, if any (what a user's
          first process on a new machine gets; fastpath configs only);
  cold    a new empty cache folder, no decisions seeded (FASTPATH_AUTOTUNE_DECISIONS=off);
  warm    a second process on the same folder (what every later job on the host sees);
  warmup  a new empty folder, `fastpath warmup MODEL --train --save-decisions` at the same
          shapes first (timed apart), then the process (what a fleet that warms once sees);
  seeded  a new empty folder, but the autotune decisions the warmup saved (or --decisions FILE)
          handed to the autotuners after enable() (routing/autotune_decisions.py): an empty cache
          that compiles only the chosen configs. warmup and seeded: fastpath configs only.
Marks, in seconds since the process was started (the parent's clock, so interpreter start-up and
imports count): imports, enable (fastpath), built, first_prefill (one no-grad forward over
batch x seq, synchronised), first_train (one forward+backward of a next-token loss). The targets
read two differences: first prefill done at most 20 s after the model is built, the first training
step at most 30 s. Also the cache entries each process added (kernels, autotune decisions).
JSON goes to --out/cold_start.json, rewritten after every measurement; the warmup's autotune
decisions to --out/autotune-decisions-CONFIG.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
TARGET_PREFILL_AFTER_BUILD_S = 20.0
TARGET_TRAIN_STEP_S = 30.0
SCENARIOS = ("shipped", "cold", "warm", "warmup", "seeded")
SHIPPED = "shipped"  # the decisions marker for _env: leave FASTPATH_AUTOTUNE_DECISIONS unset
MARKS = ("imports", "enable", "seeded", "built", "first_prefill", "first_train")
NOT_FAST = "fastpath warmup and autotune decisions are for the fast path; this configuration does not enable it"


# ---------------------------------------------------------------------------------------------
# The measured process


def child(job: dict[str, Any]) -> dict[str, Any]:
    """One measurement in this fresh process: marks in seconds since job['t0'] (epoch seconds
    the parent read just before starting it)."""
    t0 = float(job["t0"])
    marks: dict[str, float] = {}

    def mark(name: str) -> None:
        marks[name] = round(time.time() - t0, 3)

    from fastpath.proof.bench_spec import CONFIGS, PHASE_REGISTRY, BenchSettings

    spec = CONFIGS[job["config"]]
    for name in spec.hide:  # as bench's worker does: transformers then binds its torch fallbacks
        sys.modules[name] = None  # type: ignore[assignment]
    import torch

    from fastpath.models.build import build_model
    from fastpath.routing import engine as routes

    mark("imports")
    result: dict[str, Any] = {}
    if spec.enable:
        report = routes.enable(warn=False)  # hands FASTPATH_AUTOTUNE_DECISIONS to the autotuners
        mark("enable")
        seeded = [n for n in report.notes if n.startswith("autotune decisions")]
        if seeded:
            result["decisions"] = seeded[0]
            mark("seeded")
    built = build_model(job["model"], layers=job["layers"], dtype=job["dtype"], device=job["device"], seed=0)
    device = built.device
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize(device)
    mark("built")
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, built.vocab_size, (job["batch"], job["seq"]), generator=gen).to(device)
    settings = BenchSettings(source=job["model"], layers=job["layers"], dtype=job["dtype"], device=str(device),
                             seq_len=job["seq"], batch=job["batch"])
    for phase, label in (("prefill", "first_prefill"), ("train", "first_train")):
        runner = PHASE_REGISTRY[phase].runner
        assert runner is not None
        fn, setup, _tokens = runner(built.model, ids, settings)
        if setup is not None:
            setup()
        fn()
        if cuda:
            torch.cuda.synchronize(device)
        mark(label)
    result.update({"marks_s": marks, "model": built.describe()})
    if cuda:
        result["peak_gpu_memory_gib"] = round(torch.cuda.max_memory_allocated(device) / 2**30, 2)
    return result


# ---------------------------------------------------------------------------------------------
# The parent


def _env(cache: Path, decisions: Path | str | None = None) -> dict[str, str]:
    env = dict(os.environ)
    # seeded: the given file; shipped: whatever enable() picks by itself; the others: none
    env.pop("FASTPATH_AUTOTUNE_DECISIONS", None)
    if decisions != SHIPPED:
        env["FASTPATH_AUTOTUNE_DECISIONS"] = str(decisions) if decisions is not None else "off"
    env["TRITON_CACHE_DIR"] = str(cache)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SRC), env.get("PYTHONPATH")) if p)
    env.setdefault("USE_HUB_KERNELS", "0")
    return env


def _cache_count(cache: Path) -> dict[str, int]:
    from fastpath.proof.warmup import count_cache

    count = count_cache(cache)
    return {"kernels": count.kernels, "autotune": count.autotune}


def _last_line(text: str) -> str:
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return lines[-1] if lines else "no output"


def measure(args: argparse.Namespace, config: str, cache: Path, scenario: str, work: Path,
            decisions: Path | str | None = None) -> dict[str, Any]:
    """One child process on `cache`; its marks, what it added to the cache, its exit status."""
    job = {"config": config, "model": args.model, "layers": args.layers, "batch": args.batch, "seq": args.seq,
           "dtype": args.dtype, "device": args.device}
    before = _cache_count(cache)
    result_path = work / f"{config}-{scenario}.json"
    job["result"] = str(result_path)
    job["t0"] = time.time()
    job_path = work / f"{config}-{scenario}.job.json"
    job_path.write_text(json.dumps(job))
    entry: dict[str, Any] = {"config": config, "scenario": scenario, "cache_dir": str(cache),
                             "cache_before": before}
    try:
        proc = subprocess.run([sys.executable, __file__, "--child", str(job_path)], env=_env(cache, decisions),
                              capture_output=True, text=True, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        entry["error"] = f"timed out after {args.timeout:g} s"
        return entry
    entry["wall_s"] = round(time.time() - job["t0"], 3)
    entry["cache_added"] = {k: v - before[k] for k, v in _cache_count(cache).items()}
    if proc.returncode != 0 or not result_path.exists():
        entry["error"] = f"exit {proc.returncode}: {_last_line(proc.stderr)}"
        return entry
    entry.update(json.loads(result_path.read_text()))
    marks = entry["marks_s"]
    entry["prefill_after_build_s"] = round(marks["first_prefill"] - marks["built"], 3)
    entry["train_step_s"] = round(marks["first_train"] - marks["first_prefill"], 3)
    entry["targets_met"] = {
        "prefill_after_build": entry["prefill_after_build_s"] <= TARGET_PREFILL_AFTER_BUILD_S,
        "train_step": entry["train_step_s"] <= TARGET_TRAIN_STEP_S,
    }
    return entry


def run_warmup(args: argparse.Namespace, cache: Path, decisions: Path) -> dict[str, Any]:
    """`fastpath warmup` on `cache` at the measured shapes, timed, its autotune decisions saved
    to `decisions`; its one line when it refuses."""
    argv = [sys.executable, "-m", "fastpath", "warmup", args.model, "--batch", str(args.batch),
            "--seq", str(args.seq), "--dtype", args.dtype, "--device", args.device, "--train",
            "--save-decisions", str(decisions)]
    if args.layers is not None:
        argv += ["--layers", str(args.layers)]
    start = time.time()
    try:
        proc = subprocess.run(argv, env=_env(cache), capture_output=True, text=True, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return {"command": argv[1:], "error": f"timed out after {args.timeout:g} s"}
    out: dict[str, Any] = {"command": argv[1:], "exit": proc.returncode, "seconds": round(time.time() - start, 3),
                           "cache_added": _cache_count(cache)}
    if proc.returncode != 0:
        out["refused" if proc.returncode in (2, 3) else "error"] = _last_line(proc.stderr)
    return out


def _line(entry: dict[str, Any]) -> str:
    head = f"{entry['config']:>10} {entry['scenario']:>6}:"
    if "skipped" in entry or "error" in entry:
        return f"{head} {entry.get('skipped') or entry.get('error')}"
    m = entry["marks_s"]
    met = entry["targets_met"]
    return (f"{head} built {m['built']:.1f} s, first prefill {m['first_prefill']:.1f} s "
            f"(+{entry['prefill_after_build_s']:.1f} s, target <= {TARGET_PREFILL_AFTER_BUILD_S:g}: "
            f"{'met' if met['prefill_after_build'] else 'NOT met'}), first train step +{entry['train_step_s']:.1f} s "
            f"(target <= {TARGET_TRAIN_STEP_S:g}: {'met' if met['train_step'] else 'NOT met'}); "
            f"compiled {entry['cache_added']['kernels']} kernels, {entry['cache_added']['autotune']} autotune decisions")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", help="directory for cold_start.json")
    parser.add_argument("--model", default="qwen3.5-27b", help="preset or config.json (random weights)")
    parser.add_argument("--layers", type=int, default=8, help="cut to N layers (8)")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--seq", type=int, default=4096)
    parser.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"])
    parser.add_argument("--device", default="cuda", help="cuda; cpu only smoke-tests the script (TRITON_INTERPRET=1)")
    parser.add_argument("--configs", default="reference,fastpath", help="bench's configuration names")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS), help=f"comma list of {', '.join(SCENARIOS)}")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per process (900)")
    parser.add_argument("--keep-caches", action="store_true", help="keep the cache folders (default: removed)")
    parser.add_argument("--decisions", default=None, metavar="FILE",
                        help="autotune decisions for the seeded scenario (default: the warmup scenario's)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if str(SRC) not in sys.path:
        sys.path.insert(0, str(SRC))
    if args.child:
        job = json.loads(Path(args.child).read_text())
        Path(job["result"]).write_text(json.dumps(child(job)))
        return 0
    if not args.out:
        parser.error("--out is required")
    from fastpath.proof.bench_spec import CONFIGS

    configs = [c for c in args.configs.split(",") if c]
    scenarios = [s for s in args.scenarios.split(",") if s]
    bad = [c for c in configs if c not in CONFIGS] + [s for s in scenarios if s not in SCENARIOS]
    if not configs or not scenarios or bad:
        print(f"cold_start: unknown config or scenario {bad[0] if bad else '(none given)'!r}; configs: "
              f"{', '.join(CONFIGS)}; scenarios: {', '.join(SCENARIOS)}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    base = Path(tempfile.mkdtemp(prefix="fastpath-cold-start-"))
    import signal

    def stop(signum: int, _frame: Any) -> None:  # `timeout`, a scheduler: no child outlives us
        raise KeyboardInterrupt(signum)

    signal.signal(signal.SIGTERM, stop)
    doc: dict[str, Any] = {
        "benchmark": "cold_start",
        "when": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "settings": {k: getattr(args, k) for k in ("model", "layers", "batch", "seq", "dtype", "device")}
        | {"configs": configs, "scenarios": scenarios},
        "environment": {k: os.environ.get(k) for k in ("TRITON_INTERPRET", "TRITON_CACHE_AUTOTUNING",
                                                          "FLA_CACHE_RESULTS", "FASTPATH_FLA_DQKWG")},
        "targets": {"prefill_after_build_s": TARGET_PREFILL_AFTER_BUILD_S, "train_step_s": TARGET_TRAIN_STEP_S},
        "not_timing_data": ("CPU / Triton interpreter: a smoke test of the script, not timing data"
                            if args.device == "cpu" or os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
                            else None),
        "runs": [],
    }

    def keep(entry: dict[str, Any]) -> None:
        doc["runs"].append(entry)
        (out / "cold_start.json").write_text(json.dumps(doc, indent=1) + "\n")
        print(f"cold_start: {_line(entry)}", file=sys.stderr, flush=True)

    interrupted = False
    try:
        for config in configs:
            work = base / config
            work.mkdir()
            if SHIPPED in scenarios:
                if not CONFIGS[config].enable:
                    keep({"config": config, "scenario": SHIPPED, "skipped": NOT_FAST})
                else:
                    shipped = work / "cache-shipped"
                    shipped.mkdir()
                    keep(measure(args, config, shipped, SHIPPED, work, SHIPPED))
            cold = work / "cache-cold"
            cold.mkdir()
            if "cold" in scenarios or "warm" in scenarios:
                keep(measure(args, config, cold, "cold", work))
            if "warm" in scenarios:
                keep(measure(args, config, cold, "warm", work))
            decisions = Path(args.decisions) if args.decisions else None
            if "warmup" in scenarios:
                if not CONFIGS[config].enable:
                    keep({"config": config, "scenario": "warmup", "skipped": NOT_FAST})
                else:
                    warmed = work / "cache-warmup"
                    warmed.mkdir()
                    saved = out / f"autotune-decisions-{config}.json"  # kept: the data to ship per GPU
                    warm = run_warmup(args, warmed, saved)
                    if warm.get("exit") != 0:
                        keep({"config": config, "scenario": "warmup", "warmup": warm,
                              "skipped": f"fastpath warmup did not warm: {warm.get('refused') or warm.get('error')}"})
                    else:
                        decisions = decisions or saved
                        entry = measure(args, config, warmed, "warmup", work)
                        entry["warmup"] = warm
                        keep(entry)
            if "seeded" in scenarios:
                if not CONFIGS[config].enable:
                    keep({"config": config, "scenario": "seeded", "skipped": NOT_FAST})
                elif decisions is None or not decisions.is_file():
                    keep({"config": config, "scenario": "seeded", "skipped": "no autotune decisions: the warmup "
                          "scenario saved none here (or pass --decisions FILE)"})
                else:
                    seeded = work / "cache-seeded"
                    seeded.mkdir()
                    entry = measure(args, config, seeded, "seeded", work, decisions)
                    entry["decisions_file"] = str(decisions)
                    keep(entry)
    except KeyboardInterrupt:  # subprocess.run killed the running child; what finished is on disk
        interrupted = True
        doc["interrupted"] = True
    finally:
        if args.keep_caches:
            print(f"cold_start: cache folders kept under {base}", file=sys.stderr)
        else:
            shutil.rmtree(base, ignore_errors=True)
    (out / "cold_start.json").write_text(json.dumps(doc, indent=1) + "\n")
    failed = [r for r in doc["runs"] if "error" in r]
    if interrupted:
        print(f"cold_start: interrupted; {len(doc['runs'])} measurements kept in {out / 'cold_start.json'}",
              file=sys.stderr)
        return 130
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
