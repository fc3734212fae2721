"""`--check-client`: the refusals before work and the one entry point that runs a client's own
code on a finished capture, each through the format's class (capture/formats.py) and the client
readers and comparisons of capture/clients.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastpath.capture.clients import (
    CHECK_ROWS,
    ClientResult,
    installed_version,
    target_logits,
    write_client_target,
)
from fastpath.capture.formats import FORMAT_NAMES, FORMATS, capture_format, format_of
from fastpath.shared.errors import UsageError


def side_venv_hint(client: str) -> str:
    """How to get `client` without touching this Python's transformers / torch (one sentence)."""
    import sys

    fmt = capture_format(client)
    venv = f"~/.venvs/{client}"
    return (f"Do not pip install it into this Python ({fmt.client_pins}: pip may replace the ones you train "
            "with); use a side "
            f"venv that sees this Python's packages: {sys.executable} -m venv --system-site-packages {venv} && "
            f"{venv}/bin/{fmt.client_install}, then run {venv}/bin/python -m fastpath capture MODEL --out DIR "
            f"--check-client {client} on the finished capture")


def require_client(client: str, model_dir: Path | None) -> None:
    """One-line refusals before any work: an unknown or missing client, or no model directory."""
    if client not in FORMATS:
        raise UsageError(f"--check-client must be one of {', '.join(FORMAT_NAMES)}, got {client!r}")
    if installed_version(client) is None:
        raise UsageError(f"--check-client {client}: {client} is not installed in this Python; the check runs the "
                         f"client's own code. {side_venv_hint(client)}")
    if model_dir is None:
        raise UsageError(f"--check-client {client} needs MODEL to be a local model directory: the client "
                         "reads the target's lm_head and final norm from one")


def check_client(client: str, *, out: Path, model: Any, model_dir: Path, writer: Any, aux_ids: list[int],
                 convention: str, eps: float, client_target: Path | None = None, rows: list[int] | None = None,
                 say: Any = None) -> dict[str, Any]:
    """Run `client`'s own code on a few rows of the capture in `out` and compare with `model`'s
    logits; with client_target, write that directory and check it too. Returns the record for
    capture_summary.json["client_checks"][client]; `say` gets one line per mismatch."""
    fmt = capture_format(client)
    if not isinstance(writer, fmt.writer_class):
        raise UsageError(f"--check-client {client} reads the {fmt.name} layout; {out} holds the "
                         f"{format_of(writer).name} layout")
    rows = rows if rows is not None else list(range(CHECK_ROWS))
    rows = [i for i in rows if writer.is_done(i)]
    if not rows:
        raise UsageError(f"--check-client {client}: {out} has no captured rows to check")
    targets = {}
    for idx in rows:
        ids = writer.row_ids(idx)
        targets[idx] = (ids, target_logits(model, ids))
    reading = {"writer": writer, "aux_ids": aux_ids, "convention": convention, "eps": eps}
    results = fmt.client_results(model_dir, out, rows, targets, target_kind="model", **reading)
    fixed: list[ClientResult] = []
    if client_target is not None:
        write_client_target(model_dir, client_target, fmt.client_target_norm(model, convention))
        fixed = fmt.client_results(client_target, out, rows, targets, target_kind="client target", **reading)
    record = {"client": client, "version": installed_version(client), "rows": rows,
              "model": [r.to_json() for r in results],
              "client_target": str(client_target) if client_target is not None else None,
              "with_client_target": [r.to_json() for r in fixed],
              "ok": not any(r.problem for r in results)}
    fixed_ok = {r.path for r in fixed if r.ok}
    # every measured path matches on MODEL or on the client target (what the user is told to point it at)
    record["ok_with_client_target"] = bool(fixed) and all(r.ok or r.path in fixed_ok for r in results
                                                          if r.rel_l2 is not None)
    if say is not None:
        for r in results:
            if r.problem:
                say(f"WARNING: {r.problem}" + (f". Remedy: {r.remedy}" if r.remedy else "")
                    + (f" ({', '.join(r.sources)})" if r.sources else ""))
        on_model = {r.path: r for r in results}
        for r in fixed:
            if r.rel_l2 is None:
                continue
            name = r.path.split(" (")[0]
            if r.ok:
                say(f"with --client-target {client_target}: {name} matches the target ({r.measured()}): point "
                    f"{client} at {client_target} for it")
            elif on_model.get(r.path) is not None and on_model[r.path].ok:
                say(f"{name} reads MODEL correctly and {client_target} wrongly ({r.measured()}): keep MODEL for it")
            else:
                say(f"with --client-target {client_target}: {name} still differs from the target ({r.measured()})")
        matching = [r for r in results if r.ok]
        if matching:
            say(f"{client} {record['version']}: " + "; ".join(f"{r.path.split(' (')[0]} matches the target's logits "
                                                              f"({r.measured()})" for r in matching)
                + f" on {len(rows)} rows")
    return record
