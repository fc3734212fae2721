"""`fastpath warmup MODEL` arguments and entry point: the input and the cache dir checked before
anything heavy is imported, exit 3 where nothing would compile, one progress line per phase, and
what landed in Triton's cache (the work, and why it pays: proof/warmup.py)."""

from __future__ import annotations

import argparse
import contextlib
import os
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from fastpath.proof.warmup import (
    AUTOTUNE_ENV,
    INTERPRETER,
    NothingToCompile,
    WarmupSettings,
    cache_dir,
    check_cache_dir,
    count_cache,
    refuse_here,
    warm_model,
)
from fastpath.shared.errors import FastpathError, UsageError, first_line

SHARE_HINT = ("to share with a fleet: export TRITON_CACHE_DIR=<a folder every node mounts> (and "
              f"{AUTOTUNE_ENV}=1) in the jobs and here, run this once per GPU model and software "
              "stack (torch, Triton, fastpath, fla-core versions), then start the jobs")


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

    require("warmup")  # torch and transformers: one install line, before torch is imported
    from fastpath.routing.routes import check_switches

    check_switches()  # a bad FASTPATH_* value: one line, before any compile
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

