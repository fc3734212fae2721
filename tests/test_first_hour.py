"""The first hour of a new user, for real: a fresh virtual environment, `pip install` of this
checkout WITHOUT torch (the README's base install), then every feature that needs an extra must
say in one line which `pip install` brings it and exit 2, never a traceback; the doctor works.

Slow-ish (a venv and a pip install from the local index: ~30-60 s on 2 cores), but it is the
only test that sees the package as a user installs it, so it stays in the suite.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest
from repo_paths import ROOT

# fastpath-kit is not on PyPI: the line names the checkout the venv was installed from (PEP 610)
KERNELS = 'pip install "{checkout}[kernels]"'
BENCH = 'pip install "{checkout}[bench]"'
CAPTURE = 'pip install "{checkout}[capture]"'


@pytest.fixture(scope="module")
def bare_venv(tmp_path_factory) -> Path:
    """A venv holding fastpath-kit and its base dependencies only (no torch, no matplotlib)."""
    tmp = tmp_path_factory.mktemp("first-hour")
    checkout = tmp / "checkout"  # a copy, so the build leaves nothing in the worktree
    checkout.mkdir()
    shutil.copy(ROOT / "pyproject.toml", checkout)
    shutil.copy(ROOT / "README.md", checkout)
    shutil.copytree(ROOT / "src", checkout / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    env_dir = tmp / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    python = env_dir / "bin" / "python"
    proc = subprocess.run([str(python), "-m", "pip", "install", "-q", str(checkout)],
                          capture_output=True, text=True, timeout=300, env=_clean_env())
    if proc.returncode != 0:
        pytest.skip(f"pip cannot install the checkout here (no index reachable?): {proc.stderr.strip()[-300:]}")
    return env_dir


def _clean_env() -> dict[str, str]:
    """The user's environment: no PYTHONPATH pointing at the source tree, no interpreter flag."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TRITON_INTERPRET", "PYTHONHOME")}


def _run(env_dir: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(env_dir / "bin" / argv[0]), *argv[1:]], capture_output=True, text=True,
                          timeout=120, env=_clean_env(), cwd=env_dir)


def _one_line_exit_2(proc: subprocess.CompletedProcess[str], pip: str) -> str:
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert pip.format(checkout=proc.args[0].split("/venv/")[0] + "/checkout") in lines[0], lines[0]
    return lines[0]


def test_the_bare_install_has_no_torch_and_import_fastpath_stays_light(bare_venv):
    proc = _run(bare_venv, "python", "-c",
                "import importlib.util, sys, fastpath; "
                "assert importlib.util.find_spec('torch') is None; "
                "assert importlib.util.find_spec('matplotlib') is None; "
                "print(fastpath.__version__, sorted(m for m in sys.modules if m in ('torch', 'rich')))")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().endswith("[]")


def test_the_doctor_works_on_the_bare_install(bare_venv):
    proc = _run(bare_venv, "fastpath", "doctor", "--probe", "static", "--model", "qwen3.5-27b", "--json")
    # 1: slow or blocked, 3: UNKNOWN (no GPU here, nothing blocks); never a crash
    assert proc.returncode in (0, 1, 3), proc.stderr
    assert '"verdict"' in proc.stdout and "Traceback" not in proc.stderr


@pytest.mark.parametrize(("argv", "pip"), [
    (("fastpath", "verify", "lfm2-1.2b"), KERNELS),
    (("fastpath", "warmup", "qwen3.5-27b"), KERNELS),
    (("fastpath", "bench", "lfm2-1.2b"), BENCH),
    (("fastpath", "capture", "lfm2-1.2b", "data.jsonl", "--out", "o"), CAPTURE),
    (("fastpath", "run", "--", "python", "-c", "pass"), KERNELS),
    (("python", "-c", "import fastpath; fastpath.enable()"), KERNELS),
    (("python", "-c", "import fastpath; print(fastpath.explain(object()))"), KERNELS),
    (("python", "-c", "import fastpath.causal_conv1d"), KERNELS),
])
def test_every_feature_needing_an_extra_names_the_pip_command(bare_venv, argv, pip):
    line = _one_line_exit_2(_run(bare_venv, *argv), pip)
    assert "torch" in line
    if argv[0] == "fastpath":  # the command the user typed, not another one, is named
        assert line.startswith(f"fastpath {argv[1]}: error: fastpath {argv[1]} needs "), line


def test_disable_without_torch_is_a_no_op(bare_venv):
    proc = _run(bare_venv, "python", "-c", "import fastpath; fastpath.disable(); print('ok')")
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr


def test_an_api_error_caught_by_the_caller_is_an_import_error(bare_venv):
    proc = _run(bare_venv, "python", "-c",
                "import fastpath\ntry:\n    fastpath.enable()\nexcept ImportError as e:\n    print('caught', e.name)")
    assert proc.returncode == 0 and proc.stdout.strip() == "caught torch", proc.stderr


def test_sys_executable_is_not_the_bare_venv(bare_venv):
    # Sanity: the suite itself runs elsewhere (with torch), so the checks above are not vacuous.
    assert Path(sys.executable).resolve() != (bare_venv / "bin" / "python").resolve()
