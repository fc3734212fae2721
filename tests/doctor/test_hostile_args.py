"""Argument edges are usage errors (exit 2, one line), and `fastpath run`
keeps the user's sitecustomize (a package or .pyc-only too, its attributes visible) and empty
(current-directory) PYTHONPATH entries."""

from __future__ import annotations

import os
import py_compile
import subprocess
import sys
from pathlib import Path

import pytest
from hostile_fakes import SRC, env, fastpath, one_line_error

from fastpath.routing.launcher import BOOTSTRAP_DIR, launch_environment


@pytest.mark.parametrize("args", [
    ["--on", "sh -c true x", "--timeout", "nan"],
    ["--on", "sh -c true x", "--timeout", "inf"],
    ["--on", "sh -c true x", "--timeout", "-1"],
    ["--timeout", "0"],
    ["--hosts", "HOSTS", "--jobs", "0"],
    ["--hosts", "HOSTS", "--jobs", "-3"],
    ["--hosts", "HOSTS", "--timeout", "0"],
    ["--hosts", "HOSTS", "--timeout", "nan"],
    ["--hosts", "HOSTS", "--timeout", "abc"],
])
def test_bad_numbers_are_usage_errors(tmp_path: Path, args: list[str]) -> None:
    hosts = tmp_path / "fleet.txt"
    hosts.write_text("sh -c 'sleep 1000' x\n")
    proc = fastpath("doctor", *[str(hosts) if a == "HOSTS" else a for a in args], timeout=60)
    assert proc.returncode == 2, proc.stderr.decode()
    assert "--timeout" in one_line_error(proc) or "--jobs" in one_line_error(proc)


@pytest.mark.parametrize("value", ["abc", "nan", "-5", "inf"])
def test_probe_timeout_env_is_a_usage_error(value: str) -> None:
    proc = fastpath("doctor", "--probe", "static", extra_env={"FASTPATH_PROBE_TIMEOUT": value})
    assert proc.returncode == 2
    assert "FASTPATH_PROBE_TIMEOUT" in one_line_error(proc)


def test_probe_timeout_env_on_a_target_is_reported_not_fatal() -> None:
    """On a target the probe cannot refuse: it uses the default and says so in probe.errors."""
    code = ("import json, os; os.environ['FASTPATH_PROBE_TIMEOUT'] = 'abc'\n"
            "from fastpath.doctor.probe import Options\n"
            "o = Options(site_packages=[], skip=['imports'])\n"
            "print(o.timeout, o.timeout_error)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env(),
                         timeout=60)
    assert out.stdout.startswith("30.0 FASTPATH_PROBE_TIMEOUT="), out.stderr


# --- fastpath run --------------------------------------------------------------------------------
def _run_python(code: str, site: Path, cwd: Path, pythonpath: str | None = None) -> str:
    extra = {"PYTHONPATH": pythonpath if pythonpath is not None else
             os.pathsep.join([str(site), str(SRC)]), "FASTPATH_ENABLE_QUIET": "1"}
    script = cwd / "prog.py"
    script.write_text(code)
    proc = subprocess.run([sys.executable, "-m", "fastpath", "run", "--", sys.executable,
                           str(script)], capture_output=True, text=True, cwd=cwd, timeout=120,
                          env={**env(), **extra})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.strip()


PROG = "import sitecustomize\nprint(getattr(sitecustomize, 'USER_MARK', 'missing'))\n"


def test_user_sitecustomize_package_runs_and_stays_visible(tmp_path: Path) -> None:
    site = tmp_path / "site"
    (site / "sitecustomize").mkdir(parents=True)
    (site / "sitecustomize" / "__init__.py").write_text("USER_MARK = 'package'\n")
    assert _run_python(PROG, site, tmp_path) == "package"


def test_user_sitecustomize_pyc_only_runs(tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    source = site / "sitecustomize.py"
    source.write_text("USER_MARK = 'pyc'\n")
    py_compile.compile(str(source), cfile=str(site / "sitecustomize.pyc"))
    source.unlink()
    assert _run_python(PROG, site, tmp_path) == "pyc"


def test_user_sitecustomize_attributes_and_enable_hook(tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("USER_MARK = 'module'\n")
    prog = PROG + ("import sys\nprint(any(type(f).__name__ == '_EnableOnTransformersImport' "
                   "for f in sys.meta_path))\n")
    assert _run_python(prog, site, tmp_path).split() == ["module", "True"]


def test_empty_pythonpath_entry_means_cwd_and_is_kept(tmp_path: Path) -> None:
    work = tmp_path / "work"
    (work / "sub").mkdir(parents=True)
    (work / "helper_in_cwd.py").write_text("VALUE = 'from cwd'\n")
    # the program lives elsewhere, so only the empty PYTHONPATH entry finds helper_in_cwd
    prog = tmp_path / "elsewhere"
    prog.mkdir()
    pythonpath = os.pathsep.join(["", str(SRC)])
    code = "import helper_in_cwd\nprint(helper_in_cwd.VALUE)\n"
    script = prog / "prog.py"
    script.write_text(code)
    proc = subprocess.run([sys.executable, "-m", "fastpath", "run", "--", sys.executable,
                           str(script)], capture_output=True, text=True, cwd=work, timeout=120,
                          env={**env(), "PYTHONPATH": pythonpath, "FASTPATH_ENABLE_QUIET": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "from cwd"
    parts = launch_environment({"PYTHONPATH": f"{os.pathsep}/a{os.pathsep}"})["PYTHONPATH"]
    assert parts.split(os.pathsep) == [str(BOOTSTRAP_DIR), "", "/a", ""]
