"""`fastpath run -- CMD`: enable() reaches a child python and a grandchild with no code change."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from fastpath.routing.launcher import BOOTSTRAP_DIR, launch_environment

# Each level imports transformers (the trigger), reports whether enable() is in force, and the
# first two levels start the next one as a plain subprocess.
PROBE = textwrap.dedent(
    """
    import json, os, subprocess, sys
    import transformers
    from fastpath.routing.engine import is_enabled
    level = int(sys.argv[1])
    out = {"level": level, "enabled": is_enabled(), "pid": os.getpid()}
    if level < 2:
        child = subprocess.run([sys.executable, __file__, str(level + 1)], capture_output=True, text=True)
        out["child"] = json.loads(child.stdout) if child.returncode == 0 else child.stderr[-2000:]
    print(json.dumps(out))
    """
)


def _fastpath(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fastpath", *args], capture_output=True, text=True,
                          env=env, cwd=cwd, timeout=300)


def test_no_command_is_a_one_line_usage_error() -> None:
    proc = _fastpath("run")
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0
    assert "no command given" in proc.stderr


def test_unknown_command_is_a_one_line_usage_error() -> None:
    proc = _fastpath("run", "--", "no-such-program-fastpath-test")
    assert proc.returncode == 2
    assert "command not found" in proc.stderr and proc.stderr.strip().count("\n") == 0


@pytest.mark.parametrize(("name", "value", "says"), [
    ("FASTPATH_LM_LOSS", "sometimes", "expected one of auto, off"),
    ("FASTPATH_GLUE", "maybe", "FASTPATH_GLUE='maybe'"),
    ("FASTPATH_AUTOTUNE_DECISIONS", "/no/such/decisions.json", "cannot read autotune decisions"),
])
def test_a_bad_switch_stops_before_the_program_starts(tmp_path: Path, name: str, value: str, says: str) -> None:
    """The program's processes enable() only at their first transformers import; a bad switch
    is refused by `fastpath run` itself, in one line, and the program never runs."""
    marker = tmp_path / "ran"
    env = dict(os.environ, **{name: value})
    proc = _fastpath("run", "--", sys.executable, "-c", f"open({str(marker)!r}, 'w')", env=env)
    assert proc.returncode == 2, proc.stderr
    assert says in proc.stderr and proc.stderr.strip().count("\n") == 0, proc.stderr
    assert not marker.exists()


def test_child_and_grandchild_get_enable(tmp_path: Path) -> None:
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    env = dict(os.environ, FASTPATH_ENABLE_QUIET="1")
    proc = _fastpath("run", "--", sys.executable, str(script), "0", env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    top = json.loads(proc.stdout.strip().splitlines()[-1])
    child = top["child"]
    assert isinstance(child, dict), child
    grandchild = child["child"]
    assert isinstance(grandchild, dict), grandchild
    assert [top["enabled"], child["enabled"], grandchild["enabled"]] == [True, True, True]
    assert len({top["pid"], child["pid"], grandchild["pid"]}) == 3


def test_without_run_nothing_is_enabled(tmp_path: Path) -> None:
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    env = {k: v for k, v in os.environ.items() if k != "FASTPATH_ENABLE"}
    proc = subprocess.run([sys.executable, str(script), "1"], capture_output=True, text=True, env=env,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["enabled"] is False and out["child"]["enabled"] is False


def test_existing_sitecustomize_still_runs(tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    marker = tmp_path / "marker"
    (site / "sitecustomize.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]))
    proc = _fastpath("run", "--", sys.executable, "-c",
                     "import sys; print(sys.modules['sitecustomize'].__file__)", env=env)
    assert proc.returncode == 0, proc.stderr
    # ours ran first and chained to the original, which is then *the* sitecustomize module
    assert Path(proc.stdout.strip()) == site / "sitecustomize.py"
    assert marker.read_text() == "ran"


def test_launch_environment_puts_bootstrap_first_once() -> None:
    env = launch_environment({"PYTHONPATH": f"/a{os.pathsep}{BOOTSTRAP_DIR}{os.pathsep}/b"})
    assert env["PYTHONPATH"].split(os.pathsep) == [str(BOOTSTRAP_DIR), "/a", "/b"]
    assert env["FASTPATH_ENABLE"] == "1"


@pytest.mark.skipif(
    subprocess.run([sys.executable, "-c", "import torch.distributed.run"], capture_output=True).returncode != 0,
    reason="torch.distributed.run not importable",
)
def test_torchrun_workers_get_enable(tmp_path: Path) -> None:
    """`fastpath run -- torchrun --nproc-per-node 2 train.py`: each worker is enabled."""
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(
        """
        import json, os
        import transformers
        from fastpath.routing.engine import is_enabled
        print(json.dumps({"rank": int(os.environ["RANK"]), "enabled": is_enabled()}), flush=True)
        """
    ))
    env = dict(os.environ, FASTPATH_ENABLE_QUIET="1", OMP_NUM_THREADS="1")
    proc = _fastpath("run", "--", sys.executable, "-m", "torch.distributed.run", "--standalone",
                     "--nproc-per-node", "2", str(script), env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert sorted(r["rank"] for r in rows) == [0, 1]
    assert all(r["enabled"] for r in rows)
