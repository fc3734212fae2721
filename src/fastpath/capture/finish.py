"""After the loop: rank 0 writes the dataset index and capture_summary.json once every row is on
disk; then the client checks (what speculators / SpecForge would train against, rebuilt from
the capture: capture.client_check), asked for or run because the client is importable.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fastpath.capture import distributed
from fastpath.capture.formats import capture_format
from fastpath.capture.layers import decoder_parts, norm_convention
from fastpath.capture.options import CaptureOptions, say_to
from fastpath.capture.out_dir import STATE_DIR
from fastpath.capture.target import load_target, resolve_target
from fastpath.capture.writers import SUMMARY_NAME, atomic_json
from fastpath.models.resolve import ResolvedModel
from fastpath.shared.errors import FastpathError, UsageError, first_line


def finish(out: Path, writer: Any, rows: list[Any], loaded: Any, meta: dict[str, str], built: Any,
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


def client_checks(opts: CaptureOptions, target: ResolvedModel, out: Path, writer: Any, model: Any,
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
    say = lambda msg: say_to(world, opts.progress, msg)  # noqa: E731
    built = load_target(opts, target.device, target=target)
    return client_check(opts, out, capture_format(opts.format).make_writer(out), built.model,
                        list(settings["layers"]), say, target.model_dir)
