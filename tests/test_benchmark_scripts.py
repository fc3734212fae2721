"""Every script in benchmarks/ starts: `--help` exits 0 with a usage line. The device runs them
from a fresh copy of the tree, where an import path left behind by a move (tests/ regrouped into
folders) costs a whole device call; here it costs a second."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from repo_paths import BENCHMARKS, ROOT

SCRIPTS = sorted(p.name for p in BENCHMARKS.glob("*.py"))


@pytest.mark.parametrize("name", SCRIPTS)
def test_script_starts(name: str) -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    proc = subprocess.run([sys.executable, str(BENCHMARKS / name), "--help"], capture_output=True,
                          text=True, timeout=300, cwd=str(ROOT), env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.lower().startswith("usage:"), proc.stdout[:200]
