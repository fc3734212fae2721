"""Every rule in the catalogue fires on one fixture and stays silent on a near-identical one.

Fixtures are facts dicts (the probe's schema) derived from the story machine in fakeenv.seed_facts;
the no-fire fixture differs from the firing one only in the fact the rule is about.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable

import pytest
from fakeenv import seed_facts

from fastpath.doctor.diagnosis import diagnose
from fastpath.doctor.rules import RULES

Fixture = Callable[[dict], tuple[dict, str | None]]


def _nvcc(version: str) -> dict:
    path = f"/usr/local/cuda-{version}/bin/nvcc"
    major, minor = (int(x) for x in version.split("."))
    return {"path": path, "realpath": path, "paths": [path], "version": f"{version}.93",
            "major": major, "minor": minor, "found_by": ["/usr/local/cuda-*"], "kind": "nvcc",
            "major_matches_torch": None, "source": "fake"}


def _pkg(facts: dict, dist: str, **imp) -> dict:
    p = facts["packages"][dist]
    p["import"] = {"ok": imp.pop("ok", False), "error_kind": imp.pop("kind", None),
                   "error": imp.pop("error", None)}
    p.update(imp)
    return facts


def _conv_ok(facts: dict, sass: tuple[str, ...] = ()) -> dict:
    so = [{"path": "/site/causal_conv1d_cuda.so", "sass": list(sass), "ptx": []}] if sass else []
    return _pkg(facts, "causal-conv1d", ok=True, version="1.6.1", so_files=so)


def _gpu(facts: dict, cc: str) -> dict:
    for g in facts["gpus"]:
        g["compute_capability"] = cc
    return facts


def _set(facts: dict, path: str, value) -> dict:
    *keys, last = path.split(".")
    d = facts
    for k in keys:
        d = d[k]
    d[last] = value
    return facts


def _hub(facts: dict, variant: str) -> dict:
    """transformers 5.25 + kernels with a Hub cache holding `variant` of both repos."""
    from test_doctor_verdict import hub_cache_facts

    _pkg(_set(facts, "packages.transformers.version", "5.25.0"), "kernels", ok=True,
         version="0.19.1")
    facts["hub_kernels"] = hub_cache_facts(variant)
    return facts


def _both(fire: Callable[[dict], dict], quiet: Callable[[dict], dict],
          model: str | None = "qwen3.5-27b") -> tuple[Fixture, Fixture]:
    return (lambda f: (fire(f), model)), (lambda f: (quiet(f), model))


def _ident(f: dict) -> dict:
    return f


CASES: dict[str, tuple[Fixture, Fixture]] = {
    "no-gpu": _both(lambda f: _set(_set(f, "gpus", []), "torch.cuda_available", False), _ident),
    "torch-cpu-build": _both(lambda f: _set(_set(f, "torch.cuda", None), "torch.arch_list", []),
                             _ident),
    "torch-no-cuda-device": _both(lambda f: _set(f, "torch.cuda_available", False), _ident),
    "torch-arch-not-covered": _both(
        lambda f: _set(_set(f, "torch.device_arch_covered", False), "torch.arch_list",
                       ["sm_80", "sm_90"]), _ident),
    "causal-conv1d-missing": _both(_ident, _conv_ok),
    "fla-missing": _both(lambda f: _pkg(f, "fla-core", kind="not-installed", version=None,
                                        error="No module named 'fla'"), _ident),
    "mamba-needs-mamba-ssm": _both(_ident, lambda f: _pkg(f, "mamba-ssm", ok=True, version="2.3.0"),
                                   model="mamba2"),
    "no-usable-nvcc": _both(_ident, lambda f: _set(f, "nvcc_candidates", [_nvcc("12.8")])),
    "nvcc-major-mismatch": _both(lambda f: _set(f, "nvcc_candidates", [_nvcc("13.0")]),
                                 lambda f: _set(f, "nvcc_candidates", [_nvcc("12.8")])),
    "cu12-nvcc-wheel-ptxas-only": _both(
        lambda f: _set(f, "nvcc_candidates", [
            {"path": "/site/nvidia/cuda_nvcc/bin/ptxas", "kind": "ptxas-only-wheel",
             "version": "12.8.93", "found_by": ["pip wheel"]}]),
        lambda f: _set(f, "nvcc_candidates", [
            {"path": "/site/nvidia/cuda_nvcc/bin/ptxas", "kind": "ptxas-only-wheel",
             "version": "12.8.93", "found_by": ["pip wheel"]}, _nvcc("12.8")])),
    "cuda-home-stale": _both(
        lambda f: _set(f, "cuda_home", dict(f["cuda_home"], torch_would_use="/usr/local/cuda",
                                            how="/usr/local/cuda exists", has_nvcc=False)),
        _ident),
    "host-gcc-unsupported": _both(lambda f: _set(f, "gcc.version", "14.2.0"), _ident),
    "cuda-home-path-diverge": _both(
        lambda f: _set(f, "cuda_home", dict(f["cuda_home"], diverge=True,
                                            cuda_home_env="/usr/local/cuda-12.8",
                                            cuda_path_env="/opt/cuda-13.0")), _ident),
    "extension-missing-arch": _both(lambda f: _conv_ok(f, ("sm_80", "sm_90")),
                                    lambda f: _conv_ok(f, ("sm_90", "sm_120"))),
    "extension-abi-mismatch": _both(
        lambda f: _pkg(f, "causal-conv1d", kind="abi-mismatch", version="1.6.1",
                       error="ImportError: undefined symbol: _ZN3c104cuda9SetDeviceEi"), _ident),
    "extension-cuda-init": _both(
        lambda f: _pkg(f, "causal-conv1d", kind="cuda-init", version="1.6.1",
                       error="RuntimeError: CUDA driver initialization failed"), _ident),
    "extension-import-error": _both(
        lambda f: _pkg(f, "flash-attn", kind="other", version="2.8.3",
                       error="ImportError: cannot import name 'x' from 'flash_attn'"),
        lambda f: _pkg(f, "flash-attn", kind="other", version=None,
                       error="ImportError: cannot import name 'x' from 'flash_attn'")),
    "fla-hopper-backward": _both(
        lambda f: _gpu(f, "9.0"),
        lambda f: _pkg(_gpu(f, "9.0"), "tilelang", ok=True, version="0.1.15")),
    "dao-sm103-nvcc13": _both(lambda f: _conv_ok(_gpu(f, "10.3"), ("sm_100", "sm_103")),
                              lambda f: _conv_ok(_gpu(f, "10.3"), ("sm_100",))),
    "transformers-silent-fallback": _both(
        lambda f: _set(f, "packages.transformers.version", "5.15.0"), _ident),
    "transformers-hub-kernels-default": _both(
        lambda f: _pkg(_set(f, "packages.transformers.version", "5.25.0"), "kernels", ok=True,
                       version="0.10.0"),
        lambda f: _set(_pkg(_set(f, "packages.transformers.version", "5.25.0"), "kernels",
                            ok=True, version="0.10.0"), "env.USE_HUB_KERNELS", "0")),
    "hub-kernel-cached": _both(
        lambda f: _hub(f, "torch211-cxx11-cu128-x86_64-linux"),
        lambda f: _hub(f, "torch210-cxx11-cu128-x86_64-linux")),
    "mamba-ssm-cuda-scan-missing": _both(
        lambda f: _set(_pkg(f, "mamba-ssm", ok=True, version="2.3.3"),
                       "packages.mamba-ssm.extension_modules", {"selective_scan_cuda": None}),
        lambda f: _set(_pkg(f, "mamba-ssm", ok=True, version="2.3.3"),
                       "packages.mamba-ssm.extension_modules", {"selective_scan_cuda": "/s.so"}),
        model="falcon-mamba-7b"),
    "mamba-kernels-hub-only": _both(
        lambda f: _pkg(_set(f, "packages.transformers.version", "5.10.0"), "kernels", ok=True,
                       version="0.10.0"),
        lambda f: _pkg(_set(f, "packages.transformers.version", "5.15.0"), "kernels", ok=True,
                       version="0.10.0"),
        model="mamba2"),
    "causal-conv1d-prebuilt-wheel": _both(_ident, _conv_ok),
    "triton-no-gpu-backend": _both(lambda f: _set(f, "triton.gpu_backend", False), _ident),
    "liger-kernel-composes": ((lambda f: (f, "qwen3.5-27b")), (lambda f: (f, "lfm2-1.2b"))),
    "speculators-zero-centred-verifier-norm": _both(
        lambda f: _set(f, "packages.speculators", {"version": "0.9.0", "module": "speculators", "source": "fake",
                                                   "import": {"ok": True}, "so_files": []}), _ident),
}


def test_every_rule_has_a_firing_and_a_quiet_fixture():
    assert set(CASES) == {r.id for r in RULES}


@pytest.mark.parametrize("rule_id", sorted(CASES))
def test_rule_fires(rule_id):
    facts, model = CASES[rule_id][0](copy.deepcopy(seed_facts()))
    d = diagnose(facts, model)
    (f,) = [f for f in d.findings if f.id == rule_id]
    rule = next(r for r in RULES if r.id == rule_id)
    assert f.severity == rule.severity and f.title == rule.title and f.source.startswith("https://")
    assert f.remedies, rule_id
    for text in (f.detail, *f.remedies):  # every template placeholder was filled
        assert not re.search(r"\{[a-z_]+\}", text), text


@pytest.mark.parametrize("rule_id", sorted(CASES))
def test_rule_stays_quiet(rule_id):
    facts, model = CASES[rule_id][1](copy.deepcopy(seed_facts()))
    assert rule_id not in [f.id for f in diagnose(facts, model).findings]


@pytest.mark.parametrize("torch_facts,says", [({}, "none is installed"),
                                              ({"version": "2.13.0+cpu", "cuda": None}, "this one has no CUDA")])
def test_toolkit_remedy_names_the_torch_that_is_there(torch_facts, says):
    """First-hour finding: with no torch at all the remedy said 'this one has no CUDA'."""
    facts = copy.deepcopy(seed_facts())
    facts["torch"] = torch_facts
    d = diagnose(facts, None)
    (f,) = [f for f in d.findings if f.id == "causal-conv1d-missing"]
    assert any(says in r for r in f.remedies), f.remedies
