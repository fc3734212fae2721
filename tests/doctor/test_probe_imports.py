"""The probe's guarded imports: one interpreter for every package, a fresh one only after a crash
or a hang, each failure keeping its classified reason (fake packages on PYTHONPATH, real imports)."""

from __future__ import annotations

import os

from fakeenv import write_dist_info

from fastpath.doctor import probe

# Each fake package reports the pid of the interpreter that imported it as its __version__.
PID_MODULE = b"import os\n__version__ = str(os.getpid())\n"


def _site(tmp_path, packages):
    site = tmp_path / "site"
    for name, body in packages.items():
        write_dist_info(site, name, "1.0", {f"{name}/__init__.py": body})
    return site


def _opts(site, timeout=20.0):
    return probe.Options(env=dict(os.environ, PYTHONPATH=str(site)), site_packages=[str(site)],
                         timeout=timeout)


def test_packages_import_in_one_interpreter_in_order(tmp_path):
    site = _site(tmp_path, {"pkga": PID_MODULE, "pkgb": PID_MODULE,
                            "pkgc": b"raise ImportError('undefined symbol: _ZN3c10foo')\n"})
    steps = ["module:pkga", "module:pkgb", "module:pkgc", "module:no_such_module_xyz"]
    r = probe.run_import_steps(steps, _opts(site))
    assert r["module:pkga"]["ok"] and r["module:pkgb"]["ok"]
    assert r["module:pkga"]["version"] == r["module:pkgb"]["version"]  # same interpreter
    assert probe.import_verdict(r["module:pkgc"])["error_kind"] == "abi-mismatch"
    assert probe.import_verdict(r["module:no_such_module_xyz"])["error_kind"] == "not-installed"


def test_a_crashing_import_is_named_and_the_rest_still_run(tmp_path):
    crash = b"import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\n"
    site = _site(tmp_path, {"pkga": PID_MODULE, "crashy": crash, "pkgb": PID_MODULE})
    r = probe.run_import_steps(["module:pkga", "module:crashy", "module:pkgb"], _opts(site))
    v = probe.import_verdict(r["module:crashy"])
    assert v["ok"] is False and "SIGSEGV" in v["error"] and v["error_kind"] == "other"
    assert r["module:pkga"]["ok"] and r["module:pkgb"]["ok"]
    assert r["module:pkga"]["version"] != r["module:pkgb"]["version"]  # a fresh interpreter
    assert r["_interpreters"] == 2


def test_a_hanging_import_times_out_and_the_rest_still_run(tmp_path):
    site = _site(tmp_path, {"hangs": b"import time\ntime.sleep(60)\n", "pkgb": PID_MODULE})
    r = probe.run_import_steps(["module:hangs", "module:pkgb"], _opts(site, timeout=1.5))
    v = probe.import_verdict(r["module:hangs"])
    assert v["ok"] is False and "timed out after 1.5s" in v["error"]
    assert r["module:pkgb"]["ok"]


def test_a_package_printing_on_import_does_not_confuse_the_protocol(tmp_path):
    noisy = b"print('FASTPATH_JSON not json'); print('hello')\n__version__ = '9'\n"
    site = _site(tmp_path, {"noisy": noisy})
    r = probe.run_import_steps(["module:noisy"], _opts(site))
    assert r["_interpreters"] == 1 and r["module:noisy"].pop("_seconds") >= 0
    assert r["module:noisy"] == {"ok": True, "version": "9",
                                 "file": str(site / "noisy" / "__init__.py")}


def test_collect_imports_packages_but_reads_transformers_from_dist_info(tmp_path):
    site = _site(tmp_path, {"kernels": PID_MODULE})
    write_dist_info(site, "transformers", "5.17.0",
                    {"transformers/__init__.py": b"raise RuntimeError('imported')\n"})
    env = dict(os.environ, PYTHONPATH=str(site))
    facts = probe.collect(env=env, site_packages=[str(site)], skip=["rpm", "nvidia-smi"])
    pk = facts["packages"]
    assert pk["kernels"]["import"]["ok"] is True
    assert pk["transformers"]["version"] == "5.17.0"
    assert pk["transformers"]["import"]["ok"] is True
    assert "not imported" in pk["transformers"]["import"]["how"]
    assert facts["probe"]["import_interpreters"] == 1
    assert set(facts["probe"]["import_seconds"]) == {"torch", "module:kernels"}


def test_a_hanging_torch_does_not_cost_a_timeout_per_package(tmp_path):
    site = tmp_path / "site"
    (site / "torch").mkdir(parents=True)
    (site / "torch" / "__init__.py").write_text("import time\ntime.sleep(60)\n")  # shadows torch
    (site / "fla").mkdir()
    (site / "fla" / "__init__.py").write_text("import torch\n")
    write_dist_info(site, "pkgb", "1.0", {"pkgb/__init__.py": PID_MODULE})
    r = probe.run_import_steps(["torch", "module:fla", "module:pkgb"], _opts(site, timeout=1.5))
    assert "timed out after 1.5s" in r["torch"]["failed"]
    fla = probe.import_verdict(r["module:fla"])
    assert fla["ok"] is False and fla["error"].startswith("not attempted: import torch timed out")
    assert r["module:pkgb"]["ok"] and r["_interpreters"] == 2
