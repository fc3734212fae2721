"""The doctor's one verdict: headline, `--json` verdict and exit code agree for every fake
environment; FAST only when every op is fast as loaded AND after fastpath.enable(); Hub kernels
count as fast only when cached; no GPU here gives "blocked" (1) or "unknown" (3), never a silent 1;
the seed's case and an air-gapped Hopper node on transformers 5.25; a Mamba-1 scan that raises.

Fake environments are facts dicts (fakeenv.seed_facts) and, for the probe and the CLI, real
directories: a fake site-packages and a fake Hub cache laid out as `kernels` 0.19.1 writes it."""

from __future__ import annotations

import copy
import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from fakeenv import seed_facts, write_dist_info, write_fake_cuda_torch

from fastpath.doctor.diagnosis import VERDICT_EXIT, diagnose
from fastpath.doctor.gpu_models import parse_gpu_spec
from fastpath.doctor.hub_kernels import parse_variant, variant_rejected
from fastpath.doctor.probe import collect
from fastpath.doctor.report import EXIT_MEANING, render_text

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def _ok(facts: dict, dist: str, version: str) -> dict:
    facts["packages"][dist] = {"version": version, "so_files": [], "source": "fake",
                               "import": {"ok": True, "error_kind": None, "error": None}}
    return facts


def _missing(facts: dict, dist: str) -> dict:
    facts["packages"][dist] = {"version": None, "so_files": [], "source": "fake",
                               "import": {"ok": False, "error_kind": "not-installed",
                                          "error": "No module named ..."}}
    return facts


def hub_cache_facts(variant: str, repos=("kernels-community/fla", "kernels-community/mamba-ssm"),
                    cache_dir: str = "/home/u/.cache/huggingface/hub") -> dict:
    """The probe's `hub_kernels` fact for a cache holding `variant` of each repo at its version."""
    versions = {"kernels-community/fla": "v3", "kernels-community/mamba-ssm": "v5"}
    return {"cache_dir": cache_dir, "how": "HF_HUB_CACHE", "source": "fake", "repos": {
        r: {"path": f"{cache_dir}/kernels--{r.replace('/', '--')}",
            "refs": {versions[r]: COMMIT},
            "snapshots": {COMMIT: {variant: {"metadata": True, "backend": {"type": "cuda"}}}}}
        for r in repos}}


def env_525(*, kernels=True, fla=True, conv=False, offline=False, cached=None, hub_env=None,
            torch="2.11.0+cu128", cuda="12.8", gpu=True) -> dict:
    """seed_facts on transformers 5.25: `kernels` and fla-core installed or not, causal-conv1d,
    HF_HUB_OFFLINE, a Hub cache holding build `cached`, USE_HUB_KERNELS, a GPU here or not."""
    f = seed_facts()
    f["packages"]["transformers"]["version"] = "5.25.0"
    f["torch"].update(version=torch, cuda=cuda)
    if kernels:
        _ok(f, "kernels", "0.19.1")
    if not fla:
        _missing(f, "fla-core")
    if conv:
        _ok(f, "causal-conv1d", "1.6.1")
    if offline:
        f["env"]["HF_HUB_OFFLINE"] = "1"
    if hub_env is not None:
        f["env"]["USE_HUB_KERNELS"] = hub_env
    f["hub_kernels"] = hub_cache_facts(cached) if cached else hub_cache_facts("x", repos=())
    if not gpu:
        f["gpus"] = []
        f["torch"].update(cuda_available=False, device_arch_covered=None)
    return f


def assert_consistent(d) -> None:
    """Headline, JSON verdict, exit code and the report's last line say the same thing."""
    j = d.to_json()
    assert j["verdict"] == d.verdict and j["exit_code"] == d.exit_code and j["headline"] == d.headline
    assert VERDICT_EXIT[d.verdict] == d.exit_code, (d.verdict, d.exit_code)
    assert d.headline.startswith(d.verdict.upper() + ":"), d.headline
    text = render_text(d, 200)
    assert text.startswith(d.verdict.upper() + ":")
    assert f"exit status {d.exit_code}: {EXIT_MEANING[d.verdict]}" in " ".join(text.split())
    if d.verdict == "fast":  # FAST: every op fast, as loaded and after enable(), nothing blocks
        assert not [f for f in d.findings if f.severity == "error"]
        for t in (d.model_plan or {}).get("layer_types") or []:
            for r in t["ops"]:
                assert r["fast"] and r["with_fastpath_fast"], r


SWEEP = list(itertools.product(
    (True, False),                          # kernels
    (True, False),                          # fla-core
    (True, False),                          # causal-conv1d
    (False, True),                          # HF_HUB_OFFLINE
    (None, "torch211-cxx11-cu128-x86_64-linux"),  # Hub cache: empty / a matching build
    (None, "0", "1"),                       # USE_HUB_KERNELS
    ("here", "assumed", "none"),            # GPU
    ("qwen3.5-27b", "mamba2", "falcon-mamba-7b", None),
))


@pytest.mark.parametrize("kernels, fla, conv, offline, cached, hub_env, gpu, model", SWEEP)
def test_verdict_headline_json_and_exit_code_agree(kernels, fla, conv, offline, cached, hub_env,
                                                   gpu, model):
    f = env_525(kernels=kernels, fla=fla, conv=conv, offline=offline, cached=cached,
                hub_env=hub_env, gpu=gpu == "here")
    d = diagnose(f, model, parse_gpu_spec("H200") if gpu == "assumed" else None)
    assert_consistent(d)
    assert (d.verdict in ("blocked", "unknown")) is (gpu == "none")


def test_without_fla_core_the_plan_needs_it_so_not_fast():
    """The issue's first case: 5.25 + kernels, no fla-core, --gpu H200: the plan says the delta
    rule needs fla-core after enable(), so the verdict cannot be FAST."""
    d = diagnose(env_525(fla=False, gpu=False), "qwen3.5-27b", parse_gpu_spec("H200"))
    assert d.verdict == "slow" and d.exit_code == 1
    assert "needs fla-core: pip install fla-core" in d.headline
    assert "fla-missing" in {f.id for f in d.findings if f.severity == "error"}
    # even with both Hub builds cached (fast as loaded), enable() would make it slow
    cached = env_525(fla=False, gpu=False, cached="torch211-cxx11-cu128-x86_64-linux")
    d = diagnose(cached, "qwen3.5-27b", parse_gpu_spec("H200"))
    assert d.verdict == "slow" and d.headline.startswith(
        "SLOW: on the assumed H200 (sm_90) GPU (not detected here), with fastpath.enable(), 48 of "
        "64 layers")
    assert "loaded without it they are fast" in d.headline


def test_hub_kernel_counts_as_fast_only_when_cached():
    variant = "torch211-cxx11-cu128-x86_64-linux"
    d = diagnose(env_525(conv=True), "qwen3.5-27b")
    assert d.verdict == "slow" and "load Hub kernels that are not in the local cache" in d.headline
    assert "downloaded at from_pretrained" in d.headline
    rows = {r["op"]: r for t in d.model_plan["layer_types"] for r in t["ops"]}
    assert rows["chunk_gated_delta_rule"]["reason"] == (
        "hub kernel kernels-community/fla (downloads at from_pretrained; offline: from_pretrained "
        "raises ValueError)")
    d = diagnose(env_525(conv=True, cached=variant), "qwen3.5-27b")
    assert d.verdict == "fast" and d.exit_code == 0, d.headline
    rows = {r["op"]: r for t in d.model_plan["layer_types"] for r in t["ops"]}
    assert rows["chunk_gated_delta_rule"]["reason"] == (
        "hub kernel cached at /home/u/.cache/huggingface/hub/kernels--kernels-community--fla/"
        f"snapshots/{COMMIT}/build/{variant}")
    assert "hub-kernel-cached" in {f.id for f in d.findings}
    # a cached build for another torch does not count
    d = diagnose(env_525(conv=True, cached="torch210-cxx11-cu128-x86_64-linux"), "qwen3.5-27b")
    assert d.verdict == "slow"
    hub = {f.id: f for f in d.findings}["transformers-hub-kernels-default"]
    assert "torch 2.10, not 2.11" in hub.detail


def test_seed_case_on_transformers_525():
    """No nvcc, torch 2.11+cu128, sm_120: with and without `kernels`, with and without fla-core."""
    gpu = parse_gpu_spec("sm_120")
    cases = {
        (True, True): ("load Hub kernels that are not in the local cache", "fastpath.enable() puts "
                       "all of them on fast kernels"),
        (True, False): ("load Hub kernels", "after fastpath.enable() 48 still slow (needs fla-core"),
        (False, True): ("take the torch fallback (causal_conv1d_fn, causal_conv1d_update)",
                        "fastpath.enable() puts all of them on fast kernels"),
        (False, False): ("take the torch fallback (causal_conv1d_fn, causal_conv1d_update, "
                         "chunk_gated_delta_rule", "after fastpath.enable() 48 still slow"),
    }
    for (kernels, fla), (what, then) in cases.items():
        d = diagnose(env_525(kernels=kernels, fla=fla, gpu=False), "qwen3.5-27b", gpu)
        assert d.verdict == "slow" and d.exit_code == 1, d.headline
        assert d.headline.startswith("SLOW: on the assumed sm_120 GPU (not detected here), 48 of 64")
        assert what in d.headline and then in d.headline, d.headline
        assert "fastpath.enable()" in d.top_remedy or "pip install fla-core" in d.top_remedy
        every = " ".join(r for f in d.findings if f.severity == "error" for r in f.remedies)
        assert "fastpath.enable()" in every and (fla or "pip install fla-core" in every)
        assert "no-usable-nvcc" in {f.id for f in d.findings}
        plan = d.model_plan
        assert plan["layers_slow_with_fastpath"] == (0 if fla else 48)


def test_air_gapped_hopper_node_on_525():
    """HF_HUB_OFFLINE=1, --gpu H200, torch 2.14.1+cu130, Triton 3.8, 5.25 + kernels + fla-core."""
    def node(**kw):
        f = env_525(offline=True, torch="2.14.1+cu130", cuda="13.0", gpu=False, **kw)
        f["triton"]["version"] = "3.8.0"
        return f

    gpu = parse_gpu_spec("H200")
    d = diagnose(node(), "qwen3.5-27b", gpu)
    assert d.verdict == "slow" and d.exit_code == 1
    assert "HF_HUB_OFFLINE=1, so from_pretrained raises ValueError" in d.headline
    assert "fastpath.enable() puts all of them on fast kernels" in d.headline
    hub = {f.id: f for f in d.findings}["transformers-hub-kernels-default"]
    assert hub.severity == "error" and "routes around Hub kernels" in hub.remedies[0]
    assert "kernels.get_kernel('kernels-community/fla', version=3)" in hub.remedies[1]
    assert "USE_HUB_KERNELS=0" in hub.remedies[2]
    assert d.top_remedy == hub.remedies[0]
    assert "fla-hopper-backward" not in {f.id for f in d.findings}  # Triton 3.8 >= 3.7.1
    # the builds pre-downloaded for this torch / CUDA: FAST offline
    d = diagnose(node(cached="torch214-cxx11-cu130-x86_64-linux", conv=True), "qwen3.5-27b", gpu)
    assert d.verdict == "fast", d.headline
    # USE_HUB_KERNELS=0 on the node: the installed packages, no Hub at all
    d = diagnose(node(hub_env="0", conv=True), "qwen3.5-27b", gpu)
    assert d.verdict == "fast" and "transformers-hub-kernels-default" not in {f.id for f in d.findings}
    # offline, cached version without a build for this torch: transformers' own path (torch
    # fallback for the missing conv), not a Hub kernel
    d = diagnose(node(cached="torch210-cxx11-cu128-x86_64-linux"), "qwen3.5-27b", gpu)
    rows = {r["op"]: r for t in d.model_plan["layer_types"] for r in t["ops"]}
    assert rows["causal_conv1d_fn"]["impl"] == "torch-fallback"
    assert rows["chunk_gated_delta_rule"]["impl"] == "fast-kernel"


def test_plain_doctor_and_doctor_model_agree_on_the_same_environment():
    """The issue's /tmp/ds case: no GPU, 5.25 + kernels + fla-core, no causal-conv1d. Both
    commands are "blocked" (exit 1) with a headline that says why; neither says nothing blocks."""
    f = env_525(gpu=False)
    plain, model = diagnose(copy.deepcopy(f), None), diagnose(copy.deepcopy(f), "qwen3.5-27b")
    for d in (plain, model):
        assert d.verdict == "blocked" and d.exit_code == 1, d.headline
        assert d.headline.startswith("BLOCKED: on any GPU (none here): ")
        assert_consistent(d)
    assert "Hub kernels" in plain.headline and "Hub kernels" in model.headline
    # nothing blocking and no GPU: unknown, exit 3, said in the headline
    f = env_525(gpu=False, kernels=False, conv=True)
    for m in (None, "qwen3.5-27b"):
        d = diagnose(copy.deepcopy(f), m)
        assert d.verdict == "unknown" and d.exit_code == 3 and "exit status 3" in d.headline


def test_mamba1_scan_that_raises_is_diagnosed_not_fast():
    """state-spaces/mamba#977: mamba_ssm imports without selective_scan_cuda."""
    f = seed_facts()
    _ok(f, "mamba-ssm", "2.3.3")
    _ok(f, "causal-conv1d", "1.6.1")
    f["packages"]["mamba-ssm"]["extension_modules"] = {"selective_scan_cuda": None}
    d = diagnose(f, "falcon-mamba-7b")
    rows = {r["op"]: r for t in d.model_plan["layer_types"] for r in t["ops"]}
    assert rows["selective_scan_fn"]["impl"] == "raises-when-called"
    assert rows["mamba_inner_fn"]["impl"] == "raises-when-called"
    assert rows["selective_scan_fn"]["with_fastpath"] == "fastpath-triton"
    finding = {f.id: f for f in d.findings}["mamba-ssm-cuda-scan-missing"]
    assert finding.severity == "error"
    assert finding.source == "https://github.com/state-spaces/mamba/pull/977"
    assert "fastpath.enable()" in finding.remedies[0]
    assert d.verdict == "slow" and "which raise when called" in d.headline
    assert "fastpath.enable() puts all of them on fast kernels" in d.headline
    # with the extension: fast, no finding
    f["packages"]["mamba-ssm"]["extension_modules"] = {"selective_scan_cuda": "/s/x.so"}
    d = diagnose(f, "falcon-mamba-7b")
    assert d.verdict == "fast" and "mamba-ssm-cuda-scan-missing" not in {x.id for x in d.findings}
    # a Mamba-2 model does not call the Mamba-1 scan
    f["packages"]["mamba-ssm"]["extension_modules"] = {"selective_scan_cuda": None}
    assert "mamba-ssm-cuda-scan-missing" not in {x.id for x in diagnose(f, "mamba2").findings}


def test_variant_names_as_kernels_matches_them():
    env = {"torch": parse_variant("torch211-cxx11-cu128-x86_64-linux").torch, "cxx11": True,
           "cuda": parse_variant("torch211-cxx11-cu128-x86_64-linux").backend_version,
           "python": parse_variant("torch211-cxx11-cu128-x86_64-linux").python,
           "platform": "x86_64-linux"}
    assert variant_rejected(parse_variant("torch211-cxx11-cu128-x86_64-linux"), env) is None
    assert variant_rejected(parse_variant("torch211-cxx11-cu126-x86_64-linux"), env) is None
    assert "CUDA 13.0" in variant_rejected(parse_variant("torch211-cxx11-cu130-x86_64-linux"), env)
    assert "C++11" in variant_rejected(parse_variant("torch211-cxx98-cu128-x86_64-linux"), env)
    assert variant_rejected(parse_variant("torch-2.11-cxx11-cuda-12.8-cpython-3.9-abi3-x86_64-linux"),
                            env) is None
    assert variant_rejected(parse_variant("torch-universal"), env) is None
    assert variant_rejected(parse_variant("torch-cuda"), env) is None
    assert "noarch" in variant_rejected(parse_variant("torch-rocm"), env)
    assert variant_rejected(parse_variant("torch-stable-abi210-cu128-x86_64-linux"), env) is None
    assert "aarch64" in variant_rejected(parse_variant("torch211-cxx11-cu128-aarch64-linux"), env)


# ------------------------------------------------------------------ real files: probe and CLI


def write_hub_cache(cache: Path, repo: str, ref: str, variant: str, archs=None) -> Path:
    """A Hub kernel build as `kernels` 0.19.1 leaves it in the cache (refs/vN + snapshot)."""
    d = cache / f"kernels--{repo.replace('/', '--')}"
    (d / "refs").mkdir(parents=True, exist_ok=True)
    (d / "refs" / ref).write_text(COMMIT)
    build = d / "snapshots" / COMMIT / "build" / variant
    build.mkdir(parents=True)
    backend = {"type": "cuda", **({"archs": archs} if archs else {})}
    (build / "metadata.json").write_text(json.dumps({"name": repo, "backend": backend}))
    return build


def _site_525(tmp_path: Path, fla: bool = True) -> Path:
    site = tmp_path / "site"
    write_fake_cuda_torch(site, "2.11.0+cu128", "12.8")
    write_dist_info(site, "triton", "3.8.0", {"triton/__init__.py": b"",
                                              "triton/backends/nvidia/__init__.py": b""})
    if fla:
        write_dist_info(site, "fla-core", "0.6.0", {"fla/__init__.py": b""})
    write_dist_info(site, "kernels", "0.19.1", {"kernels/__init__.py": b""})
    write_dist_info(site, "transformers", "5.25.0", {"transformers/__init__.py": b""})
    return site


def test_probe_lists_the_hub_cache_and_the_mamba_scan_extension(tmp_path):
    cache = tmp_path / "hub"
    build = write_hub_cache(cache, "kernels-community/fla", "v3", "torch211-cxx11-cu128-x86_64-linux",
                            ["9.0", "12.0"])
    (cache / "models--org--weights").mkdir()  # model weights are not listed
    site = _site_525(tmp_path)
    write_dist_info(site, "mamba-ssm", "2.3.3", {"mamba_ssm/__init__.py": b""})
    facts = collect(env={"KERNELS_CACHE": str(cache), "PATH": "/nonexistent"},
                    root=str(tmp_path / "root"), site_packages=[str(site)],
                    skip=["imports", "rpm", "nvidia-smi"])
    hub = facts["hub_kernels"]
    assert hub["cache_dir"] == str(cache) and hub["how"] == "KERNELS_CACHE"
    assert list(hub["repos"]) == ["kernels-community/fla"]
    repo = hub["repos"]["kernels-community/fla"]
    assert repo["refs"] == {"v3": COMMIT}
    assert repo["snapshots"][COMMIT][build.name]["backend"]["archs"] == ["9.0", "12.0"]
    assert facts["packages"]["mamba-ssm"]["extension_modules"] == {"selective_scan_cuda": None}
    d = diagnose(facts, "qwen3.5-27b", parse_gpu_spec("H200"))
    rows = {r["op"]: r for t in d.model_plan["layer_types"] for r in t["ops"]}
    assert rows["chunk_gated_delta_rule"]["reason"] == f"hub kernel cached at {build}"
    assert rows["causal_conv1d_fn"]["hub"]["state"] == "download"
    # a build whose declared archs do not include the device is not served
    d = diagnose(facts, "qwen3.5-27b", parse_gpu_spec("A100"))
    rows = {r["op"]: r for t in d.model_plan["layer_types"] for r in t["ops"]}
    assert rows["chunk_gated_delta_rule"]["hub"]["state"] == "download"
    assert "archs do not include sm_80" in rows["chunk_gated_delta_rule"]["hub"]["detail"]


def test_hub_cache_dir_follows_huggingface_hub():
    from fastpath.doctor.probe import hub_cache_dir

    assert hub_cache_dir({"HOME": "/h"}) == ("/h/.cache/huggingface/hub",
                                             "~/.cache/huggingface/hub (default)")
    assert hub_cache_dir({"HOME": "/h", "HF_HOME": "/x"})[0] == "/x/hub"
    assert hub_cache_dir({"HOME": "/h", "XDG_CACHE_HOME": "/c"})[0] == "/c/huggingface/hub"
    assert hub_cache_dir({"HF_HUB_CACHE": "/y", "HF_HOME": "/x"})[0] == "/y"
    assert hub_cache_dir({"KERNELS_CACHE": "/k", "HF_HUB_CACHE": "/y"}) == ("/k", "KERNELS_CACHE")


@pytest.mark.parametrize("extra, args, verdict", [
    ({}, ["--model", "qwen3.5-27b"], "blocked"),
    ({}, [], "blocked"),
    ({"HF_HUB_OFFLINE": "1"}, ["--gpu", "H200", "--model", "qwen3.5-27b"], "slow"),
    ({"USE_HUB_KERNELS": "0"}, ["--gpu", "sm_120", "--model", "qwen3.5-27b"], "slow"),
    ({"USE_HUB_KERNELS": "0"}, ["--model", "lfm2"], "blocked"),
    ({"USE_HUB_KERNELS": "0"}, ["--model", str(Path(__file__))], None),
])
def test_cli_text_json_and_exit_status_agree(tmp_path, extra, args, verdict):
    """The real CLI over a fake site and an empty Hub cache: the text headline, the --json
    verdict and the exit status are one decision."""
    site = _site_525(tmp_path)
    root = tmp_path / "root"
    root.mkdir()
    env = dict(os.environ, PATH=os.pathsep.join(["/usr/bin", "/bin"]), FASTPATH_PROBE_ROOT=str(root),
               FASTPATH_PROBE_SITE_PACKAGES=str(site), FASTPATH_PROBE_SKIP="imports,rpm,nvidia-smi",
               CUDA_HOME="", CUDA_PATH="", KERNELS_CACHE=str(tmp_path / "hub"), COLUMNS="100",
               **extra)
    for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "USE_HUB_KERNELS"):
        if k not in extra:
            env.pop(k, None)

    def run(*more):
        return subprocess.run([sys.executable, "-m", "fastpath", "doctor", *args, *more],
                              capture_output=True, text=True, env=env, timeout=120)

    text, as_json = run(), run("--json")
    if verdict is None:  # bad input: one line, exit 2, in both forms
        assert text.returncode == as_json.returncode == 2
        assert json.loads(as_json.stdout)["exit_code"] == 2
        return
    report = json.loads(as_json.stdout)
    assert report["verdict"] == verdict, report["headline"]
    assert text.returncode == as_json.returncode == report["exit_code"] == VERDICT_EXIT[verdict]
    assert text.stdout.startswith(verdict.upper() + ":")
    assert " ".join(text.stdout.split()).startswith(" ".join(report["headline"].split()))
    assert f"exit status {report['exit_code']}: {EXIT_MEANING[verdict]}" in " ".join(text.stdout.split())
