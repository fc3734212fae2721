"""benchmarks/kernel_compile_check.py on the CPU: every fastpath Triton kernel family (conv, SSD,
selective scan, the decode updates, GatedDeltaNet gates, sigmoid gate, rotary, zero-centred RMSNorm)
compiles for sm_90, sm_100 and sm_120 with the installed Triton's bundled ptxas, 0 failures, and the
rows carry ptxas's numbers (the script's point is catching GPU-compiler refusals, and Blackwell's
smaller shared memory, without a GPU). CI runs --quick (default configs, one shape per family,
bf16), under the Triton installed here (every arch) and under today's stack's (the venv of
scripts/setup_default_stack.sh; sm_120); the full sweep is the benchmark (BENCHMARKS.md). Runs in a
subprocess: the script clears TRITON_INTERPRET for itself."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from repo_paths import ROOT, venv_missing, venv_python

triton = pytest.importorskip("triton")

SCRIPT = ROOT / "benchmarks" / "kernel_compile_check.py"
PTXAS = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
ARCHS = (90, 100, 120)
FAMILIES = {"causal_conv1d", "ssd", "selective_scan", "state_update", "gdn_gates", "sigmoid_gate",
            "rotary", "swiglu", "zc_rmsnorm", "linear_ce", "state_stats", "embedding"}


def _stack_python(stack: str) -> tuple[str, str]:
    """(python, its Triton version) of `stack`: "installed" is this interpreter; "today" is the
    venv of what `pip install ".[kernels]"` resolves today (scripts/setup_default_stack.sh), whose
    Triton is the one new users compile with (3.8 beside torch 2.14 on 2026-12-06)."""
    if stack == "installed":
        if not PTXAS.exists():
            pytest.skip("this Triton wheel has no bundled ptxas")
        return sys.executable, triton.__version__
    python = venv_python("default")
    if not python.exists():
        pytest.skip(venv_missing("default"))
    probe = subprocess.run([str(python), "-c", "import triton; print(triton.__version__)"],
                           capture_output=True, text=True, timeout=300)
    assert probe.returncode == 0, probe.stderr[-2000:]
    return str(python), probe.stdout.strip()


# the installed Triton compiles for every arch; today's stack for the seed's Blackwell card (sm_120),
# the arch whose ptxas and shared-memory limit differ most from the others (and half the CI time)
STACK_ARCHS = {"installed": ARCHS, "today": (120,)}


def _leftovers(scratch: Path) -> list[str]:
    """What the script left in its TMPDIR of its own temporary folders and files."""
    return [p.name for p in scratch.iterdir() if p.name.startswith(("fastpath-", "compile-sm"))]


@pytest.mark.parametrize("stack", ["installed", "today"])
def test_every_kernel_family_compiles_for_hopper_and_blackwell(tmp_path: Path, stack: str) -> None:
    python, version = _stack_python(stack)
    archs = STACK_ARCHS[stack]
    out = tmp_path / "rows.json"
    scratch = tmp_path / "tmp"  # the script's temporary folders (TMPDIR): none may outlive it
    scratch.mkdir()
    env = {**os.environ, "TRITON_CACHE_DIR": str(tmp_path / "cache"), "PYTHONPATH": str(ROOT / "src"),
           "TMPDIR": str(scratch)}
    proc = subprocess.run([python, str(SCRIPT), "--quick", "--dtype", "bf16", "--jobs", "2",
                           "--arch", *map(str, archs), "--out", str(out)],
                          capture_output=True, text=True, env=env, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert not _leftovers(scratch)
    data = json.loads(out.read_text())
    assert data["archs"] == list(archs) and data["triton"] == version
    rows = data["rows"]
    assert not [r for r in rows if "error" in r]
    for arch in archs:
        mine = [r for r in rows if r["arch"] == arch]
        assert {r["family"] for r in mine} == FAMILIES, arch
        assert data["summary"][str(arch)]["failed"] == 0
        for row in mine:
            assert row["ok"] and 0 < row["regs"] <= 255, row
            assert row["shared_bytes"] <= data["shared_limit_bytes"][str(arch)] or row.get("autotuned")
        gates = [r for r in mine if r["kernel"] in ("_gate_fwd_kernel", "_gate_bwd_kernel")]
        assert {r["kernel"] for r in gates} == {"_gate_fwd_kernel", "_gate_bwd_kernel"}
        for row in gates:  # an elementwise kernel has nothing to spill
            assert row["spill_store_bytes"] == 0 and row["constexprs"]["BLOCK_D"] == 1024
            assert "*bf16" in row["pointer_dtypes"]
        norms = [r for r in mine if r["family"] == "zc_rmsnorm" and r["case"].startswith("hidden 5120")]
        assert {r["kernel"] for r in norms} == {"_zc_rmsnorm_fwd_kernel", "_zc_rmsnorm_bwd_kernel"}
        for row in norms:  # Qwen3.5-27B's hidden rows fit in registers both ways
            assert row["spill_store_bytes"] == 0 and row["constexprs"]["BLOCK_H"] == 8192


def test_markdown_table_of_saved_rows(tmp_path: Path) -> None:
    """--table prints the registers / spills / shared-memory table of an earlier --out file:
    per kernel and arch, binaries ok / recorded, max registers, spilling binaries (max bytes),
    max shared bytes, failures in bold."""
    rows = [
        {"arch": 90, "family": "ssd", "kernel": "_states_kernel", "ok": True, "regs": 200,
         "spill_store_bytes": 0, "shared_bytes": 99848},
        {"arch": 90, "family": "ssd", "kernel": "_states_kernel", "ok": True, "regs": 255,
         "spill_store_bytes": 64, "shared_bytes": 166928},
        {"arch": 120, "family": "ssd", "kernel": "_states_kernel", "ok": False, "regs": 255,
         "spill_store_bytes": 0, "shared_bytes": 166928, "error": "OutOfResources at load"},
        {"arch": 120, "family": "ssd", "kernel": "_states_kernel", "ok": True, "regs": 162,
         "spill_store_bytes": 0, "shared_bytes": 67080},
    ]
    saved = tmp_path / "rows.json"
    saved.write_text(json.dumps({"archs": [90, 120], "rows": rows}))
    # with no TRITON_CACHE_DIR named, the script makes its own fresh cache and removes it at exit
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "TRITON_CACHE_DIR"}
    proc = subprocess.run([sys.executable, str(SCRIPT), "--table", str(saved)],
                          capture_output=True, text=True, timeout=300, env={**env, "TMPDIR": str(scratch)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert list(scratch.iterdir()) == []
    lines = proc.stdout.strip().splitlines()
    assert lines[0].startswith("| family | kernel | sm_90:") and "sm_120:" in lines[0]
    assert lines[2] == ("| ssd | `_states_kernel` | 2/2, 255, 1 (64 B), 166928 "
                        "| 1/2, 162, 0, 67080 **1 FAILED** |")


def test_ctrl_c_keeps_finished_rows_and_no_temp_folders(tmp_path: Path) -> None:
    """Ctrl-C during a parallel run: exit 130 with one line a process, the rows the children
    finished in --out, and none of the script's temporary folders left."""
    import signal
    import time

    if not PTXAS.exists():
        pytest.skip("this Triton wheel has no bundled ptxas")
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    out = tmp_path / "rows.json"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_CACHE_DIR"}
    env.update(TMPDIR=str(scratch), PYTHONPATH=str(ROOT / "src"))
    proc = subprocess.Popen([sys.executable, str(SCRIPT), "--quick", "--dtype", "bf16", "--jobs", "2",
                             "--arch", "90", "120", "--out", str(out)], env=env, text=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.time() + 300
    while not any(p.stat().st_size > 0 for p in scratch.glob("fastpath-compile-check-*/sm*.json")):
        assert proc.poll() is None and time.time() < deadline, "no child wrote a row"
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGINT)
    err = proc.communicate(timeout=120)[1]
    assert proc.returncode == 130, err[-2000:]
    assert "kernel_compile_check: interrupted" in err and "Traceback" not in err, err[-2000:]
    rows = json.loads(out.read_text())["rows"]
    assert rows and all(r.get("ok") for r in rows if r["family"] != "(child)"), rows[:3]
    assert not _leftovers(scratch)
