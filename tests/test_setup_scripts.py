"""The setup scripts on a disk too short for them (scripts/setup_default_stack.sh before it starts,
scripts/setup_transformers_matrix.sh when the disk fills): no venv, exit 0, and a reason the skipped
tests quote (tests/support/repo_paths.venv_missing); the test suite's own install must not fail for a
full disk, and must still fail for anything else."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
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


def _run_matrix_in_tmpfs(size: str, venvs: str) -> subprocess.CompletedProcess:
    """scripts/setup_transformers_matrix.sh with its venvs on a tmpfs of `size`, mounted in a private
    mount namespace (root only): a real full disk, not an imitation of one."""
    script = f"mkdir -p {venvs} && mount -t tmpfs -o size={size} tmpfs {venvs} || exit 9; " \
             f"FASTPATH_VENVS={venvs}/v bash {ROOT / 'scripts' / 'setup_transformers_matrix.sh'}; rc=$?; " \
             f"echo '== unbuilt:'; cat {venvs}/v/*.unbuilt; exit $rc"
    return subprocess.run(["unshare", "-m", "bash", "-c", script], capture_output=True, text=True, timeout=120)


def test_a_full_disk_leaves_the_transformers_matrix_unbuilt_with_reasons(tmp_path: Path) -> None:
    if os.geteuid() != 0 or subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode != 0:
        pytest.skip("needs root and mount namespaces (unshare -m) to mount a small tmpfs")
    proc = _run_matrix_in_tmpfs("4m", str(tmp_path / "mnt"))
    assert proc.returncode == 0, proc.stderr
    printed, unbuilt = proc.stdout.split("== unbuilt:\n")
    assert len([line for line in printed.splitlines() if "NOT BUILT" in line]) == 5, proc.stdout
    reasons = unbuilt.splitlines()  # what tests/support/repo_paths.venv_missing quotes in its skips
    assert len(reasons) == 5 and all("filled while installing transformers" in r for r in reasons), reasons


def test_a_matrix_install_that_fails_for_another_reason_fails_the_script(tmp_path: Path) -> None:
    env = dict(os.environ, FASTPATH_VENVS=str(tmp_path / "venvs"), PYTHON="false")
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "setup_transformers_matrix.sh")], capture_output=True,
                          text=True, env=env, timeout=60)
    assert proc.returncode == 1, proc.stdout
    assert "NOT BUILT" not in proc.stdout
    assert not list((tmp_path / "venvs").glob("*.unbuilt"))
