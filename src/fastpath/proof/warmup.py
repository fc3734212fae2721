"""`fastpath warmup MODEL`: compile every Triton kernel a model's fast path runs, and let every
autotuner decide, once, before the jobs that need them.

Why: Triton compiles a kernel at its first call, for the GPU and the argument specialisation it
sees, and an autotuned kernel first compiles and times every config it is offered. On an empty
cache the first prefill of an 8-layer Qwen3.5-27B cut ended 68 s after start on an H200 (13 s on
the torch reference) and its first forward+backward took 106 s more (BENCHMARKS.md): FLA's
autotuned chunk kernels plus fastpath's own compiles. Both land in Triton's cache directory
(TRITON_CACHE_DIR, else $TRITON_HOME/.triton/cache, else ~/.triton/cache): the compiled binaries
always; the autotune decisions where the autotuner asks for it (Triton >= 3.4's `cache_results`,
triton-lang/triton PR #6261; fla-core passes it unless FLA_CACHE_RESULTS=0, fastpath's own
autotuned kernels pass it, TRITON_CACHE_AUTOTUNING=1 turns it on for every autotuner built after
it is set). A process that finds them there loads instead of compiling and timing.

This command builds the model's cut with random weights on the GPU (models/build.py, as bench and
verify do), applies enable(), and runs bench's own phases once at the given shapes (forward; with
--train also forward+backward), one progress line per phase. Kernels specialise on head sizes,
dtypes, alignment and, for a few of FLA's autotuners, the batch size; seldom on the sequence
length: warm at the batch and dtype the job uses.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from fastpath.shared.errors import FastpathError, UsageError

NO_CUDA = "warmup compiles GPU kernels: no CUDA device"
INTERPRETER = ("warmup compiles GPU kernels: TRITON_INTERPRET=1 runs them in Triton's interpreter, "
               "which compiles nothing; unset it")
AUTOTUNE_ENV = "TRITON_CACHE_AUTOTUNING"


class NothingToCompile(FastpathError):
    """No GPU kernel can be compiled here (no CUDA device, or the Triton interpreter): exit 3."""

    exit_code = 3


# ---------------------------------------------------------------------------------------------
# Triton's cache directory


def cache_dir(environ: dict[str, str] | None = None) -> tuple[Path, str]:
    """Where Triton keeps compiled kernels and autotune decisions, and why there (the same rule
    as Triton's `knobs.cache.dir`, read here without importing Triton)."""
    env = os.environ if environ is None else environ
    if env.get("TRITON_CACHE_DIR"):
        return Path(env["TRITON_CACHE_DIR"]).expanduser(), "TRITON_CACHE_DIR"
    if env.get("TRITON_HOME"):
        return Path(env["TRITON_HOME"]).expanduser() / ".triton" / "cache", "TRITON_HOME"
    return Path("~/.triton/cache").expanduser(), "default; TRITON_CACHE_DIR not set"


def check_cache_dir(path: Path) -> None:
    """UsageError unless `path` exists (or can be made) and takes a new file: a cache that
    cannot be written would make the whole warmup a loss, found only at its end."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".fastpath-warmup-", delete=True):
            pass
    except OSError as exc:
        reason = exc.strerror or exc.__class__.__name__
        raise UsageError(f"Triton cache dir {path} is not writable ({reason}); set TRITON_CACHE_DIR "
                         "to a folder this user can write") from None


@dataclass(frozen=True)
class CacheCount:
    """What a Triton cache directory holds: compiled kernels (one folder per binary, with its
    metadata JSON) and autotune decisions (`*.autotune.json`)."""

    kernels: int
    autotune: int

    def minus(self, before: CacheCount) -> CacheCount:
        return CacheCount(self.kernels - before.kernels, self.autotune - before.autotune)


def count_cache(path: Path) -> CacheCount:
    kernels = autotune = 0
    if not path.is_dir():
        return CacheCount(0, 0)
    for entry in path.iterdir():
        if not entry.is_dir():
            continue
        names = [p.name for p in entry.iterdir()]
        if any(n.endswith(".autotune.json") for n in names):
            autotune += 1
        elif any(n.endswith(".json") and not n.startswith("__grp__") for n in names):
            kernels += 1
    return CacheCount(kernels, autotune)


# ---------------------------------------------------------------------------------------------
# The work


@dataclass
class WarmupSettings:
    source: str
    layers: int | None = None  # None: the fewest that keep every layer type
    batch: int = 1
    seq_len: int = 4096
    dtype: str = "bf16"
    device: str = "cuda"
    train: bool = False
    decode: bool = False  # also two cached decode steps (the serving kernels: conv update, recurrent rule)
    seed: int = 0
    save_decisions: str | None = None  # write the autotune decisions made here to this file

    def validate(self) -> None:
        if self.batch < 1:
            raise UsageError(f"--batch must be at least 1, got {self.batch}")
        if self.seq_len < 2:
            raise UsageError(f"--seq must be at least 2, got {self.seq_len}")
        if self.layers is not None:
            from fastpath.models.resolve import check_layers

            check_layers(self.layers)


@dataclass
class WarmupResult:
    """Seconds per phase (in order) and what enable() / explain() said."""

    phases: dict[str, float] = field(default_factory=dict)
    layers: int = 0
    model: str = ""
    slow_ops: list[str] = field(default_factory=list)
    decisions: int | None = None  # decisions written to settings.save_decisions


def warm_model(settings: WarmupSettings, say: Callable[[str], None]) -> WarmupResult:
    """Build, enable(), run bench's phases once: every kernel of the fast path at these shapes
    compiles and every autotuner decides. Runs anywhere torch runs (the CPU under TRITON_INTERPRET
    checks the flow); the command refuses where nothing would compile."""
    result = WarmupResult()
    last = [time.perf_counter()]

    def done(phase: str) -> None:
        now = time.perf_counter()
        result.phases[phase] = round(now - last[0], 3)
        last[0] = now

    say("importing torch, transformers and the fast path")
    import torch

    from fastpath.models.build import build_model
    from fastpath.models.resolve import resolve_model
    from fastpath.proof.bench_spec import PHASE_REGISTRY, BenchSettings
    from fastpath.routing import engine as routes

    done("import")
    layers = settings.layers
    if layers is None:
        layers = resolve_model(settings.source, layers=None, dtype=settings.dtype, device="meta").min_layers
    say("enable()")
    routes.enable(warn=False)
    done("enable")
    try:
        say(f"building {settings.source} ({layers} layers, {settings.dtype}, random weights) on {settings.device}")
        built = build_model(settings.source, layers=layers, dtype=settings.dtype, device=settings.device,
                            seed=settings.seed)
        result.layers, result.model = built.num_layers, built.describe()
        result.slow_ops = sorted({f"{r['op']}: {r.get('impl')}" for r in routes.explain(built.model).rows
                                  if not r.get("fast")})
        done("build")
        gen = torch.Generator().manual_seed(settings.seed + 1)
        ids = torch.randint(0, built.vocab_size, (settings.batch, settings.seq_len), generator=gen)
        ids = ids.to(built.device)
        bench = BenchSettings(source=settings.source, layers=layers, dtype=settings.dtype,
                              device=str(built.device), seq_len=settings.seq_len, batch=settings.batch,
                              decode_tokens=2)
        phases = ["prefill"] + (["train"] if settings.train else []) + (["decode"] if settings.decode else [])
        for name in phases:
            phase = PHASE_REGISTRY[name]
            say(f"{phase.label} at batch {settings.batch} x seq {settings.seq_len} "
                "(compiles and autotunes on a cold cache)")
            assert phase.runner is not None
            fn, setup, _tokens = phase.runner(built.model, ids, bench)
            if setup is not None:
                setup()
            fn()
            if built.device.type == "cuda":
                torch.cuda.synchronize(built.device)
            built.model.zero_grad(set_to_none=True)
            done(name)
        if settings.save_decisions:
            result.decisions = save_decisions(Path(settings.save_decisions))
    finally:
        routes.disable()
    return result


def save_decisions(path: Path) -> int:
    """Write every autotune decision this process made (routing/autotune_decisions.py) to `path`,
    merged into the decisions already there for the same GPU (warm several models into one
    file); how many the file holds. On a CPU (the interpreter tunes nothing) the capability is []."""
    import json

    from fastpath.routing import autotune_decisions

    device = autotune_decisions.this_device()
    name, capability = device if device is not None else ("cpu", ())
    doc = autotune_decisions.record(name, capability, autotune_decisions.versions())  # type: ignore[arg-type]
    if path.is_file() and path.stat().st_size:
        doc = autotune_decisions.merge(autotune_decisions.load(path), doc)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1) + "\n")
    return sum(len(rows) for rows in doc["kernels"].values())


def refuse_here(device: str, environ: dict[str, str] | None = None) -> None:
    """NothingToCompile where no GPU kernel would compile: the interpreter, no CUDA device."""
    env = os.environ if environ is None else environ
    if env.get("TRITON_INTERPRET", "0") not in ("", "0"):
        raise NothingToCompile(INTERPRETER)
    if not str(device).startswith("cuda"):
        raise NothingToCompile(f"{NO_CUDA} (--device {device})")
    import torch

    if not torch.cuda.is_available():
        raise NothingToCompile(NO_CUDA)
