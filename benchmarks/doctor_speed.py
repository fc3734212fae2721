"""`fastpath doctor` (full and static) next to `python -m torch.utils.collect_env`, same host,
same call: N interleaved runs of each, medians, JSON out; plus where a full probe's time goes.

Usage (on the GPU host, from the repository root; ~1-2 minutes):
    python3 benchmarks/doctor_speed.py --out OUTDIR [-n 5] [--model qwen3.5-27b] [--no-profile]

Writes OUTDIR/doctor_speed.json. Per run: wall seconds, exit code, CPU seconds of the process
tree (not inflated much by other load), the probe's own seconds and, for the full probe, the
seconds of each guarded import step and how many interpreters it started. The profile part times
single steps in fresh interpreters (import torch; + CUDA init; + device properties; Triton's
driver; each kernel package; transformers) so a regression can be pinned to its cause.
The issue's target: median full doctor <= median collect_env (ratio <= 1.0) on the GPU host.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

REPO_SRC = Path(__file__).resolve().parents[1] / "src"

COMMANDS = {
    "doctor_full": ["-m", "fastpath", "doctor", "--json"],
    "doctor_static": ["-m", "fastpath", "doctor", "--json", "--probe", "static"],
    "collect_env": ["-m", "torch.utils.collect_env"],
}

PROFILE = {
    "import torch": "import torch",
    "import torch + cuda.is_available()": "import torch; torch.cuda.is_available()",
    "import torch + device properties": (
        "import torch\nif torch.cuda.is_available(): torch.cuda.get_device_properties(0)"),
    "import triton + driver target": (
        "import triton\nfrom triton.runtime import driver\ndriver.active.get_current_target()"),
    "import torch + fla": "import torch, fla",
    "import torch + causal_conv1d": "import torch, causal_conv1d",
    "import torch + tilelang": "import torch, tilelang",
    "import transformers": "import transformers",
}
SRC = [REPO_SRC]  # --src replaces it (time another checkout's doctor, e.g. before a change)


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(SRC[0]), *filter(None, [env.get("PYTHONPATH")])])
    return env


def run_once(argv: list[str], timeout: float = 300) -> dict:
    """Wall and CPU seconds of one command (its whole process tree), exit code, probe timings."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, *argv], capture_output=True, text=True,
                          timeout=timeout, env=_env())
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = {"wall_s": round(wall, 3), "exit_code": proc.returncode,
           "cpu_s": round((after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), 3)}
    if argv[:2] == ["-m", "fastpath"]:
        try:
            report = json.loads(proc.stdout)
            probe = (report.get("facts") or {}).get("probe") or {}
            out["probe_s"] = probe.get("seconds")
            out["import_seconds"] = probe.get("import_seconds")
            out["import_interpreters"] = probe.get("import_interpreters")
            out["verdict"] = report.get("verdict")
        except (json.JSONDecodeError, AttributeError):
            out["stderr_tail"] = proc.stderr.strip().splitlines()[-1:] or None
    elif proc.returncode != 0:
        out["stderr_tail"] = proc.stderr.strip().splitlines()[-1:] or None
    return out


def _median(values: list[float]) -> float | None:
    return round(statistics.median(values), 3) if values else None


def profile(runs: int) -> dict:
    """Median wall seconds of each single step in a fresh interpreter."""
    out = {}
    for name, code in PROFILE.items():
        walls = []
        for _ in range(runs):
            r = run_once(["-c", code])
            if r["exit_code"] != 0:
                tail = " ".join(r.get("stderr_tail") or [])
                out[name] = "not installed" if "No module named" in tail else f"failed: {tail}"
                break
            walls.append(r["wall_s"])
        else:
            out[name] = _median(walls)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="output directory (doctor_speed.json)")
    parser.add_argument("-n", type=int, default=5, help="timed runs of each command (after a warm-up)")
    parser.add_argument("--model", help="also plan this model in the doctor runs")
    parser.add_argument("--no-profile", action="store_true", help="skip the per-step profile")
    parser.add_argument("--only", choices=sorted(COMMANDS), action="append",
                        help="time only these commands (repeatable)")
    parser.add_argument("--src", help="time the fastpath in this src directory instead")
    args = parser.parse_args()
    if args.src:
        SRC[0] = Path(args.src).resolve()
    names = args.only or list(COMMANDS)
    if "collect_env" in names and importlib.util.find_spec("torch") is None:
        names.remove("collect_env")
    cmds = {n: COMMANDS[n] + (["--model", args.model] if args.model and n != "collect_env" else [])
            for n in names}
    for argv in cmds.values():  # warm the page cache, .pyc files and Triton's driver cache
        run_once(argv)
    runs: dict[str, list[dict]] = {n: [] for n in cmds}
    loads = []
    for _ in range(args.n):  # interleaved, so drift in the host's load hits every command alike
        for n, argv in cmds.items():
            loads.append(round(os.getloadavg()[0], 2))
            runs[n].append(run_once(argv))
    summary = {n: {"median_wall_s": _median([r["wall_s"] for r in rs]),
                   "min_wall_s": min(r["wall_s"] for r in rs),
                   "median_cpu_s": _median([r["cpu_s"] for r in rs]),
                   "exit_codes": sorted({r["exit_code"] for r in rs})}
               for n, rs in runs.items()}
    full = runs.get("doctor_full") or []
    if full and full[0].get("import_seconds"):
        steps = sorted({k for r in full for k in (r.get("import_seconds") or {})})
        summary["doctor_full"]["median_import_seconds"] = {
            s: _median([r["import_seconds"][s] for r in full if s in (r.get("import_seconds") or {})])
            for s in steps}
        summary["doctor_full"]["median_probe_s"] = _median([r["probe_s"] for r in full
                                                            if r.get("probe_s") is not None])
    ratio = None
    if "doctor_full" in summary and "collect_env" in summary:
        ratio = round(summary["doctor_full"]["median_wall_s"] / summary["collect_env"]["median_wall_s"], 3)
    result = {
        "benchmark": "doctor_speed",
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                    "python": platform.python_version()},
        "commands": {n: " ".join(["python", *argv]) for n, argv in cmds.items()},
        "fastpath_src": str(SRC[0]),
        "runs_each": args.n,
        "summary": summary,
        "full_over_collect_env": ratio,
        "runs": runs,
        "load_avg_1min_before_each_run": loads,
        "profile_median_wall_s": None if args.no_profile else profile(2),
    }
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "doctor_speed.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({"summary": summary, "full_over_collect_env": ratio,
                      "profile_median_wall_s": result["profile_median_wall_s"]}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
