"""benchmarks/embedding_gpu.py on the CPU: its launch and token specs parse as the module doc
says, a bad one is argparse's one-line error (exit 2) before anything is built, and without a
GPU a valid call ends with the script's exit 3. The timings need the device (parts.sh part
`embedding`)."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

import pytest
from repo_paths import BENCHMARKS, import_benchmark

SCRIPT = BENCHMARKS / "embedding_gpu.py"


def _bench():
    return import_benchmark("embedding_gpu")


def test_specs_parse() -> None:
    bench = _bench()
    assert bench.parse_launches(bench.DEFAULT_LAUNCHES)[0] == (8, 1024)
    assert bench.parse_launches(" 1x4096 ,2x32") == [(1, 4096), (2, 32)]
    assert bench.parse_tokens("4096,7") == [4096, 7]


@pytest.mark.parametrize("spec", ["8", "8x1000", "0x1024", "x1024", "8x", "-1x64", ""])
def test_bad_launches_are_named(spec: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="--launches"):
        _bench().parse_launches(spec)


@pytest.mark.parametrize("spec", ["", "0", "a,1", "4096,-2"])
def test_bad_tokens_are_named(spec: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="--tokens"):
        _bench().parse_tokens(spec)


def _run(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    env["CUDA_VISIBLE_DEVICES"] = ""
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=300, env=env)


def test_bad_spec_exits_2_and_no_gpu_exits_3() -> None:
    bad = _run("--launches", "8x1000")
    assert bad.returncode == 2 and "--launches" in bad.stderr.splitlines()[-1]
    proc = _run("--tokens", "16")
    assert proc.returncode == 3 and proc.stderr.strip().endswith("needs a CUDA GPU"), proc.stderr
