"""benchmarks/linear_ce_gpu.py's --rows-sweep on the CPU: its access-order spec parses as the
module doc says, a bad spec is argparse's one-line error (exit 2) before anything is built, and
without a GPU a valid one ends with the script's exit 3. The timings themselves need the device
(parts.sh part `cerows`)."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

import pytest
from repo_paths import BENCHMARKS, ROOT, import_benchmark

SCRIPT = BENCHMARKS / "linear_ce_gpu.py"


def _bench():
    return import_benchmark("linear_ce_gpu")


def test_default_spec_parses() -> None:
    bench = _bench()
    assert bench.parse_rows_sweep(bench.DEFAULT_ROWS_SWEEP) == [
        ("0", 0, False), ("0r", 0, True), ("1x", 1, False), ("1xr", 1, True), ("2x", 2, False),
        ("2xr", 2, True), ("4xr", 4, True)]
    assert bench.parse_rows_sweep(" 8x , 0 ") == [("8x", 8, False), ("0", 0, False)]


@pytest.mark.parametrize("spec", ["0x", "2", "x", "r", "-1x", "1.5x", "2xrr", ",", ""])
def test_bad_items_are_named(spec: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="--rows-sweep"):
        _bench().parse_rows_sweep(spec)


def _run(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": str(ROOT / "src")}
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=env,
                          timeout=300)


def test_cli_bad_spec_exit_2_and_no_gpu_exit_3(tmp_path) -> None:
    out = tmp_path / "rows.json"
    bad = _run("--rows-sweep", "0,3", "--out", str(out))
    assert bad.returncode == 2 and "--rows-sweep item '3'" in bad.stderr, bad.stderr
    assert bad.stderr.strip().splitlines()[-1].startswith("linear_ce_gpu.py: error:")
    good = _run("--rows-sweep", "0,2xr", "--out", str(out))
    assert good.returncode == 3 and good.stderr.strip() == "linear_ce_gpu: needs a CUDA GPU", good.stderr
    assert not out.exists()
