"""benchmarks/hub_wrappers_gpu.py (the device's `hub` part) run here on the CPU, in the
transformers 5.25 + kernels venv: each family asked for is measured (no import, build or step
error), and a family that raised makes the script exit 1. A stale import path once cost a whole device call:
the script reported every family as ModuleNotFoundError and still exited 0."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from repo_paths import BENCHMARKS, ROOT, venv_missing, venv_python

KERNELS_PY = venv_python("5.25.0-kernels")
SCRIPT = BENCHMARKS / "hub_wrappers_gpu.py"
FAMILIES = ("qwen3_5_text", "qwen3_next", "nemotron_h", "falcon_mamba")

pytestmark = pytest.mark.skipif(not KERNELS_PY.exists(),
                                reason=venv_missing("5.25.0-kernels"))


def _run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT / "src"))
    env.pop("USE_HUB_KERNELS", None)
    return subprocess.run([str(KERNELS_PY), str(SCRIPT), "--device", "cpu", *args],
                          capture_output=True, text=True, env=env, timeout=600, cwd=str(tmp_path))


# on the CPU, two of the four (the device runs all): Qwen3.5 (gated delta rule, and the fused
# LM-head loss that returns no logits under the interpreter) and Falcon-Mamba (Mamba-1)
CPU_FAMILIES = ("qwen3_5_text", "falcon_mamba")


def test_every_family_is_measured_on_the_cpu(tmp_path: Path) -> None:
    out = tmp_path / "hub.json"
    proc = _run(tmp_path, "--out", str(out), "--families", ",".join(CPU_FAMILIES))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    doc = json.loads(out.read_text())
    assert doc["transformers"].startswith("5.25"), doc["transformers"]
    assert set(doc["families"]) == set(CPU_FAMILIES) and set(CPU_FAMILIES) <= set(FAMILIES)
    for name, res in doc["families"].items():
        assert "error" not in res, (name, res.get("traceback"))
        ops_after = {row["op"] for row in res["explain_after"]}
        assert ops_after, name
        assert res["load_enabled"].get("error") is None, (name, res["load_enabled"])
        # the fast path's step and the float32 reference saw the same weights
        assert abs(res["loss"] - res["ref_loss"]) < 0.05 * abs(res["ref_loss"]), name


def test_a_family_that_raises_makes_the_script_fail(tmp_path: Path) -> None:
    """An unknown family is refused by argparse (exit 2) before any work; a family whose model
    cannot be built (here: a matrix_worker whose build raises, put in sys.modules first) is
    recorded with its error and the exit status is 1."""
    proc = _run(tmp_path, "--out", str(tmp_path / "x.json"), "--families", "no_such_model")
    assert proc.returncode == 2 and "unknown model type" in proc.stderr, proc.stderr
    assert not (tmp_path / "x.json").exists()
    code = (
        "import runpy, sys, types\n"
        "m = types.ModuleType('matrix_worker')\n"
        "def build(model_type):\n"
        "    raise RuntimeError('broken on purpose')\n"
        "m.build = build\n"
        "sys.modules['matrix_worker'] = m\n"
        "sys.argv = ['x', '--device', 'cpu', '--out', 'y.json', '--families', 'falcon_mamba']\n"
        f"runpy.run_path({str(SCRIPT)!r}, run_name='__main__')\n")
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT / "src"))
    broken = subprocess.run([str(KERNELS_PY), "-c", code], capture_output=True, text=True,
                            timeout=600, cwd=str(tmp_path), env=env)
    assert broken.returncode == 1, broken.stdout + broken.stderr[-2000:]
    doc = json.loads((tmp_path / "y.json").read_text())
    assert "broken on purpose" in doc["families"]["falcon_mamba"]["error"]
