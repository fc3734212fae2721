"""Fleet doctor speed: N targets over loopback ssh (a throwaway sshd on 127.0.0.1).

Every target is this same machine reached through its own ssh session, so all N probes share this
machine's cores: the wall time is bounded below by the run's total CPU time / cores. Each scenario
gets its own sshd, which is stopped and reaped afterwards, so `fleet_cpu_s` (getrusage of our
children: ssh clients + sshd + remote shells + probes) is the run's own CPU cost, exact even when
other work shares the machine; `wall_s` is not (see `loadavg_1min`). `client_cpu_s` is the local
side alone (this process + its ssh clients): what a real fleet costs the machine running fastpath.

Scenarios, N targets at the default --jobs:
  ssh_only      N `ssh ... true` sessions (the transport floor, no probe),
  probe_static  the probe as fleets run it by default (`python3 - --static`: imports nothing),
  probe_full    the probe with --probe full (imports torch & the kernel packages in subprocesses),
  cli_default   `fastpath doctor --hosts FILE --json` end to end (the fleet default: static),
  cli_full      the same with `--probe full`,
plus one target alone (`*_one_target`) and, with --serial, the static probe at --jobs 1.

    python3 benchmarks/fleet_speed.py [--targets 32] [--serial] [--out benchmarks/results/fleet_speed.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import resource
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "support"))  # sshd_server

from sshd_server import ThrowawaySshd, sshd_missing_reason, start_sshd  # noqa: E402

from fastpath.doctor.fleet import DEFAULT_JOBS, probe_fleet  # noqa: E402
from fastpath.doctor.inventory import Target  # noqa: E402
from fastpath.doctor.remote import run_command  # noqa: E402


def cpu_times() -> tuple[int, int]:
    """(busy, total) jiffies over all cores."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + fields[4]
    return sum(fields) - idle, sum(fields)


def children_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def self_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def measure(workdir: Path, fn: Any) -> dict[str, Any]:
    """Run fn(server) against a fresh sshd; wall time, machine load, and the run's own CPU."""
    server = start_sshd(workdir)
    try:
        c0 = children_cpu_s()
        s0 = self_cpu_s()
        b0, t0 = cpu_times()
        started = time.perf_counter()
        extra = fn(server)
        wall = time.perf_counter() - started
        b1, t1 = cpu_times()
        # before sshd is reaped: only this process and its ssh clients (the local side)
        client = children_cpu_s() - c0 + self_cpu_s() - s0
    finally:
        server.stop()  # reaped: its sessions' CPU is now in our RUSAGE_CHILDREN
    cpu = children_cpu_s() - c0 + self_cpu_s() - s0
    cores = os.cpu_count() or 1
    out = {
        "wall_s": round(wall, 3),
        "fleet_cpu_s": round(cpu, 2),
        "client_cpu_s": round(client, 2),  # local side: fastpath + ssh clients
        "cpu_floor_wall_s": round(cpu / cores, 2),  # wall can't beat this on this machine
        "machine_busy_fraction": round((b1 - b0) / max(1, t1 - t0), 3),
        "loadavg_1min": round(os.getloadavg()[0], 2),
    }
    out.update(extra or {})
    return out


def fleet_run(targets: list[Target], jobs: int, static: bool) -> dict[str, Any]:
    results = asyncio.run(probe_fleet(targets, jobs=jobs, timeout=120, static=static))
    statuses = [r.status for r in results]
    return {
        "ok": statuses.count("ok"),
        "failed": [r.error for r in results if r.status != "ok"][:3],
        "slowest_target_s": round(max(r.seconds for r in results), 3),
    }


def ssh_only(server: ThrowawaySshd, n: int) -> dict[str, Any]:
    async def go() -> list[int | None]:
        runs = await asyncio.gather(*(run_command(server.prefix("true"), b"", 120) for _ in range(n)))
        return [r.returncode for r in runs]

    codes = asyncio.run(go())
    return {"ok": codes.count(0)}


def cli_run(fleet_file: Path, *extra: str) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, "-m", "fastpath", "doctor", "--hosts", str(fleet_file), "--json", "--timeout", "120",
         *extra],
        capture_output=True,
        text=True,
        timeout=600,
    )
    try:
        report = json.loads(proc.stdout)
        ok = sum(t["status"] == "ok" for t in report["targets"])
    except ValueError:
        ok = 0
    return {"ok": ok, "exit_code": proc.returncode, "stderr_tail": proc.stderr.strip()[-300:]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", type=int, default=32)
    parser.add_argument("--serial", action="store_true", help="also time the static probe at --jobs 1")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "fleet_speed.json"))
    opts = parser.parse_args()
    reason = sshd_missing_reason()
    if reason:
        print(f"fleet_speed: skipped: {reason}", file=sys.stderr)
        return 2
    n = opts.targets

    def targets(server: ThrowawaySshd, count: int) -> list[Target]:
        return [Target(f"t{i}", server.prefix()) for i in range(count)]

    def cli(server: ThrowawaySshd, *extra: str) -> dict[str, Any]:
        fleet_file = Path(tmp) / "fleet.txt"
        fleet_file.write_text("".join(shlex.join(server.prefix()) + "\n" for _ in range(n)))
        return cli_run(fleet_file, *extra)

    scenarios: dict[str, Any] = {
        "ssh_only": lambda srv: ssh_only(srv, n),
        "probe_static_one_target": lambda srv: fleet_run(targets(srv, 1), DEFAULT_JOBS, True),
        "probe_static": lambda srv: fleet_run(targets(srv, n), DEFAULT_JOBS, True),
        "cli_default": cli,
        "probe_full_one_target": lambda srv: fleet_run(targets(srv, 1), DEFAULT_JOBS, False),
        "probe_full": lambda srv: fleet_run(targets(srv, n), DEFAULT_JOBS, False),
        "cli_full": lambda srv: cli(srv, "--probe", "full"),
    }
    if opts.serial:
        scenarios["probe_static_jobs1"] = lambda srv: fleet_run(targets(srv, n), 1, True)
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for i, (name, fn) in enumerate(scenarios.items()):
            results[name] = row = measure(Path(tmp) / f"sshd{i}", fn)
            print(
                f"{name:24s} wall {row['wall_s']:7.2f} s  fleet cpu {row['fleet_cpu_s']:7.1f} s "
                f"(client {row['client_cpu_s']:5.1f} s) "
                f"(floor {row['cpu_floor_wall_s']:5.1f} s)  load {row['loadavg_1min']:5.1f}  ok {row.get('ok')}",
                flush=True,
            )
    record = {
        "benchmark": "fleet_speed",
        "targets": n,
        "default_jobs": DEFAULT_JOBS,
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "kernel": platform.release(),
            "openssh": subprocess.run(["ssh", "-V"], capture_output=True, text=True).stderr.strip(),
        },
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "results": results,
    }
    Path(opts.out).parent.mkdir(parents=True, exist_ok=True)
    Path(opts.out).write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {opts.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
