"""fastpath.enable() across transformers 4.57.6 / 5.12.1 / 5.17.0 / 5.23.0 / 5.25.0 (side-by-side venvs
from scripts/setup_transformers_matrix.sh, sharing the system CPU torch) and "default": the stack
`pip install ".[kernels]"` resolves today plus fla-core, in a plain venv of its own
(scripts/setup_default_stack.sh: transformers 5.25 + kernels 0.19.1 + torch 2.14 + Triton 3.8 on
2026-12-04), where transformers reaches every op through Hub-kernel wrappers.

Each version runs tests/support/matrix_worker.py in a subprocess (its own interpreter, its own transformers)
and these tests assert on the JSON: for every family the version has, outputs with enable() match
the reference path, fastpath's kernels really ran (counted at their entry points, no mocks) where the
version can route them, explain() says so, and disable() restores the reference path exactly.
"""

from __future__ import annotations

import json
import os
import sys
from concurrent.futures import Future, ThreadPoolExecutor
from functools import cache
from typing import Any

import pytest
from matrix_runs import DEFAULT, VERSIONS, WORKER, major_minor, release
from matrix_runs import kernel_calls as _kernel_calls
from matrix_runs import python_for as _python_for
from matrix_runs import run_matrix_worker as _run
from matrix_runs import venv_python as _venv_python
from repo_paths import venv_missing

from fastpath.doctor.families import CONV_MODEL_TYPES, family_for

ATOL = 1e-4  # float32 tiny models; the kernels differ from F.conv1d by rounding only
OFFLINE_ARGS = ("--families", "lfm2", "--skip-packed", "--offline-load", "qwen3_5_text")
# every worker run the module needs; started together (one per core) the first time any is needed
JOBS: list[tuple[str, tuple[str, ...]]] = [(v, ()) for v in VERSIONS] + [
    ("5.25.0", OFFLINE_ARGS), ("5.25.0-kernels", OFFLINE_ARGS)]
_POOL: ThreadPoolExecutor | None = None
_FUTURES: dict[tuple[str, tuple[str, ...]], Future] = {}


def _start_all() -> None:
    global _POOL
    if _POOL is not None:
        return
    _POOL = ThreadPoolExecutor(max_workers=max(1, min(len(JOBS), os.cpu_count() or 1)))
    for version, extra in JOBS:
        python = _python_for(version)
        if python is not None:
            _FUTURES[(version, extra)] = _POOL.submit(_run, python, extra)


@cache
def run_worker(version: str, *extra: str) -> dict[str, Any]:
    _start_all()
    future = _FUTURES.get((version, extra))
    if future is None:
        python = _python_for(version)
        if python is None:
            pytest.skip(venv_missing(version))
        future = _POOL.submit(_run, python, extra)  # type: ignore[union-attr]
    proc = future.result()
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


@cache
@pytest.mark.parametrize("version", VERSIONS)
def test_every_family_of_the_version_is_exercised(version: str) -> None:
    data = run_worker(version)
    assert data["transformers"] == release(version)
    assert data["families"], "no hybrid family found"
    discovered = set(data["discovered"])
    for model_type in data["families"]:
        family = {"qwen3_5_text": "qwen3_5", "qwen3_5_moe_text": "qwen3_5_moe"}.get(model_type, model_type)
        assert family in discovered, f"{family} uses causal_conv1d but discovery missed it"
    failed = {k: v["error"] for k, v in data["families"].items() if "error" in v}
    assert not failed, failed


@pytest.mark.parametrize("version", VERSIONS)
def test_outputs_match_reference_and_kernels_ran(version: str) -> None:
    data = run_worker(version)
    interp = os.environ.get("TRITON_INTERPRET") == "1"
    old = major_minor(version) <= (5, 14)
    for model_type, res in data["families"].items():
        if "error" in res:
            continue
        fam = family_for(model_type)
        if fam is not None and fam.name in ("mamba2", "mamba1"):
            continue  # their SSM ops are routed too: tests/routing/test_mamba_matrix.py / test_mamba1_matrix.py
        family = res["family"]
        tol = ATOL * max(1.0, res["scale"])
        assert res["max_abs_diff"] <= tol, (model_type, res["max_abs_diff"])
        assert res["gen_equal"], f"{model_type}: greedy generate differs with enable()"
        assert res["grad_names_equal"], f"{model_type}: a training step with enable() lost a gradient"
        assert res["loss_diff"] <= tol and res["grad_diff"] <= 1e-3, (model_type, res["loss_diff"],
                                                                      res["grad_diff"])
        assert res["after_build_diff"] <= tol, model_type
        assert res["disabled_diff"] == 0.0, f"{model_type}: disable() did not restore the reference"
        assert res["calls_after_disable"] == {}, f"{model_type}: kernels still called after disable()"
        assert all(not r["impl"].startswith("fastpath") for r in res["explain_after_disable"])
        conv_rows = [r for r in res["explain"] if r["op"].startswith("causal_conv1d")]
        assert conv_rows, f"{model_type}: explain() found no causal_conv1d op"
        fam = family_for(model_type)
        if old and fam is not None and fam.all_or_nothing:
            # <=5.14 Mamba-family mixers take their kernel path all-or-nothing: without mamba_ssm the
            # whole mixer (causal conv included) stays in torch; explain() must say so, not claim fast
            assert _kernel_calls(res["calls"], "fwd") == 0
            assert all(not r["fast"] and "mamba_ssm" in r["impl"] for r in conv_rows), conv_rows
            continue
        if old and family in ("lfm2", "lfm2_moe") and not interp:
            # its kernel path is gated on CUDA tensors; only the interpreter option lifts that on CPU
            assert _kernel_calls(res["calls"], "fwd") == 0
            assert all("gated on CUDA" in r["impl"] for r in conv_rows), conv_rows
            continue
        assert _kernel_calls(res["calls"], "fwd") >= 1, (model_type, res["calls"])
        assert _kernel_calls(res["calls"], "update") >= 1, (model_type, res["calls"])  # decode with cache
        assert _kernel_calls(res["calls_after_build"], "fwd") >= 1, (model_type, res["calls_after_build"])
        # explain() must say what actually ran
        impls = {r["impl"] for r in conv_rows}
        if interp and impls == {"fastpath-triton (interpreter)"}:
            conv = {k for k in res["calls"] if k.split(":")[0] in ("fwd", "bwd", "update")}
            assert conv == {"fwd:triton", "update:triton"}, res["calls"]
            # other kernels that ran (FLA's gated norm where fla-core is installed) ran fast ones
            assert not any(k.endswith(":reference") for k in res["calls"]), res["calls"]
        else:  # no interpreter, or a layer the kernels hand to their reference (e.g. width > 4)
            assert all(i.startswith("fastpath (torch reference") for i in impls), impls
            assert set(res["calls"]) == {"fwd:reference", "update:reference"}, res["calls"]


@pytest.mark.parametrize("version", VERSIONS)
def test_packed_sequences_stay_apart(version: str) -> None:
    data = run_worker(version)
    packed = data.get("packed_lfm2")
    if packed is None:
        pytest.skip(f"lfm2 not in transformers {version}")
    if major_minor(version) <= (5, 14):
        pytest.skip("lfm2 <=5.14 has no seq_idx input (no packed-sequence support to keep)")
    assert "error" not in packed, packed
    tol = ATOL * max(1.0, packed["scale"])
    assert packed["leak_diff"] > 100 * tol, packed  # the test can see a leak across the boundary...
    assert packed["diff"] <= tol, packed             # ...and with enable() there is none
    assert _kernel_calls(packed["calls"], "fwd") >= 1


def test_worker_covers_every_family_the_doctor_knows() -> None:
    sys.path.insert(0, str(WORKER.parent))
    try:
        from matrix_worker import FAMILIES, MODULE_OF
    finally:
        sys.path.remove(str(WORKER.parent))
    covered = set(FAMILIES) | {MODULE_OF[t] for t in MODULE_OF}
    assert CONV_MODEL_TYPES <= covered, CONV_MODEL_TYPES - covered


def test_offline_load_without_kernels_525() -> None:
    data = run_worker("5.25.0", *OFFLINE_ARGS)
    assert not data["kernels_installed"]
    off = data["offline_load"]
    # without fastpath, 5.25's use_kernels=True default makes from_pretrained raise here
    assert "Kernels are not available" in (off["baseline_error"] or ""), off["baseline_error"]
    assert "error" not in off, off.get("traceback")
    assert off["diff"] <= ATOL
    assert _kernel_calls(off["calls"], "fwd") >= 1
    assert off["env_USE_HUB_KERNELS"] == "0"
    assert off["env_after_disable"] is None


def test_offline_load_with_kernels_installed_525() -> None:
    """transformers 5.25 + the newest reachable `kernels` (0.17.2; 5.25 wants >=0.19.1), Hub offline:
    from_pretrained after enable() neither hangs, crashes nor silently drops to torch."""
    if _venv_python("5.25.0-kernels") is None:
        pytest.skip(venv_missing("5.25.0-kernels"))
    data = run_worker("5.25.0-kernels", *OFFLINE_ARGS)
    assert data["kernels_installed"]
    off = data["offline_load"]
    # kernels 0.17.2 fails 5.25's version check: the default load raises; enable() avoids the Hub path
    assert "Kernels are not available" in (off["baseline_error"] or ""), off["baseline_error"]
    assert "error" not in off, off.get("traceback")
    assert off["use_kernels"] is False
    assert off["diff"] <= ATOL
    assert _kernel_calls(off["calls"], "fwd") >= 1
    assert all(r["impl"].startswith("fastpath") for r in off["explain"] if r["op"].startswith("causal"))


# ops explain() must list after enable() on today's stack, per family (CPU rows; every one routed)
DEFAULT_STACK_OPS = {
    "qwen3_5_text": {"causal_conv1d_fn", "causal_conv1d_update", "chunk_gated_delta_rule",
                     "recurrent_gated_delta_rule", "gated_rmsnorm", "gdn_gates", "attn_output_gate",
                     "zc_rmsnorm"},
    "qwen3_next": {"causal_conv1d_fn", "causal_conv1d_update", "chunk_gated_delta_rule",
                   "recurrent_gated_delta_rule", "gated_rmsnorm", "attn_output_gate", "zc_rmsnorm"},
    "nemotron_h": {"causal_conv1d_fn", "causal_conv1d_update", "selective_state_update",
                   "mamba_chunk_scan_combined", "mamba_split_conv1d_scan_combined"},
    "falcon_mamba": {"causal_conv1d_fn", "causal_conv1d_update", "selective_state_update",
                     "selective_scan_fn"},
}


# ops whose Triton kernels this worker turns off (slow under the interpreter), per family
SCAN_OPS = {"falcon_mamba": {"selective_scan_fn", "selective_state_update"},
            "nemotron_h": {"mamba_chunk_scan_combined", "mamba_split_conv1d_scan_combined"}}


def test_default_stack_is_todays_resolution_with_hub_wrappers() -> None:
    """The leg runs what `pip install ".[kernels]"` resolves now: transformers >= 5.25 with the
    `kernels` it requires (its ops behind Hub-kernel wrappers), plus fla-core."""
    data = run_worker(DEFAULT)
    stack = data["stack"]
    assert major_minor(DEFAULT) >= (5, 25), stack
    assert data["kernels_installed"] and stack["kernels"], stack
    assert stack["fla-core"], stack


def test_default_stack_routes_every_op() -> None:
    """With kernels + fla-core installed, enable() routes every op of the tiny Qwen3.5, Qwen3-Next,
    Nemotron-H and Falcon-Mamba models: explain() shows no Hub-kernel and no torch-fallback row, the
    gated delta rule is FLA's route (CUDA tensors; CPU tensors keep transformers' torch function),
    and every op the family calls is listed. Before the wrappers were seen through, the delta rule
    read `hub kernel (kernels._internals.layer.layer)` and no SSM op or gdn_gates was routed."""
    data = run_worker(DEFAULT)
    for model_type, want in DEFAULT_STACK_OPS.items():
        res = data["families"].get(model_type)
        assert res is not None and "error" not in res, (model_type, res)
        for key in ("explain", "explain_after_build"):
            rows = res[key]
            assert want <= {r["op"] for r in rows}, (model_type, key, want - {r["op"] for r in rows})
            for r in rows:
                assert not r["impl"].startswith(("hub kernel", "torch fallback")), (model_type, r)
                if r["op"].endswith("gated_delta_rule"):
                    assert "FLA routed for CUDA" in r["impl"], (model_type, r)
                elif r["op"] in SCAN_OPS.get(model_type, ()):
                    # routed to fastpath's reference: test_mamba_matrix / test_mamba1_matrix run
                    # these kernels
                    assert r["fast"] or r["impl"].startswith("fastpath (torch reference"), (model_type, r)
                else:
                    assert r["fast"], (model_type, r)
        before = {r["op"]: r["impl"] for r in res["explain_before"]}
        assert all(i.startswith(("torch", "fastpath")) for i in before.values()), before
