"""`fastpath bench MODEL`: what the fast path buys on this GPU, next to the reference and the
compiled peers.

Each configuration runs in its own Python process. Why: transformers binds causal_conv1d / FLA
when it imports a modeling module (5.15+), so "the torch fallback" and "FLA + Dao CUDA" are
properties of a fresh interpreter (with those packages hidden, or not), not switches to flip
in one; a fresh process also gives each configuration a clean peak-memory counter. Every worker
builds the same model (same source, seed, dtype) and times three phases:
  prefill   forward without grad over B x L tokens (logits for the last token only, as serving does)
  train     forward + backward of a next-token loss over B x L tokens
  decode    N single-token steps with a cache after an (untimed) prefill of the L-token prompt
Warm-up runs first (Triton compiles there), then the median of the repeats, timed with CUDA
events on a GPU and perf_counter on CPU. Outputs: bench.json, bench.md and bench.png in --out.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastpath.errors import FastpathError, UsageError, first_line

SCHEMA = "fastpath.bench/1"
PHASES: dict[str, str] = {"prefill": "prefill", "train": "forward+backward", "decode": "decode"}
PROGRESS_PREFIX = "@fastpath-bench-progress "


@dataclass(frozen=True)
class ConfigSpec:
    """One way of running the model: which packages the worker hides, whether it enables fastpath."""

    name: str
    label: str
    enable: bool
    hide: tuple[str, ...] = ()
    requires: tuple[str, ...] = ()  # top-level modules that must be importable (else skipped)
    needs_cuda: bool = False


CONFIGS: dict[str, ConfigSpec] = {
    # The torch fallback users get without the compiled packages (hidden even where installed).
    "reference": ConfigSpec("reference", "transformers torch fallback", enable=False,
                            hide=("causal_conv1d", "causal_conv1d_cuda", "fla")),
    "fastpath": ConfigSpec("fastpath", "fastpath.enable()", enable=True),
    # FLA's gated delta rule with transformers' torch conv: what fastpath adds on top of FLA.
    "fla": ConfigSpec("fla", "FLA, torch conv", enable=False, hide=("causal_conv1d", "causal_conv1d_cuda"),
                      requires=("fla",), needs_cuda=True),
    # The compiled peers, as transformers binds them itself when they are installed.
    "fla+dao": ConfigSpec("fla+dao", "FLA + Dao causal-conv1d CUDA", enable=False,
                          requires=("causal_conv1d", "causal_conv1d_cuda", "fla"), needs_cuda=True),
}


@dataclass
class BenchSettings:
    source: str
    layers: int | None = None
    dtype: str = "fp32"
    device: str = "cpu"
    seq_len: int = 4096
    batch: int = 1
    decode_tokens: int = 64
    repeats: int = 5
    warmup: int = 2
    seed: int = 0
    phases: tuple[str, ...] = tuple(PHASES)

    def validate(self) -> None:
        if self.seq_len < 2:
            raise UsageError("--seq-len must be at least 2")
        if self.batch < 1:
            raise UsageError("--batch must be at least 1")
        if self.repeats < 1:
            raise UsageError("--repeats must be at least 1")
        if self.warmup < 0:
            raise UsageError("--warmup must be >= 0")
        if "decode" in self.phases and self.decode_tokens < 1:
            raise UsageError("--decode-tokens must be at least 1")
        unknown = [p for p in self.phases if p not in PHASES]
        if unknown:
            raise UsageError(f"unknown phase {unknown[0]!r}; phases: {', '.join(PHASES)}")
        if self.layers is not None and self.layers < 1:
            raise UsageError(f"--layers must be a positive integer, got {self.layers}")


# ---------------------------------------------------------------------------------------------
# Worker side (runs in the child process)


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


def _first_line(exc: BaseException) -> str:
    return f"{exc.__class__.__name__}: {first_line(exc)}".rstrip(": ")


def _phase_runner(name: str, model: Any, ids: Any, settings: BenchSettings) -> tuple[Callable[[], Any], Callable[[], Any] | None, int]:
    """(timed fn, untimed setup before each call or None, tokens processed per call)."""
    import torch

    from fastpath.proof.greedy import prefill, step

    batch, length = ids.shape
    if name == "prefill":
        def run_prefill() -> None:
            with torch.no_grad():
                model(input_ids=ids, use_cache=False, logits_to_keep=1)
        return run_prefill, None, batch * length
    if name == "train":
        def run_train() -> None:
            model.zero_grad(set_to_none=True)
            out = model(input_ids=ids, use_cache=False)
            logits = out.logits[:, :-1].float()
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
            loss.backward()
        return run_train, None, batch * length
    holder: dict[str, Any] = {}

    def setup_decode() -> None:
        holder.clear()
        with torch.no_grad():
            holder["state"] = prefill(model, ids)

    def run_decode() -> None:
        with torch.no_grad():
            state = holder["state"]
            for _ in range(settings.decode_tokens):
                state = step(model, state)
            holder["state"] = state
    return run_decode, setup_decode, batch * settings.decode_tokens


def run_config(spec: ConfigSpec, settings: BenchSettings, report: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Time every phase of one configuration in *this* process (the worker calls it first thing)."""
    say = report or (lambda _phase: None)
    _hide_modules(spec.hide)
    missing = [m for m in spec.requires if not _importable(m)]
    if missing:
        return {"config": spec.name, "label": spec.label, "skipped": f"not importable: {', '.join(missing)}"}
    import torch

    import fastpath
    from fastpath.kernels.counters import CALLS
    from fastpath.proof.models import build_model

    result: dict[str, Any] = {"config": spec.name, "label": spec.label, "phases": {}}
    if spec.enable:
        result["enable_report"] = str(fastpath.enable())
    built = build_model(settings.source, layers=settings.layers, dtype=settings.dtype,
                        device=settings.device, seed=settings.seed)
    model = built.model
    device = built.device
    result["model"] = built.to_json()
    result["environment"] = _environment(device)
    try:
        result["explain"] = [dict(r) for r in fastpath.explain(model).rows]
    except Exception as exc:  # a report only
        result["explain"] = [{"error": _first_line(exc)}]
    gen = torch.Generator().manual_seed(settings.seed + 1)
    ids = torch.randint(0, built.vocab_size, (settings.batch, settings.seq_len), generator=gen).to(device)
    timer = _Timer(device)
    calls_before = dict(CALLS)
    for phase in settings.phases:
        fn, setup, tokens = _phase_runner(phase, model, ids, settings)
        entry: dict[str, Any] = {"tokens_per_call": tokens}
        try:
            if device.type == "cuda":
                torch.cuda.synchronize()
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats(device)
            for _ in range(settings.warmup):
                if setup:
                    setup()
                fn()
                say(phase)
            samples = []
            for _ in range(settings.repeats):
                if setup:
                    setup()
                samples.append(timer(fn))
                say(phase)
            median = statistics.median(samples)
            entry.update(
                median_s=median,
                samples_s=samples,
                tokens_per_s=tokens / median if median > 0 else None,
                peak_mem_mib=(torch.cuda.max_memory_allocated(device) / 2**20) if device.type == "cuda" else None,
            )
        except Exception as exc:  # one failing phase (an FLA refusal, an OOM) must not hide the others
            entry["error"] = _first_line(exc)
            if device.type == "cuda":
                torch.cuda.empty_cache()
            for _ in range(settings.warmup + settings.repeats):
                say(phase)
        model.zero_grad(set_to_none=True)
        result["phases"][phase] = entry
    result["kernel_calls"] = {k: v - calls_before.get(k, 0) for k, v in CALLS.items() if v - calls_before.get(k, 0)}
    return result


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
    for dist in ("transformers", "triton", "fla-core", "flash-linear-attention", "causal-conv1d"):
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


def _worker_main(argv: list[str]) -> int:
    """`python -m fastpath.proof.bench --worker SPEC.json`: run one configuration, write its JSON."""
    spec_path = Path(argv[argv.index("--worker") + 1])
    job = json.loads(spec_path.read_text())
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


# ---------------------------------------------------------------------------------------------
# Parent side


def _src_root() -> str:
    import fastpath

    return str(Path(fastpath.__file__).resolve().parent.parent)


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
        proc = subprocess.Popen([sys.executable, "-m", "fastpath.proof.bench", "--worker", str(job_path)],
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
    result_path = Path(job["result"])
    if proc.returncode != 0 or not result_path.exists():
        tail = [ln for ln in log_path.read_text(errors="replace").splitlines() if ln.strip()][-1:]
        return {"config": spec.name, "label": spec.label,
                "error": f"worker exited with {proc.returncode}: {tail[0] if tail else 'no output'}"}
    return json.loads(result_path.read_text())


def preflight(settings: BenchSettings, configs: list[str]) -> None:
    """UsageError for bad settings, config names or model source: one line, before any worker."""
    settings.validate()
    if not configs:
        raise UsageError(f"--configs is empty; configs: {', '.join(CONFIGS)}")
    unknown = [c for c in configs if c not in CONFIGS]
    if unknown:
        raise UsageError(f"unknown config {unknown[0]!r}; configs: {', '.join(CONFIGS)}")
    from fastpath.proof.models import resolve_source, transformers_config

    transformers_config(resolve_source(settings.source).config, settings.layers)


def run_bench(settings: BenchSettings, configs: list[str], *, timeout: float | None = None,
              progress: Callable[[str, str], None] | None = None) -> dict[str, Any]:
    """Run each configuration in its own process and gather the results into one document."""
    preflight(settings, configs)
    results = []
    with tempfile.TemporaryDirectory(prefix="fastpath-bench-") as tmp:
        for name in configs:
            spec = CONFIGS[name]
            if spec.needs_cuda and not settings.device.startswith("cuda"):
                results.append({"config": name, "label": spec.label, "skipped": "needs a CUDA device"})
                continue
            missing = [m for m in spec.requires if importlib.util.find_spec(m) is None]
            if missing:
                results.append({"config": name, "label": spec.label, "skipped": f"not installed: {', '.join(missing)}"})
                continue
            results.append(_run_worker(spec, settings, Path(tmp), lambda ph, n=name: (progress or (lambda *_: None))(n, ph),
                                       timeout))
    doc: dict[str, Any] = {
        "schema": SCHEMA,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "settings": {**settings.__dict__, "phases": list(settings.phases)},
        "configs": results,
    }
    first = next((r for r in results if "model" in r), None)
    doc["model"] = first["model"] if first else None
    doc["environment"] = first["environment"] if first else None
    doc["speedup"] = speedups(doc)
    return doc


def tokens_per_s(doc: dict[str, Any], config: str, phase: str) -> float | None:
    for r in doc.get("configs", []):
        if r.get("config") == config:
            value = r.get("phases", {}).get(phase, {}).get("tokens_per_s")
            return float(value) if isinstance(value, (int, float)) else None
    return None


def speedups(doc: dict[str, Any]) -> dict[str, dict[str, float]]:
    """config -> phase -> tokens/s relative to the reference configuration."""
    out: dict[str, dict[str, float]] = {}
    for r in doc.get("configs", []):
        for phase in doc["settings"]["phases"]:
            base = tokens_per_s(doc, "reference", phase)
            value = tokens_per_s(doc, r["config"], phase)
            if base and value:
                out.setdefault(r["config"], {})[phase] = value / base
    return out


def compare_docs(new: dict[str, Any], old: dict[str, Any]) -> list[dict[str, Any]]:
    """Per config and phase present in both runs: old and new tokens/s and the relative change."""
    rows = []
    for r in new.get("configs", []):
        for phase in new["settings"]["phases"]:
            a = tokens_per_s(old, r["config"], phase)
            b = tokens_per_s(new, r["config"], phase)
            if a and b:
                rows.append({"config": r["config"], "phase": phase, "old": a, "new": b, "change": b / a - 1.0})
    return rows


def load_previous(path: str) -> dict[str, Any]:
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise UsageError(f"cannot read --compare file {path}: {exc}") from None
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise UsageError(f"--compare file {path} is not a fastpath bench JSON ({SCHEMA})")
    return doc


# ---------------------------------------------------------------------------------------------
# Rendering


def _fmt_rate(value: float | None) -> str:
    if value is None:
        return "-"
    if value >= 1e4:
        return f"{value / 1e3:,.1f}k"
    return f"{value:,.1f}" if value < 100 else f"{value:,.0f}"


def _cell(r: dict[str, Any], phase: str, speed: dict[str, dict[str, float]]) -> str:
    if "skipped" in r:
        return "skipped"
    entry = r.get("phases", {}).get(phase)
    if entry is None:
        return "error" if "error" in r else "-"
    if "error" in entry:
        return "error"
    text = _fmt_rate(entry.get("tokens_per_s"))
    ratio = speed.get(r["config"], {}).get(phase)
    if ratio is not None and r["config"] != "reference":
        text += f" ({ratio:.2f}x)"
    return text


def route_digest(rows: list[dict[str, Any]]) -> str:
    """'causal_conv1d_fn -> fastpath-triton; chunk_gated_delta_rule -> torch fallback (...)'."""
    by_op: dict[str, list[str]] = {}
    for r in rows:
        if "op" in r:
            impls = by_op.setdefault(str(r["op"]), [])
            if str(r.get("impl")) not in impls:
                impls.append(str(r.get("impl")))
    return "; ".join(f"{op} -> {' | '.join(impls)}" for op, impls in by_op.items()) or "no routed ops found"


def markdown(doc: dict[str, Any], comparison: list[dict[str, Any]] | None = None) -> str:
    """The results as a markdown table (tokens/s, speed-up vs reference, peak memory)."""
    s = doc["settings"]
    env = doc.get("environment") or {}
    model = doc.get("model") or {}
    phases = s["phases"]
    lines = [
        f"## fastpath bench: {s['source']}" + (f" (--layers {s['layers']})" if s.get("layers") else ""),
        "",
        f"- model: {model.get('class', '?')}, {model.get('layers', '?')} layers "
        f"({', '.join(sorted(set(model.get('layer_types', []))))}), {model.get('parameters', 0) / 1e9:.3g} B parameters, "
        f"{s['dtype']}, batch {s['batch']} x seq-len {s['seq_len']}, decode {s['decode_tokens']} tokens",
        f"- machine: {env.get('gpu') or env.get('cpu', '?')} ({env.get('host', '?')}); torch {env.get('torch')}, "
        f"triton {env.get('triton')}, transformers {env.get('transformers')}, CUDA {env.get('cuda')}",
        f"- timing: median of {s['repeats']} after {s['warmup']} warm-up runs "
        f"({'CUDA events' if str(s['device']).startswith('cuda') else 'perf_counter'}); {doc['created']}",
        "",
        "| config | " + " | ".join(f"{PHASES[p]} tok/s" for p in phases) + " | peak memory MiB ("
        + "/".join(phases) + ") |",
        "|---|" + "---|" * len(phases) + "---|",
    ]
    speed = doc.get("speedup", {})
    for r in doc["configs"]:
        mem = []
        for p in phases:
            value = r.get("phases", {}).get(p, {}).get("peak_mem_mib")
            mem.append(f"{value:,.0f}" if isinstance(value, (int, float)) else "-")
        cells = [_cell(r, p, speed) for p in phases]
        lines.append(f"| {r['config']} ({r.get('label', '')}) | " + " | ".join(cells) + f" | {'/'.join(mem)} |")
    notes = []
    for r in doc["configs"]:
        if "skipped" in r:
            notes.append(f"- {r['config']}: skipped: {r['skipped']}")
        if "error" in r:
            notes.append(f"- {r['config']}: error: {r['error']}")
        for p, entry in r.get("phases", {}).items():
            if "error" in entry:
                notes.append(f"- {r['config']} {PHASES[p]}: {entry['error']}")
        if r.get("explain"):
            notes.append(f"- {r['config']} routes: {route_digest(r['explain'])}")
        calls = r.get("kernel_calls")
        if r.get("config") == "fastpath" and calls is not None:
            notes.append(f"- fastpath kernel calls: {', '.join(f'{k} x{v}' for k, v in sorted(calls.items())) or 'none'}")
    if notes:
        lines += ["", *notes]
    if comparison:
        lines += ["", "### change vs previous run", "", "| config | phase | previous tok/s | now tok/s | change |",
                  "|---|---|---|---|---|"]
        for row in comparison:
            lines.append(f"| {row['config']} | {PHASES[row['phase']]} | {_fmt_rate(row['old'])} | "
                         f"{_fmt_rate(row['new'])} | {row['change'] * 100:+.1f}% |")
    return "\n".join(lines) + "\n"


def chart(doc: dict[str, Any], path: Path) -> None:
    """Bars of tokens/s: one panel per phase (scales differ by orders), one bar per config."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    phases = doc["settings"]["phases"]
    configs = [r for r in doc["configs"] if "phases" in r]
    colors = {"reference": "#9e9e9e", "fastpath": "#1f77b4", "fla": "#2ca02c", "fla+dao": "#ff7f0e"}
    fig, axes = plt.subplots(1, len(phases), figsize=(4.2 * len(phases), 4.2), squeeze=False)
    for ax, phase in zip(axes[0], phases, strict=True):
        names, values = [], []
        for r in configs:
            value = r["phases"].get(phase, {}).get("tokens_per_s")
            names.append(r["config"])
            values.append(value or 0.0)
        bars = ax.bar(names, values, color=[colors.get(n, "#2ca02c") for n in names])
        base = tokens_per_s(doc, "reference", phase)
        for bar, name, value in zip(bars, names, values, strict=True):
            label = _fmt_rate(value) if value else "error"
            if base and value and name != "reference":
                label += f"\n{value / base:.2f}x"
            ax.annotate(label, (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                        ha="center", va="bottom", fontsize=8)
        ax.set_title(PHASES[phase])
        ax.set_ylabel("tokens/s")
        ax.margins(y=0.2)
    s = doc["settings"]
    env = doc.get("environment") or {}
    where = env.get("gpu") or f"CPU{' (Triton interpreter)' if env.get('triton_interpret') == '1' else ''}"
    fig.suptitle(f"{s['source']}" + (f" ({s['layers']} layers)" if s.get("layers") else "")
                 + f", {s['dtype']}, B={s['batch']}, L={s['seq_len']}, {where}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_outputs(doc: dict[str, Any], out_dir: Path, comparison: list[dict[str, Any]] | None) -> dict[str, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"json": out_dir / "bench.json", "markdown": out_dir / "bench.md", "chart": out_dir / "bench.png"}
    paths["json"].write_text(json.dumps(doc, indent=1, default=str) + "\n")
    paths["markdown"].write_text(markdown(doc, comparison))
    chart(doc, paths["chart"])
    return paths


# ---------------------------------------------------------------------------------------------
# CLI


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", metavar="MODEL", help="preset name, config.json path, or local model directory with safetensors")
    parser.add_argument("--seq-len", type=int, default=4096, help="tokens per row (default 4096)")
    parser.add_argument("--batch", type=int, default=1, help="rows (default 1)")
    parser.add_argument("--layers", type=int, default=None, help="keep the first N layers (layer-type pattern kept)")
    parser.add_argument("--dtype", default="auto", choices=["auto", "bf16", "fp16", "fp32"], help="auto: bf16 on a GPU, fp32 on CPU")
    parser.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    parser.add_argument("--decode-tokens", type=int, default=64, help="cached single-token steps timed (default 64)")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per phase; the median is reported (default 5)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed runs per phase first (default 2)")
    parser.add_argument("--phases", default=",".join(PHASES), help=f"comma list of {', '.join(PHASES)}")
    parser.add_argument("--configs", default=",".join(CONFIGS), help=f"comma list of {', '.join(CONFIGS)}")
    parser.add_argument("--seed", type=int, default=0, help="seed for random weights and inputs")
    parser.add_argument("--out", default="fastpath-bench", help="directory for bench.json, bench.md, bench.png")
    parser.add_argument("--compare", metavar="PREVIOUS.json", default=None, help="show the change against an earlier bench.json")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds per configuration (default 3600)")
    parser.add_argument("--json", action="store_true", help="print the result JSON on stdout (files are written too)")


def main(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from fastpath.proof.models import resolve_device, resolve_dtype

    device = str(resolve_device(args.device))
    settings = BenchSettings(
        source=args.model, layers=args.layers, dtype=resolve_dtype(args.dtype, device), device=device,
        seq_len=args.seq_len, batch=args.batch, decode_tokens=args.decode_tokens, repeats=args.repeats,
        warmup=args.warmup, seed=args.seed, phases=tuple(p.strip() for p in args.phases.split(",") if p.strip()),
    )
    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    previous = load_previous(args.compare) if args.compare else None
    preflight(settings, configs)
    err = Console(stderr=True)
    per_config = len(settings.phases) * (settings.warmup + settings.repeats)
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=err, transient=False) as bar:
        task = bar.add_task("bench", total=per_config * len(configs))

        def on_progress(config: str, phase: str) -> None:
            bar.update(task, advance=1, description=f"{config}: {PHASES.get(phase, phase)}")

        doc = run_bench(settings, configs, timeout=args.timeout, progress=on_progress)
        bar.update(task, completed=per_config * len(configs), description="done")
    comparison = compare_docs(doc, previous) if previous else None
    if comparison is not None:
        doc["compare"] = {"file": args.compare, "changes": comparison}
    paths = write_outputs(doc, Path(args.out), comparison)
    if args.json:
        json.dump(doc, sys.stdout, indent=1, default=str)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(paths["markdown"].read_text())
    err.print(f"wrote {paths['json']}, {paths['markdown']}, {paths['chart']}")
    failed = [r["config"] for r in doc["configs"] if "error" in r]
    return 1 if failed else 0


if __name__ == "__main__":
    if "--worker" in sys.argv:
        raise SystemExit(_worker_main(sys.argv))
