"""fastpath.enable() on the six Mamba-2 families across transformers 4.57.6 / 5.12.1 / 5.17.0 / 5.23.0 /
5.25.0, without mamba-ssm installed (tests/support/matrix_worker.py --mamba, one subprocess per version).

Per family: logits, greedy decode with cache (selective_state_update), one training step (loss and
every parameter gradient; the fused split-conv op where the layer calls it) agree with the reference
path; fastpath's kernels ran (counted at their entry points); explain() says what ran; disable()
restores the reference exactly, also for a model built while enabled. Packed sequences (seq_idx)
stay apart where the version carries seq_idx to the mixer.
Under TRITON_INTERPRET=1 (scripts/test.sh) the kernels run on CPU; <=5.14 mixers gate their kernel
path on CUDA weights, which enable(lift_device_gate=True) lifts for the test (not for falcon_h1, whose
<=5.14 kernel path enters torch.cuda.device()).
"""

from __future__ import annotations

import pytest
from matrix_runs import (
    TOL,
    VERSIONS,
    VersionRuns,
    assert_routed_case_matches,
    major_minor,
    old,
)
from matrix_runs import kernel_calls as _calls

from fastpath.kernels.ssd import interface as ssd_interface

MAMBA_OPS = ("mamba_chunk_scan_combined", "selective_state_update", "mamba_split_conv1d_scan_combined")
# families whose model forward carries seq_idx down to the Mamba-2 mixer, by release (read off the
# worker runs): <=5.14 bamba and granitemoehybrid; 5.15-5.24 all but mamba2; 5.25 all six
PACKED_SUPPORT = {"old": {"bamba", "granitemoehybrid"},
                  "5.15": {"bamba", "granitemoehybrid", "nemotron_h", "falcon_h1", "zamba2"},
                  "5.25": {"mamba2", "bamba", "granitemoehybrid", "nemotron_h", "falcon_h1", "zamba2"}}


def _packed_support(version: str) -> set[str]:
    if old(version):
        return PACKED_SUPPORT["old"]
    return PACKED_SUPPORT["5.25" if major_minor(version) >= (5, 25) else "5.15"]


TRITON_SCAN_VERSION = "5.17.0"


def _worker_args(version: str) -> tuple[str, ...]:
    # the Triton SSD scan under the CPU interpreter costs minutes per version: it runs on one
    # version (the kernels are the same code everywhere), the others check the routing around it
    return ("--mamba",) if version == TRITON_SCAN_VERSION else ("--mamba", "--scan-reference")


RUNS = VersionRuns(_worker_args, "Mamba-2")
_families = RUNS.interpreted


@pytest.mark.parametrize("version", VERSIONS)
def test_outputs_decode_and_training_match_the_reference(version: str) -> None:
    data = _families(version)
    assert data["families"], "no Mamba-2 family found"
    for family, res in data["families"].items():
        assert_routed_case_matches(family, res)


@pytest.mark.parametrize("version", VERSIONS)
def test_kernels_ran_and_explain_says_so(version: str) -> None:
    data = _families(version)
    triton_scan = ssd_interface.KERNELS_READY and not data["scan_reference"]
    scan_impl = "triton" if triton_scan else "reference"
    for family, res in data["families"].items():
        rows = [r for r in res["explain"] if r["op"] in MAMBA_OPS]
        before = [r for r in res["explain_before"] if r["op"] in MAMBA_OPS]
        after = [r for r in res["explain_after_disable"] if r["op"] in MAMBA_OPS]
        assert before and all(not r["fast"] for r in before), (family, before)
        assert all(not r["impl"].startswith("fastpath") for r in after), (family, after)
        if old(version) and family == "falcon_h1":
            assert res["calls"] == {} and res["train_calls"] == {}, res["calls"]
            assert all("gated on CUDA" in r["impl"] for r in rows), rows
            continue
        assert {r["op"] for r in rows} == set(MAMBA_OPS), (family, rows)
        assert res["calls"].get(f"ssd_fwd:{scan_impl}", 0) >= 1, (family, res["calls"])
        assert res["calls"].get("ssd_update:triton", 0) >= 1, (family, res["calls"])  # decode
        assert _calls(res["calls"], "fwd") >= 1 and _calls(res["calls"], "update") >= 1, res["calls"]
        assert res["train_calls"].get(f"ssd_bwd:{scan_impl}", 0) >= 1, (family, res["train_calls"])
        assert _calls(res["calls_after_build"], "ssd_fwd") >= 1, family
        for r in rows:
            if r["op"] == "selective_state_update" or triton_scan:
                assert r["impl"] == "fastpath-triton (interpreter)" and r["fast"], (family, r)
            else:  # the scan runs its reference in this worker (--scan-reference)
                assert r["impl"].startswith("fastpath (torch reference") and not r["fast"], (family, r)


@pytest.mark.parametrize("version", VERSIONS)
def test_mamba2_training_takes_the_fused_split_conv_op(version: str) -> None:
    res = _families(version)["families"]["mamba2"]
    assert res["train_calls"].get("ssd_split_conv_scan:composed", 0) >= 1, res["train_calls"]


@pytest.mark.parametrize("version", VERSIONS)
def test_packed_sequences_stay_apart(version: str) -> None:
    data = _families(version)
    for family, res in data["packed"].items():
        assert "error" not in res, (family, res)
        tol = TOL * max(1.0, res["scale"])
        assert res["leak_diff"] > 100 * tol, (family, res)  # the check can see a leak
        if family in _packed_support(version):
            assert res["diff"] <= tol, (family, res)
            assert _calls(res["calls"], "ssd_fwd") >= 1, (family, res)
