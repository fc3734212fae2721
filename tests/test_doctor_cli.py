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


def test_cli_on_a_fake_gpu_machine_exits_1_for_slow(tmp_path):
    """Real CLI, real probe, fake machine: an sm_120 GPU (fake nvidia-smi), nvcc 12.8 only."""
    import os

    from fakeenv import write_dpkg_status, write_fake_nvcc, write_fake_nvidia_smi

    root, bindir, site = tmp_path / "root", tmp_path / "bin", tmp_path / "site"
    site.mkdir()
    write_fake_nvcc(root / "usr/local/cuda-12.8/bin", "12.8")
    write_fake_nvidia_smi(bindir, [{"name": "NVIDIA RTX PRO 6000", "cc": "12.0", "mib": 97887}],
                          "575.57.08", "12.9")
    write_dpkg_status(root / "var/lib/dpkg/status", [("cuda-nvcc-12-8", "12.8.93-1")])
    env = dict(os.environ, PATH=os.pathsep.join([str(bindir), "/usr/bin", "/bin"]),
               FASTPATH_PROBE_ROOT=str(root), FASTPATH_PROBE_SITE_PACKAGES=str(site),
               FASTPATH_PROBE_SKIP="imports,rpm")
    r = subprocess.run([sys.executable, "-m", "fastpath", "doctor", "--json", "--model",
                        "qwen3.5-27b"], capture_output=True, text=True, env=env, timeout=120)
    report = json.loads(r.stdout)
    assert report["verdict"] == "slow" and r.returncode == 1
    assert report["facts"]["gpus"][0]["compute_capability"] == "12.0"
    (cand,) = report["facts"]["nvcc_candidates"]
    assert cand["version"] == "12.8.93" and "/usr/local/cuda-*" in cand["found_by"]
    assert any(f.startswith("dpkg cuda-nvcc-12-8") for f in cand["found_by"])
    assert report["model"]["layers_slow"] == 48
