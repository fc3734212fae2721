"""`fastpath doctor --gpu SPEC`: this environment judged for a GPU that is not here, and the
no-GPU report (package-level blockers, what each op needs). Real CLI + real static probe over a
fake site-packages and an empty system root (no nvcc, no GPU), as a CPU image builder sees it."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys

import pytest
from fakeenv import seed_facts, write_story_site

from fastpath.doctor.diagnosis import diagnose
from fastpath.doctor.gpu_models import GPU_MODELS, parse_gpu_spec
from fastpath.shared.errors import UsageError


def _cpu_builder(tmp_path):
    site = write_story_site(tmp_path / "site")
    root, bindir = tmp_path / "root", tmp_path / "bin"
    root.mkdir()
    bindir.mkdir()
    return dict(os.environ, PATH=os.pathsep.join([str(bindir), "/usr/bin", "/bin"]),
                FASTPATH_PROBE_ROOT=str(root), FASTPATH_PROBE_SITE_PACKAGES=str(site),
                FASTPATH_PROBE_SKIP="imports,rpm", CUDA_HOME="", CUDA_PATH="")


def _doctor(env, *args):
    return subprocess.run([sys.executable, "-m", "fastpath", "doctor", *args],
                          capture_output=True, text=True, env=env, timeout=120)


def test_story_on_a_cpu_machine_with_gpu_sm_120(tmp_path):
    env = _cpu_builder(tmp_path)
    r = _doctor(env, "--json", "--gpu", "sm_120", "--model", "qwen3.5-27b")
    report = json.loads(r.stdout)
    assert r.returncode == 1 and report["verdict"] == "slow", report["headline"]
    assert report["facts"]["gpus"] == []  # nothing was detected: the GPU is assumed
    assert report["assumed_gpu"]["sm"] == "sm_120"
    assert "assumed sm_120 GPU (not detected here)" in report["headline"]
    plan = report["model"]
    assert (plan["layers_slow"], plan["layers_total"]) == (48, 64)
    assert plan["layers_slow_with_fastpath"] == 0
    (missing,) = [f for f in report["findings"] if f["id"] == "causal-conv1d-missing"]
    first, second = missing["remedies"][:2]
    assert "fastpath.enable()" in first and "sm_120" in first  # 1: the compiler-free route
    assert "cuda-nvcc-13-0" in second and "CUDA_HOME=/usr/local/cuda-13.0" in second  # 2: torch's major
    every = " ".join(r for f in report["findings"] for r in f["remedies"])
    assert "nvidia-cuda-nvcc" not in every and "cu12" not in every
    assert report["top_remedy"] == first


def test_same_environment_without_gpu_reports_blockers_and_needs(tmp_path):
    env = _cpu_builder(tmp_path)
    r = _doctor(env, "--json", "--model", "qwen3.5-27b")
    report = json.loads(r.stdout)
    assert report["verdict"] == "blocked" and r.returncode == 1
    assert report["headline"].startswith("BLOCKED: on any GPU") and "--gpu" in report["headline"]
    assert any(f["id"] == "causal-conv1d-missing" and f["severity"] == "error"
               for f in report["findings"])
    needs = {r["op"]: r["with_fastpath_needs"] for t in report["model"]["layer_types"]
             for r in t["ops"]}
    assert needs["causal_conv1d_fn"] == "needs a GPU"
    assert needs["chunk_gated_delta_rule"] is None  # fla-core is installed


def test_dockerfile_line_prints_a_report_and_fails_the_build(tmp_path):
    env = _cpu_builder(tmp_path)
    r = _doctor(env, "--gpu", "RTX PRO 6000", "--model", "qwen3.5-27b")
    assert r.returncode == 1
    assert r.stdout.startswith("SLOW: on the assumed RTX PRO 6000 (sm_120) GPU")


def _no_gpu_seed(archs):
    facts = seed_facts()
    facts["gpus"] = []
    facts["torch"].update(cuda_available=False, device_arch_covered=None, arch_list=archs)
    facts["triton"]["gpu_backend"] = False
    return facts


@pytest.mark.parametrize("spec,cc", [("sm_80", "8.0"), ("sm_90", "9.0"), ("sm_100", "10.0"),
                                     ("sm_120", "12.0")])
@pytest.mark.parametrize("covered", [True, False])
def test_assumed_gpu_against_torch_builds_with_and_without_its_arch(spec, cc, covered):
    sm = "sm_" + cc.replace(".", "")
    archs = [a for a in ["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"]
             if covered or a != sm]
    d = diagnose(_no_gpu_seed(archs), "qwen3.5-27b", parse_gpu_spec(spec))
    ids = [f.id for f in d.findings]
    assert d.verdict == "slow" and d.exit_code == 1 and "no-gpu" not in ids
    assert ("torch-arch-not-covered" in ids) is (not covered)
    assert ("fla-hopper-backward" in ids) is (cc == "9.0")  # Triton 3.6.0, no tilelang: FLA #640
    conv = [r for t in d.model_plan["layer_types"] for r in t["ops"] if r["op"] == "causal_conv1d_fn"]
    if covered:
        assert conv[0]["with_fastpath"] == "fastpath-triton"
    else:
        assert conv[0]["with_fastpath_needs"] == f"needs a torch build for {sm}"


def test_assumed_gpu_never_overrides_the_facts_shown():
    facts = _no_gpu_seed(["sm_90"])
    before = copy.deepcopy(facts)
    d = diagnose(facts, None, parse_gpu_spec("H100"))
    assert facts == before and d.to_json()["facts"]["gpus"] == []
    assert d.to_json()["assumed_gpu"]["name"] == "H100"


@pytest.mark.parametrize("spec,cc,sm", [
    ("sm_120", (12, 0), "sm_120"), ("12.0", (12, 0), "sm_120"), ("sm_90a", (9, 0), "sm_90a"),
    ("120", (12, 0), "sm_120"), ("H200", (9, 0), "sm_90"), ("nvidia h100", (9, 0), "sm_90"),
    ("A100", (8, 0), "sm_80"), ("L40S", (8, 9), "sm_89"), ("RTX PRO 6000", (12, 0), "sm_120"),
    ("rtx-pro-6000", (12, 0), "sm_120"), ("B200", (10, 0), "sm_100"), ("GB200", (10, 0), "sm_100"),
    ("RTX 5090", (12, 0), "sm_120"), ("GeForce RTX 5090", (12, 0), "sm_120"),
])
def test_gpu_spec_parsing(spec, cc, sm):
    a = parse_gpu_spec(spec)
    assert a.capability == cc and a.sm == sm


@pytest.mark.parametrize("spec", ["", "sm_", "H9000", "99.0", "sm_1x", "cpu"])
def test_bad_gpu_spec_is_a_usage_error(spec):
    with pytest.raises(UsageError, match="--gpu"):
        parse_gpu_spec(spec)


def test_every_product_row_has_a_source_url():
    for names, (major, minor), source in GPU_MODELS:
        assert names and source.startswith("https://") and 7 <= major <= 12 and minor <= 9


def test_no_gpu_extension_built_for_no_gpu_torch_supports():
    facts = _no_gpu_seed(["sm_80", "sm_90", "sm_100", "sm_120"])
    facts["packages"]["causal-conv1d"] = {
        "version": "1.6.1", "import": {"ok": True, "error_kind": None, "error": None},
        "so_files": [{"path": "/site/causal_conv1d_cuda.so", "sass": ["sm_70"], "ptx": []}]}
    d = diagnose(facts, "qwen3.5-27b")
    (f,) = [f for f in d.findings if f.id == "extension-missing-arch"]
    assert d.verdict == "blocked" and d.exit_code == 1
    assert "runs on none of the GPUs torch 2.11.0+cu128 is built for" in f.detail
    facts["packages"]["causal-conv1d"]["so_files"][0]["sass"] = ["sm_70", "sm_90"]
    assert "extension-missing-arch" not in [f.id for f in diagnose(facts, "qwen3.5-27b").findings]


def test_after_enable_says_what_each_op_needs_without_a_gpu(tmp_path):
    facts = _no_gpu_seed(["sm_90"])
    facts["packages"]["fla-core"] = {"version": None, "so_files": [], "import": {
        "ok": False, "error_kind": "not-installed", "error": "No module named 'fla'"}}
    d = diagnose(facts, "qwen3.5-27b")
    needs = {r["op"]: r["with_fastpath_needs"] for t in d.model_plan["layer_types"] for r in t["ops"]}
    assert needs["chunk_gated_delta_rule"] == "needs fla-core: pip install fla-core"
    assert needs["causal_conv1d_fn"] == "needs a GPU"
    assert {"fla-missing", "causal-conv1d-missing"} <= {f.id for f in d.findings}
    # Mamba-2: enable() routes the SSD ops too (routing/ssd_route.py), so on the assumed GPU
    # every op is fastpath's, and without one each op names the GPU as what it needs
    mamba = diagnose(_no_gpu_seed(["sm_90"]), "mamba2", parse_gpu_spec("sm_90"))
    rows = [r for t in mamba.model_plan["layer_types"] for r in t["ops"]]
    assert {r["op"] for r in rows} >= {"mamba_chunk_scan_combined", "causal_conv1d_fn"}
    assert all(r["with_fastpath"] == "fastpath-triton" and r["with_fastpath_needs"] is None
               for r in rows), rows
    assert mamba.model_plan["layers_slow_with_fastpath"] == 0
    here = diagnose(_no_gpu_seed(["sm_90"]), "mamba2")
    ssm = next(r for t in here.model_plan["layer_types"] for r in t["ops"]
               if r["op"] == "mamba_chunk_scan_combined")
    assert ssm["with_fastpath_needs"] == "needs a GPU"
    # Mamba-1: enable() routes selective_scan_fn, mamba_inner_fn and the state update as well
    # (routing/selective_scan_route.py): fastpath's on the assumed GPU, each op needing the GPU here
    cfg = tmp_path / "config.json"
    cfg.write_text('{"model_type": "mamba", "num_hidden_layers": 4}')
    mamba1 = diagnose(_no_gpu_seed(["sm_90"]), str(cfg), parse_gpu_spec("sm_90"))
    rows = [r for t in mamba1.model_plan["layer_types"] for r in t["ops"]]
    assert {r["op"] for r in rows} >= {"selective_scan_fn", "mamba_inner_fn", "selective_state_update"}
    assert all(r["with_fastpath"] == "fastpath-triton" and r["with_fastpath_needs"] is None
               for r in rows), rows
    here = diagnose(_no_gpu_seed(["sm_90"]), str(cfg))
    scan = next(r for t in here.model_plan["layer_types"] for r in t["ops"] if r["op"] == "selective_scan_fn")
    assert scan["with_fastpath_needs"] == "needs a GPU"
