"""What `fastpath capture` takes and gives back: its options, where a run stands (what a Ctrl-C
says was kept), its result, and the checks that need neither torch nor the model, each one line
before anything is read.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastpath.capture import distributed
from fastpath.capture.data import file_sha256
from fastpath.capture.formats import DEFAULT_FORMAT, FORMAT_NAMES, CaptureFormat, capture_format
from fastpath.capture.out_dir import check_out
from fastpath.shared.errors import FastpathError, UsageError


class CaptureCheckError(FastpathError):
    """A captured row failed its checks: the run stops, naming the row."""


@dataclass
class CaptureStatus:
    """Where a capture stands, filled in as it goes: what an interrupt says was kept."""

    stage: str = "while starting"
    rows: int | None = None  # rows in DATA, once read
    out: Path | None = None
    writer: Any = None

    def kept(self) -> str:
        """'12 of 40 rows are in --out DIR ...' (the files on disk, counted now)."""
        out = self.out
        if out is None or self.writer is None:
            return "nothing written"
        if self.rows is None:
            touched = out.is_dir() and any(out.iterdir())
            return f"--out {out} {'left as it was' if touched else 'not written to'} (DATA not read yet)"
        done = sum(1 for i in range(self.rows) if self.writer.is_done(i)) if out.is_dir() else 0
        if done == 0:
            return f"0 of {self.rows} rows in --out {out}: nothing captured yet"
        return (f"{done} of {self.rows} rows in --out {out}, every row file complete (written by atomic rename)")


@dataclass
class CaptureOptions:
    model: str
    data: str
    out: str
    format: str = DEFAULT_FORMAT  # a name in capture.formats.FORMATS
    max_len: int = 4096
    batch_tokens: int = 16384
    layers: str | None = None
    layer_convention: str = "before"
    dtype: str = "bf16"
    device: str | None = "auto"
    seed: int = 0
    model_layers: int | None = None
    tokenizer: str | None = None
    resume: bool = False
    allow_slow: bool = False
    reference_path: bool = False  # run the whole capture on the fallback (benchmarks)
    check_every: int = 256
    # re-check this many leading tokens of a sampled row (0: all). A reference forward costs
    # ~1.7x a fast one: whole 4096-token rows made the re-checks most of capture's overhead.
    recheck_tokens: int = 1024
    shard: str = "auto"  # auto | replicate | fsdp (distributed.choose_shard)
    verify_last: int = 4
    write_threads: int = 4
    write_slots: int | None = None  # staged rows at most (default: three batches' worth, within STAGING_BUDGET)
    overlap: bool = True  # queue batch k+1's forward before settling batch k (loop.capture_loop)
    progress: bool = True
    enable_kwargs: dict[str, Any] = field(default_factory=dict)
    check_client: str | None = None  # speculators | specforge: rebuild its training targets (capture.clients)
    client_target: str | None = None  # write MODEL as that client should read it here, and check it
    # with --format speculators and MODEL a directory: run speculators' check without --check-client
    # when speculators is importable (a user who does not know its norm bug will not ask), else say
    # once that the check exists
    auto_check_client: bool = True
    status: CaptureStatus = field(default_factory=CaptureStatus)
    # the CLI: a callable giving the message for a Ctrl-C before anything is written; the first
    # SIGINT then ends the process at once (interrupts.ExitAtFirstInterrupt)
    setup_interrupt_text: Any = None
    on_model: Any = None  # callable(model) after loading (tests inject faults through it)
    prebuilt: Any = None  # a BuiltModel from _load_target to reuse (benchmarks: one build, several runs)


@dataclass
class CaptureResult:
    out: Path
    rows: int
    written: int
    skipped_done: int
    tokens: int
    seconds: float
    checked: list[dict[str, Any]]
    path: str
    summary: dict[str, Any]
    shard: str = "replicate"
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


def check_options(opts: CaptureOptions) -> None:
    """Every check that needs neither torch nor transformers (the imports alone take seconds):
    one line, before the command says anything else. The rest (layers against the config, DATA's
    rows) follows the progress line that says they are being read."""
    from fastpath.models.dtypes import DTYPE_NAMES

    if opts.max_len < 2:
        raise UsageError("--max-len must be at least 2")
    if opts.batch_tokens < 1:
        raise UsageError("--batch-tokens must be positive")
    if str(opts.dtype).strip().lower() not in DTYPE_NAMES:
        raise UsageError(f"unknown dtype {opts.dtype!r}; use bf16, fp16 or fp32")
    if opts.model_layers is not None and opts.model_layers < 1:
        raise UsageError(f"--model-layers must be a positive integer, got {opts.model_layers}")
    if opts.check_every < 0:
        raise UsageError("--check-every must be >= 0 (0: only each rank's first row)")
    if opts.recheck_tokens < 0:
        raise UsageError("--recheck-tokens must be >= 0 (0: the whole row)")
    if opts.write_threads < 1 or (opts.write_slots is not None and opts.write_slots < 1):
        raise UsageError("--write-threads (and write_slots) must be at least 1")
    if opts.reference_path and not opts.allow_slow:
        raise UsageError("--reference-path runs the torch fallback: it needs --allow-slow")
    if opts.data is not None and not Path(opts.data).is_file():
        raise UsageError(f"data file {opts.data} does not exist")
    check_out(Path(opts.out).expanduser(), opts.resume)


def check_format_options(opts: CaptureOptions) -> CaptureFormat:
    """The format's choices that need no model, refused in one line before MODEL is read: the
    dtypes its client reads (CaptureFormat.check_dtype); --client-target needs a client."""
    fmt = capture_format(opts.format)
    fmt.check_dtype(opts.dtype)
    if opts.client_target and not opts.check_client:
        raise UsageError(f"--client-target goes with --check-client {'|'.join(FORMAT_NAMES)}")
    return fmt


def check_client_options(opts: CaptureOptions, model_dir: Path | None) -> None:
    """--check-client refused in one line before the load: it needs the client installed, a model
    directory (`model_dir`, from resolve_target) and the client's own layout."""
    if opts.check_client:
        from fastpath.capture.client_check import require_client

        require_client(opts.check_client, model_dir)
        if opts.check_client != opts.format:
            raise UsageError(f"--check-client {opts.check_client} reads the {opts.check_client} layout; "
                             f"--format is {opts.format}")


def say_to(world: distributed.World, enabled: bool, msg: str) -> None:
    if enabled and world.is_main:
        print(f"fastpath capture: {msg}", file=sys.stderr, flush=True)


def settings_record(opts: CaptureOptions, aux_ids: list[int], built: Any, load_device: Any) -> dict[str, Any]:
    """What a --resume must match (out_dir.SETTINGS_KEYS), as .capture/settings.json holds it."""
    return {
        "model": opts.model, "data": str(Path(opts.data).resolve()), "data_sha256": file_sha256(opts.data),
        "format": opts.format,
        "max_len": opts.max_len, "batch_tokens": opts.batch_tokens, "layers": aux_ids,
        "dtype": built.dtype_name, "seed": built.seed, "model_layers": opts.model_layers,
        # random weights depend on the device they were drawn on (FSDP draws them on the host)
        "weights_init": "checkpoint" if built.seed is None else f"random on {load_device.type}",
    }
