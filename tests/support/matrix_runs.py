"""The transformers matrix of the enable tests (tests/routing/test_enable_matrix.py,
test_mamba_matrix.py, test_mamba1_matrix.py): which python each version runs in, the worker
subprocess (tests/support/matrix_worker.py, one per version, its own transformers), the release a
version stands for, and what the Mamba matrices share: their runs and the routed-vs-reference
checks of matrix_worker.routed_case."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pytest
from repo_paths import ROOT, SUPPORT, VENVS, venv_missing
from repo_paths import venv_python as venv_exe

WORKER = SUPPORT / "matrix_worker.py"
VERSIONS = ["4.57.6", "5.12.1", "5.17.0", "5.23.0", "5.25.0", "default"]
DEFAULT = "default"  # the venv of today's `pip install ".[kernels]"`: its release is read from it
TOL = 1e-4          # float32 tiny models, relative to the logits' scale
GRAD_TOL = 1e-3     # max |dgrad| / max |grad| over every parameter


def python_for(version: str) -> str | None:
    if version == "5.17.0":
        try:
            import transformers
        except ImportError:
            return None
        return sys.executable if transformers.__version__ == "5.17.0" else venv_python(version)
    return venv_python(version)


def venv_python(version: str) -> str | None:
    exe = venv_exe(version)
    return str(exe) if exe.exists() else None


def run_matrix_worker(python: str, extra: tuple[str, ...]) -> subprocess.CompletedProcess:
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONPATH=str(ROOT / "src"))
    env.pop("USE_HUB_KERNELS", None)
    return subprocess.run([python, str(WORKER), *extra], capture_output=True, text=True, env=env,
                          timeout=1200, cwd=str(ROOT))


def release(version: str) -> str:
    """The transformers release a matrix entry runs: the entry itself, or (DEFAULT) the version
    installed in its venv, read from the dist-info folder without starting it."""
    if version != DEFAULT:
        return version
    found = sorted((VENVS / f"tf-{DEFAULT}").glob("lib/python*/site-packages/transformers-*.dist-info"))
    match = re.search(r"transformers-([0-9][^-]*)\.dist-info$", str(found[-1])) if found else None
    return match.group(1) if match else "0.0"


def major_minor(version: str) -> tuple[int, int]:
    major, minor = release(version).split(".")[:2]
    return int(major), int(minor)


def old(version: str) -> bool:
    """<=5.14: the releases whose mixers gate their kernel path on CUDA weights."""
    return major_minor(version) <= (5, 14)


def kernel_calls(calls: dict[str, int], op: str) -> int:
    return sum(n for key, n in calls.items() if key.startswith(op + ":"))


class VersionRuns:
    """One worker run per version with the arguments args_for(version) gives; all of them start
    together (one per core) the first time any is needed, and each result is read once."""

    def __init__(self, args_for: Callable[[str], tuple[str, ...]], matrix: str) -> None:
        self._args_for = args_for
        self._matrix = matrix  # "Mamba-2", "Mamba-1": for the skip reason
        self._pool = ThreadPoolExecutor(max_workers=max(1, min(len(VERSIONS), os.cpu_count() or 1)))
        self._futures: dict[str, Future] = {}
        self._results: dict[str, dict[str, Any]] = {}

    def _start(self, version: str) -> Future | None:
        if version not in self._futures:
            python = python_for(version)
            if python is None:
                return None
            self._futures[version] = self._pool.submit(run_matrix_worker, python, self._args_for(version))
        return self._futures[version]

    def run(self, version: str) -> dict[str, Any]:
        if version not in self._results:
            for v in VERSIONS:
                self._start(v)
            future = self._start(version)
            if future is None:
                pytest.skip(venv_missing(version))
            proc = future.result()
            assert proc.returncode == 0, proc.stderr[-3000:]
            self._results[version] = json.loads(proc.stdout)
        return self._results[version]

    def interpreted(self, version: str) -> dict[str, Any]:
        """The version's run, skipped unless its kernels ran under TRITON_INTERPRET=1."""
        data = self.run(version)
        if os.environ.get("TRITON_INTERPRET") != "1" or not data["interp"]:
            pytest.skip(f"the {self._matrix} matrix runs the kernels under TRITON_INTERPRET=1")
        assert data["transformers"] == release(version)
        return data


def assert_routed_case_matches(family: str, res: dict[str, Any]) -> None:
    """matrix_worker.routed_case's result: enable() gives the reference's logits, greedy decode,
    loss and gradients, also on a model built after enable(); disable() restores it exactly."""
    assert "error" not in res, (family, res.get("traceback"))
    tol = TOL * max(1.0, res["scale"])
    assert res["max_abs_diff"] <= tol, (family, res["max_abs_diff"])
    assert res["gen_equal"], f"{family}: greedy decode differs with enable()"
    assert res["loss_diff"] <= TOL * 10, (family, res["loss_diff"])
    assert res["grad_names_equal"] and res["grad_rel_diff"] <= GRAD_TOL, (family, res["grad_rel_diff"])
    assert res["after_build_diff"] <= tol, family
    assert res["disabled_diff"] == 0.0 and res["disabled_diff_built_during"] == 0.0, family
    assert res["calls_after_disable"] == {}, family
