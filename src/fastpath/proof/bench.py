"""`fastpath bench MODEL`: what the fast path buys on this GPU, next to the reference and the
compiled peers.

Each configuration runs in its own worker process (proof/bench_worker.py) on the same model (same
source, seed, dtype) and times the registered phases (proof/bench_spec.py: prefill, forward +
backward, decode, decode replayed from a CUDA graph). This module is the parent: it checks the
configurations and sizes the job before any work starts (preflight), then runs the workers and
gathers their results into one document (run_bench). The command line, proof/bench_cli.py, shows
their progress on stderr and writes bench.json, bench.md and (with matplotlib) bench.png through
proof/bench_outputs.py.
"""

from __future__ import annotations

import datetime
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fastpath.proof.bench_outputs import speedups, speedups_versus
from fastpath.proof.bench_spec import (
    CONFIGS,
    PHASE_REGISTRY,
    PROGRESS_PREFIX,
    SCHEMA,
    BenchSettings,
    ConfigSpec,
)
from fastpath.shared.errors import UsageError


def _src_root() -> str:
    """The directory that holds the fastpath package (put on the workers' PYTHONPATH)."""
    return str(Path(__file__).resolve().parents[2])


def _run_worker(spec: ConfigSpec, settings: BenchSettings, workdir: Path, on_progress: Callable[[str], None],
                timeout: float | None) -> dict[str, Any]:
    job = {"config": spec.name, "result": str(workdir / f"{spec.name}.result.json"),
           "settings": {**settings.__dict__, "phases": list(settings.phases)}}
    job_path = workdir / f"{spec.name}.job.json"
    job_path.write_text(json.dumps(job))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_src_root(), env.get("PYTHONPATH")) if p)
    env.setdefault("USE_HUB_KERNELS", "0")
    log_path = workdir / f"{spec.name}.stderr.txt"
    with log_path.open("w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "fastpath.proof.bench_worker", str(job_path)],
                                stdout=subprocess.PIPE, stderr=log, text=True, env=env)
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                if line.startswith(PROGRESS_PREFIX):
                    on_progress(line[len(PROGRESS_PREFIX):].strip())
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            return {"config": spec.name, "label": spec.label, "error": f"timed out after {timeout:g} s"}
        except BaseException:  # Ctrl-C, SIGTERM (bench_cli._signals_interrupt): no worker outlives bench
            proc.kill()
            proc.wait()
            raise
    result_path = Path(job["result"])
    if proc.returncode != 0 or not result_path.exists():
        tail = [ln for ln in log_path.read_text(errors="replace").splitlines() if ln.strip()][-1:]
        return {"config": spec.name, "label": spec.label,
                "error": f"worker exited with {proc.returncode}: {tail[0] if tail else 'no output'}"}
    return json.loads(result_path.read_text())


def skip_reason(spec: ConfigSpec, device: str) -> str | None:
    """Why configuration `spec` cannot run here (decided before any worker), or None."""
    if spec.needs_cuda and not device.startswith("cuda"):
        return "needs a CUDA device"
    missing = [m for m in spec.requires if importlib.util.find_spec(m) is None]
    return f"not installed: {', '.join(missing)}" if missing else None


def preflight(settings: BenchSettings, configs: list[str], check_memory: bool = True) -> Any:
    """UsageError for bad settings, config names or model source, or a job that will not fit in
    memory: one line, before any worker. Returns the job's size (models/sizing.py) or None."""
    settings.validate()
    if not configs:
        raise UsageError(f"--configs is empty; configs: {', '.join(CONFIGS)}")
    unknown = [c for c in configs if c not in CONFIGS]
    if unknown:
        raise UsageError(f"unknown config {unknown[0]!r}; configs: {', '.join(CONFIGS)}")
    skips = {c: skip_reason(CONFIGS[c], settings.device) for c in configs}
    if all(skips.values()):  # a run of skips only used to exit 0 and draw an empty chart
        raise UsageError("nothing to measure here: every configuration would be skipped ("
                         + "; ".join(f"{c}: {why}" for c, why in skips.items())
                         + f"); nothing written. Configs: {', '.join(CONFIGS)}")
    from fastpath.models.resolve import resolve_model

    # Read once here; each worker is its own process and builds from settings.source itself.
    model = resolve_model(settings.source, layers=settings.layers, dtype=settings.dtype, device=settings.device)
    if not check_memory:
        return None
    from fastpath.models.sizing import size_job

    # One configuration at a time, each in its own process: the largest phase sets the peak.
    backward = any(PHASE_REGISTRY[p].backward for p in settings.phases)
    return size_job(model, what=f"bench {settings.source}", batch=settings.batch, seq_len=settings.seq_len,
                    backward=backward, paths=1, reference="reference" in configs)


def assemble(settings: BenchSettings, results: list[dict[str, Any]], size: Any, *, created: str,
             total: int, why_partial: str | None = None) -> dict[str, Any]:
    """The bench document from the configurations measured so far; `why_partial` marks a run
    that has not measured all `total` configurations (still running, interrupted)."""
    doc: dict[str, Any] = {
        "schema": SCHEMA,
        "created": created,
        "settings": {**settings.__dict__, "phases": list(settings.phases)},
        "configs": list(results),
        "partial": {"done": len(results), "total": total, "why": why_partial} if why_partial else None,
    }
    first = next((r for r in results if "model" in r), None)
    doc["model"] = first["model"] if first else None
    doc["environment"] = first["environment"] if first else None
    doc["sizing"] = size.to_json() if size is not None else None
    doc["speedup"] = speedups(doc)
    doc["speedup_versus"] = speedups_versus(doc)
    return doc


STILL_RUNNING = "the others had not run when this file was written"
def run_bench(settings: BenchSettings, configs: list[str], *, timeout: float | None = None,
              progress: Callable[[str, str], None] | None = None, size: Any = None,
              on_result: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Run each configuration in its own process and gather the results into one document.
    `size`: the preflight's estimate (preflight runs here when it is None). `on_result` gets the
    document so far after each configuration (bench writes it to disk: a run that is killed
    keeps what it measured)."""
    if size is None:
        size = preflight(settings, configs)
    created = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="fastpath-bench-") as tmp:
        for name in configs:
            spec = CONFIGS[name]
            skipped = skip_reason(spec, settings.device)
            if skipped:
                results.append({"config": name, "label": spec.label, "skipped": skipped})
            else:
                results.append(_run_worker(spec, settings, Path(tmp),
                                           lambda ph, n=name: (progress or (lambda *_: None))(n, ph), timeout))
            if on_result is not None and len(results) < len(configs):
                on_result(assemble(settings, results, size, created=created, total=len(configs),
                                   why_partial=STILL_RUNNING))
    return assemble(settings, results, size, created=created, total=len(configs))
