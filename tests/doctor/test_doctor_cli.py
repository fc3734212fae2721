"""`fastpath doctor` through the real CLI in a subprocess: exit codes, one-line errors, JSON."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from fastpath.doctor.diagnosis import VERDICT_EXIT


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
    assert report["verdict"] in ("fast", "slow", "blocked", "unknown")
    assert r.returncode == report["exit_code"] == VERDICT_EXIT[report["verdict"]]
    assert report["headline"].startswith(report["verdict"].upper() + ":")
    assert report["model"]["layers_total"] == 64
    facts = report["facts"]
    assert facts["schema"] == "fastpath.facts/1"
    assert isinstance(facts["nvcc_candidates"], list) and isinstance(facts["gpus"], list)
    for c in facts["nvcc_candidates"]:
        assert {"path", "version", "found_by", "major_matches_torch"} <= set(c)
    if not facts["gpus"] and not (facts.get("torch") or {}).get("cuda_available"):
        assert report["verdict"] in ("blocked", "unknown") and "--gpu" in report["headline"]


def test_local_doctor_text_leads_with_verdict():
    r = _doctor("--model", "lfm2")
    first = r.stdout.splitlines()[0]
    assert first.split(":")[0] in ("FAST", "SLOW", "BLOCKED", "UNKNOWN")
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


@pytest.mark.parametrize("args,words", [
    (["--hosts", "HOSTS", "--jobs", "0"], "--jobs: must be at least 1"),
    (["--on", ""], "--on needs a command prefix"),
    (["--on", "   "], "--on needs a command prefix"),
    (["--gpu", "H9000"], "--gpu 'H9000'"),
    (["--jobs", "2"], "--limit/--jobs need --hosts"),
])
def test_usage_errors_exit_2_with_one_line(tmp_path, args, words):
    hosts = tmp_path / "hosts"
    hosts.write_text("env\n")
    r = _doctor(*[str(hosts) if a == "HOSTS" else a for a in args])
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.count("\n") == 1 and words in r.stderr, r.stderr


def test_json_is_one_document_also_when_the_target_cannot_be_diagnosed(tmp_path):
    r = _doctor("--json", "--python", "/bin/false")  # runs, prints nothing: no facts
    report = json.loads(r.stdout)
    assert r.returncode == 3 and report["exit_code"] == 3 and report["verdict"] == "error"
    assert "probe under /bin/false failed" in report["error"] and report["target"] == "/bin/false"
    r = _doctor("--json", "--python", "/no/such/python3")
    report = json.loads(r.stdout)
    assert r.returncode == 2 and report["exit_code"] == 2 and "no such interpreter" in report["error"]
    assert r.stderr.count("\n") == 1


def test_help_documents_the_exit_codes_and_gpu():
    r = _doctor("--help")
    text = " ".join(r.stdout.split())
    assert "3 could not diagnose" in text and "--gpu SPEC" in text and "sm_120" in text


def test_unknown_model_type_names_the_installed_transformers(tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"model_type": "llama", "num_hidden_layers": 4}))
    env_facts = dict(__import__("os").environ, FASTPATH_PROBE_SKIP="imports,rpm")
    r = subprocess.run([sys.executable, "-m", "fastpath", "doctor", "--json", "--model", str(cfg)],
                       capture_output=True, text=True, env=env_facts, timeout=120)
    report = json.loads(r.stdout)
    import transformers

    assert report["model"]["summary"] == [
        f"no kernel ops in llama under transformers {transformers.__version__}: nothing for "
        "fastpath to fix"]


@pytest.mark.parametrize("config,words", [
    ({"num_hidden_layers": "many"}, "num_hidden_layers must be a positive integer"),  # sizes
    ({}, "cannot read the layer layout"),  # sizes fine, but no layers to plan
])
def test_unreadable_layer_fields_are_one_line_exit_2(tmp_path, config, words):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"model_type": "qwen3_5_text", **config}))
    r = _doctor("--probe", "static", "--model", str(cfg))
    assert r.returncode == 2 and r.stdout == "" and r.stderr.count("\n") == 1, r.stderr
    assert words in r.stderr, r.stderr


def test_on_with_a_missing_python_falls_back_to_sh_and_says_so():
    r = _doctor("--json", "--on", "env", "--python", "/nonexistent/python3")
    report = json.loads(r.stdout)
    assert report["facts"]["probe"]["kind"] == "sh"
    assert "sh probe only" in report["headline"] and "/nonexistent/python3" in report["headline"]


def test_bare_word_in_a_hosts_file_is_a_host_to_ssh_to(tmp_path):
    from fastpath.doctor.inventory import load_targets

    hosts = tmp_path / "hosts"
    hosts.write_text("gpu-node-1\nssh -p 2222 gpu-node-2  # a prefix\n")
    first, second = load_targets(hosts)
    assert first.name == "gpu-node-1" and first.prefix[0] == "ssh"
    assert first.prefix[-2:] == ["--", "gpu-node-1"] and "BatchMode=yes" in first.prefix
    assert second.prefix == ["ssh", "-p", "2222", "gpu-node-2"]


def test_fleet_json_is_one_document_also_for_a_bad_hosts_file(tmp_path):
    r = _doctor("--json", "--hosts", str(tmp_path / "missing.ini"))
    report = json.loads(r.stdout)
    assert r.returncode == 2 and report["exit_code"] == 2 and "no such file" in report["error"]
