"""The capture loop: load the target and the rows, gate on the fast path, then per batch:
forward with hooks -> check every state -> re-run sampled rows on the reference path -> write.

Order matters for "nothing half-written": a batch is written only after all its rows passed, and
each file appears by an atomic rename. A failed check stops every rank with the row id; what was
written before is complete and `--resume` continues from it.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastpath.errors import FastpathError, UsageError, first_line
from fastpath.proof.capture import distributed
from fastpath.proof.capture.checks import mean_token_norm, row_problems
from fastpath.proof.capture.data import load_rows, load_tokenizer
from fastpath.proof.capture.layers import (
    capture_hooks,
    decoder_parts,
    norm_convention,
    parse_layers,
)
from fastpath.proof.capture.packing import batches_for_rank, make_batches
from fastpath.proof.capture.recheck import recheck_row
from fastpath.proof.capture.writers import SUMMARY_NAME, BackgroundWrites, atomic_json, make_writer

STATE_DIR = ".capture"  # per-rank records and the settings a resume must match
SETTINGS_KEYS = ("model", "data", "data_sha256", "format", "max_len", "batch_tokens", "layers", "dtype", "seed",
                 "model_layers")


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
class CaptureOptions:
    model: str
    data: str
    out: str
    format: str = "speculators"
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
    verify_last: int = 4
    progress: bool = True
    enable_kwargs: dict[str, Any] = field(default_factory=dict)
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

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


def _say(world: distributed.World, enabled: bool, msg: str) -> None:
    if enabled and world.is_main:
        print(f"fastpath capture: {msg}", file=sys.stderr, flush=True)


def _prepare_out(out: Path, resume: bool, settings: dict[str, Any]) -> None:
    """Refuse a non-empty DIR without --resume, and a resume with different settings."""
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} exists and is not a directory")
    state = out / STATE_DIR / "settings.json"
    if out.is_dir() and any(out.iterdir()):
        if not resume:
            raise UsageError(f"--out {out} is not empty; pass --resume to continue a capture there")
        if not state.is_file():
            raise UsageError(f"--out {out} holds no fastpath capture to resume ({STATE_DIR}/settings.json missing)")
        try:
            old = json.loads(state.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise UsageError(f"cannot read {state}: {exc}") from None
        diff = [k for k in SETTINGS_KEYS if old.get(k) != settings.get(k)]
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
    import fastpath

    if opts.reference_path:
        if not opts.allow_slow:
            raise UsageError("--reference-path runs the torch fallback: it needs --allow-slow")
        fastpath.disable()
        return "slow (--allow-slow --reference-path): every op on transformers' reference path", False
    fastpath.enable(**{"warn": False, **opts.enable_kwargs})
    try:
        fastpath.assert_fast(model)
    except FastpathError as exc:
        slow = [r for r in fastpath.explain(model).rows if not r["fast"]]
        reason = (f"{len(slow)} op(s) take a slow path (first: {slow[0]['layer']} {slow[0]['op']}: {slow[0]['impl']})"
                  if slow else first_line(exc))
        if not opts.allow_slow:
            fastpath.disable()
            raise FastpathError(f"refusing to capture on a slow fallback: {reason} "
                                "(run `fastpath doctor MODEL`; --allow-slow to capture anyway)") from None
        return f"slow (--allow-slow): {reason}", True
    return "fast", True


class _Progress:
    def __init__(self, world: distributed.World, enabled: bool, total_rows: int) -> None:
        self.world, self.enabled, self.total = world, enabled, total_rows
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
        rate = est_done / elapsed
        eta = (self.total - est_done) / rate if rate > 0 else float("inf")
        eta_text = "-" if eta == float("inf") else f"{int(eta // 60)}m{int(eta % 60):02d}s"
        print(f"fastpath capture: {est_done}/{self.total} rows, {tokens / elapsed:,.0f} tok/s per process, "
              f"ETA {eta_text}", file=sys.stderr, flush=True)


def load_target(opts: CaptureOptions, device: Any) -> Any:
    from fastpath.proof.models import build_model
    from fastpath.proof.run_paths import hidden_compiled_peers

    # The reference path must be transformers' torch fallbacks (as in `fastpath verify`).
    with hidden_compiled_peers():
        return build_model(opts.model, layers=opts.model_layers, dtype=opts.dtype, device=str(device),
                           seed=opts.seed)


def run_capture(opts: CaptureOptions) -> CaptureResult:
    """Capture every row of opts.data into opts.out (see the package doc)."""
    import torch

    from fastpath.proof.compare import TOLERANCES
    from fastpath.proof.models import dtype_label, resolve_device

    if opts.max_len < 2:
        raise UsageError("--max-len must be at least 2")
    if opts.batch_tokens < 1:
        raise UsageError("--batch-tokens must be positive")
    if opts.check_every < 0:
        raise UsageError("--check-every must be >= 0 (0: only each rank's first row)")
    world = distributed.world_from_env()
    device = resolve_device(opts.device)
    if device.type == "cuda" and world.size > 1:
        device = torch.device("cuda", world.local_rank)
        torch.cuda.set_device(device)
    out = Path(opts.out).expanduser()
    writer = make_writer(opts.format, out)
    active, owned = distributed.init(world, device)
    try:
        return _run(opts, world, device, out, writer, active, TOLERANCES, dtype_label)
    finally:
        import fastpath

        fastpath.disable()
        distributed.shutdown(owned)


def _run(opts: CaptureOptions, world: distributed.World, device: Any, out: Path, writer: Any, active: bool,
         tolerances: dict[str, Any], dtype_label: Any) -> CaptureResult:
    import torch

    say = lambda msg: _say(world, opts.progress, msg)  # noqa: E731
    say(f"loading {opts.model}")
    built = opts.prebuilt if opts.prebuilt is not None else load_target(opts, device)
    model = built.model
    if opts.on_model is not None:
        opts.on_model(model)
    parts = decoder_parts(model)
    num_layers = len(parts.layers)
    aux_ids = parse_layers(opts.layers, num_layers, opts.layer_convention)
    capture_ids = sorted({*aux_ids, num_layers})
    tok_source = opts.tokenizer or (str(built.source.path) if built.source.kind == "dir" else None)
    tokenizer = load_tokenizer(tok_source) if tok_source else None
    loaded = load_rows(opts.data, tokenizer, opts.max_len, built.vocab_size)
    rows = loaded.rows
    settings = {
        "model": opts.model, "data": str(Path(opts.data).resolve()), "data_sha256": file_sha256(opts.data),
        "format": opts.format,
        "max_len": opts.max_len, "batch_tokens": opts.batch_tokens, "layers": aux_ids,
        "dtype": dtype_label(built.dtype), "seed": built.seed, "model_layers": opts.model_layers,
    }
    path_label, on_fast = _gate_fast_path(model, opts)  # before DIR is touched: a refusal leaves it as it was
    _prepare_out(out, opts.resume, settings)
    distributed.barrier(active)
    if world.is_main:
        _write_settings(out, settings)
    distributed.barrier(active)
    say(f"{built.describe()}; path: {path_label}")
    convention = norm_convention(parts.norm)
    tol = tolerances[dtype_label(built.dtype)]
    meta = {
        "fastpath_path": path_label,
        "fastpath_layers_capture_before": ",".join(str(i) for i in [*aux_ids, num_layers]),
        "fastpath_last_state": (f"hidden_states[:, -1]: output of decoder layer {num_layers - 1} before the final norm"
                                if writer.needs_pre else f"hidden_state: output of the final norm (model.{parts.norm_name})"),
        "fastpath_final_norm": f"model.{parts.norm_name}: {convention}",
        "fastpath_dtype": dtype_label(built.dtype),
        "fastpath_model": opts.model,
    }
    batches = make_batches([len(r.input_ids) for r in rows], opts.batch_tokens)
    mine = batches_for_rank(batches, world.rank, world.size)
    steps = -(-len(batches) // world.size)

    # Resume: trust finished files, but re-read and re-check the last few of this rank.
    done = {i for _, b in mine for i in b if writer.is_done(i)}
    for idx in sorted(done)[-opts.verify_last:] if opts.verify_last else []:
        row = rows[idx]
        problems = writer.layout_problems(idx, row.input_ids, row.loss_mask, len(aux_ids),
                                          int(built.config.hidden_size), built.dtype)
        if not problems:
            with torch.no_grad():
                emb = mean_token_norm(model.get_input_embeddings()(torch.tensor(row.input_ids, device=device)))
            problems = row_problems(writer.stored_states(idx, len(aux_ids)), emb)
        if problems:
            say(f"resume: row {idx} fails its re-check ({problems[0]}); capturing it again")
            for p in writer.row_paths(idx):
                p.unlink(missing_ok=True)
            done.discard(idx)
    if done:
        say(f"resume: {len(done)} rows already written on rank {world.rank}")

    progress = _Progress(world, opts.progress, len(rows))
    start = time.perf_counter()
    writes = BackgroundWrites()
    try:
        written, tokens, checked, error, stopped = _capture_loop(
            steps, mine, done, rows, parts, model, device, aux_ids, capture_ids, num_layers, writer, meta, tol,
            on_fast, opts, writes, active, progress)
    finally:
        writes.close()
    seconds = time.perf_counter() - start
    if error is not None:
        raise error
    if stopped:
        raise FastpathError(f"rank {world.rank}: stopped because another rank failed (see its message)")
    record = {"rank": world.rank, "rows_written": written, "rows_already_done": len(done), "tokens": tokens,
              "seconds": seconds, "checked": checked}
    atomic_json(out / STATE_DIR / f"rank{world.rank}.json", record)
    distributed.barrier(active)
    progress.update(written + len(done), tokens, final=True)
    summary: dict[str, Any] = {}
    finish_error: FastpathError | None = None
    if world.is_main:
        try:
            summary = _finish(out, writer, rows, loaded, meta, built, world, aux_ids, num_layers, convention,
                              path_label, opts)
        except FastpathError as exc:
            finish_error = exc
    if distributed.any_failed(finish_error is not None, device, active):
        raise finish_error or FastpathError("rank 0 could not write the dataset index (see its message)")
    return CaptureResult(out, len(rows), written, len(done), tokens, seconds, checked, path_label, summary)


def _capture_loop(steps: int, mine: list[tuple[int, list[int]]], done: set[int], rows: list[Any], parts: Any,
                  model: Any, device: Any, aux_ids: list[int], capture_ids: list[int], num_layers: int,
                  writer: Any, meta: dict[str, str], tol: Any, on_fast: bool, opts: CaptureOptions,
                  writes: BackgroundWrites, active: bool, progress: _Progress,
                  ) -> tuple[int, int, list[dict[str, Any]], BaseException | None, bool]:
    """This rank's batches; every rank runs `steps` steps and learns after each whether any failed."""
    import torch

    checked: list[dict[str, Any]] = []
    written = tokens = 0
    first_row_checked = False
    error: BaseException | None = None
    for step in range(steps):
        if error is None and step < len(mine):
            _, batch = mine[step]
            todo = [i for i in batch if i not in done]
            if todo:
                try:
                    n_tok, row_checks = _capture_batch(
                        batch, todo, rows, parts, model, device, aux_ids, capture_ids, num_layers, writer,
                        meta, tol, on_fast, opts, writes, check_first=not first_row_checked)
                    first_row_checked = True
                    checked.extend(row_checks)
                    written += len(todo)
                    tokens += n_tok
                except FastpathError as exc:
                    error = exc
                except torch.cuda.OutOfMemoryError as exc:
                    error = FastpathError(f"out of GPU memory on a batch of {len(batch)} rows "
                                          f"({first_line(exc)}); lower --batch-tokens")
        if distributed.any_failed(error is not None, device, active):
            return written, tokens, checked, error, True
        progress.update(written + len(done), tokens)
    try:
        writes.wait()
    except FastpathError as exc:
        error = exc
    return written, tokens, checked, error, distributed.any_failed(error is not None, device, active)


def _capture_batch(batch: list[int], todo: list[int], rows: list[Any], parts: Any, model: Any, device: Any,
                   aux_ids: list[int], capture_ids: list[int], num_layers: int, writer: Any,
                   meta: dict[str, str], tol: Any, on_fast: bool, opts: CaptureOptions, writes: BackgroundWrites,
                   check_first: bool) -> tuple[int, list[dict[str, Any]]]:
    """Forward one batch, check every row (on the device), re-check the sampled ones, then hand
    `todo` to the background writers."""
    import torch

    lengths = [len(rows[i].input_ids) for i in batch]
    width = max(lengths)
    ids = torch.zeros(len(batch), width, dtype=torch.long)
    mask = torch.zeros(len(batch), width, dtype=torch.long)
    for b, i in enumerate(batch):
        ids[b, : lengths[b]] = torch.tensor(rows[i].input_ids)
        mask[b, : lengths[b]] = 1
    ids, mask = ids.to(device), mask.to(device)
    padded = min(lengths) != width
    with torch.no_grad(), capture_hooks(parts, capture_ids) as box:
        parts.base(input_ids=ids, attention_mask=mask if padded else None, use_cache=False)
        embeds = model.get_input_embeddings()(ids)
    missing = [i for i in capture_ids if i not in box.states] + ([] if box.final_post is not None else ["final norm"])
    if missing:
        raise CaptureCheckError(f"the hooks captured nothing for {missing}: this model's layers did not run")
    staged = []
    row_checks: list[dict[str, Any]] = []
    for b, idx in enumerate(batch):
        if idx not in todo:
            continue
        n = lengths[b]
        states = {i: box.states[i][b, :n].detach() for i in capture_ids}
        post = box.final_post[b, :n].detach()
        named = {f"layer {i}": states[i] for i in aux_ids}
        named[f"layer {num_layers} (last layer, pre-norm)"] = states[num_layers]
        named["final norm"] = post
        problems = row_problems(named, mean_token_norm(embeds[b, :n]))
        if problems:
            raise CaptureCheckError(f"row {idx} (data line {rows[idx].line}) failed its checks: {problems[0]}"
                                    + (f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""))
        if (opts.check_every and idx % opts.check_every == 0) or check_first:
            check_first = False
            captured = {f"layer {i}": states[i] for i in capture_ids}
            captured["final norm"] = post
            diffs = recheck_row(parts, ids[b, :n], captured, capture_ids, tol, on_fast,
                                {"warn": False, **opts.enable_kwargs})
            worst = max(diffs, key=lambda d: d.rel)
            row_checks.append({"row": idx, "ok": all(d.ok for d in diffs), "worst": worst.name,
                               "rel": worst.rel, "token_rel_max": max(d.token_rel_max for d in diffs)})
            bad = [d for d in diffs if not d.ok]
            if bad:
                d = bad[0]
                why = ", ".join(d.flags) if d.flags else f"rel {d.rel:.2e} (limit {tol.rel:g}), worst token {d.token_rel_max:.2e}"
                raise CaptureCheckError(f"row {idx} (data line {rows[idx].line}): {d.name} differs from the "
                                        f"reference path: {why}")
        staged.append((idx, states, post))
    for idx, states, post in staged:
        row = rows[idx]
        wanted = [states[i] for i in aux_ids]
        wanted += [states[num_layers]] if writer.needs_pre else []
        wanted += [post] if writer.needs_post else []
        host, ready = to_host(wanted)
        aux_host = host[: len(aux_ids)]
        rest = host[len(aux_ids):]
        pre_host = rest.pop(0) if writer.needs_pre else None
        post_host = rest.pop(0) if writer.needs_post else None
        args = (idx, torch.tensor(row.input_ids, dtype=torch.long), torch.tensor(row.loss_mask, dtype=torch.long),
                aux_host, pre_host, post_host, meta)

        def write(args: tuple = args, ready: Any = ready) -> None:
            if ready is not None:
                ready.synchronize()
            writer.write_row(*args)

        writes.submit(idx, write)
    return sum(lengths[b] for b, i in enumerate(batch) if i in todo), row_checks


_COPY_STREAMS: dict[Any, Any] = {}


def to_host(tensors: list[Any]) -> tuple[list[Any], Any]:
    """Device -> pinned host copies on a side stream, so the next batch's forward overlaps them.
    Returns the host tensors and an event to wait on before reading them (None on CPU)."""
    import torch

    if not tensors or not tensors[0].is_cuda:
        return list(tensors), None
    device = tensors[0].device
    stream = _COPY_STREAMS.get(device)
    if stream is None:
        stream = _COPY_STREAMS[device] = torch.cuda.Stream(device=device)
    stream.wait_stream(torch.cuda.current_stream(device))
    host = []
    with torch.cuda.stream(stream):
        for t in tensors:
            h = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
            h.copy_(t, non_blocking=True)
            t.record_stream(stream)  # the allocator must not reuse t before the copy ran
            host.append(h)
        event = torch.cuda.Event()
        event.record(stream)
    return host, event


def _finish(out: Path, writer: Any, rows: list[Any], loaded: Any, meta: dict[str, str], built: Any,
            world: distributed.World, aux_ids: list[int], num_layers: int, convention: str, path_label: str,
            opts: CaptureOptions) -> dict[str, Any]:
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
        "format": writer.name,
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
        "max_len": opts.max_len, "batch_tokens": opts.batch_tokens, "world_size": world.size,
        "shard_checks": "every written row: finite, not all zero, not constant, not the same at every "
                        "position, mean token norm within the band of the embeddings'",
        "reference_checks": {"check_every": opts.check_every, "rows": checked,
                             "all_ok": all(c["ok"] for c in checked)},
        "ranks": [{k: v for k, v in rec.items() if k != "checked"} for rec in ranks],
    }
    atomic_json(out / SUMMARY_NAME, summary)
    return summary
