"""A capture's output directory: refused before anything is read when it is a file, not empty
without --resume, or not a capture; the settings a resume must match (.capture/settings.json,
written by rank 0 once every rank has checked them); the metadata every row file carries.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fastpath.capture import distributed
from fastpath.capture.writers import atomic_json, remove_stale_temps
from fastpath.shared.errors import UsageError
from fastpath.shared.output_files import PROBE_PREFIX, probe_dir

STATE_DIR = ".capture"  # per-rank records and the settings a resume must match


SETTINGS_KEYS = ("model", "data", "data_sha256", "format", "max_len", "batch_tokens", "layers", "dtype", "seed",
                 "model_layers", "weights_init")


# Keys newer than some captures on disk: compared only when the old settings have them.
_LATER_KEYS = ("weights_init",)


def check_out(out: Path, resume: bool) -> bool:
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


def open_out(out: Path, resuming: bool, settings: dict[str, Any], resume: bool, world: distributed.World,
             active: bool) -> None:
    """Refuse a resume with other settings, then (rank 0) write the settings and drop a killed
    run's temporary files; every rank waits for that before writing."""
    _prepare_out(out, resuming, settings)
    distributed.barrier(active)
    if world.is_main:
        _write_settings(out, settings)
        if resume:
            remove_stale_temps(out)  # left by a killed run; no rank writes before the barrier
    distributed.barrier(active)


def _prepare_out(out: Path, resuming: bool, settings: dict[str, Any]) -> None:
    """Refuse a resume (resuming: check_out found a capture to continue) with different settings."""
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


def row_meta(model: str, writer: Any, parts: Any, built: Any, path_label: str, aux_ids: list[int],
              num_layers: int, convention: str) -> dict[str, str]:
    """The metadata every row file (and the index) carries: path, layers, last state, norm, dtype."""

    return {
        "fastpath_path": path_label,
        "fastpath_layers_capture_before": ",".join(str(i) for i in [*aux_ids, num_layers]),
        "fastpath_last_state": (f"hidden_states[:, -1]: output of decoder layer {num_layers - 1} before the final norm"
                                if writer.needs_pre else f"hidden_state: output of the final norm (model.{parts.norm_name})"),
        "fastpath_final_norm": f"model.{parts.norm_name}: {convention}",
        "fastpath_dtype": built.dtype_name,
        "fastpath_model": model,
    }
