"""The capture loop: load the target and the rows, gate on the fast path, then per batch:
forward with hooks -> check every state (on the device) -> re-run sampled rows on the reference
path -> stage the rows for the background writers (staging.RowWrites) -> next batch.

Order matters for "nothing half-written": a batch is staged only after all its rows passed, and
each file appears by an atomic rename. A failed check stops every rank with the row id; what was
written before is complete and `--resume` continues from it.

The run records where its time went (CaptureResult.timings, per rank in the summary): forward
(the batch forwards; on a GPU the device is synchronised after each, which costs nothing as the
checks read results right after), checks, recheck (reference forwards and comparisons), stage
(layout + queued copies), write_wait (blocked on a free staging slot or on the final writes),
sync (status all-reduces and, sharded, the padding forwards) and other (the rest of the loop).
"""

from __future__ import annotations

import json
import shlex
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastpath.capture import distributed
from fastpath.capture.checks import batch_problems, row_problems, token_norms
from fastpath.capture.data import load_rows, load_tokenizer
from fastpath.capture.formats import DEFAULT_FORMAT, FORMAT_NAMES, CaptureFormat, capture_format
from fastpath.capture.interrupts import ExitAtFirstInterrupt
from fastpath.capture.layers import capture_hooks, decoder_parts, norm_convention, parse_layers
from fastpath.capture.packing import batches_for_rank, make_batches
from fastpath.capture.recheck import recheck_rows
from fastpath.capture.staging import RowWrites, slot_bytes
from fastpath.capture.writers import SUMMARY_NAME, atomic_json, remove_stale_temps
from fastpath.models.resolve import ResolvedModel
from fastpath.shared.errors import FastpathError, UsageError, first_line
from fastpath.shared.output_files import PROBE_PREFIX, probe_dir

STATE_DIR = ".capture"  # per-rank records and the settings a resume must match
SETTINGS_KEYS = ("model", "data", "data_sha256", "format", "max_len", "batch_tokens", "layers", "dtype", "seed",
                 "model_layers", "weights_init")
# Keys newer than some captures on disk: compared only when the old settings have them.
_LATER_KEYS = ("weights_init",)
STAGING_BUDGET = 8 << 30  # host bytes of staged rows at most (at least one slot)


def file_sha256(path: str | Path) -> str:
    """Content hash of DATA: a resume against an edited file would pair rows with the wrong files."""
    import hashlib

    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


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
    write_slots: int | None = None  # staged rows at most (default: two batches' worth, within STAGING_BUDGET)
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


def _say(world: distributed.World, enabled: bool, msg: str) -> None:
    if enabled and world.is_main:
        print(f"fastpath capture: {msg}", file=sys.stderr, flush=True)


def _check_out(out: Path, resume: bool) -> bool:
    """Refuse a DIR that is a file, or non-empty without --resume, or a resume of something that
    is not a capture. True when there is a capture to resume."""
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} exists and is not a directory")
    probe_dir(out, "--out")  # tried for real: root passes every permission check, /proc refuses mkdir
    # under torchrun another rank may be probing --out at this moment: its probe file is not a capture
    if not out.exists() or all(p.name.startswith(PROBE_PREFIX) for p in out.iterdir()):
        return False
    if not resume:
        raise UsageError(f"--out {out} is not empty; pass --resume to continue a capture there")
    if not (out / STATE_DIR / "settings.json").is_file():
        raise UsageError(f"--out {out} holds no fastpath capture to resume ({STATE_DIR}/settings.json missing)")
    return True


def _prepare_out(out: Path, resuming: bool, settings: dict[str, Any]) -> None:
    """Refuse a resume (resuming: _check_out found a capture to continue) with different settings."""
    state = out / STATE_DIR / "settings.json"
    if resuming:
        try:
            old = json.loads(state.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise UsageError(f"cannot read {state}: {exc}") from None
        diff = [k for k in SETTINGS_KEYS if (k in old or k not in _LATER_KEYS) and old.get(k) != settings.get(k)]
        if diff:
            raise UsageError(f"--resume with different settings than the run in {out}: {', '.join(diff)}")


def _write_settings(out: Path, settings: dict[str, Any]) -> None:
    try:
        out.mkdir(parents=True, exist_ok=True)
        atomic_json(out / STATE_DIR / "settings.json", settings)
    except OSError as exc:
        raise UsageError(f"cannot write to --out {out}: {exc.strerror or exc}") from None


def _gate_fast_path(model: Any, opts: CaptureOptions) -> tuple[str, bool]:
    """enable() + assert_fast, or a clear refusal. Returns (path label, on_fast_path)."""
    from fastpath.routing import engine as routes

    if opts.reference_path:
        if not opts.allow_slow:
            raise UsageError("--reference-path runs the torch fallback: it needs --allow-slow")
        routes.disable()
        return "slow (--allow-slow --reference-path): every op on transformers' reference path", False
    routes.enable(**{"warn": False, **opts.enable_kwargs})
    try:
        routes.assert_fast(model)
    except FastpathError as exc:
        slow = [r for r in routes.explain(model).rows if not r["fast"]]
        reason = (f"{len(slow)} op(s) take a slow path (first: {slow[0]['layer']} {slow[0]['op']}: {slow[0]['impl']})"
                  if slow else first_line(exc))
        if not opts.allow_slow:
            routes.disable()
            raise FastpathError(f"refusing to capture on a slow fallback: {reason} "
                                f"(run `fastpath doctor --model {shlex.quote(str(opts.model))}`; "
                                "--allow-slow to capture anyway)") from None
        return f"slow (--allow-slow): {reason}", True
    return "fast", True


class _Progress:
    """Rows done and the ETA on stderr. `already`: rows this rank found finished (--resume); the
    rate counts only rows done in this run, or a resume's ETA would credit it with the old ones."""

    def __init__(self, world: distributed.World, enabled: bool, total_rows: int, already: int = 0) -> None:
        self.world, self.enabled, self.total, self.already = world, enabled, total_rows, already
        self.start = time.perf_counter()
        self.last = 0.0
        self.shown = -1

    def update(self, rows_done: int, tokens: int, final: bool = False) -> None:
        now = time.perf_counter()
        if not (self.enabled and self.world.is_main) or (not final and now - self.last < 2.0):
            return
        if final and rows_done == self.shown:
            return
        self.last, self.shown = now, rows_done
        elapsed = max(now - self.start, 1e-9)
        est_done = min(rows_done * self.world.size, self.total)
        rate = max(rows_done - self.already, 0) * self.world.size / elapsed
        eta = (self.total - est_done) / rate if rate > 0 else float("inf")
        eta_text = "-" if eta == float("inf") else f"{int(eta // 60)}m{int(eta % 60):02d}s"
        print(f"fastpath capture: {est_done}/{self.total} rows, {tokens / elapsed:,.0f} tok/s per process, "
              f"ETA {eta_text}", file=sys.stderr, flush=True)


def resolve_target(opts: CaptureOptions, device: Any) -> ResolvedModel:
    """MODEL read once, cut to --model-layers, in --dtype, on `device` (the prebuilt model's own
    when there is one): the layer ids, the tokenizer, the shard decision, the build and the client
    checks all read this value, never opts.model again."""
    if opts.prebuilt is not None:
        return opts.prebuilt.resolved
    from fastpath.models.resolve import resolve_model

    return resolve_model(opts.model, layers=opts.model_layers, dtype=opts.dtype, device=device)


def load_target(opts: CaptureOptions, device: Any, skeleton: bool = False,
                target: ResolvedModel | None = None) -> Any:
    """The target with its weights on `device`, or (skeleton) only its shapes, on meta.
    target: the run's resolve_target (resolved here when not given)."""
    from fastpath.models.build import build_resolved
    from fastpath.models.paths import hidden_compiled_peers

    target = (target if target is not None else resolve_target(opts, device)).on(device)
    # The reference path must be transformers' torch fallbacks (as in `fastpath verify`).
    with hidden_compiled_peers():
        return build_resolved(target, seed=opts.seed, skeleton=skeleton)


def _shard_mode(opts: CaptureOptions, world: distributed.World, device: Any, target: ResolvedModel) -> str:
    import torch

    return distributed.choose_shard(opts.shard, world.size, device.type, lambda: target.weight_bytes,
                                    lambda: torch.cuda.get_device_properties(device).total_memory)


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


def _auto_client_check(opts: CaptureOptions, out: Path, writer: Any, model: Any, aux_ids: list[int],
                       say: Any, model_dir: Path | None) -> dict[str, Any] | None:
    """Without --check-client: the check of the format's client when it is importable here (its
    record, also in capture_summary.json), else one line saying that the check exists. Never
    fails the capture: the rows are on disk; a check that cannot run is one warning."""
    import importlib.util

    fmt = capture_format(opts.format)
    if not fmt.checked_unasked or not opts.auto_check_client or opts.prebuilt is not None:
        return None
    client = fmt.name
    if model_dir is None:
        return None  # random weights: no checkpoint a client would train against
    if importlib.util.find_spec(client) is None:
        from fastpath.capture.client_check import side_venv_hint

        say(f"note: {client} is not installed in this Python, so what it trains against was not checked; "
            f"`--check-client {client}` does ({fmt.unasked_why}). {side_venv_hint(client)}")
        return None
    say(f"checking what {client} trains against ({client} is installed; this check runs whenever it is)")
    try:
        return {client: client_check(opts, out, writer, model, aux_ids, say, model_dir, client=client)}
    except Exception as exc:  # the client's own code: its failure is a warning, the capture stands
        say(f"WARNING: the {client} check could not run ({first_line(exc, with_type=True)}); run "
            f"`fastpath capture MODEL --out {out} --check-client {client}` to see it alone")
        return None


def client_check(opts: CaptureOptions, out: Path, writer: Any, model: Any, aux_ids: list[int],
                 say: Any, model_dir: Path | None, client: str | None = None) -> dict[str, Any]:
    """capture.client_check.check_client for this capture; the record also lands in capture_summary.json."""
    from fastpath.capture.client_check import check_client
    from fastpath.capture.layers import decoder_parts, norm_convention

    norm = decoder_parts(model).norm
    client = client or opts.check_client
    assert client is not None and model_dir is not None  # check_client_options
    record = check_client(client, out=out, model=model, model_dir=model_dir, writer=writer,
                          aux_ids=aux_ids, convention=norm_convention(norm),
                          eps=float(getattr(norm, "variance_epsilon", getattr(norm, "eps", 1e-6))),
                          client_target=Path(opts.client_target) if opts.client_target else None, say=say)
    summary_path = out / SUMMARY_NAME
    summary = json.loads(summary_path.read_text()) if summary_path.is_file() else {}
    summary.setdefault("client_checks", {})[client] = record
    atomic_json(summary_path, summary)
    return record


def check_existing_capture(opts: CaptureOptions) -> dict[str, Any]:
    """`fastpath capture MODEL --out DIR --check-client X` without DATA: check the capture in DIR,
    rebuilding MODEL with the settings it was captured with (layers cut, dtype, seed)."""
    if not opts.check_client:
        raise UsageError("DATA is required (or leave it out with --check-client to check the capture in --out)")
    out = Path(opts.out).expanduser()
    state = out / STATE_DIR / "settings.json"
    if not state.is_file() or not (out / SUMMARY_NAME).is_file():
        raise UsageError(f"--out {out} holds no finished fastpath capture ({STATE_DIR}/settings.json, {SUMMARY_NAME})")
    settings = json.loads(state.read_text())
    opts.format = settings.get("format", opts.format)
    opts.dtype, opts.model_layers = settings.get("dtype", opts.dtype), settings.get("model_layers")
    opts.seed = settings.get("seed") if settings.get("seed") is not None else opts.seed
    if opts.check_client != opts.format:
        raise UsageError(f"--check-client {opts.check_client} reads the {opts.check_client} layout; {out} holds "
                         f"the {opts.format} layout")
    from fastpath.capture.client_check import require_client

    target = resolve_target(opts, opts.device)
    require_client(opts.check_client, target.model_dir)
    world = distributed.world_from_env()
    say = lambda msg: _say(world, opts.progress, msg)  # noqa: E731
    built = load_target(opts, target.device, target=target)
    return client_check(opts, out, capture_format(opts.format).make_writer(out), built.model,
                        list(settings["layers"]), say, target.model_dir)


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
    _check_out(Path(opts.out).expanduser(), opts.resume)


def run_capture(opts: CaptureOptions) -> CaptureResult:
    """Capture every row of opts.data into opts.out (see the package doc)."""
    import torch

    from fastpath.models.dtypes import resolve_device

    check_options(opts)
    fmt = check_format_options(opts)
    world = distributed.world_from_env()
    device = resolve_device(opts.device)
    if device.type == "cuda" and world.size > 1:
        device = torch.device("cuda", world.local_rank)
        torch.cuda.set_device(device)
    target = resolve_target(opts, device)  # MODEL's config: read here, once
    check_client_options(opts, target.model_dir)
    shard = _shard_mode(opts, world, device, target)
    out = Path(opts.out).expanduser()
    writer = fmt.make_writer(out)
    opts.status.out, opts.status.writer = out, writer
    active, owned = distributed.init(world, device)
    guard = ExitAtFirstInterrupt(opts.setup_interrupt_text if world.is_main else (lambda: ""),
                                 active=opts.setup_interrupt_text is not None)
    try:
        with guard:
            return _run(opts, target, fmt, world, device, shard, out, writer, active, guard)
    finally:
        from fastpath.routing import engine as routes

        routes.disable()
        distributed.shutdown(owned)


@dataclass
class _Loop:
    """What every step of the capture loop reads (one rank's view)."""

    opts: CaptureOptions
    rows: list[Any]
    parts: Any
    device: Any
    aux_ids: list[int]
    capture_ids: list[int]
    num_layers: int
    writer: Any
    meta: dict[str, str]
    tol: Any
    on_fast: bool
    norms: Any  # per-vocabulary-entry embedding norms (checks.token_norms), on the device
    writes: RowWrites
    active: bool
    budget: distributed.ForwardBudget | None  # sharded: equal forward counts per step
    timings: dict[str, float] = field(default_factory=dict)

    def add(self, key: str, since: float) -> float:
        now = time.perf_counter()
        self.timings[key] = self.timings.get(key, 0.0) + now - since
        return now


def _staging(opts: CaptureOptions, writer: Any, rows: list[Any], todo: list[int], mine: list[tuple[int, list[int]]],
             aux_ids: list[int], hidden: int, dtype: Any, device: Any) -> RowWrites:
    """Slots sized for this rank's longest row (the layout's shapes, worked out on the meta
    device); two batches' worth by default, at most STAGING_BUDGET bytes, never more than rows."""
    import torch

    longest = max((len(rows[i].input_ids) for i in todo), default=1)
    state = torch.empty(longest, hidden, dtype=dtype, device="meta")
    shapes = [tuple(t.shape) for t in writer.layout([state] * len(aux_ids), state, state)]
    nbytes = slot_bytes(shapes, dtype)
    most = max((len(b) for _, b in mine), default=1)
    slots = opts.write_slots or max(2, 2 * most)
    slots = max(1, min(slots, STAGING_BUDGET // max(nbytes, 1), len(todo)))
    return RowWrites(slots, nbytes, pin=device.type == "cuda", threads=opts.write_threads)


def _read_rows(opts: CaptureOptions, target: ResolvedModel, say: Any) -> Any:
    """--layers against the target's config, then DATA's rows (tokenized with --tokenizer, else the
    model directory's): what the user typed is checked from the config alone, before the weights
    load (a large checkpoint takes minutes, on every rank)."""
    from fastpath.models.sizing import human_bytes

    parse_layers(opts.layers, int(target.config.num_hidden_layers), opts.layer_convention)
    opts.status.stage = "while reading DATA"
    tokenizer_dir = opts.tokenizer or (str(target.model_dir) if target.model_dir is not None else None)
    size = Path(opts.data).stat().st_size if Path(opts.data).is_file() else 0
    say(f"reading {opts.data} ({human_bytes(size)}" + (", tokenizing every conversation)" if tokenizer_dir else ")"))
    tokenizer = load_tokenizer(tokenizer_dir) if tokenizer_dir else None
    loaded = load_rows(opts.data, tokenizer, opts.max_len, int(target.config.vocab_size))
    opts.status.rows = len(loaded.rows)
    return loaded


def _load_model(opts: CaptureOptions, target: ResolvedModel, world: distributed.World, device: Any, shard: str,
                rows: int, say: Any) -> tuple[Any, Any, bool]:
    """(the built target, the device its weights were made on, whether this rank holds a meta
    skeleton). Sharded, only rank 0 loads the weights (on the host); the other ranks build the
    model on the meta device and receive their shards from it (distributed.shard_decoder), so the
    host holds one copy of the checkpoint however many processes run."""
    import torch

    opts.status.stage = "while building the model"
    say(f"{rows} rows; loading {opts.model}" + (" on rank 0's host, to shard with FSDP2" if shard == "fsdp" else "")
        + ("" if opts.prebuilt is not None or target.model_dir is not None
           else ": random weights initialised on the host first (minutes for a full-size preset)"))
    load_device = torch.device("cpu") if shard == "fsdp" else device
    skeleton = shard == "fsdp" and not world.is_main and opts.prebuilt is None
    built = opts.prebuilt if opts.prebuilt is not None else load_target(opts, load_device, skeleton, target)
    if opts.on_model is not None:
        opts.on_model(built.model)
    return built, load_device, skeleton


def _settings_record(opts: CaptureOptions, aux_ids: list[int], built: Any, load_device: Any) -> dict[str, Any]:
    """What a --resume must match (SETTINGS_KEYS), as .capture/settings.json holds it."""

    return {
        "model": opts.model, "data": str(Path(opts.data).resolve()), "data_sha256": file_sha256(opts.data),
        "format": opts.format,
        "max_len": opts.max_len, "batch_tokens": opts.batch_tokens, "layers": aux_ids,
        "dtype": built.dtype_name, "seed": built.seed, "model_layers": opts.model_layers,
        # random weights depend on the device they were drawn on (FSDP draws them on the host)
        "weights_init": "checkpoint" if built.seed is None else f"random on {load_device.type}",
    }


def _open_out(out: Path, resuming: bool, settings: dict[str, Any], opts: CaptureOptions, world: distributed.World,
              active: bool) -> None:
    """Refuse a resume with other settings, then (rank 0) write the settings and drop a killed
    run's temporary files; every rank waits for that before writing."""
    _prepare_out(out, resuming, settings)
    distributed.barrier(active)
    if world.is_main:
        _write_settings(out, settings)
        if opts.resume:
            remove_stale_temps(out)  # left by a killed run; no rank writes before the barrier
    distributed.barrier(active)


def _row_meta(opts: CaptureOptions, writer: Any, parts: Any, built: Any, path_label: str, aux_ids: list[int],
              num_layers: int, convention: str) -> dict[str, str]:
    """The metadata every row file (and the index) carries: path, layers, last state, norm, dtype."""

    return {
        "fastpath_path": path_label,
        "fastpath_layers_capture_before": ",".join(str(i) for i in [*aux_ids, num_layers]),
        "fastpath_last_state": (f"hidden_states[:, -1]: output of decoder layer {num_layers - 1} before the final norm"
                                if writer.needs_pre else f"hidden_state: output of the final norm (model.{parts.norm_name})"),
        "fastpath_final_norm": f"model.{parts.norm_name}: {convention}",
        "fastpath_dtype": built.dtype_name,
        "fastpath_model": opts.model,
    }


def _recheck_resumed(opts: CaptureOptions, writer: Any, rows: list[Any], mine: list[tuple[int, list[int]]],
                     aux_ids: list[int], built: Any, norms: Any, say: Any, rank: int) -> set[int]:
    """This rank's rows already on disk (--resume): finished files are trusted, but the last
    `verify_last` are re-read and re-checked, and one that fails is removed to be captured again."""
    import torch

    done = {i for _, b in mine for i in b if writer.is_done(i)}
    host_norms = norms.cpu()
    for idx in sorted(done)[-opts.verify_last:] if opts.verify_last else []:
        row = rows[idx]
        problems = writer.layout_problems(idx, row.input_ids, row.loss_mask, len(aux_ids),
                                          int(built.config.hidden_size), built.dtype)
        if not problems:
            problems = row_problems(writer.stored_states(idx, len(aux_ids)),
                                    host_norms[torch.tensor(row.input_ids)].mean())
        if problems:
            say(f"resume: row {idx} fails its re-check ({problems[0]}); capturing it again")
            for p in writer.row_paths(idx):
                p.unlink(missing_ok=True)
            done.discard(idx)
    if done:
        say(f"resume: {len(done)} rows already written on rank {rank}")
    return done


def _timings(loop: _Loop, writes: RowWrites, seconds: float) -> dict[str, float]:
    """Where the loop's time went (module doc), rounded; staging_alloc is before the loop."""
    timings = {k: round(v, 4) for k, v in loop.timings.items()}
    timings["write_wait"] = round(writes.wait_s, 4)
    timings["other"] = round(max(0.0, seconds - sum(timings.values())), 4)
    timings["staging_alloc"] = round(writes.alloc_s, 4)  # before the loop, not in `seconds`
    return timings


def _client_checks(opts: CaptureOptions, target: ResolvedModel, out: Path, writer: Any, model: Any,
                   aux_ids: list[int], shard: str, say: Any) -> dict[str, Any] | None:
    """Rank 0, after the index: --check-client's record, else the format's own check when its
    client is importable (_auto_client_check); None when neither ran."""
    if opts.check_client:
        if shard == "fsdp":
            say(f"--check-client {opts.check_client}: not run under FSDP (one process forwards alone); run "
                f"`fastpath capture MODEL --out {out} --check-client {opts.check_client}` afterwards")
            return None
        return {opts.check_client: client_check(opts, out, writer, model, aux_ids, say, target.model_dir)}
    if shard == "fsdp":
        return None
    return _auto_client_check(opts, out, writer, model, aux_ids, say, target.model_dir)


def _run(opts: CaptureOptions, target: ResolvedModel, fmt: CaptureFormat, world: distributed.World, device: Any,
         shard: str, out: Path, writer: Any, active: bool, guard: ExitAtFirstInterrupt) -> CaptureResult:
    from fastpath.models.compare import TOLERANCES

    say = lambda msg: _say(world, opts.progress, msg)  # noqa: E731
    status = opts.status
    resuming = _check_out(out, opts.resume)
    if opts.reference_path and not opts.allow_slow:
        raise UsageError("--reference-path runs the torch fallback: it needs --allow-slow")
    loaded = _read_rows(opts, target, say)
    rows = loaded.rows
    built, load_device, skeleton = _load_model(opts, target, world, device, shard, len(rows), say)
    model = built.model
    parts = decoder_parts(model)
    num_layers = len(parts.layers)
    aux_ids = parse_layers(opts.layers, num_layers, opts.layer_convention)
    capture_ids = sorted({*aux_ids, num_layers})
    settings = _settings_record(opts, aux_ids, built, load_device)
    if shard == "fsdp":
        distributed.shard_decoder(parts, device, world)
        built.device = device
    with distributed.unsharded_root(parts):  # both read the final norm's and the embeddings' weights
        convention = norm_convention(parts.norm)
        norms = token_norms(model.get_input_embeddings()).to(device)
    status.stage = "while checking the fast path"
    path_label, on_fast = _gate_fast_path(model, opts)  # before DIR is touched: a refusal leaves it as it was
    guard.close()  # from here on --out is written: Ctrl-C stops between batches, keeping every finished row
    status.stage = "while capturing"
    _open_out(out, resuming, settings, opts, world, active)
    say(f"{built.describe()}; path: {path_label}" + (f"; FSDP2 over {world.size} processes" if shard == "fsdp" else ""))
    note = None if opts.check_client else fmt.capture_note(target.model_dir if opts.prebuilt is None else None)
    if note:
        say(note)
    tol = TOLERANCES[built.dtype_name]
    meta = _row_meta(opts, writer, parts, built, path_label, aux_ids, num_layers, convention)
    batches = make_batches([len(r.input_ids) for r in rows], opts.batch_tokens)
    mine = batches_for_rank(batches, world.rank, world.size)
    steps = -(-len(batches) // world.size)
    done = _recheck_resumed(opts, writer, rows, mine, aux_ids, built, norms, say, world.rank)

    todo = [i for _, b in mine for i in b if i not in done]
    writes = _staging(opts, writer, rows, todo, mine, aux_ids, int(built.config.hidden_size), built.dtype, device)
    budget = distributed.ForwardBudget(parts, device, active) if shard == "fsdp" else None
    loop = _Loop(opts, rows, parts, device, aux_ids, capture_ids, num_layers, writer, meta, tol, on_fast, norms,
                 writes, active, budget)
    progress = _Progress(world, opts.progress, len(rows), already=len(done))
    start = time.perf_counter()
    try:
        written, tokens, checked, error, stopped = _capture_loop(loop, steps, mine, done, progress)
    finally:
        writes.close()
        if budget is not None:
            budget.close()
    seconds = time.perf_counter() - start
    timings = _timings(loop, writes, seconds)
    if error is not None:
        raise error
    if stopped:
        raise FastpathError(f"rank {world.rank}: stopped because another rank failed (see its message)")
    record = {"rank": world.rank, "rows_written": written, "rows_already_done": len(done), "tokens": tokens,
              "seconds": seconds, "shard": shard, "timings": timings, "checked": checked,
              "padding_forwards": budget.padded if budget is not None else 0,
              "weights": "received from rank 0 (built on meta)" if skeleton else "loaded on this rank"}
    atomic_json(out / STATE_DIR / f"rank{world.rank}.json", record)
    distributed.barrier(active)
    progress.update(written + len(done), tokens, final=True)
    summary: dict[str, Any] = {}
    finish_error: FastpathError | None = None
    if world.is_main:
        try:
            summary = _finish(out, writer, rows, loaded, meta, built, world, aux_ids, num_layers, convention,
                              path_label, opts, shard)
        except FastpathError as exc:
            finish_error = exc
    if distributed.any_failed(finish_error is not None, device, active):
        raise finish_error or FastpathError("rank 0 could not write the dataset index (see its message)")
    status.stage = "while checking the client"
    if world.is_main:
        checks = _client_checks(opts, target, out, writer, model, aux_ids, shard, say)
        if checks is not None:
            summary["client_checks"] = checks
    return CaptureResult(out, len(rows), written, len(done), tokens, seconds, checked, path_label, summary,
                         shard, timings)


def recheck_plan(todo: list[int], check_every: int, first: bool) -> list[int]:
    """Rows of a batch to re-run on the reference path: every check_every-th row id, and the
    first row this rank captures when `first`."""
    return [idx for k, idx in enumerate(todo) if (check_every and idx % check_every == 0) or (first and k == 0)]


def _capture_loop(loop: _Loop, steps: int, mine: list[tuple[int, list[int]]], done: set[int], progress: _Progress,
                  ) -> tuple[int, int, list[dict[str, Any]], BaseException | None, bool]:
    """This rank's batches; every rank runs `steps` steps and learns after each whether any failed."""
    import torch

    checked: list[dict[str, Any]] = []
    written = tokens = 0
    first = True
    error: BaseException | None = None
    for step in range(steps):
        batch = mine[step][1] if step < len(mine) else []
        todo = [i for i in batch if i not in done]
        plan = recheck_plan(todo, loop.opts.check_every, first) if todo else []
        if loop.budget is not None:
            since = time.perf_counter()
            loop.budget.plan(bool(todo), len(plan))
            loop.add("sync", since)
        if todo:
            try:
                n_tok, row_checks = _capture_batch(loop, batch, todo, plan)
                first = False
                checked.extend(row_checks)
                written += len(todo)
                tokens += n_tok
            except FastpathError as exc:
                error = exc
            except torch.cuda.OutOfMemoryError as exc:
                if loop.budget is not None:
                    raise  # sharded: the other ranks are inside this forward's collectives
                error = FastpathError(f"out of GPU memory on a batch of {len(batch)} rows "
                                      f"({first_line(exc)}); lower --batch-tokens")
        since = time.perf_counter()
        if loop.budget is not None:
            loop.budget.pad()
        failed = distributed.any_failed(error is not None, loop.device, loop.active)
        loop.add("sync", since)
        if failed:
            return written, tokens, checked, error, True
        progress.update(written + len(done), tokens)
    try:
        loop.writes.wait()
    except FastpathError as exc:
        error = exc
    return written, tokens, checked, error, distributed.any_failed(error is not None, loop.device, loop.active)


def _capture_batch(loop: _Loop, batch: list[int], todo: list[int], plan: list[int]) -> tuple[int, list[dict[str, Any]]]:
    """Forward one batch, check every row on the device, re-check the `plan` rows on the
    reference path, then stage `todo` for the background writers."""
    import torch

    rows, parts, writer, device = loop.rows, loop.parts, loop.writer, loop.device
    since = time.perf_counter()
    lengths = [len(rows[i].input_ids) for i in batch]
    width = max(lengths)
    ids = torch.zeros(len(batch), width, dtype=torch.long)
    mask = torch.zeros(len(batch), width, dtype=torch.long)
    for b, i in enumerate(batch):
        ids[b, : lengths[b]] = torch.tensor(rows[i].input_ids)
        mask[b, : lengths[b]] = 1
    ids, mask = ids.to(device), mask.to(device)
    padded = min(lengths) != width
    with torch.no_grad(), capture_hooks(parts, loop.capture_ids) as box:
        parts.base(input_ids=ids, attention_mask=mask if padded else None, use_cache=False)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    since = loop.add("forward", since)
    missing = [i for i in loop.capture_ids if i not in box.states] + ([] if box.final_post is not None else ["final norm"])
    if missing:
        raise CaptureCheckError(f"the hooks captured nothing for {missing}: this model's layers did not run")
    mine = [(b, idx) for b, idx in enumerate(batch) if idx in todo]
    states: dict[int, dict[int, Any]] = {}
    posts: dict[int, Any] = {}
    named = []
    embed_norms = []
    for b, idx in mine:
        n = lengths[b]
        states[idx] = {i: box.states[i][b, :n].detach() for i in loop.capture_ids}
        posts[idx] = box.final_post[b, :n].detach()
        row_named = {f"layer {i}": states[idx][i] for i in loop.aux_ids}
        row_named[f"layer {loop.num_layers} (last layer, pre-norm)"] = states[idx][loop.num_layers]
        row_named["final norm"] = posts[idx]
        named.append(row_named)
        embed_norms.append(loop.norms[ids[b, :n]].mean())
    for (_, idx), problems in zip(mine, batch_problems(named, embed_norms), strict=True):
        if problems:
            raise CaptureCheckError(f"row {idx} (data line {rows[idx].line}) failed its checks: {problems[0]}"
                                    + (f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""))
    since = loop.add("checks", since)
    row_checks: list[dict[str, Any]] = []
    position = {idx: b for b, idx in mine}
    sampled = []
    for idx in plan:
        # a causal model's first n positions do not depend on the rest: a prefix re-check is exact
        n = lengths[position[idx]]
        n = min(n, loop.opts.recheck_tokens) if loop.opts.recheck_tokens else n
        captured = {f"layer {i}": states[idx][i][:n] for i in loop.capture_ids}
        captured["final norm"] = posts[idx][:n]
        sampled.append((ids[position[idx], :n], captured))
    all_diffs = recheck_rows(parts, sampled, loop.capture_ids, loop.tol, loop.on_fast)
    for idx, diffs in zip(plan, all_diffs, strict=True):
        worst = max(diffs, key=lambda d: d.rel)
        row_checks.append({"row": idx, "ok": all(d.ok for d in diffs), "worst": worst.name,
                           "rel": worst.rel, "token_rel_max": max(d.token_rel_max for d in diffs)})
        bad = [d for d in diffs if not d.ok]
        if bad:
            d = bad[0]
            why = ", ".join(d.flags) if d.flags else f"rel {d.rel:.2e} (limit {loop.tol.rel:g}), worst token {d.token_rel_max:.2e}"
            raise CaptureCheckError(f"row {idx} (data line {rows[idx].line}): {d.name} differs from the "
                                    f"reference path: {why}")
    since = loop.add("recheck", since)
    waited = loop.writes.wait_s
    for _, idx in mine:
        row = rows[idx]
        stored = writer.layout([states[idx][i] for i in loop.aux_ids],
                               states[idx][loop.num_layers] if writer.needs_pre else None,
                               posts[idx] if writer.needs_post else None)
        row_ids = torch.tensor(row.input_ids, dtype=torch.long)
        row_mask = torch.tensor(row.loss_mask, dtype=torch.long)

        def write(saved: list[Any], idx: int = idx, row_ids: Any = row_ids, row_mask: Any = row_mask) -> None:
            writer.write_row(idx, row_ids, row_mask, saved, loop.meta)

        loop.writes.stage(idx, stored, write)
    loop.add("stage", since)
    loop.timings["stage"] -= loop.writes.wait_s - waited  # time blocked on a slot is write_wait
    return sum(lengths[b] for b, _ in mine), row_checks


def _finish(out: Path, writer: Any, rows: list[Any], loaded: Any, meta: dict[str, str], built: Any,
            world: distributed.World, aux_ids: list[int], num_layers: int, convention: str, path_label: str,
            opts: CaptureOptions, shard: str) -> dict[str, Any]:
    """Rank 0: every row present -> dataset index, token_freq.pt, capture_summary.json."""
    missing = [i for i in range(len(rows)) if not writer.is_done(i)]
    if missing:
        raise FastpathError(f"{len(missing)} rows have no files (first: row {missing[0]}); run again with --resume")
    writer.write_index([(r.input_ids, r.loss_mask) for r in rows], meta)
    ranks = []
    for r in range(world.size):
        path = out / STATE_DIR / f"rank{r}.json"
        if path.is_file():
            ranks.append(json.loads(path.read_text()))
    checked = sorted((c for rec in ranks for c in rec.get("checked", [])), key=lambda c: c["row"])
    from fastpath._version import __version__

    summary = {
        "fastpath_version": __version__,
        "format": opts.format,
        "model": built.to_json(),
        "rows": len(rows),
        "tokens": sum(len(r.input_ids) for r in rows),
        "loss_tokens": sum(sum(r.loss_mask) for r in rows),
        "data": {"path": str(Path(opts.data).resolve()), "truncated_to_max_len": loaded.truncated,
                 "skipped_lines": loaded.skipped, "row_to_line": [r.line for r in rows]},
        "layers": {"convention": "capture-before (id i = input of decoder layer i; id L = last layer's output)",
                   "aux": aux_ids, "last": num_layers, "final_norm": meta["fastpath_final_norm"],
                   "norm_convention": convention},
        "path": path_label,
        "max_len": opts.max_len, "batch_tokens": opts.batch_tokens, "world_size": world.size, "shard": shard,
        "shard_checks": "every written row: finite, not all zero, not constant, not the same at every "
                        "position, mean token norm within the band of the embeddings'",
        "reference_checks": {"check_every": opts.check_every, "recheck_tokens": opts.recheck_tokens, "rows": checked,
                             "all_ok": all(c["ok"] for c in checked)},
        "ranks": [{k: v for k, v in rec.items() if k != "checked"} for rec in ranks],
    }
    atomic_json(out / SUMMARY_NAME, summary)
    return summary
