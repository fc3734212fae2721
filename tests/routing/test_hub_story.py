"""With transformers 5.25 and `kernels` installed the doctor said causal_conv1d
goes to the Hub kernel even after fastpath.enable() ("after fastpath.enable(): hub-kernel"),
while enable() routes it to fastpath. Now one function (fastpath.shared.hub_kernels_env) decides whether
Hub kernels are on, before and after enable(), for the doctor's plan and for routing.

Each case runs tests/support/hub_story_worker.py in the interpreter of a side-by-side venv (as
test_enable_matrix.py does): the real probe and plan of that environment, then a real enable()
and explain() on a tiny Qwen3.5; the two must name the same implementation for every op.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from repo_paths import ROOT, SUPPORT, venv_python

pytest.importorskip("torch")
pytest.importorskip("transformers")

KERNELS_PY = venv_python("5.25.0-kernels")
CASES = {  # name -> (interpreter, USE_HUB_KERNELS or None)
    "5.25-kernels-unset": (KERNELS_PY, None),
    "5.25-kernels-0": (KERNELS_PY, "0"),
    "5.25-kernels-1": (KERNELS_PY, "1"),
    "this-python-unset": (Path(sys.executable), None),
}
# explain() names the recurrent op by transformers' own attribute; the plan by the FLA function
SAME_OP = {"recurrent_gated_delta_rule": "fused_recurrent_gated_delta_rule"}


def _run(python: Path, value: str | None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONPATH=str(ROOT / "src"))
    env.pop("USE_HUB_KERNELS", None)
    if value is not None:
        env["USE_HUB_KERNELS"] = value
    return subprocess.run([str(python), str(SUPPORT / "hub_story_worker.py")],
                          capture_output=True, text=True, env=env, timeout=900, cwd=str(ROOT))


@cache
def _all() -> dict[str, Any]:
    runnable = {k: v for k, v in CASES.items() if v[0].exists()}
    with ThreadPoolExecutor(max_workers=max(1, min(2, os.cpu_count() or 1))) as pool:
        futures = {k: pool.submit(_run, *v) for k, v in runnable.items()}
    out = {}
    for name, future in futures.items():
        proc = future.result()
        assert proc.returncode == 0, proc.stderr[-3000:]
        out[name] = json.loads(proc.stdout)
    return out


def story(name: str) -> dict[str, Any]:
    data = _all().get(name)
    if data is None:
        pytest.skip(f"{CASES[name][0]} missing (run scripts/setup_transformers_matrix.sh)")
    return data


def who_serves(impl: str) -> str:
    """explain()'s implementation, in the plan's words (plan.after_enable's `by`)."""
    if impl.startswith("fastpath"):
        return "fastpath"
    if impl.startswith("hub kernel"):
        return "hub"
    if impl.split(" ")[0] in ("causal_conv1d", "fla", "mamba_ssm", "fla-fwd+torch-bwd"):
        return "package"
    return "torch"


@pytest.mark.parametrize("name", ["5.25-kernels-unset", "5.25-kernels-0", "this-python-unset"])
def test_the_plan_and_explain_tell_the_same_story(name: str) -> None:
    data = story(name)
    planned = {op: row["by"] for op, row in data["doctor"].items()}
    # the plan's ops (explain() also lists ops the doctor does not plan: the norm, glue ops)
    explained = {SAME_OP.get(op, op): who_serves(impl) for op, impl in data["explain"].items()
                 if SAME_OP.get(op, op) in planned}
    assert planned == explained, (planned, data["explain"])
    assert planned["causal_conv1d_fn"] == planned["causal_conv1d_update"] == "fastpath"


def test_before_enable_the_525_default_is_the_hub_and_after_it_is_not() -> None:
    data = story("5.25-kernels-unset")
    assert data["transformers"] == "5.25.0"
    assert {row["impl"] for row in data["doctor"].values()} == {"hub-kernel"}  # from_pretrained's default
    assert all(row["with_fastpath"] != "hub-kernel" for row in data["doctor"].values())
    assert data["env"] is None and data["env_after_enable"] == "0"
    assert not data["explain_notes"]  # after enable() nothing kernelizes


def test_a_users_use_hub_kernels_1_is_kept_and_both_say_hub() -> None:
    data = story("5.25-kernels-1")
    assert data["env_after_enable"] == "1"
    assert {row["by"] for row in data["doctor"].values()} == {"hub"}
    assert any("was set by you" in n for n in data["notes"])
    assert any("kernelizes" in n for n in data["explain_notes"])


def test_use_hub_kernels_is_read_as_transformers_reads_it() -> None:
    semantics = story("5.25-kernels-unset")["env_semantics"]
    assert semantics, "transformers 5.25 reads USE_HUB_KERNELS at call time"
    differs = {v: pair for v, pair in semantics.items() if pair[0] != pair[1]}
    assert not differs, differs


def test_the_doctor_report_no_longer_says_hub_kernel_after_enable() -> None:
    """The text a user read in the 5.25 + `kernels` venv: 'after fastpath.enable(): hub-kernel'
    for causal_conv1d, where enable() routes it to fastpath."""
    if not KERNELS_PY.exists():
        pytest.skip(f"{KERNELS_PY} missing (run scripts/setup_transformers_matrix.sh)")
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), COLUMNS="80")
    env.pop("USE_HUB_KERNELS", None)
    proc = subprocess.run([str(KERNELS_PY), "-m", "fastpath", "doctor", "--model", "qwen3.5-27b",
                           "--gpu", "H100", "--probe", "static"], capture_output=True, text=True,
                          env=env, timeout=300)
    text = " ".join(proc.stdout.split())
    assert "transformers 5.25.0" in text, proc.stdout + proc.stderr
    assert "after fastpath.enable(): hub-kernel" not in text
    assert text.count("after fastpath.enable(): fastpath") == 2  # causal_conv1d_fn and _update
