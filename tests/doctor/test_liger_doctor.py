"""The doctor and Liger Kernel: the probe reads liger-kernel's version from its dist-info (nothing
imported), and for a --model whose family Liger patches an info finding says that its patch
composes with enable(), with the measured memory effect, and whether Liger is here."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
from fakeenv import seed_facts, write_dist_info

from fastpath.doctor.diagnosis import diagnose
from fastpath.shared.liger_families import PATCH_FUNCTIONS

RULE = "liger-kernel-composes"


def _liger(version: str | None, transformers: str = "5.17.0") -> dict:
    facts = copy.deepcopy(seed_facts())
    facts["packages"]["transformers"]["version"] = transformers
    if version is not None:
        facts["packages"]["liger-kernel"] = {"version": version, "module": "liger_kernel",
                                             "source": "package metadata (fake)", "so_files": []}
    return facts


def _finding(facts: dict, model: str | None):
    found = [f for f in diagnose(facts, model=model).findings if f.id == RULE]
    return found[0] if found else None


def test_the_probe_reads_liger_kernel_from_dist_info_without_importing(tmp_path: Path) -> None:
    from fastpath.doctor.probe import collect

    site = tmp_path / "site"
    # a module that raises if imported: the probe must only read the dist-info
    write_dist_info(site, "liger-kernel", "0.8.5", {"liger_kernel/__init__.py": b"raise SystemExit(7)\n"})
    for skip in (["imports"], None):
        facts = collect(site_packages=[str(site)], root=str(tmp_path), skip=skip, env={"PATH": str(tmp_path)})
        entry = facts["packages"]["liger-kernel"]
        assert entry["version"] == "0.8.5" and entry["module"] == "liger_kernel"
        assert "liger_kernel-0.8.5.dist-info" in entry["source"]
    empty = collect(site_packages=[str(tmp_path / "none")], root=str(tmp_path), skip=["imports"],
                    env={"PATH": str(tmp_path)})
    assert empty["packages"]["liger-kernel"]["version"] is None


@pytest.mark.parametrize("model,fn", [("qwen3.5-27b", "apply_liger_kernel_to_qwen3_5"),
                                      ("qwen3.5-35b-a3b", "apply_liger_kernel_to_qwen3_5_moe"),
                                      ("qwen3-next-80b-a3b", "apply_liger_kernel_to_qwen3_next"),
                                      ("falcon-h1-7b", "apply_liger_kernel_to_falcon_h1")])
def test_a_family_liger_patches_gets_the_info_finding(model: str, fn: str) -> None:
    f = _finding(_liger("0.8.5"), model)
    assert f is not None and f.severity == "info"
    assert f"`{fn}`" in f.detail and "liger-kernel 0.8.5 is installed" in f.detail
    assert "-46 %" in f.detail and "either order" in f.detail
    assert f"{fn}(model=model)" in f.remedies[0] and "pip install" not in f.remedies[0]
    assert f.source.endswith("liger_kernel/transformers/monkey_patch.py")


def test_not_installed_says_so_and_how() -> None:
    f = _finding(_liger(None), "qwen3.5-27b")
    assert "liger-kernel is not installed here" in f.detail
    assert f.remedies[0].startswith('pip install "fastpath-kit[train]"; then ')


def test_transformers_older_than_liger_accepts() -> None:
    f = _finding(_liger("0.8.5", transformers="4.57.6"), "qwen3-next-80b-a3b")
    assert "refuses transformers 4.57.6" in f.detail and ">= 5.0.0" in f.detail


@pytest.mark.parametrize("model", ["lfm2-1.2b", "nemotron-h-8b", "zamba2-7b", None])
def test_quiet_for_families_liger_does_not_patch_and_without_a_model(model: str | None) -> None:
    assert _finding(_liger("0.8.5"), model) is None


def test_every_family_in_the_table_is_one_liger_names() -> None:
    """The doctor's table (read in liger-kernel 0.8.5) against the installed Liger's own, when here.
    In a subprocess: importing Liger's monkey_patch imports modeling modules (qwen3_5, ...)."""
    import json
    import subprocess
    import sys

    pytest.importorskip("liger_kernel")
    code = ("import json; from liger_kernel.transformers import monkey_patch as m; "
            "print(json.dumps({k: f.__name__ for k, f in m.MODEL_TYPE_TO_APPLY_LIGER_FN.items()}))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    installed = json.loads(proc.stdout.strip().splitlines()[-1])
    for model_type, fn in PATCH_FUNCTIONS.items():
        assert installed[model_type] == fn, model_type
