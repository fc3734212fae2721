"""Wall time of `fastpath doctor --json` (local probe, no --model), N runs, median reported.

Usage: python benchmarks/doctor_speed.py [-n 7] [--out benchmarks/results/doctor_speed.json]
Records the load average next to the timings (on a shared 2-core box other jobs inflate the wall
time) and the CPU seconds of the whole process tree (doctor + its probe subprocesses), which the
load does not inflate much.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone


def run_once(extra: list[str]) -> tuple[float, int, float | None, float]:
    """(wall s, exit code, probe's own seconds, CPU s of the whole process tree)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "fastpath", "doctor", "--json", *extra],
                          capture_output=True, text=True, timeout=300)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    probe_s = None
    try:
        probe_s = json.loads(proc.stdout)["facts"]["probe"]["seconds"]
    except (json.JSONDecodeError, KeyError, TypeError):
        pass
    return wall, proc.returncode, probe_s, cpu


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=7, help="runs (after one warm-up run)")
    parser.add_argument("--model", help="also plan this model (default: none)")
    parser.add_argument("--probe", choices=("full", "static"), help="pass --probe to the doctor")
    parser.add_argument("--out", help="write the result JSON here too")
    args = parser.parse_args()
    extra = (["--model", args.model] if args.model else []) + (
        ["--probe", args.probe] if args.probe else [])
    run_once(extra)  # warm the page cache / .pyc files
    walls, probes, codes, loads, cpus = [], [], [], [], []
    for _ in range(args.n):
        loads.append(os.getloadavg()[0])
        wall, code, probe_s, cpu = run_once(extra)
        walls.append(wall)
        cpus.append(cpu)
        codes.append(code)
        if probe_s is not None:
            probes.append(probe_s)
    result = {
        "benchmark": "doctor_speed",
        "command": " ".join(["fastpath", "doctor", "--json", *extra]),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                    "python": platform.python_version()},
        "runs": args.n,
        "wall_s": [round(w, 3) for w in walls],
        "median_wall_s": round(statistics.median(walls), 3),
        "min_wall_s": round(min(walls), 3),
        "median_probe_s": round(statistics.median(probes), 3) if probes else None,
        "median_cpu_s": round(statistics.median(cpus), 3),
        "exit_codes": sorted(set(codes)),
        "load_avg_1min_before_each_run": [round(x, 2) for x in loads],
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
