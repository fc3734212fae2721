"""benchmarks/sscan_ncu.py (the Nsight Compute driver) off the GPU: its help, bad arguments as
one-line errors before any GPU work, and its one-line refusal with exit 2 where there is no CUDA
device (it profiles compiled kernels only)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[3] / "benchmarks" / "sscan_ncu.py"


def _run(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(SCRIPT.parents[1] / "src")}
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                          timeout=300, env=env)


def test_help_names_the_variant_syntax():
    proc = _run("--help")
    assert proc.returncode == 0
    assert "@A/B/C" in proc.stdout and "--bwd" in proc.stdout


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for a machine without CUDA")
def test_without_cuda_one_line_and_exit_2():
    proc = _run("--variants", "tile@0/0/1/0/0/3")
    assert proc.returncode == 2
    assert proc.stderr.strip() == "sscan_ncu: needs a CUDA device"


@pytest.mark.parametrize("args,says", [
    (("--variants", "tiles"), "unknown variant 'tiles'"),
    (("--variants", "tile@0/x"), "'tile@0/x': '0/x' is not integers joined by '/'"),
    (("--variants", "tile@0/0/1"), "'tile@0/0/1': tile takes 5 to 8 numbers a config, got '0/0/1'"),
    (("--variants", "seq@1/2/3/4/5/6/7/8"), "seq takes"),
    (("--cases", "1x"), "case '1x' is not BxL"),
    (("--cases", "0x4096"), "case '0x4096' is not BxL"),
])
def test_bad_arguments_one_line_exit_2(args, says):
    proc = _run(*args)
    assert proc.returncode == 2
    assert says in proc.stderr and proc.stderr.count("\n") == 1
