"""The doctor and the drafter-training clients: the probe reports speculators/specforge
from their dist-info (never imported) only where installed, and the doctor lists speculators'
zero-centred verifier-norm issue with its sources when speculators is installed and the target's
final norm is zero-centred (or no model is named). Fake site-packages and facts dicts."""

from __future__ import annotations

import copy

from fakeenv import seed_facts, write_dist_info

from fastpath.doctor import probe
from fastpath.doctor.diagnosis import diagnose
from fastpath.shared.known_issues import speculators_zero_centred_norm

RULE = "speculators-zero-centred-verifier-norm"


def _with_speculators(version: str | None) -> dict:
    facts = copy.deepcopy(seed_facts())
    if version is not None:
        facts["packages"]["speculators"] = {
            "version": version, "module": "speculators", "source": "package metadata fake",
            "import": {"ok": True, "error_kind": None, "error": None, "how": "dist-info present; not imported"},
            "so_files": []}
    return facts


def _finding(facts: dict, model: str | None):
    found = [f for f in diagnose(facts, model).findings if f.id == RULE]
    return found[0] if found else None


def test_listed_for_a_qwen35_target_with_speculators_installed_and_its_sources():
    f = _finding(_with_speculators("0.9.0"), "qwen3.5-27b")
    assert f is not None and f.severity == "warning"
    assert "speculators 0.9.0" in f.detail and "EAGLE-3" in f.detail and "x̂·(1 + w)" in f.detail
    assert "DFlash resolves" in f.detail  # qwen3_5_text is in PR #1090's list
    for source in ("speculators/pull/1090", "speculators/pull/1145", "speculators/issues/797"):
        assert source in f.source
    assert "--check-client speculators --client-target" in f.remedies[0]


def test_qwen3_next_is_wrong_for_both_drafters_and_a_mamba_target_is_not_listed():
    assert "EAGLE-3 and DFlash" in _finding(_with_speculators("0.9.0"), "qwen3-next-80b-a3b").detail
    assert _finding(_with_speculators("0.9.0"), "nemotron-h-8b") is None
    assert _finding(_with_speculators(None), "qwen3.5-27b") is None  # not installed: nothing said
    assert _finding(_with_speculators("0.9.0"), None) is not None  # no model named: listed for the types


def test_a_newer_speculators_is_reported_as_unchecked():
    assert "not checked" in speculators_zero_centred_norm("0.10.0", "qwen3_5_moe")
    assert speculators_zero_centred_norm("0.8.1", "qwen3_5_moe") == "EAGLE-3 and DFlash"
    assert speculators_zero_centred_norm("garbage", "qwen3_5") is None


def test_the_probe_reports_installed_clients_from_dist_info_only(tmp_path):
    site = tmp_path / "site-packages"
    write_dist_info(site, "speculators", "0.9.0", {"speculators/__init__.py": b"raise SystemExit('imported')\n"})
    facts = probe.collect(env={"PATH": "/nonexistent"}, root=str(tmp_path / "root"), site_packages=[str(site)],
                          skip=["nvidia-smi"])
    entry = facts["packages"]["speculators"]
    assert entry["version"] == "0.9.0" and entry["import"]["ok"] is True
    assert "not imported" in entry["import"]["how"]
    assert "specforge" not in facts["packages"]  # absent clients add no rows
