"""`fastpath verify MODEL --liger`: Liger's patch on the built model before both runs, the backward
through Liger's fused linear cross-entropy, PASS at fp32 limits on a tiny Qwen3.5 (CPU, Triton
interpreter with tests/support/liger_interpreter.py so Liger's kernels run), and bad input refused in one
line before any work: a family Liger does not patch, a CPU without the interpreter."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from liger_run import run_with_liger
from repo_paths import ROOT
from tiny_configs import LFM2_2L as TINY_LFM2
from tiny_configs import QWEN35_2L as TINY_QWEN35

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("liger_kernel")

SCRIPT = """
from fastpath.proof.run_paths import verify_model
result = verify_model({source!r}, dtype="fp32", seq_len=12, batch=2, backward=True, decode_tokens=2,
                      device="cpu", liger=True)
print(json.dumps(result.to_json(), default=str))
"""


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), HF_HUB_OFFLINE="1", **extra)
    if "TRITON_INTERPRET" not in extra:
        env.pop("TRITON_INTERPRET", None)
    return env


def test_verify_liger_passes_with_both_sets_of_kernels(tmp_path: Path) -> None:
    source = tmp_path / "tiny.json"
    source.write_text(json.dumps(TINY_QWEN35))
    doc = run_with_liger(SCRIPT.format(source=str(source)))
    # the same function; on CPU tensors Liger's and FLA's ops are in place but not fast: SLOW
    assert not doc["problems"] and doc["verdict"] == "SLOW", doc.get("problems")
    assert all("need a GPU" in line or "fla" in line.lower() for line in doc["slow_ops"]), doc["slow_ops"]
    assert "Liger Kernel on both paths: apply_liger_kernel_to_qwen3_5(model=...)" in doc["model"]["notes"]
    assert doc["grads"] and all(g["ok"] for g in doc["grads"])
    assert any(k.endswith(":triton") for k in doc["fast_calls"]), doc["fast_calls"]
    assert not any(k.endswith(":triton") for k in doc["reference_calls"]), doc["reference_calls"]
    for rows in (doc["explain"], doc["reference_explain"]):  # Liger on both sides
        ops = {r["op"] for r in rows if str(r.get("impl", "")).startswith("liger ")}
        assert {"rmsnorm", "swiglu", "lm_loss"} <= ops, ops


@pytest.mark.parametrize("model,interp,says", [
    (TINY_LFM2, "1", "has no patch for model_type 'lfm2'"),
    (TINY_QWEN35, None, "--liger needs a CUDA device (here: cpu)"),
])
def test_verify_liger_refuses_in_one_line(tmp_path: Path, model: dict, interp: str | None, says: str) -> None:
    source = tmp_path / "m.json"
    source.write_text(json.dumps(model))
    extra = {"TRITON_INTERPRET": interp} if interp else {}
    proc = subprocess.run([sys.executable, "-m", "fastpath", "verify", str(source), "--liger", "--device", "cpu"],
                          capture_output=True, text=True, timeout=600, env=_env(**extra), cwd=str(ROOT))
    assert proc.returncode == 2, (proc.stdout[-1500:], proc.stderr[-1500:])
    lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
    assert says in lines[-1], proc.stderr[-1500:]
    assert "Traceback" not in proc.stderr
