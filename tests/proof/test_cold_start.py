"""benchmarks/cold_start.py at tiny size on the CPU (kernels in Triton's interpreter): every
measurement is its own process on its own cache folder, the JSON has every run with ordered
marks, and the warmup scenario carries `fastpath warmup`'s own refusal (nothing compiles here)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from repo_paths import ROOT
from tiny_configs import QWEN35_2L as TINY_QWEN35

pytest.importorskip("torch")
pytest.importorskip("transformers")



def test_cold_start_json_on_cpu(tmp_path):
    source = tmp_path / "tiny.json"
    source.write_text(json.dumps(TINY_QWEN35))
    out = tmp_path / "out"
    env = {**os.environ, "TRITON_INTERPRET": "1",
           "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT / "src"), os.environ.get("PYTHONPATH")) if p)}
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "cold_start.py"), "--model", str(source),
                           "--layers", "2", "--device", "cpu", "--batch", "1", "--seq", "16", "--dtype", "fp32",
                           "--out", str(out)], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads((out / "cold_start.json").read_text())
    assert doc["benchmark"] == "cold_start" and doc["not_timing_data"]
    assert doc["settings"]["configs"] == ["reference", "fastpath"]
    runs = {(r["config"], r["scenario"]): r for r in doc["runs"]}
    assert set(runs) == {(c, s) for c in ("reference", "fastpath")
                         for s in ("shipped", "cold", "warm", "warmup", "seeded")}
    for config in ("reference", "fastpath"):
        cold, warm = runs[(config, "cold")], runs[(config, "warm")]
        assert cold["cache_before"] == {"kernels": 0, "autotune": 0}  # a fresh, empty folder
        assert warm["cache_dir"] == cold["cache_dir"]  # the second process reuses it
        for run in (cold, warm):
            marks = run["marks_s"]
            names = ["imports", "enable", "seeded", "built", "first_prefill", "first_train"]
            names = [n for n in names if n in marks]
            assert names[0] == "imports" and names[-3:] == ["built", "first_prefill", "first_train"]
            assert ("enable" in marks) == (config == "fastpath")
            values = [marks[n] for n in names]
            assert values == sorted(values) and 0 < values[0] and values[-1] <= run["wall_s"]
            assert run["prefill_after_build_s"] == pytest.approx(marks["first_prefill"] - marks["built"], abs=2e-3)
            assert run["train_step_s"] == pytest.approx(marks["first_train"] - marks["first_prefill"], abs=2e-3)
            assert set(run["targets_met"]) == {"prefill_after_build", "train_step"}
            assert run["cache_added"] == {"kernels": 0, "autotune": 0}  # the interpreter compiles nothing
            assert "seeded" not in marks and "decisions" not in run  # no decisions file: nothing seeded
    for scenario in ("shipped", "warmup", "seeded"):
        assert "does not enable" in runs[("reference", scenario)]["skipped"]
    shipped = runs[("fastpath", "shipped")]  # enable() picked the file itself: none for a CPU
    assert shipped["cache_before"] == {"kernels": 0, "autotune": 0} and shipped["cache_dir"] != runs[
        ("fastpath", "cold")]["cache_dir"]
    assert "decisions" not in shipped and shipped["marks_s"]["first_train"] <= shipped["wall_s"]
    warmup = runs[("fastpath", "warmup")]
    assert warmup["warmup"]["exit"] == 3 and "TRITON_INTERPRET=1" in warmup["skipped"]
    assert "no autotune decisions" in runs[("fastpath", "seeded")]["skipped"]  # the warmup saved none


def test_seeded_scenario_hands_the_decisions_file_to_the_process(tmp_path):
    """On a CPU the file is read and refused (decisions are for the GPU they were recorded on):
    the plumbing from --decisions to the process's seed() is what runs here."""
    source = tmp_path / "tiny.json"
    source.write_text(json.dumps(TINY_QWEN35))
    decisions = tmp_path / "decisions.json"
    decisions.write_text(json.dumps({"schema": "fastpath.autotune-decisions/1",
                                     "device": {"name": "NVIDIA H200", "capability": [9, 0]},
                                     "versions": {}, "kernels": {}}))
    out = tmp_path / "out"
    env = {**os.environ, "TRITON_INTERPRET": "1",
           "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT / "src"), os.environ.get("PYTHONPATH")) if p)}
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "cold_start.py"), "--model", str(source),
                           "--layers", "2", "--device", "cpu", "--batch", "1", "--seq", "8", "--dtype", "fp32",
                           "--configs", "fastpath", "--scenarios", "seeded", "--decisions", str(decisions),
                           "--out", str(out)], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    [run] = json.loads((out / "cold_start.json").read_text())["runs"]
    assert run["scenario"] == "seeded" and run["decisions_file"] == str(decisions)
    assert run["cache_before"] == {"kernels": 0, "autotune": 0}
    assert run["decisions"] == ("autotune decisions not applied: recorded on compute capability 9.0, this "
                                "device is not a CUDA GPU")
    assert run["marks_s"]["enable"] <= run["marks_s"]["seeded"] <= run["marks_s"]["built"]


def test_unknown_config_is_one_line_exit_2(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "cold_start.py"), "--configs", "nope",
                           "--out", str(tmp_path)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "nope" in proc.stderr
