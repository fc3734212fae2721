"""scripts/setup_default_stack.sh on a disk too short for torch's CUDA build: no venv, exit 0, and
a reason the skipped tests quote (tests/support/repo_paths.venv_missing); the test suite's own
install must not fail for a full disk."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import repo_paths
from repo_paths import ROOT


def test_a_short_disk_leaves_the_default_stack_unbuilt_with_its_reason(tmp_path: Path, monkeypatch) -> None:
    venvs = tmp_path / "venvs"
    env = dict(os.environ, FASTPATH_VENVS=str(venvs), FASTPATH_DEFAULT_STACK_MB=str(10**12))
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "setup_default_stack.sh")], capture_output=True,
                          text=True, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "NOT BUILT" in proc.stdout and "MB free" in proc.stdout, proc.stdout
    assert not (venvs / "tf-default").exists()
    reason = (venvs / "tf-default.unbuilt").read_text()
    assert "needs about 1000000000000 MB" in reason, reason
    monkeypatch.setattr(repo_paths, "VENVS", venvs)
    assert repo_paths.venv_missing("default") == f"transformers default venv not built: {reason.strip()}"
    assert "setup_transformers_matrix.sh" in repo_paths.venv_missing("5.23.0")
