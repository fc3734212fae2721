"""`fastpath bench MODEL` arguments and entry point: settings from the arguments, --out and
--compare checked before any work, the workers' progress on stderr, the files and the summary;
exit 1 when a configuration failed, 128 + N on signal N with what was measured kept (the run
itself: proof/bench.py)."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

from fastpath.proof.bench import preflight, run_bench
from fastpath.proof.bench_outputs import (
    compare_docs,
    load_previous,
    machine_mismatches,
    settings_mismatches,
    terminal_text,
    write_outputs,
    write_tables,
)
from fastpath.proof.bench_spec import (
    CONFIGS,
    DEFAULT_CONFIGS,
    PHASE_REGISTRY,
    BenchSettings,
    default_phases,
    phase_label,
)
from fastpath.shared.errors import UsageError

OUTPUT_NAMES = ("bench.json", "bench.md", "bench.png")
DEFAULT_OUT = "fastpath-bench"


class BenchInterrupted(KeyboardInterrupt):
    """SIGTERM / SIGHUP during bench (a `timeout`, a job scheduler, a closed terminal): handled
    like Ctrl-C, so the worker is killed and the finished configurations stay on disk."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


@contextlib.contextmanager
def _signals_interrupt() -> Any:
    """SIGTERM and SIGHUP raise BenchInterrupted in the main thread while the block runs."""
    import signal

    def handler(signum: int, _frame: Any) -> None:
        raise BenchInterrupted(signum)

    saved = {}
    for sig in (signal.SIGTERM, getattr(signal, "SIGHUP", None)):
        if sig is not None:
            saved[sig] = signal.signal(sig, handler)
    try:
        yield
    finally:
        for sig, old in saved.items():
            signal.signal(sig, old)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", metavar="MODEL", help="preset name, config.json path, or local model directory with safetensors")
    parser.add_argument("--seq-len", type=int, default=4096, help="tokens per row (default 4096)")
    parser.add_argument("--batch", type=int, default=1, help="rows (default 1)")
    parser.add_argument("--layers", type=int, default=None, help="keep N layers, every layer type of the model represented")
    parser.add_argument("--dtype", default="auto", choices=["auto", "bf16", "fp16", "fp32"], help="auto: bf16 on a GPU, fp32 on CPU")
    parser.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    parser.add_argument("--decode-tokens", type=int, default=64, help="cached single-token steps timed (default 64)")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per phase; the median is reported (default 5)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed runs per phase first (default 2)")
    cuda_only = [name for name, phase in PHASE_REGISTRY.items() if phase.needs_cuda]
    about = "; ".join(f"{name}: {phase.about}" for name, phase in PHASE_REGISTRY.items() if phase.about)
    parser.add_argument("--phases", default=None, help=(
        f"comma list of {', '.join(PHASE_REGISTRY)} (default: {','.join(default_phases())}"
        + (f", and {','.join(cuda_only)} on a CUDA device" if cuda_only else "") + ")"
        + (f"; {about}" if about else "")))
    parser.add_argument("--configs", default=",".join(DEFAULT_CONFIGS),
                        help=f"comma list of {', '.join(CONFIGS)} (default: {','.join(DEFAULT_CONFIGS)})")
    parser.add_argument("--seed", type=int, default=0, help="seed for random weights and inputs")
    parser.add_argument("--out", default=None, metavar="DIR", help=(
        f"directory for bench.json, bench.md, bench.png (default: {DEFAULT_OUT}, or the next free {DEFAULT_OUT}-N "
        "when it holds an earlier run); a DIR given here that holds an earlier run's files needs --force"))
    parser.add_argument("--force", action="store_true", help="let --out DIR replace an earlier run's files")
    parser.add_argument("--compare", metavar="PREVIOUS.json", default=None, help="show the change against an earlier bench.json")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds per configuration (default 3600)")
    parser.add_argument("--json", action="store_true", help="print the result JSON on stdout (files are written too)")


class _BenchProgress:
    """Worker progress on stderr: a rich bar in a terminal, one plain line per (config, phase)
    when piped (see proof/progress.py)."""

    def __init__(self, total: int) -> None:
        from fastpath.proof.progress import Stages

        self.stages = Stages("bench")
        self.total = total
        self.bar: Any = None
        self.last: tuple[str, str] | None = None

    def __enter__(self) -> _BenchProgress:
        if self.stages.rich:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
            )

            self.bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                TimeElapsedColumn(), console=Console(stderr=True), transient=False)
            self.bar.__enter__()
            self.task = self.bar.add_task("bench", total=self.total)
        return self

    def note(self, text: str) -> None:
        if self.bar is not None:
            self.bar.console.print(f"bench: {text}", markup=False, highlight=False)
        else:
            self.stages.note(text)

    def __call__(self, config: str, phase: str) -> None:
        if self.bar is not None:
            self.bar.update(self.task, advance=1, description=f"{config}: {phase_label(phase)}")
        elif (config, phase) != self.last:
            self.stages(f"{config}: {phase_label(phase)}")
        self.last = (config, phase)

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.update(self.task, completed=self.total, description="done")
            self.bar.__exit__(None, None, None)
        elif exc[0] is None:
            self.stages("done")


def main(args: argparse.Namespace) -> int:
    from fastpath.shared.extras import require, requirement_error

    require("bench")  # before any work: torch and transformers
    from fastpath.routing.routes import check_switches

    check_switches()  # a bad FASTPATH_* value stops here, not in each worker
    no_chart = requirement_error("chart")  # matplotlib: only the PNG depends on it
    from fastpath.models.dtypes import resolve_device, resolve_dtype
    from fastpath.shared.output_files import check_out_dir, free_dir

    if args.out is None:  # the default folder never replaces an earlier run: the next free name
        out = free_dir(Path(DEFAULT_OUT), OUTPUT_NAMES)
        if out != Path(DEFAULT_OUT):
            print(f"fastpath bench: {DEFAULT_OUT}/ holds an earlier run; this one goes to {out}/", file=sys.stderr)
    else:
        out = Path(args.out).expanduser()
    # before any work: a bad --out used to cost the whole run
    check_out_dir(out, "--out", OUTPUT_NAMES, force=args.force or args.out is None)
    device = str(resolve_device(args.device))
    phases = default_phases(device) if args.phases is None else tuple(p.strip() for p in args.phases.split(",") if p.strip())
    settings = BenchSettings(
        source=args.model, layers=args.layers, dtype=resolve_dtype(args.dtype, device), device=device,
        seq_len=args.seq_len, batch=args.batch, decode_tokens=args.decode_tokens, repeats=args.repeats,
        warmup=args.warmup, seed=args.seed, phases=phases,
    )
    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    previous = load_previous(args.compare) if args.compare else None
    if previous is not None:
        settings.validate()
        differ = settings_mismatches({**settings.__dict__}, os.environ.get("TRITON_INTERPRET") == "1", previous)
        if differ:
            raise UsageError(f"--compare {args.compare} is not comparable with this run: {'; '.join(differ)} "
                             "(run with the same model, shape, dtype and device, or leave out --compare)")
    size = preflight(settings, configs)
    per_config = len(settings.phases) * (settings.warmup + settings.repeats)
    latest: dict[str, Any] = {}

    def keep(doc: dict[str, Any]) -> None:  # after each configuration: on disk at once
        latest["doc"] = doc
        write_tables(doc, out, None)

    try:
        with _signals_interrupt(), _BenchProgress(per_config * len(configs)) as progress:
            for line in size.header():
                progress.note(line)
            if size.defaults_note():
                progress.note(f"note: {size.defaults_note()}")
            doc = run_bench(settings, configs, timeout=args.timeout, progress=progress, size=size, on_result=keep)
    except KeyboardInterrupt as exc:
        signum = exc.signum if isinstance(exc, BenchInterrupted) else 2
        return _interrupted(latest.get("doc"), out, signum)
    comparison = compare_docs(doc, previous) if previous else None
    if comparison is not None:
        assert previous is not None
        doc["compare"] = {"file": args.compare, "changes": comparison, "differences": machine_mismatches(doc, previous)}
    paths, no_png = write_outputs(doc, out, comparison, draw_chart=no_chart is None)
    if args.json:
        json.dump(doc, sys.stdout, indent=1, default=str)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(terminal_text(doc, comparison, shutil.get_terminal_size().columns))
    print(f"fastpath bench: wrote {', '.join(str(p) for p in paths.values())}", file=sys.stderr)
    if no_png is not None:
        print(f"fastpath bench: no bench.png: {no_png}", file=sys.stderr)
    failed = [r["config"] for r in doc["configs"] if "error" in r]
    return 1 if failed else 0


def _interrupted(doc: dict[str, Any] | None, out: Path, signum: int) -> int:
    """Mark what is on disk as interrupted; one line on stderr; exit 128 + signal."""
    import signal

    name = signal.Signals(signum).name
    if doc is None or not doc["configs"]:
        print(f"fastpath bench: interrupted ({name}) before the first configuration finished; nothing written",
              file=sys.stderr)
        return 128 + signum
    doc["partial"] = {**doc["partial"], "why": f"interrupted by {name}"}
    paths = write_tables(doc, out, None)
    print(f"fastpath bench: interrupted ({name}); {doc['partial']['done']} of {doc['partial']['total']} "
          f"configurations measured, kept in {paths['json']} and {paths['markdown']} (marked partial)",
          file=sys.stderr)
    return 128 + signum
