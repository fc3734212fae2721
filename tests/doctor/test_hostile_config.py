"""Hostile model configs are refused in one line (exit 2) before any layer
walk or allocation: `num_hidden_layers: 1e9` ran `doctor --model` 34 s to 5.4 GB and a
MemoryError; negative sizes were accepted; verify/bench gave raw tracebacks from build_model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hostile_fakes import fastpath, one_line_error

from fastpath.shared.errors import UsageError
from fastpath.shared.model_source import load_config, load_preset_with_source

BASE = {k: v for k, v in load_preset_with_source("qwen3-next").items() if k != "_fastpath_source"}

BAD = {
    "layers-1e9": {"num_hidden_layers": 1e9},
    "layers-negative": {"num_hidden_layers": -4},
    "layers-zero": {"num_hidden_layers": 0},
    "hidden-negative": {"hidden_size": -2048},
    "vocab-huge": {"vocab_size": 10**12},
    "heads-string": {"num_attention_heads": "16"},
    "intermediate-float": {"intermediate_size": 1.5},
    "layers-bool": {"num_hidden_layers": True},
    "kernel-negative": {"linear_conv_kernel_dim": -1},
    "layer-types-huge": {"layer_types": ["linear_attention"] * 100_000},
}


def _write(tmp_path: Path, name: str, config: dict) -> Path:
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(config))
    return path


@pytest.mark.parametrize("case", sorted(BAD))
def test_load_config_refuses(tmp_path: Path, case: str) -> None:
    path = _write(tmp_path, case, {**BASE, **BAD[case]})
    with pytest.raises(UsageError) as info:
        load_config(str(path))
    assert "\n" not in str(info.value)
    nested = _write(tmp_path, case + "-nested", {"model_type": "qwen3_5", "text_config":
                                                 {**BASE, **BAD[case]}})
    with pytest.raises(UsageError, match="text_config"):
        load_config(str(nested))


def test_real_configs_still_load(tmp_path: Path) -> None:
    assert load_config(str(_write(tmp_path, "ok", {**BASE, "num_experts": 0,
                                                   "head_dim": None})))["model_type"]


@pytest.mark.parametrize("command", [
    ["doctor", "--probe", "static", "--model"],
    ["verify", "--device", "cpu"],
    ["bench", "--device", "cpu"],
])
@pytest.mark.parametrize("case", ["layers-1e9", "hidden-negative"])
def test_commands_exit_2_in_one_line(tmp_path: Path, command: list[str], case: str) -> None:
    path = _write(tmp_path, case, {**BASE, **BAD[case]})
    proc = fastpath(*command, str(path), timeout=120, cwd=tmp_path)  # outputs land in tmp
    assert proc.returncode == 2, proc.stderr.decode()[-2000:]
    assert "outside" in one_line_error(proc)
