"""benchmarks/kernel_compile_check.py on the CPU: the recorded launches of the sigmoid-gate
kernels compile for sm_90 with the installed Triton's bundled ptxas, and the rows carry ptxas's
numbers (the script's whole point is catching GPU-compiler refusals without a GPU).
Runs in a subprocess: the script clears TRITON_INTERPRET for itself."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

triton = pytest.importorskip("triton")

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "kernel_compile_check.py"
PTXAS = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"


@pytest.mark.skipif(not PTXAS.exists(), reason="this Triton wheel has no bundled ptxas")
def test_sigmoid_gate_compiles_for_sm90(tmp_path: Path) -> None:
    out = tmp_path / "rows.json"
    env = {**os.environ, "TRITON_CACHE_DIR": str(tmp_path / "cache")}
    proc = subprocess.run([sys.executable, str(SCRIPT), "--only", "sigmoid_gate", "--dtype", "bf16",
                           "--out", str(out)], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    data = json.loads(out.read_text())
    assert data["arch"] == 90 and data["triton"] == triton.__version__
    kernels = {row["kernel"] for row in data["rows"]}
    assert kernels == {"_gate_fwd_kernel", "_gate_bwd_kernel"}
    for row in data["rows"]:
        assert row["ok"] and 0 < row["regs"] <= 255
        assert row["spill_store_bytes"] == 0  # an elementwise kernel has nothing to spill
        assert row["constexprs"]["BLOCK_D"] == 1024 and "*bf16" in row["pointer_dtypes"]
