"""`fastpath doctor` through the real CLI in a subprocess: exit codes, one-line errors, JSON."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


def _doctor(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "fastpath", "doctor", *args],
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("make_arg", [
    lambda tmp: "no-such-preset",
    lambda tmp: str(tmp / "missing.json"),
    lambda tmp: (tmp / "bad.json").write_text("{oops") and str(tmp / "bad.json"),
    lambda tmp: (tmp / "bin.json").write_bytes(b"\xff\xfe\x00") and str(tmp / "bin.json"),
    lambda tmp: str(tmp),  # a directory without config.json
])
def test_bad_model_input_is_one_line_exit_2(tmp_path, make_arg):
    r = _doctor("--model", make_arg(tmp_path))
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fastpath doctor: error:")
    assert "Traceback" not in r.stderr and r.stdout == ""


def test_bad_option_combinations_exit_2():
    r = _doctor("--limit", "gpu")
    assert r.returncode == 2 and "--hosts" in r.stderr
    r = _doctor("--python", "/no/such/python3")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1


def test_local_doctor_json_on_this_machine():
    r = _doctor("--json", "--model", "qwen3.5-27b")
    report = json.loads(r.stdout)
    assert report["schema_version"] == 1
    assert report["verdict"] in ("fast", "slow", "unknown")
    assert r.returncode == report["exit_code"]
    assert report["model"]["layers_total"] == 64
    facts = report["facts"]
    assert facts["schema"] == "fastpath.facts/1"
    assert isinstance(facts["nvcc_candidates"], list) and isinstance(facts["gpus"], list)
    for c in facts["nvcc_candidates"]:
        assert {"path", "version", "found_by", "major_matches_torch"} <= set(c)
    if not facts["gpus"] and not (facts.get("torch") or {}).get("cuda_available"):
        assert report["verdict"] == "unknown" and r.returncode == 0


def test_local_doctor_text_leads_with_verdict():
    r = _doctor("--model", "lfm2")
    first = r.stdout.splitlines()[0]
    assert first.split(":")[0] in ("FAST", "SLOW", "UNKNOWN")
    assert "Model plan" in r.stdout and "nvcc candidates" in r.stdout
