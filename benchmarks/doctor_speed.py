"""Wall time of `fastpath doctor --json` (local probe, no --model), N runs, median reported.

Usage: python benchmarks/doctor_speed.py [-n 7] [--out benchmarks/results/doctor_speed.json]
Records the load average next to the timings: on a shared 2-core box other jobs inflate them.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone


def run_once(extra: list[str]) -> tuple[float, int, float | None]:
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "fastpath", "doctor", "--json", *extra],
                          capture_output=True, text=True, timeout=300)
    wall = time.perf_counter() - start
    probe_s = None
    try:
        probe_s = json.loads(proc.stdout)["facts"]["probe"]["seconds"]
    except (json.JSONDecodeError, KeyError, TypeError):
        pass
    return wall, proc.returncode, probe_s


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=7, help="runs (after one warm-up run)")
    parser.add_argument("--model", help="also plan this model (default: none)")
    parser.add_argument("--out", help="write the result JSON here too")
    args = parser.parse_args()
    extra = ["--model", args.model] if args.model else []
    run_once(extra)  # warm the page cache / .pyc files
    walls, probes, codes, loads = [], [], [], []
    for _ in range(args.n):
        loads.append(os.getloadavg()[0])
        wall, code, probe_s = run_once(extra)
        walls.append(wall)
        codes.append(code)
        if probe_s is not None:
            probes.append(probe_s)
    result = {
        "benchmark": "doctor_speed",
        "command": "fastpath doctor --json" + (" --model " + args.model if args.model else ""),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                    "python": platform.python_version()},
        "runs": args.n,
        "wall_s": [round(w, 3) for w in walls],
        "median_wall_s": round(statistics.median(walls), 3),
        "min_wall_s": round(min(walls), 3),
        "median_probe_s": round(statistics.median(probes), 3) if probes else None,
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
