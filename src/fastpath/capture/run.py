"""A whole capture, in order: the options checked (options.py) and --out probed (out_dir.py), the
target resolved and its rows read, the weights loaded and the fast path gated (target.py), the
settings a resume must match written (out_dir.py), then the loop (loop.py: per batch, launch the
forward with hooks, the checks and the rows' copies on the device -> launch the next batch ->
read the checks, re-run sampled rows on the reference path, hand the rows to the background
writers), and rank 0's index and client checks (finish.py).

Order matters for "nothing half-written": a batch's rows go to the writers only after all of
them passed, and each file appears by an atomic rename. A failed check stops every rank with the
row id; what was written before is complete and `--resume` continues from it.

The run records where its time went (CaptureResult.timings, per rank in the summary), as host
time: forward (queueing the batch forwards), checks (queueing them, then waiting for their
numbers: the device time the host did not hide), recheck (reference forwards and comparisons),
stage (layouts, queued copies, hand-over to the writers), write_wait (blocked on a free staging
slot or on the final writes), sync (status all-reduces and, sharded, the padding forwards) and
other (the rest of the loop). A capture's cost over the plain forward is measured against a
forward-only loop (benchmarks/capture_speed.py), not from these keys.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from fastpath.capture import distributed
from fastpath.capture.checks import token_norms
from fastpath.capture.finish import client_checks, finish
from fastpath.capture.formats import CaptureFormat
from fastpath.capture.interrupts import ExitAtFirstInterrupt
from fastpath.capture.layers import decoder_parts, norm_convention, parse_layers
from fastpath.capture.loop import (
    Loop,
    Progress,
    capture_loop,
    loop_timings,
    recheck_resumed,
    staging,
)
from fastpath.capture.options import (
    CaptureOptions,
    CaptureResult,
    check_client_options,
    check_format_options,
    check_options,
    say_to,
    settings_record,
)
from fastpath.capture.out_dir import STATE_DIR, check_out, open_out, row_meta
from fastpath.capture.packing import batches_for_rank, make_batches
from fastpath.capture.target import (
    gate_fast_path,
    load_model,
    read_rows,
    resolve_target,
    shard_mode,
)
from fastpath.capture.writers import atomic_json
from fastpath.models.resolve import ResolvedModel
from fastpath.shared.errors import FastpathError


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
    shard = shard_mode(opts, world, device, target)
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


def _run(opts: CaptureOptions, target: ResolvedModel, fmt: CaptureFormat, world: distributed.World, device: Any,
         shard: str, out: Path, writer: Any, active: bool, guard: ExitAtFirstInterrupt) -> CaptureResult:
    from fastpath.models.compare import TOLERANCES

    say = lambda msg: say_to(world, opts.progress, msg)  # noqa: E731
    status = opts.status
    resuming = check_out(out, opts.resume)
    loaded = read_rows(opts, target, say)
    rows = loaded.rows
    built, load_device, skeleton = load_model(opts, target, world, device, shard, len(rows), say)
    model = built.model
    parts = decoder_parts(model)
    num_layers = len(parts.layers)
    aux_ids = parse_layers(opts.layers, num_layers, opts.layer_convention)
    capture_ids = sorted({*aux_ids, num_layers})
    settings = settings_record(opts, aux_ids, built, load_device)
    if shard == "fsdp":
        distributed.shard_decoder(parts, device, world)
        built.device = device
    with distributed.unsharded_root(parts):  # both read the final norm's and the embeddings' weights
        convention = norm_convention(parts.norm)
        norms = token_norms(model.get_input_embeddings()).to(device)
    status.stage = "while checking the fast path"
    path_label, on_fast = gate_fast_path(model, opts)  # before DIR is touched: a refusal leaves it as it was
    guard.close()  # from here on --out is written: Ctrl-C stops between batches, keeping every finished row
    status.stage = "while capturing"
    open_out(out, resuming, settings, opts.resume, world, active)
    say(f"{built.describe()}; path: {path_label}" + (f"; FSDP2 over {world.size} processes" if shard == "fsdp" else ""))
    note = None if opts.check_client else fmt.capture_note(target.model_dir if opts.prebuilt is None else None)
    if note:
        say(note)
    tol = TOLERANCES[built.dtype_name]
    meta = row_meta(opts.model, writer, parts, built, path_label, aux_ids, num_layers, convention)
    batches = make_batches([len(r.input_ids) for r in rows], opts.batch_tokens)
    mine = batches_for_rank(batches, world.rank, world.size)
    steps = -(-len(batches) // world.size)
    done = recheck_resumed(opts, writer, rows, mine, aux_ids, built, norms, say, world.rank)

    todo = [i for _, b in mine for i in b if i not in done]
    writes = staging(opts, writer, rows, todo, mine, aux_ids, int(built.config.hidden_size), built.dtype, device)
    budget = distributed.ForwardBudget(parts, device, active) if shard == "fsdp" else None
    loop = Loop(opts, rows, parts, device, aux_ids, capture_ids, num_layers, writer, meta, tol, on_fast, norms,
                 writes, active, budget)
    progress = Progress(world, opts.progress, len(rows), already=len(done))
    start = time.perf_counter()
    try:
        written, tokens, checked, error, stopped = capture_loop(loop, steps, mine, done, progress)
    finally:
        writes.close()
        if budget is not None:
            budget.close()
    seconds = time.perf_counter() - start
    timings = loop_timings(loop, writes, seconds)
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
            summary = finish(out, writer, rows, loaded, meta, built, world, aux_ids, num_layers, convention,
                              path_label, opts, shard)
        except FastpathError as exc:
            finish_error = exc
    if distributed.any_failed(finish_error is not None, device, active):
        raise finish_error or FastpathError("rank 0 could not write the dataset index (see its message)")
    status.stage = "while checking the client"
    if world.is_main:
        checks = client_checks(opts, target, out, writer, model, aux_ids, shard, say)
        if checks is not None:
            summary["client_checks"] = checks
    return CaptureResult(out, len(rows), written, len(done), tokens, seconds, checked, path_label, summary,
                         shard, timings)
