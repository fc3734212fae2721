"""fastpath.enable() on the four Mamba-1 families (mamba, falcon_mamba, jamba, zamba) across
transformers 4.57.6 / 5.12.1 / 5.17.0 / 5.23.0 / 5.25.0 without mamba-ssm installed
(tests/support/matrix_worker.py --mamba1, one subprocess per version).

Per family: logits, greedy decode with cache (selective_state_update), one training step (loss and
every parameter gradient; mamba's fused mamba_inner_fn where the version calls it) agree with the
reference path; fastpath's kernels ran (counted at their entry points); explain() says what ran;
disable() restores the reference exactly, also for a model built while enabled.
Under TRITON_INTERPRET=1 (scripts/test.sh) the conv and decode kernels run on CPU; the selective
scan takes its float reference here (--scan-reference: its Triton kernels under the interpreter
cost minutes per version; tests/routing/test_selective_scan_route.py runs them through a routed model and
tests/kernels/selective_scan/test_selective_scan*.py check them). <=5.14 mixers gate their kernel path on CUDA weights,
which enable(lift_device_gate=True) lifts for the test. No release carries packed sequences
(seq_idx) through the Mamba-1 scan, so there is no packed case.
"""

from __future__ import annotations

from typing import Any

import pytest
from matrix_runs import (
    VERSIONS,
    VersionRuns,
    assert_routed_case_matches,
    major_minor,
    old,
)
from matrix_runs import kernel_calls as _calls

MAMBA1_OPS = ("selective_scan_fn", "selective_state_update", "mamba_inner_fn")
RUNS = VersionRuns(lambda version: ("--mamba1", "--scan-reference", "--gen-tokens", "2"), "Mamba-1")


def _families(version: str) -> dict[str, Any]:
    data = RUNS.interpreted(version)
    assert set(data["families"]) == {"mamba", "falcon_mamba", "jamba", "zamba"}
    return data["families"]


@pytest.mark.parametrize("version", VERSIONS)
def test_outputs_decode_and_training_match_the_reference(version: str) -> None:
    for family, res in _families(version).items():
        assert_routed_case_matches(family, res)


@pytest.mark.parametrize("version", VERSIONS)
def test_kernels_ran_and_explain_says_so(version: str) -> None:
    for family, res in _families(version).items():
        rows = [r for r in res["explain"] if r["op"] in MAMBA1_OPS]
        before = [r for r in res["explain_before"] if r["op"] in MAMBA1_OPS or r["op"].startswith("causal")]
        after = [r for r in res["explain_after_disable"] if r["op"] in MAMBA1_OPS]
        assert before and all(not r["fast"] for r in before), (family, before)
        assert all(not r["impl"].startswith("fastpath") for r in after), (family, after)
        ops = {r["op"] for r in rows}
        assert {"selective_scan_fn", "selective_state_update"} <= ops, (family, rows)
        if family in ("jamba", "zamba"):  # they never call the fused op
            assert "mamba_inner_fn" not in ops, (family, ops)
        for r in rows:
            if r["op"] == "selective_state_update":
                assert r["impl"] == "fastpath-triton (interpreter)" and r["fast"], (family, r)
            elif r["op"] == "selective_scan_fn" or not r["impl"].startswith("declined"):
                # --scan-reference: the scan's Triton kernels are switched off in this worker
                assert r["impl"].startswith("fastpath (torch reference") and not r["fast"], (family, r)
        assert res["calls"].get("ss_fwd:reference", 0) >= 1, (family, res["calls"])
        assert res["calls"].get("ss_update:triton", 0) >= 1, (family, res["calls"])  # decode
        assert _calls(res["calls"], "fwd") >= 1 and _calls(res["calls"], "update") >= 1, res["calls"]
        assert res["train_calls"].get("ss_bwd:reference", 0) >= 1, (family, res["train_calls"])
        assert _calls(res["calls_after_build"], "ss_fwd") >= 1, family


@pytest.mark.parametrize("version", VERSIONS)
def test_falcon_mamba_fused_op_follows_the_reference_path(version: str) -> None:
    """Falcon-Mamba's normed fused call is declined (5.15-5.24: transformers' unfused path runs on
    the routed ops) or composed from them (<=5.14); 5.25 no longer calls it."""
    rows = [r for r in _families(version)["falcon_mamba"]["explain"] if r["op"] == "mamba_inner_fn"]
    if major_minor(version) >= (5, 25):
        assert rows == []
    elif old(version):
        assert rows and all(r["impl"].startswith("fastpath (torch reference") for r in rows), rows
    else:
        assert rows and all(r["impl"].startswith("declined") and r["fast"] for r in rows), rows
