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

import argparse
import contextlib
import os
import tempfile
import textwrap
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastpath.shared.errors import FastpathError, UsageError, first_line

NO_CUDA = "warmup compiles GPU kernels: no CUDA device"
INTERPRETER = ("warmup compiles GPU kernels: TRITON_INTERPRET=1 runs them in Triton's interpreter, "
               "which compiles nothing; unset it")
AUTOTUNE_ENV = "TRITON_CACHE_AUTOTUNING"
SHARE_HINT = ("to share with a fleet: export TRITON_CACHE_DIR=<a folder every node mounts> (and "
              f"{AUTOTUNE_ENV}=1) in the jobs and here, run this once per GPU model and software "
              "stack (torch, Triton, fastpath, fla-core versions), then start the jobs")


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
            from fastpath.models.build import check_layers

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

    from fastpath.models.build import build_model, plan_job
    from fastpath.proof.bench_spec import PHASE_REGISTRY, BenchSettings
    from fastpath.routing import engine as routes

    done("import")
    layers = settings.layers
    if layers is None:
        layers = plan_job(settings.source, layers=None, dtype=settings.dtype, device="meta").min_layers
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


# ---------------------------------------------------------------------------------------------
# CLI


EPILOG = """\
what it does: builds MODEL's cut with random weights on the GPU, applies
fastpath.enable(), runs one forward (with --train one forward+backward, with
--decode two cached decode steps) at --batch x --seq, so every Triton kernel
of the fast path compiles and every autotuner decides. One progress line per
phase with elapsed seconds.

where it goes: Triton's cache, TRITON_CACHE_DIR (else ~/.triton/cache).
Compiled kernels are always kept there; autotune decisions where the
autotuner asks (fla-core and fastpath do; TRITON_CACHE_AUTOTUNING=1 asks
for every autotuner, and this command sets it for itself).

a fleet: set TRITON_CACHE_DIR to a folder every node mounts, run warmup once
per GPU model and software stack, then the jobs with the same setting.
Kernels depend on head sizes, dtype and batch, seldom on the sequence
length: warm at the batch and dtype the jobs use.

exit status: 0 warmed, 1 a phase failed (out of memory, a kernel error),
2 bad input (unknown preset, bad number, a cache dir that is not writable),
3 nothing to compile here (no CUDA device, or TRITON_INTERPRET=1),
130 interrupted (Ctrl-C; what compiled so far stays in the cache).
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = EPILOG
    parser.add_argument("model", metavar="MODEL", help="preset name, config.json path, or model directory")
    parser.add_argument("--layers", type=int, default=None, metavar="N",
                        help="keep N layers (default: the fewest that keep every layer type: "
                             "the same kernels as the whole model)")
    parser.add_argument("--batch", type=int, default=1, metavar="B", help="rows (default 1)")
    parser.add_argument("--seq", type=int, default=4096, metavar="L", help="tokens per row (default 4096)")
    parser.add_argument("--dtype", default="auto", choices=["auto", "bf16", "fp16", "fp32"],
                        help="auto: bf16")
    parser.add_argument("--train", action="store_true", help="also forward+backward (training kernels)")
    parser.add_argument("--decode", action="store_true",
                        help="also two cached decode steps (serving kernels)")
    parser.add_argument("--device", default="cuda", help="cuda | cuda:N (default cuda)")
    parser.add_argument("--save-decisions", metavar="FILE", default=None,
                        help="also write the autotune decisions made here to FILE (JSON, merged "
                             "with the ones FILE holds for this GPU kind; a later process on the "
                             "same GPU kind applies them: FASTPATH_AUTOTUNE_DECISIONS=FILE)")


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


def _check_mergeable(path: Path) -> None:
    """An existing --save-decisions FILE must be decisions for this GPU kind (they are merged):
    said before the work, not after it."""
    from fastpath.routing import autotune_decisions

    if not path.stat().st_size:
        return
    held = autotune_decisions.load(path).get("device", {}).get("capability")
    device = autotune_decisions.this_device()
    if device is not None and held != list(device[1]):
        raise UsageError(f"--save-decisions {path} holds decisions for compute capability {held}, this GPU "
                         f"is {list(device[1])}; give another file")


@contextlib.contextmanager
def _terminate_as_interrupt() -> Iterator[None]:
    """SIGTERM (a `timeout`, a scheduler) stops the warmup like Ctrl-C."""
    import signal

    def handler(signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt(signum)

    old = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def main(args: argparse.Namespace) -> int:
    from fastpath.shared.model_source import load_config

    settings = WarmupSettings(source=args.model, layers=args.layers, batch=args.batch, seq_len=args.seq,
                              dtype="bf16" if args.dtype == "auto" else args.dtype, device=args.device,
                              train=args.train, decode=args.decode, save_decisions=args.save_decisions)
    settings.validate()
    load_config(args.model)  # an unknown preset is one line before anything is imported
    if args.save_decisions:  # before any work: a bad path used to cost the whole run
        from fastpath.shared.output_files import resolve_save_file

        settings.save_decisions = str(resolve_save_file(args.save_decisions, "--save-decisions",
                                                        "autotune-decisions.json", force=True))
    where, why = cache_dir()
    check_cache_dir(where)
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        raise NothingToCompile(INTERPRETER)
    from fastpath.shared.extras import require

    require("verify")  # torch and transformers: one install line, before torch is imported
    refuse_here(settings.device)
    if settings.save_decisions and Path(settings.save_decisions).is_file():
        _check_mergeable(Path(settings.save_decisions))
    # Every autotuner built from here on keeps its decisions on disk (Triton >= 3.4).
    os.environ.setdefault(AUTOTUNE_ENV, "1")
    from fastpath.proof.progress import Stages

    before = count_cache(where)
    with Stages("warmup") as stages:
        stages.note(f"Triton cache: {where} ({why})")
        try:
            with _terminate_as_interrupt():
                result = warm_model(settings, stages)
        except FastpathError:
            raise
        except KeyboardInterrupt:
            new = count_cache(where).minus(before)
            stages.note(f"interrupted during {stages.current}; {new.kernels} kernels compiled so far "
                        f"stay in {where}")
            raise
        except Exception as exc:  # out of memory, a kernel error: one line, exit 1
            hint = "; lower --batch or --seq" if "OutOfMemoryError" in type(exc).__name__ else ""
            raise FastpathError(f"{stages.current or 'warmup'}: {first_line(exc, with_type=True)}{hint}") from None
    new = count_cache(where).minus(before)
    print(f"warmed {result.model}")
    print("seconds: " + ", ".join(f"{k} {v:.1f}" for k, v in result.phases.items()))
    print(f"Triton cache: {where} ({why}): {new.kernels} kernels compiled, {new.autotune} autotune "
          "decisions stored in this run")
    if result.decisions is not None:
        print(f"autotune decisions: {settings.save_decisions} holds {result.decisions}")
    for op in result.slow_ops:
        print(f"note: not on a fast kernel, nothing compiled for it: {op}")
    print(textwrap.fill(SHARE_HINT, 80, break_long_words=False, break_on_hyphens=False))
    return 0

