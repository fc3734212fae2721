"""The doctor's part of first contact: what a new user reads first.

- An image builder (CPU-only torch, no nvcc) judged for a GPU (--gpu) or on a GPU host hears the
  no-nvcc story: the compiler-free route first, then the toolkit route.
- Fleets exit 1 for a slow *or blocked* target, and --help / README say so.
- One fla package everywhere (fla-core), the Mamba remedy starts compiler-free, the --gpu error
  names H200 and RTX 5090, a Hub id points to its preset, no `pip install fastpath-kit` where it
  is installed, and the report's last line says what its exit status means.

Every test runs the real CLI (a subprocess) on a fake environment: a fake target answering with
a facts report, or the real probe pointed at a fake site-packages and an empty system root.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from fakeenv import seed_facts, write_dist_info
from hostile_fakes import fake_target, fastpath, framed, one_line_error
from repo_paths import ROOT
from test_narrow_output import assert_fits


def last_paragraph(out: str) -> str:
    """The report's last paragraph (after its last blank line), on one line."""
    return " ".join(out.strip().split("\n\n")[-1].split())


def _cpu_torch(facts: dict) -> dict:
    facts["torch"] = {"version": "2.13.0+cpu", "cuda": None, "arch_list": [], "cxx11_abi": True,
                      "cuda_available": False, "device_arch_covered": None, "source": "fake"}
    facts["packages"]["torch"]["version"] = "2.13.0+cpu"
    return facts


def _image_builder() -> dict:
    """A CPU image builder: CPU-only torch, no GPU, no nvcc (seed_facts has no nvcc)."""
    facts = _cpu_torch(copy.deepcopy(seed_facts()))
    facts["gpus"], facts["driver"] = [], None
    return facts


def _doctor_json(tmp: Path, facts: dict, *args: str) -> dict:
    target = fake_target(tmp, "t", stdout=framed(facts))
    proc = fastpath("doctor", "--on", " ".join(target), "--json", *args)
    assert proc.returncode in (0, 1), proc.stderr.decode()[-2000:]
    return json.loads(proc.stdout)


def _finding(doc: dict, rule: str) -> dict:
    found = [f for f in doc["findings"] if f["id"] == rule]
    assert found, [f["id"] for f in doc["findings"]]
    return found[0]


def _no_nvcc_story(doc: dict) -> None:
    ids = [f["id"] for f in doc["findings"]]
    assert {"torch-cpu-build", "causal-conv1d-missing", "no-usable-nvcc"} <= set(ids), ids
    first, second = _finding(doc, "no-usable-nvcc")["remedies"][:2]
    assert first.startswith("Compiler-free (no nvcc)") and "fastpath.enable()" in first
    assert "a CUDA build of torch" in first  # what has to come first on this machine
    assert second.startswith("CUDA toolkit")


# --- item 11 -------------------------------------------------------------------------------------
def test_image_builder_judged_for_a_named_gpu_hears_the_no_nvcc_story(tmp_path: Path) -> None:
    _no_nvcc_story(_doctor_json(tmp_path, _image_builder(), "--gpu", "H100", "--model", "qwen3.5-27b"))


def test_a_gpu_host_with_a_cpu_torch_hears_it_too(tmp_path: Path) -> None:
    facts = _cpu_torch(copy.deepcopy(seed_facts()))  # 8 GPUs detected, CPU torch, no nvcc
    _no_nvcc_story(_doctor_json(tmp_path, facts, "--model", "qwen3.5-27b"))


def test_without_any_gpu_the_toolchain_is_not_judged(tmp_path: Path) -> None:
    doc = _doctor_json(tmp_path, _image_builder(), "--model", "qwen3.5-27b")
    assert "no-usable-nvcc" not in [f["id"] for f in doc["findings"]]


def test_the_real_probe_on_an_image_builder_without_nvcc(tmp_path: Path) -> None:
    """The real probe, pointed at a site-packages with a CPU torch and at an empty system root,
    with nothing on PATH: no nvcc anywhere, as in the reported image builder."""
    site = tmp_path / "site"
    write_dist_info(site, "torch", "2.13.0+cpu", {
        "torch/__init__.py": b"", "torch/version.py": b"__version__ = '2.13.0+cpu'\ncuda = None\n"})
    write_dist_info(site, "transformers", "5.17.0", {"transformers/__init__.py": b""})
    (tmp_path / "root").mkdir()
    (tmp_path / "bin").mkdir()
    env = {"FASTPATH_PROBE_SITE_PACKAGES": str(site), "FASTPATH_PROBE_ROOT": str(tmp_path / "root"),
           "PATH": str(tmp_path / "bin"), "CUDA_HOME": "", "CUDA_PATH": "", "CONDA_PREFIX": "",
           "COLUMNS": "80"}
    args = ("doctor", "--probe", "static", "--gpu", "H100", "--model", "qwen3.5-27b")
    doc = json.loads(fastpath(*args, "--json", extra_env=env, timeout=180).stdout)
    assert doc["facts"]["nvcc_candidates"] == [], doc["facts"]["nvcc_candidates"]
    _no_nvcc_story(doc)
    text = fastpath(*args, extra_env=env, timeout=180)
    out = text.stdout.decode()
    assert text.returncode == 1 and "(no-usable-nvcc)" in out
    assert_fits(out)
    assert last_paragraph(out).startswith("exit status 1: slow path found")


def test_fleets_exit_1_for_a_blocked_target_and_say_so(tmp_path: Path) -> None:
    blocked = fake_target(tmp_path, "blocked", stdout=framed(_image_builder()))  # no GPU: blocked
    hosts = tmp_path / "hosts.txt"
    hosts.write_text(" ".join(blocked) + "\n")
    proc = fastpath("doctor", "--hosts", str(hosts), "--model", "qwen3.5-27b",
                    extra_env={"COLUMNS": "80"})
    out = proc.stdout.decode()
    assert proc.returncode == 1, out + proc.stderr.decode()
    assert "verdict: blocked" in out  # no GPU to judge, but blocked on any GPU
    assert " ".join(out.split()).endswith("exit status 1: a target is slow or blocked (its fixes: "
                                          "fastpath doctor --on PREFIX); the doctor ran fine")
    help_text = " ".join(fastpath("doctor", "--help", extra_env={"COLUMNS": "80"}).stdout.decode().split())
    assert "Fleets (--hosts): 1 if any target is slow or blocked" in help_text
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert "Fleets: 1 if any target is slow or blocked" in readme and "target is slow," not in readme


# --- item 12 -------------------------------------------------------------------------------------
def test_one_fla_package_everywhere(tmp_path: Path) -> None:
    facts = copy.deepcopy(seed_facts())
    facts["packages"]["fla-core"] = {"version": None, "so_files": [], "import": {
        "ok": False, "error_kind": "not-installed", "error": "no module fla"}}
    doc = _doctor_json(tmp_path, facts, "--model", "qwen3.5-27b")
    text = json.dumps(doc["findings"]) + json.dumps(doc["model"])
    assert "pip install fla-core" in _finding(doc, "fla-missing")["remedy"]
    assert "pip install flash-linear-attention" not in text
    needs = {r["with_fastpath_needs"] for t in doc["model"]["layer_types"] for r in t["ops"]
             if r["op"].endswith("gated_delta_rule")}
    assert needs == {"needs fla-core: pip install fla-core"}, needs


@pytest.mark.parametrize("cuda_torch", [True, False])
def test_the_mamba_remedy_starts_compiler_free(tmp_path: Path, cuda_torch: bool) -> None:
    facts = copy.deepcopy(seed_facts()) if cuda_torch else _cpu_torch(copy.deepcopy(seed_facts()))
    doc = _doctor_json(tmp_path, facts, "--model", "nemotron-h-8b")
    remedies = _finding(doc, "mamba-needs-mamba-ssm")["remedies"]
    assert remedies[0].startswith("Compiler-free (no nvcc, no mamba_ssm)"), remedies
    assert "pip install mamba-ssm" in remedies[1]


def test_gpu_error_names_the_current_parts() -> None:
    from fastpath.doctor.gpu_models import EXAMPLE_NAMES, parse_gpu_spec

    err = one_line_error(fastpath("doctor", "--gpu", "H300"))
    for name in ("H200", "RTX 5090", "B200", "RTX PRO 6000"):
        assert name in err, err
    for name in EXAMPLE_NAMES:  # every name the error offers is accepted
        assert parse_gpu_spec(name).name == name


def test_a_hub_id_is_pointed_to_its_preset() -> None:
    proc = fastpath("doctor", "--model", "Qwen/Qwen3.5-27B")
    err = one_line_error(proc)
    assert proc.returncode == 2
    assert "Hugging Face Hub id" in err and "preset qwen3.5-27b" in err, err
    unknown = one_line_error(fastpath("doctor", "--model", "meta-llama/Llama-3.1-8B"))
    assert "hf download meta-llama/Llama-3.1-8B config.json" in unknown, unknown
    path = one_line_error(fastpath("doctor", "--model", "models/config.json"))
    assert "config file models/config.json does not exist" in path and "Hub" not in path


def test_no_pip_install_fastpath_kit_where_it_is_installed(tmp_path: Path) -> None:
    facts = copy.deepcopy(seed_facts())
    facts["packages"]["fastpath-kit"] = {"version": "0.1.0", "so_files": [], "import": {
        "ok": True, "error_kind": None, "error": None}}
    doc = _doctor_json(tmp_path, facts, "--model", "qwen3.5-27b")
    assert doc["top_remedy"].startswith("Compiler-free (no nvcc): call `fastpath.enable()`")
    assert "pip install fastpath-kit" not in json.dumps(doc["findings"])
    absent = _doctor_json(tmp_path, seed_facts(), "--model", "qwen3.5-27b")  # another host
    assert "`pip install fastpath-kit`, then call `fastpath.enable()`" in absent["top_remedy"]


def test_the_probe_reports_fastpath_kit(tmp_path: Path) -> None:
    from fastpath.doctor.probe import collect

    site = tmp_path / "site"
    write_dist_info(site, "fastpath-kit", "0.1.0", {"fastpath/__init__.py": b""})
    for skip in (["imports"], None):
        facts = collect(site_packages=[str(site)], root=str(tmp_path), skip=skip,
                        env={"PATH": str(tmp_path)})
        assert facts["packages"]["fastpath-kit"]["version"] == "0.1.0"
        assert facts["packages"]["fastpath-kit"]["import"]["ok"] is True


def test_quick_start_exit_1_says_slow_path_found(tmp_path: Path) -> None:
    """README's quick start on a healthy-but-slow machine: exit 1, and the last line says why."""
    target = fake_target(tmp_path, "t", stdout=framed(seed_facts()))
    proc = fastpath("doctor", "--on", " ".join(target), "--model", "qwen3.5-27b",
                    extra_env={"COLUMNS": "80"})
    out = proc.stdout.decode()
    assert proc.returncode == 1
    assert last_paragraph(out) == ("exit status 1: slow path found (the fixes are above); the "
                                   "doctor itself ran fine"), out[-600:]
    fast = copy.deepcopy(seed_facts())
    fast["packages"]["causal-conv1d"] = {"version": "1.6.1", "so_files": [], "import": {
        "ok": True, "error_kind": None, "error": None}}
    target = fake_target(tmp_path, "fast", stdout=framed(fast))
    proc = fastpath("doctor", "--on", " ".join(target), "--model", "qwen3.5-27b")
    assert proc.returncode == 0
    assert last_paragraph(proc.stdout.decode()) == "exit status 0: fast path, nothing to fix"
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert 'exit status 1 = "slow path found"' in readme

