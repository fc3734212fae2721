"""Fleet exit code: 1 if any target is slow (or blocked), else 3 if any could not be diagnosed,
else 0 -- the single-target codes combined."""

from __future__ import annotations

from fakeenv import seed_facts

from fastpath.doctor.diagnosis import diagnose
from fastpath.doctor.fleet import TargetResult, fleet_exit_code
from fastpath.doctor.inventory import Target


def _ok(facts, model=None):
    return TargetResult(Target("t", ["env"]), "ok", None, 0.1, facts, diagnose(facts, model))


def _fast():
    facts = seed_facts()
    facts["packages"]["causal-conv1d"] = {"version": "1.6.1", "so_files": [],
                                          "import": {"ok": True, "error_kind": None, "error": None}}
    return _ok(facts, "qwen3.5-27b")


def test_fleet_exit_codes():
    fast, slow = _fast(), _ok(seed_facts(), "qwen3.5-27b")
    down = TargetResult(Target("d", ["ssh", "d"]), "unreachable", "unreachable: refused", 0.1)
    assert fast.diagnosis.exit_code == 0 and slow.diagnosis.exit_code == 1
    assert fleet_exit_code([fast, fast]) == 0
    assert fleet_exit_code([fast, down]) == 3
    assert fleet_exit_code([fast, down, slow]) == 1


def test_a_target_with_empty_facts_is_undiagnosed_not_fatal():
    from fastpath.doctor.fleet import _diagnose_all

    empty = TargetResult(Target("e", ["env"]), "ok", None, 0.1, {})
    fast = _fast()
    _diagnose_all([empty, fast], None)
    assert empty.status == "failed" and "no facts" in empty.error
    assert fleet_exit_code([empty, fast]) == 3
