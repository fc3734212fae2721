"""The capture loop, per batch: launch (forward with hooks, every state's checks and the rows'
stored layouts, all queued on the device) -> the next batch's launch -> settle (read the checks,
re-run sampled rows on the reference path, queue the rows' device->host copies, hand the rows
to the background writers of staging.RowWrites); with the progress line, the staging slots and
the record of where the time went (CaptureResult.timings: forward, checks, recheck, stage,
write_wait, sync, other; run.py's module doc).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fastpath.capture import distributed
from fastpath.capture.checks import row_problems
from fastpath.capture.layers import capture_hooks
from fastpath.capture.options import CaptureCheckError, CaptureOptions
from fastpath.capture.recheck import recheck_rows
from fastpath.capture.staging import RowWrites, slot_bytes
from fastpath.shared.errors import FastpathError, first_line

STAGING_BUDGET = 8 << 30  # host bytes of staged rows at most (at least one slot)


@dataclass
class Loop:
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


class Progress:
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


def staging(opts: CaptureOptions, writer: Any, rows: list[Any], todo: list[int], mine: list[tuple[int, list[int]]],
             aux_ids: list[int], hidden: int, dtype: Any, device: Any) -> RowWrites:
    """Slots sized for this rank's longest row (the layout's shapes, worked out on the meta
    device); three batches' worth by default (one being written, one waiting for its checks,
    one being copied), at most STAGING_BUDGET bytes, never more than rows."""
    import torch

    longest = max((len(rows[i].input_ids) for i in todo), default=1)
    state = torch.empty(longest, hidden, dtype=dtype, device="meta")
    shapes = [tuple(t.shape) for t in writer.layout([state] * len(aux_ids), state, state)]
    nbytes = slot_bytes(shapes, dtype)
    most = max((len(b) for _, b in mine), default=1)
    slots = opts.write_slots or max(3, 3 * most)
    slots = max(1, min(slots, STAGING_BUDGET // max(nbytes, 1), len(todo)))
    return RowWrites(slots, nbytes, pin=device.type == "cuda", threads=opts.write_threads)


def recheck_resumed(opts: CaptureOptions, writer: Any, rows: list[Any], mine: list[tuple[int, list[int]]],
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


def recheck_plan(todo: list[int], check_every: int, first: bool) -> list[int]:
    """Rows of a batch to re-run on the reference path: every check_every-th row id, and the
    first row this rank captures when `first`."""
    return [idx for k, idx in enumerate(todo) if (check_every and idx % check_every == 0) or (first and k == 0)]


@dataclass
class Launched:
    """A batch whose forward, checks and stored layouts are queued on the device: its rows'
    device->host copies are queued by `start_copies` (after the next batch's forward is queued)
    and reach the writers only in `settle_batch`, once every check has passed."""

    todo: list[int]
    plan: list[int]
    lengths: list[int]
    ids: Any  # [B, width] on the device
    position: dict[int, int]  # row id -> row of the batch
    states: dict[int, dict[int, Any]]  # row id -> layer -> [T, H]
    posts: dict[int, Any]  # row id -> final norm output [T, H]
    names: list[list[str]]  # checks.batch_stats' state names per row
    stats: Any  # their numbers: on the host once `ready` has fired (None: no rows)
    ready: Any  # CUDA event of the numbers' copy; None when they are on the host already
    outputs: list[tuple[int, list[Any], Any]] = field(default_factory=list)  # (row id, stored tensors, write)
    laid_out: Any = None  # CUDA event: the stored tensors are ready (None off CUDA)
    staged: list[Any] = field(default_factory=list)  # staging.Staged per row, once start_copies ran


def capture_loop(loop: Loop, steps: int, mine: list[tuple[int, list[int]]], done: set[int], progress: Progress,
                  ) -> tuple[int, int, list[dict[str, Any]], BaseException | None, bool]:
    """This rank's batches; every rank runs `steps` steps and learns after each whether any failed.

    Overlapped (`opts.overlap`, not sharded): batch k's checks are read, its rows' host copies
    queued and its rows handed to the writers after batch k+1's forward is queued, so the device
    never waits for the host's share of a step (the verdict, re-check bookkeeping, file writes)
    nor the next forward's read-back for the rows' copies (start_copies). Sharded runs settle every
    batch in its own step: their forwards (re-checks included) must line up across ranks."""
    import torch

    checked: list[dict[str, Any]] = []
    written = tokens = 0
    first = True
    error: BaseException | None = None
    overlap = loop.opts.overlap and loop.budget is None
    pending: Launched | None = None

    def attempt(rows: int, step: Callable[..., Any], *args: Any) -> Any:
        """step(*args), or None with its failure kept as `error` (the first one wins)."""
        nonlocal error
        try:
            return step(*args)
        except FastpathError as exc:
            error = error or exc
        except torch.cuda.OutOfMemoryError as exc:
            if loop.budget is not None:
                raise  # sharded: the other ranks are inside this forward's collectives
            error = error or FastpathError(f"out of GPU memory on a batch of {rows} rows ({first_line(exc)}); "
                                           "lower --batch-tokens")
        return None

    def settle(batch: Launched) -> None:
        nonlocal written, tokens
        settled = attempt(len(batch.lengths), settle_batch, loop, batch)
        if settled is not None:
            checked.extend(settled[1])
            written += len(batch.todo)
            tokens += settled[0]

    try:
        for step in range(steps):
            batch = mine[step][1] if step < len(mine) else []
            todo = [i for i in batch if i not in done]
            plan = recheck_plan(todo, loop.opts.check_every, first) if todo else []
            if loop.budget is not None:
                since = time.perf_counter()
                loop.budget.plan(bool(todo), len(plan))
                loop.add("sync", since)
            launched = attempt(len(batch), launch_batch, loop, batch, todo, plan) if todo else None
            first = first and launched is None
            if pending is not None:  # the batch before: its rows are finished work, keep them
                settle(pending)
                pending = None
            if launched is not None:
                if error is not None:
                    discard(loop, launched)
                elif overlap:
                    pending = launched
                else:
                    settle(launched)
            since = time.perf_counter()
            if loop.budget is not None:
                loop.budget.pad()
            failed = distributed.any_failed(error is not None, loop.device, loop.active)
            loop.add("sync", since)
            if failed:
                return written, tokens, checked, error, True
            progress.update(written + len(done), tokens)
        if pending is not None:  # the last batch; the status all-reduce below counts it (every rank calls it)
            settle(pending)
            pending = None
    finally:
        if pending is not None:  # Ctrl-C or a sharded OOM: the unsettled batch is not written
            discard(loop, pending)
    try:
        loop.writes.wait()
    except FastpathError as exc:
        error = exc
    return written, tokens, checked, error, distributed.any_failed(error is not None, loop.device, loop.active)


def _long(values: list[int]) -> Any:
    """A list of ints as an int64 CPU tensor, through numpy: torch.tensor(list) takes 0.3-0.7 ms for
    a 4,096-token row on the dev VM, numpy's conversion about 0.1 ms (host time between forwards)."""
    import numpy as np
    import torch

    return torch.from_numpy(np.asarray(values, dtype=np.int64))


def launch_batch(loop: Loop, batch: list[int], todo: list[int], plan: list[int]) -> Launched:
    """Queue one batch on the device: the forward with hooks, the checks' numbers (one
    non-blocking copy to the host) and each row's stored tensors in their layout. Nothing waits
    for the device here and nothing is copied to the host or written (start_copies, settle_batch)."""
    import torch

    from fastpath.capture.checks import batch_stats

    rows, parts, writer, device = loop.rows, loop.parts, loop.writer, loop.device
    since = time.perf_counter()
    row_ids = {i: _long(rows[i].input_ids) for i in batch}  # once per row: the batch and its file
    lengths = [len(rows[i].input_ids) for i in batch]
    width = max(lengths)
    ids = torch.zeros(len(batch), width, dtype=torch.long)
    mask = torch.zeros(len(batch), width, dtype=torch.long)
    for b, i in enumerate(batch):
        ids[b, : lengths[b]] = row_ids[i]
        mask[b, : lengths[b]] = 1
    cuda = device.type == "cuda"
    ids, mask = (t.pin_memory().to(device, non_blocking=True) if cuda else t.to(device) for t in (ids, mask))
    padded = min(lengths) != width
    with torch.no_grad(), capture_hooks(parts, loop.capture_ids) as box:
        parts.base(input_ids=ids, attention_mask=mask if padded else None, use_cache=False)
    since = loop.add("forward", since)
    missing = [i for i in loop.capture_ids if i not in box.states] + ([] if box.final_post is not None else ["final norm"])
    if missing:
        raise CaptureCheckError(f"the hooks captured nothing for {missing}: this model's layers did not run")
    mine = [(b, idx) for b, idx in enumerate(batch) if idx in todo]
    states: dict[int, dict[int, Any]] = {}
    posts: dict[int, Any] = {}
    named = []
    for b, idx in mine:
        n = lengths[b]
        states[idx] = {i: box.states[i][b, :n].detach() for i in loop.capture_ids}
        posts[idx] = box.final_post[b, :n].detach()
        row_named = {f"layer {i}": states[idx][i] for i in loop.aux_ids}
        row_named[f"layer {loop.num_layers} (last layer, pre-norm)"] = states[idx][loop.num_layers]
        row_named["final norm"] = posts[idx]
        named.append(row_named)
    # each row's mean embedding norm over its own tokens, for the whole batch at once (an int index
    # of the result is a view; a list would be a host->device copy)
    per_row = (loop.norms[ids] * mask).sum(1) / mask.sum(1)
    embed_norms = per_row if len(mine) == len(batch) else [per_row[b] for b, _ in mine]
    names, stats = batch_stats(named, embed_norms)
    ready = None
    if stats is not None and cuda:
        host = torch.empty(stats.shape, dtype=stats.dtype, pin_memory=True)
        host.copy_(stats, non_blocking=True)
        ready = torch.cuda.Event()
        ready.record()
        stats = host
    since = loop.add("checks", since)
    launched = Launched(todo, plan, lengths, ids, {idx: b for b, idx in mine}, states, posts, names, stats, ready)
    for _, idx in mine:
        row = rows[idx]
        stored = writer.layout([states[idx][i] for i in loop.aux_ids],
                               states[idx][loop.num_layers] if writer.needs_pre else None,
                               posts[idx] if writer.needs_post else None)
        row_mask = _long(row.loss_mask)

        def write(saved: list[Any], idx: int = idx, tokens: Any = row_ids[idx], row_mask: Any = row_mask) -> None:
            writer.write_row(idx, tokens, row_mask, saved, loop.meta)

        launched.outputs.append((idx, stored, write))
    if cuda:
        launched.laid_out = torch.cuda.Event()
        launched.laid_out.record()
    loop.add("stage", since)
    return launched


def start_copies(loop: Loop, launched: Launched) -> None:
    """Queue the batch's device->host copies into staging slots (once). Called after the next
    batch's forward is queued: transformers' mask helper reads a value back at the start of every
    forward (masking_utils.find_packed_sequence_indices), and that small copy waits on the same
    copy engine as the rows' (168 MB each at Qwen3.5-27B's size); queued before it, they held the
    next forward 11.7 ms per 4-row batch (BENCHMARKS.md). The copies wait only for this batch's
    layouts (laid_out)."""
    since = time.perf_counter()
    waited = loop.writes.wait_s
    try:
        while launched.outputs:
            idx, stored, write = launched.outputs.pop(0)
            launched.staged.append(loop.writes.copy(idx, stored, write, after=launched.laid_out))
    except BaseException:
        discard(loop, launched)
        raise
    loop.add("stage", since)
    loop.timings["stage"] -= loop.writes.wait_s - waited  # time blocked on a slot is write_wait


def discard(loop: Loop, launched: Launched) -> None:
    """Give a launched batch's slots back unwritten (and drop the layouts not yet copied)."""
    for staged in launched.staged:
        loop.writes.release(staged)
    launched.staged.clear()
    launched.outputs.clear()


def settle_batch(loop: Loop, launched: Launched) -> tuple[int, list[dict[str, Any]]]:
    """Read a launched batch's checks, re-check its `plan` rows on the reference path, then
    hand its rows to the writers; a failed check releases them unwritten and raises."""
    from fastpath.capture.checks import problems_from

    rows = loop.rows
    since = time.perf_counter()
    try:
        if launched.ready is not None:
            launched.ready.synchronize()
        values = [] if launched.stats is None else launched.stats.tolist()
        for idx, problems in zip(launched.position, problems_from(launched.names, values), strict=True):
            if problems:
                raise CaptureCheckError(f"row {idx} (data line {rows[idx].line}) failed its checks: {problems[0]}"
                                        + (f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""))
        since = loop.add("checks", since)
        row_checks = _recheck(loop, launched)
        since = loop.add("recheck", since)
        start_copies(loop, launched)
        since = time.perf_counter()
    except BaseException:
        discard(loop, launched)
        raise
    for staged in launched.staged:
        loop.writes.queue(staged)
    launched.staged.clear()
    loop.add("stage", since)
    return sum(launched.lengths[launched.position[idx]] for idx in launched.position), row_checks


def _recheck(loop: Loop, launched: Launched) -> list[dict[str, Any]]:
    """Re-run the batch's `plan` rows on the reference path; raise at the first that differs."""
    rows, lengths, position = loop.rows, launched.lengths, launched.position
    row_checks: list[dict[str, Any]] = []
    sampled = []
    for idx in launched.plan:
        # a causal model's first n positions do not depend on the rest: a prefix re-check is exact
        n = lengths[position[idx]]
        n = min(n, loop.opts.recheck_tokens) if loop.opts.recheck_tokens else n
        captured = {f"layer {i}": launched.states[idx][i][:n] for i in loop.capture_ids}
        captured["final norm"] = launched.posts[idx][:n]
        sampled.append((launched.ids[position[idx], :n], captured))
    all_diffs = recheck_rows(loop.parts, sampled, loop.capture_ids, loop.tol, loop.on_fast)
    for idx, diffs in zip(launched.plan, all_diffs, strict=True):
        worst = max(diffs, key=lambda d: d.rel)
        row_checks.append({"row": idx, "ok": all(d.ok for d in diffs), "worst": worst.name,
                           "rel": worst.rel, "token_rel_max": max(d.token_rel_max for d in diffs)})
        bad = [d for d in diffs if not d.ok]
        if bad:
            d = bad[0]
            why = ", ".join(d.flags) if d.flags else f"rel {d.rel:.2e} (limit {loop.tol.rel:g}), worst token {d.token_rel_max:.2e}"
            raise CaptureCheckError(f"row {idx} (data line {rows[idx].line}): {d.name} differs from the "
                                    f"reference path: {why}")
    return row_checks


def loop_timings(loop: Loop, writes: RowWrites, seconds: float) -> dict[str, float]:
    """Where the loop's time went (module doc), rounded; staging_alloc is before the loop."""
    timings = {k: round(v, 4) for k, v in loop.timings.items()}
    timings["write_wait"] = round(writes.wait_s, 4)
    timings["other"] = round(max(0.0, seconds - sum(timings.values())), 4)
    timings["staging_alloc"] = round(writes.alloc_s, 4)  # before the loop, not in `seconds`
    return timings
