"""Rules + doctor verdicts on facts dicts (fake environment data for the rules)."""

from __future__ import annotations

import copy

import pytest
from fakeenv import seed_facts

from fastpath.doctor import rules
from fastpath.doctor.diagnosis import diagnose
from fastpath.doctor.rules import RULES, causal_conv1d_wheel, evaluate


def _ids(findings):
    return [f.id for f in findings]


def _by_id(diag, rule_id):
    (f,) = [f for f in diag.findings if f.id == rule_id]
    return f


def _nvcc(path, version, major):
    return {"path": path, "realpath": path, "paths": [path], "version": version, "major": major,
            "minor": int(version.split(".")[1]), "found_by": ["PATH"], "kind": "nvcc",
            "major_matches_torch": None, "source": "fake"}


def test_seed_story_verdict_plan_and_remedy_order():
    d = diagnose(seed_facts(), "qwen3.5-27b")
    assert d.verdict == "slow" and d.exit_code == 1
    plan = d.model_plan
    assert (plan["layers_slow"], plan["layers_total"]) == (48, 64)
    assert "48 of 64 layers take the torch fallback for causal_conv1d_fn" in plan["summary"][0]
    assert plan["layers_slow_with_fastpath"] == 0  # fla is there; fastpath supplies the conv
    assert d.headline.startswith("SLOW: 48 of 64 layers of qwen3.5-27b")

    missing = _by_id(d, "causal-conv1d-missing")
    assert missing.severity == "error"
    first, second = missing.remedies[:2]
    assert "pip install fastpath-kit" in first and "fastpath.enable()" in first
    assert "fastpath run --" in first
    for pkg in ("cuda-nvcc-12-8", "cuda-cudart-dev-12-8", "libcusparse-dev-12-8",
                "libcublas-dev-12-8"):
        assert pkg in second
    assert d.top_remedy == first
    assert "no-usable-nvcc" in _ids(d.findings)
    # never the ptxas-only pip wheel, never a CUDA 13 compiler, in any remedy
    every_remedy = " ".join(r for f in d.findings for r in f.remedies)
    assert "nvidia-cuda-nvcc" not in every_remedy
    assert "cu13" not in every_remedy and "13-0" not in every_remedy and "13.0" not in every_remedy

    wheel = _by_id(d, "causal-conv1d-prebuilt-wheel")
    assert "causal_conv1d-1.6.1.post4+cu12torch2.11cxx11abiTRUE-cp312-cp312-linux_x86_64.whl" in (
        wheel.detail)
    assert "NOT covered" in wheel.detail and "torch 2.11" in wheel.detail


def test_wheel_inside_the_release_matrix_is_offered_first_after_fastpath():
    facts = seed_facts()
    facts["torch"]["version"] = "2.10.0+cu128"
    w = causal_conv1d_wheel(rules.Context(facts))
    assert w["covered"] and w["name"].startswith("causal_conv1d-1.6.1.post4+cu12torch2.10cxx11abiTRUE")
    d = diagnose(facts, "qwen3.5-27b")
    remedies = _by_id(d, "causal-conv1d-missing").remedies
    assert "fastpath-kit" in remedies[0]
    assert "releases/download" in remedies[1] and "%2Bcu12torch2.10" in remedies[1]
    assert "cuda-nvcc-12-8" in remedies[2]


def test_fastpath_not_first_without_triton_backend():
    facts = seed_facts()
    facts["triton"]["gpu_backend"] = False
    d = diagnose(facts, "qwen3.5-27b")
    assert "fastpath" not in _by_id(d, "causal-conv1d-missing").remedies[0]


def test_family_without_causal_conv1d_gets_no_fastpath_route():
    facts = seed_facts()
    d = diagnose(facts, {"model_type": "llama", "num_hidden_layers": 32})
    assert d.verdict == "fast" and d.exit_code == 0
    assert "causal-conv1d-missing" not in _ids(d.findings)
    assert all("fastpath-kit" not in r for f in d.findings for r in f.remedies)


def test_all_good_is_fast():
    facts = seed_facts()
    facts["packages"]["causal-conv1d"] = {
        "version": "1.6.1", "import": {"ok": True, "error_kind": None, "error": None},
        "so_files": [{"path": "/x/causal_conv1d_cuda.so", "sass": ["sm_90", "sm_120"],
                      "ptx": []}], "source": "fake"}
    facts["nvcc_candidates"] = [_nvcc("/usr/local/cuda-12.8/bin/nvcc", "12.8.93", 12)]
    facts["cuda_home"].update(torch_would_use="/usr/local/cuda-12.8", has_nvcc=True,
                              headers={"cuda_runtime.h": True, "cusparse.h": True},
                              nvcc_version="12.8.93", how="PATH")
    d = diagnose(facts, "qwen3.5-27b")
    assert d.verdict == "fast" and d.exit_code == 0, _ids(d.findings)
    assert d.model_plan["layers_slow"] == 0
    assert d.headline.startswith("FAST")


def test_no_gpu_still_reports_package_blockers_and_suggests_gpu():
    facts = seed_facts()
    facts["gpus"] = []
    facts["torch"]["cuda_available"] = False
    d = diagnose(facts, "qwen3.5-27b")
    assert d.verdict == "blocked" and d.exit_code == 1  # causal-conv1d is missing on any GPU
    assert "no-gpu" in _ids(d.findings)
    assert _by_id(d, "causal-conv1d-missing").severity == "error"
    assert d.headline.startswith("BLOCKED: on any GPU") and "--gpu" in d.headline
    conv = [r for t in d.model_plan["layer_types"] for r in t["ops"] if r["op"] == "causal_conv1d_fn"]
    assert conv and all(r["with_fastpath_needs"] == "needs a GPU" for r in conv)


def test_no_gpu_and_nothing_missing_is_unknown_exit_3():
    facts = seed_facts()
    facts["gpus"] = []
    facts["torch"]["cuda_available"] = False
    facts["packages"]["causal-conv1d"] = {"version": "1.6.1", "import": {"ok": True}, "so_files": []}
    d = diagnose(facts, "qwen3.5-27b")
    assert d.verdict == "unknown" and d.exit_code == 3, _ids(d.findings)
    assert d.headline.startswith("UNKNOWN") and "--gpu" in d.headline and "exit status 3" in d.headline


def test_nvcc_major_mismatch_and_ptxas_wheel():
    facts = seed_facts()
    facts["nvcc_candidates"] = [
        _nvcc("/usr/local/cuda-13.0/bin/nvcc", "13.0.88", 13),
        {"path": "/sp/nvidia/cuda_nvcc/bin/ptxas", "realpath": "/sp/nvidia/cuda_nvcc/bin/ptxas",
         "paths": [], "version": "12.8.93", "major": None, "found_by": ["pip"],
         "kind": "ptxas-only-wheel", "major_matches_torch": None, "source": "fake"},
    ]
    d = diagnose(facts, "qwen3.5-27b")
    ids = _ids(d.findings)
    assert "nvcc-major-mismatch" in ids and "no-usable-nvcc" not in ids
    mm = _by_id(d, "nvcc-major-mismatch")
    assert "13.0.88" in mm.detail
    assert "fastpath-kit" in mm.remedies[0] and "cuda-nvcc-12-8" in mm.remedies[1]
    ptx = _by_id(d, "cu12-nvcc-wheel-ptxas-only")
    assert "ships only ptxas" in ptx.detail


def test_stale_cuda_home_and_divergence():
    facts = seed_facts()
    facts["nvcc_candidates"] = [_nvcc("/usr/local/cuda-12.8/bin/nvcc", "12.8.93", 12)]
    facts["cuda_home"].update(torch_would_use="/opt/old-cuda", has_nvcc=False,
                              how="CUDA_HOME env", include_dir="/opt/old-cuda/include",
                              cuda_home_env="/opt/old-cuda", cuda_path_env="/usr/local/cuda-12.8",
                              diverge=True)
    d = diagnose(facts)
    stale = _by_id(d, "cuda-home-stale")
    assert "/opt/old-cuda/bin/nvcc does not exist" in stale.detail
    assert "cusparse.h" in stale.detail
    assert "cuda-home-path-diverge" in _ids(d.findings)


def test_extension_missing_arch_and_abi_mismatch():
    facts = seed_facts()
    facts["packages"]["causal-conv1d"] = {
        "version": "1.6.1", "import": {"ok": True, "error_kind": None, "error": None},
        "so_files": [{"path": "/x/causal_conv1d_cuda.so", "sass": ["sm_80", "sm_90"],
                      "ptx": []}], "source": "fake"}
    facts["packages"]["mamba-ssm"] = {
        "version": "2.2.4", "import": {"ok": False, "error_kind": "abi-mismatch",
                                       "error": "ImportError: undefined symbol: _ZN3c107Warning"},
        "so_files": [], "source": "fake"}
    d = diagnose(facts, "qwen3.5-27b")
    arch = _by_id(d, "extension-missing-arch")
    assert "sm_80 sm_90" in arch.detail and "12.0" in arch.detail
    assert "TORCH_CUDA_ARCH_LIST=\"12.0+PTX\"" in arch.remedies[-1]
    abi = _by_id(d, "extension-abi-mismatch")
    assert "mamba-ssm" in abi.detail and abi.severity == "error"
    assert d.verdict == "slow"


def test_fla_hopper_backward_window():
    facts = seed_facts()
    for g in facts["gpus"]:
        g["compute_capability"] = "9.0"
    d = diagnose(facts)
    f = _by_id(d, "fla-hopper-backward")
    # fastpath's own route (only the refused op changes implementation) first, then the upgrade
    assert "fastpath.enable()" in f.remedies[0] and "chunk_bwd_dqkwg" in f.remedies[0]
    assert "triton>=3.7.1" in f.remedies[1] and "tilelang" in f.remedies[1]
    assert "fla 0." in f.detail or "fla ?" in f.detail
    assert f.source.endswith("/issues/640")
    facts2 = copy.deepcopy(facts)
    facts2["triton"]["version"] = "3.7.1"
    assert "fla-hopper-backward" not in _ids(evaluate(facts2))
    facts3 = copy.deepcopy(facts)
    facts3["packages"]["tilelang"]["import"] = {"ok": True, "error_kind": None, "error": None}
    assert "fla-hopper-backward" not in _ids(evaluate(facts3))


def test_dao_sm103_built_by_nvcc13():
    facts = seed_facts()
    for g in facts["gpus"]:
        g["compute_capability"] = "10.3"
    facts["packages"]["causal-conv1d"] = {
        "version": "1.6.0", "import": {"ok": True, "error_kind": None, "error": None},
        "so_files": [{"path": "/x/cc.so", "sass": ["sm_100", "sm_103"], "ptx": []}],
        "source": "fake"}
    f = _by_id(diagnose(facts), "dao-sm103-nvcc13")
    assert f.source.endswith("/issues/105") and "fastpath-kit" in f.remedies[0]


@pytest.mark.parametrize("version, fires", [("5.15.0", True), ("5.16.2", True), ("5.17.0", False)])
def test_transformers_silent_fallback(version, fires):
    facts = seed_facts()
    facts["packages"]["transformers"]["version"] = version
    assert ("transformers-silent-fallback" in _ids(diagnose(facts, "qwen3.5-27b").findings)) is fires


def test_transformers_525_hub_kernels_default_and_plan():
    facts = seed_facts()
    facts["packages"]["transformers"]["version"] = "5.25.0"
    facts["packages"]["kernels"] = {"version": "0.19.1", "import": {"ok": True, "error_kind": None,
                                                                    "error": None},
                                    "so_files": [], "source": "fake"}
    d = diagnose(facts, "qwen3.5-27b")
    assert "USE_HUB_KERNELS=0" in _by_id(d, "transformers-hub-kernels-default").remedies[0]
    impls = {r["op"]: r["impl"] for t in d.model_plan["layer_types"] for r in t["ops"]}
    assert impls["causal_conv1d_fn"] == "hub-kernel"
    facts["env"]["USE_HUB_KERNELS"] = "0"
    d = diagnose(facts, "qwen3.5-27b")
    assert "transformers-hub-kernels-default" not in _ids(d.findings)
    impls = {r["op"]: r["impl"] for t in d.model_plan["layer_types"] for r in t["ops"]}
    assert impls["causal_conv1d_fn"] == "torch-fallback"


def test_mamba_family_needs_mamba_ssm_too():
    d = diagnose(seed_facts(), "mamba2")
    f = _by_id(d, "mamba-needs-mamba-ssm")
    assert "all 64 of 64 layers" in f.detail
    # fastpath.enable() routes the Mamba-2 SSD ops as well as the conv (routing/ssd_route.py):
    # the finding says so and offers that route first, as the plan's after-enable column does
    assert d.model_plan["layers_slow_with_fastpath"] == 0
    assert "fastpath.enable() routes all of this family's ops" in f.detail
    assert "no mamba_ssm" in f.remedies[0] and "`fastpath.enable()`" in f.remedies[0]
    assert "pip install mamba-ssm" in f.remedies[1]


def test_mamba1_family_needs_mamba_ssm_and_fastpath_routes_it(tmp_path):
    # enable() routes the Mamba-1 ops too (routing/selective_scan_route.py): offered first, as for Mamba-2
    cfg = tmp_path / "config.json"
    cfg.write_text('{"model_type": "mamba", "num_hidden_layers": 4}')
    d = diagnose(seed_facts(), str(cfg))
    f = _by_id(d, "mamba-needs-mamba-ssm")
    assert "fastpath.enable() routes all of this family's ops" in f.detail
    assert "no mamba_ssm" in f.remedies[0] and "`fastpath.enable()`" in f.remedies[0]
    assert d.model_plan["layers_slow_with_fastpath"] == 0


def test_mamba_kernels_hub_only_in_514():
    facts = seed_facts()
    facts["packages"]["transformers"]["version"] = "5.12.1"
    facts["packages"]["kernels"]["import"] = {"ok": True, "error_kind": None, "error": None}
    d = diagnose(facts, "mamba2")
    assert "mamba-kernels-hub-only" in _ids(d.findings)


def test_every_rule_is_data_with_source_and_remedy():
    ids = [r.id for r in RULES]
    assert len(ids) == len(set(ids))
    for rule in RULES:
        assert rule.source.startswith("https://"), rule.id
        assert rule.remedies, rule.id
        assert rule.severity in ("error", "warning", "info"), rule.id


def test_json_shape():
    j = diagnose(seed_facts(), "qwen3.5-27b").to_json()
    assert j["schema_version"] == 1 and j["verdict"] == "slow"
    assert set(j["findings"][0]) >= {"id", "severity", "title", "detail", "remedy", "source"}
    assert j["model"]["layers_total"] == 64 and j["model"]["layers_slow"] == 48
    assert "nvcc_candidates" in j["facts"] and "gpus" in j["facts"] and "packages" in j["facts"]


def test_torch_cannot_see_the_gpu_old_driver():
    facts = seed_facts()
    facts["torch"]["cuda_available"] = False
    facts["driver"]["cuda_version"] = "12.4"
    facts["env"]["CUDA_VISIBLE_DEVICES"] = ""
    f = _by_id(diagnose(facts), "torch-no-cuda-device")
    assert "12.4 < torch's CUDA 12.8" in f.detail and "CUDA_VISIBLE_DEVICES=''" in f.detail


def test_no_facts_cannot_be_diagnosed_exit_3():
    from fastpath.shared.errors import TargetError

    with pytest.raises(TargetError) as info:
        diagnose({}, "qwen3.5-27b")
    assert info.value.exit_code == 3


def test_partial_facts_from_the_sh_probe_do_not_crash():
    facts = {"schema": "fastpath.facts/1", "probe": {"kind": "sh", "errors": {}},
             "gpus": [{"index": 0, "name": "H200", "compute_capability": "9.0"}],
             "nvcc_candidates": [{"path": "/usr/bin/nvcc", "version": "12.0.140", "major": 12,
                                  "kind": "nvcc", "found_by": ["PATH"]}]}
    d = diagnose(facts, "qwen3.5-27b")
    assert d.verdict in ("slow", "blocked", "unknown")
    assert d.model_plan["transformers"] is None and d.model_plan["by_version"]
    assert d.to_json()["schema_version"] == 1


@pytest.mark.parametrize("model", ["qwen3.5-27b", "mamba2", "lfm2", None])
def test_no_gpu_blocks_only_on_package_level_findings(model):
    """Without a GPU, what blocks is what would block on every GPU: here causal-conv1d (and
    mamba-ssm for mamba2) are missing, so the verdict is "blocked" (exit 1)."""
    facts = seed_facts()
    facts["gpus"] = []
    facts["torch"].update(cuda_available=False)
    d = diagnose(facts, model)
    assert d.verdict == "blocked" and d.exit_code == 1
    blocking = {f.id for f in d.findings if f.severity == "error"}
    assert blocking <= {"causal-conv1d-missing", "mamba-needs-mamba-ssm"}, blocking


def test_host_gcc_too_new_for_cuda_128():
    facts = seed_facts()
    facts["gcc"]["version"] = "14.2.0"
    f = _by_id(diagnose(facts, "qwen3.5-27b"), "host-gcc-unsupported")
    assert "6-13" in f.detail and "fastpath-kit" in f.remedies[0]
    facts["gcc"]["version"] = "13.3.0"
    assert "host-gcc-unsupported" not in _ids(diagnose(facts, "qwen3.5-27b").findings)
