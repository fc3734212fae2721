"""The bench worker: `python -m fastpath.proof.bench_worker JOB.json` runs one configuration in a
fresh interpreter and writes its result JSON.

Why a process per configuration: transformers binds causal_conv1d / FLA when it imports a
modeling module (5.15+), so "the torch fallback" and "FLA + Dao CUDA" are properties of a fresh
interpreter (with those packages hidden, or not), not switches to flip in one; a fresh process
also gives each configuration a clean peak-memory counter. Warm-up runs first (Triton compiles
there), then the repeats, timed with CUDA events on a GPU and perf_counter on CPU.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fastpath.proof.bench_spec import (
    COMPILED_PHASES,
    CONFIGS,
    NEEDS_CUDA,
    PHASE_REGISTRY,
    PROGRESS_PREFIX,
    BenchSettings,
    ConfigSpec,
    Phase,
)
from fastpath.proof.verdict import kernel_impls
from fastpath.shared.errors import FastpathError, first_line

TORCH = "torch"  # what a configuration ran when no fast kernel executed
INTERPRETED = "(interpreter)"
NOT_COMPILED = f"the torch.compile configuration times {' and '.join(COMPILED_PHASES)} only"
NOT_TIMING_DATA = "Triton interpreter: kernels emulated on the CPU, a correctness run, not timing data"


def _hide_modules(names: tuple[str, ...]) -> None:
    """Make `import name` raise ImportError in this process (transformers then takes torch)."""
    for name in names:
        sys.modules[name] = None  # type: ignore[assignment]


class _Timer:
    """Seconds for one call: CUDA events on a GPU (device time, no host sync inside), else perf_counter."""

    def __init__(self, device: Any) -> None:
        import torch

        self.cuda = device.type == "cuda"
        self.torch = torch

    def __call__(self, fn: Callable[[], Any]) -> float:
        if self.cuda:
            start = self.torch.cuda.Event(enable_timing=True)
            end = self.torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / 1e3
        import time

        begin = time.perf_counter()
        fn()
        return time.perf_counter() - begin



def run_config(spec: ConfigSpec, settings: BenchSettings, report: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Time every phase of one configuration in *this* process (the worker calls it first thing)."""
    say = report or (lambda _phase: None)
    _hide_modules(spec.hide)
    missing = [m for m in spec.requires if not _importable(m)]
    if missing:
        return {"config": spec.name, "label": spec.label, "skipped": f"not importable: {', '.join(missing)}"}
    import torch

    from fastpath.kernels.counters import CALLS
    from fastpath.models.build import build_model
    from fastpath.routing import engine as routes

    result: dict[str, Any] = {"config": spec.name, "label": spec.label, "phases": {}}
    if spec.enable:
        result["enable_report"] = str(routes.enable())
    built = build_model(settings.source, layers=settings.layers, dtype=settings.dtype,
                        device=settings.device, seed=settings.seed)
    model = built.model
    device = built.device
    result["model"] = built.to_json()
    result["environment"] = _environment(device)
    if spec.liger:
        from fastpath.routing.liger_route import LigerUnsupported, apply_liger

        try:
            result["liger"] = apply_liger(model)
        except LigerUnsupported as exc:
            return {"config": spec.name, "label": spec.label, "skipped": str(exc)}
    try:
        result["explain"] = [dict(r) for r in routes.explain(model).rows]
    except Exception as exc:  # a report only
        result["explain"] = [{"error": first_line(exc, with_type=True)}]
    if spec.compile:
        model.forward = torch.compile(model.forward)
    gen = torch.Generator().manual_seed(settings.seed + 1)
    ids = torch.randint(0, built.vocab_size, (settings.batch, settings.seq_len), generator=gen).to(device)
    timer = _Timer(device)
    calls_before = dict(CALLS)
    for name in settings.phases:
        phase = PHASE_REGISTRY[name]
        ticks = settings.warmup + settings.repeats
        skip = (NEEDS_CUDA if phase.needs_cuda and device.type != "cuda"
                else NOT_COMPILED if spec.compile and name not in COMPILED_PHASES else None)
        if skip:
            entry: dict[str, Any] = {"skipped": skip}
            for _ in range(ticks):
                say(name)
        elif phase.measure is not None:
            entry = _self_timed(phase, model, ids, settings, device, lambda n=name: say(n))
        else:
            entry = _timed(phase, model, ids, settings, device, timer, lambda n=name: say(n))
        model.zero_grad(set_to_none=True)
        result["phases"][name] = entry
    if spec.compile:
        from torch._dynamo.utils import counters

        result["compiled_graphs"] = int(counters["stats"]["unique_graphs"])
    result["kernel_calls"] = {k: v - calls_before.get(k, 0) for k, v in CALLS.items() if v - calls_before.get(k, 0)}
    result["implementation"] = implementation(spec, result["kernel_calls"], device)
    if result["implementation"].endswith(INTERPRETED):
        for entry in result["phases"].values():
            if "samples_s" in entry:
                entry["not_timing_data"] = NOT_TIMING_DATA
    return result



def _reset_peak(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def _summarise(entry: dict[str, Any], device: Any) -> dict[str, Any]:
    """Median, tokens/s and peak memory from `samples_s`, the same for both kinds of phase."""
    import torch

    median = statistics.median(entry["samples_s"])
    tokens = entry["tokens_per_call"]
    entry.update(median_s=median, tokens_per_s=tokens / median if median > 0 else None,
                 peak_mem_mib=(torch.cuda.max_memory_allocated(device) / 2**20) if device.type == "cuda" else None)
    return entry


def _failed(entry: dict[str, Any], exc: Exception, device: Any) -> dict[str, Any]:
    import torch

    entry["error"] = first_line(exc, with_type=True)
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return entry


def _timed(phase: Phase, model: Any, ids: Any, settings: BenchSettings, device: Any, timer: _Timer,
           tick: Callable[[], None]) -> dict[str, Any]:
    """Warm-up calls, then `repeats` calls timed one by one around the runner's function."""
    assert phase.runner is not None
    fn, setup, tokens = phase.runner(model, ids, settings)
    entry: dict[str, Any] = {"tokens_per_call": tokens}
    done = 0
    try:
        _reset_peak(device)
        for _ in range(settings.warmup):
            if setup:
                setup()
            fn()
            done += 1
            tick()
        samples = []
        for _ in range(settings.repeats):
            if setup:
                setup()
            samples.append(timer(fn))
            done += 1
            tick()
        entry["samples_s"] = samples
        return _summarise(entry, device)
    except Exception as exc:  # one failing phase (an FLA refusal, an OOM) must not hide the others
        for _ in range(settings.warmup + settings.repeats - done):
            tick()
        return _failed(entry, exc, device)


def _self_timed(phase: Phase, model: Any, ids: Any, settings: BenchSettings, device: Any,
                tick: Callable[[], None]) -> dict[str, Any]:
    """A phase that times itself (bench_spec.PhaseMeasure): its samples, summarised like the others."""
    assert phase.measure is not None
    tick()  # progress shows the phase while it runs
    entry: dict[str, Any] = {}
    try:
        _reset_peak(device)
        entry = dict(phase.measure(model, ids, settings))
        if "skipped" not in entry and "error" not in entry:
            _summarise(entry, device)
    except Exception as exc:
        _failed(entry, exc, device)
    for _ in range(settings.warmup + settings.repeats - 1):
        tick()
    return entry


def implementation(spec: ConfigSpec, calls: dict[str, int], device: Any) -> str:
    """What a configuration really ran, so the report can say when two ran the same code.

    enable() on a CPU without the Triton interpreter routes every call to the kernels'
    torch reference: the same torch code as the reference configuration ("torch").
    """
    liger = " + Liger" if spec.liger else ""
    if not spec.enable:
        base = spec.name.removesuffix("+liger")
        return (TORCH if base == "reference" else base) + liger
    compiled = " + torch.compile" if spec.compile else ""
    if not kernel_impls(calls).get("triton"):
        return TORCH + compiled + liger
    if device.type == "cpu":
        return f"fastpath Triton{compiled}{liger} {INTERPRETED}"
    return f"fastpath Triton{compiled}{liger}"


def _importable(module: str) -> bool:
    if sys.modules.get(module, False) is None:
        return False
    try:
        __import__(module)
    except Exception:
        return False
    return True


def _environment(device: Any) -> dict[str, Any]:
    import torch

    env: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__,
                           "host": platform.node(), "device": str(device)}
    for dist in ("transformers", "triton", "fla-core", "flash-linear-attention", "causal-conv1d", "liger-kernel"):
        try:
            from importlib.metadata import version

            env[dist] = version(dist)
        except Exception:
            env[dist] = None
    if device.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(device)
        env["cuda"] = torch.version.cuda
    else:
        env["cpu"] = platform.processor() or platform.machine()
    env["triton_interpret"] = os.environ.get("TRITON_INTERPRET")
    return env



def main(argv: list[str]) -> int:
    """Run the job file argv[0] names; the result JSON goes where the job says."""
    job = json.loads(Path(argv[0]).read_text())
    spec = CONFIGS[job["config"]]
    settings = BenchSettings(**{**job["settings"], "phases": tuple(job["settings"]["phases"])})

    def report(phase: str) -> None:
        print(PROGRESS_PREFIX + phase, flush=True)

    try:
        result = run_config(spec, settings, report)
    except FastpathError as exc:
        result = {"config": spec.name, "label": spec.label, "error": str(exc)}
    Path(job["result"]).write_text(json.dumps(result, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
