"""Liger Kernel composed with fastpath.enable(), in either order, across the transformers matrix.

tests/support/liger_worker.py runs under each transformers (the system python's 5.17, .venvs/tf-*) and
reports per family Liger patches (qwen3_5, qwen3_5_moe, qwen3_next, falcon_h1): the model under
enable() + Liger (Liger on the built model, and Liger's class-level patch before enable()) against
plain transformers (logits, the next-token loss through Liger's fused linear cross-entropy, every
gradient, at verify's fp32 limits), which kernels really ran (fastpath's entry-point counters,
Liger's autograd nodes behind the loss), explain(), and what disable() left: Liger's patches in
place, fastpath's gone, the modeling module as it was before enable().

Liger's own kernels run in the Triton interpreter with the test-process adaptations of
tests/support/liger_interpreter.py (the interpreter passes float arguments unwrapped and leaves
libdevice's rsqrt unmapped). Findings per version are asserted as findings: liger-kernel 0.8.5
refuses transformers < 5.0 at import.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import Future, ThreadPoolExecutor
from functools import cache
from typing import Any

import pytest
from repo_paths import ROOT, SUPPORT, VENVS, venv_missing, venv_python

pytest.importorskip("torch")
pytest.importorskip("transformers")

WORKER = SUPPORT / "liger_worker.py"
FLA_DIR = VENVS / "fla"
LIGER_MISSING = subprocess.run([sys.executable, "-c", "import importlib.util, sys; "
                                "sys.exit(importlib.util.find_spec('liger_kernel') is None)"]).returncode != 0
pytestmark = pytest.mark.skipif(LIGER_MISSING, reason="liger-kernel not installed (pip install '.[test]')")

ALL = "qwen3_5_text,qwen3_5_moe_text,qwen3_next,falcon_h1"
DENSE = "qwen3_5_text,falcon_h1"
MOE = "qwen3_5_moe_text,qwen3_next"  # a minute or more each in the interpreter: one version, own job
# job -> (python: "system" or a .venvs/tf-* version, worker arguments); the longest first
JOBS: dict[str, tuple[str, tuple[str, ...]]] = {
    "5.17.0-moe": ("system", ("--families", MOE)),
    "5.17.0": ("system", ("--families", DENSE)),
    "5.17.0+fla": ("system", ("--families", "qwen3_5_text", "--fla", str(FLA_DIR))),
    "4.57.6": ("4.57.6", ("--families", "qwen3_5_text")),
    "5.12.1": ("5.12.1", ("--families", DENSE)),
    "5.23.0": ("5.23.0", ("--families", DENSE)),
    "5.25.0": ("5.25.0", ("--families", DENSE)),
}
ORDERS = ("enable_then_liger", "liger_then_enable")
# (family, newest transformers minor) where fastpath's kernels cannot run on CPU tensors: falcon_h1's
# <=5.14 cuda_kernels_forward enters torch.cuda.device() (routing/ssd_route.lift_device_gates)
CPU_UNROUTED = {"falcon_h1": (5, 14)}
FP32 = {"rel": 1e-5, "grad_rel": 1e-3}  # verify's fp32 limits (models/compare.py TOLERANCES)
LIGER_NODES = {"LigerRMSNormFunctionBackward", "LigerFusedLinearCrossEntropyFunctionBackward"}
LIGER_MLP_NODES = {"LigerSiLUMulFunctionBackward", "LigerFusedMoEFunctionBackward"}


def _python(where: str) -> str | None:
    if where == "system":
        import transformers

        return sys.executable if transformers.__version__ == "5.17.0" else None
    exe = venv_python(where)
    return str(exe) if exe.exists() else None


def _skip_reason(job: str) -> str | None:
    where, args = JOBS[job]
    if _python(where) is None:
        return venv_missing(where)
    if "--fla" in args and not (FLA_DIR / "fla" / "__init__.py").exists():
        return "fla-core not installed in .venvs/fla (scripts/setup_fla.sh)"
    return None


_POOL: ThreadPoolExecutor | None = None
_FUTURES: dict[str, Future] = {}


def _run(python: str, args: tuple[str, ...]) -> subprocess.CompletedProcess:
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONPATH=str(ROOT / "src"),
               TRITON_INTERPRET="1", USE_HUB_KERNELS="0")
    return subprocess.run([python, str(WORKER), *args], capture_output=True, text=True, env=env,
                          timeout=1500, cwd=str(ROOT))


def _start_all() -> None:
    """Every job at once on the first need (one per core): the longest (5.17, MoE) first."""
    global _POOL
    if _POOL is not None:
        return
    _POOL = ThreadPoolExecutor(max_workers=max(1, min(len(JOBS), os.cpu_count() or 1)))
    for job, (where, args) in JOBS.items():
        python = _python(where)
        if python is not None and _skip_reason(job) is None:
            _FUTURES[job] = _POOL.submit(_run, python, args)


@cache
def worker(job: str) -> dict[str, Any]:
    reason = _skip_reason(job)
    if reason:
        pytest.skip(reason)
    _start_all()
    proc = _FUTURES[job].result()
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _families(job: str) -> list[str]:
    args = JOBS[job][1]
    return args[args.index("--families") + 1].split(",")


CASES = [(job, family) for job in JOBS for family in _families(job)]


def _case(job: str, model_type: str) -> dict[str, Any]:
    out = worker(job)
    if "liger_import_error" in out:
        pytest.skip(f"finding: {out['liger_import_error']}")
    res = out["families"][model_type]
    if res.get("absent"):
        pytest.skip(f"transformers {out['transformers']} has no {model_type}")
    assert "error" not in res, res.get("traceback") or res["error"]
    assert "liger_unsupported" not in res, res["liger_unsupported"]
    return res


def _fastpath_rows(step: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for r in step["explain"] if not str(r["impl"]).startswith("liger ")]


@pytest.mark.parametrize("job,model_type,order", [(j, f, o) for j, f in CASES for o in ORDERS])
def test_both_sets_of_kernels_run_and_match_the_reference(job: str, model_type: str, order: str) -> None:
    res = _case(job, model_type)
    step = res[order]
    # the same function as plain transformers: logits, loss and every gradient
    assert step["logits_rel"] <= FP32["rel"], step["logits_rel"]
    assert step["loss_rel"] <= FP32["rel"], step["loss_rel"]
    assert step["grads_missing"] == []
    assert step["grad_rel_max"] <= FP32["grad_rel"], (step["grad_worst"], step["grad_rel_max"])
    # Liger's kernels ran: its autograd Functions are behind the loss, its forwards are in place
    assert step["fused_loss"]
    nodes = set(step["nodes"])
    assert LIGER_NODES <= nodes and nodes & LIGER_MLP_NODES, sorted(nodes)
    ops = {r["op"] for r in step["explain"] if str(r["impl"]).startswith("liger ")}
    assert {"rmsnorm", "swiglu", "lm_loss"} <= ops, ops
    assert step["liger_forwards"]["<root>"] == "lce_forward"
    # fastpath's kernels ran too (counted at their entry points) and explain() says so
    triton = {k: n for k, n in step["calls"].items() if k.endswith(":triton") and n}
    if _cpu_unrouted(job, model_type):
        assert not triton, step["calls"]  # the documented CPU limit; on a GPU they run
        return
    assert triton, step["calls"]
    assert any(r["fast"] and str(r["impl"]).startswith("fastpath") for r in _fastpath_rows(step))


def _cpu_unrouted(job: str, model_type: str) -> bool:
    newest = CPU_UNROUTED.get(model_type)
    version = tuple(int(x) for x in worker(job)["transformers"].split(".")[:2])
    return newest is not None and version <= newest


@pytest.mark.parametrize("job,model_type", CASES)
def test_disable_keeps_liger_and_restores_exactly(job: str, model_type: str) -> None:
    res = _case(job, model_type)
    for order in ORDERS:
        after = res[f"{order}_disabled"]
        assert after["calls"] == {}, (order, after["calls"])  # fastpath's kernels: gone
        assert after["logits_rel"] <= FP32["rel"], (order, after["logits_rel"])
        assert after["liger_forwards"] == res[order]["liger_forwards"], order  # Liger's: all still there
        assert not any(str(r["impl"]).startswith("fastpath") for r in _fastpath_rows(after)), order
    # Liger applied after enable(): the modeling module differs from before enable() only where
    # Liger replaced a name, and holds nothing of fastpath's
    assert res["after_disable_changed_not_liger"] == []
    assert res["after_disable_fastpath_names"] == []
    # Liger applied before enable(): disable() leaves the module exactly as enable() found it
    assert res["liger_then_enable_restored"] == []


@pytest.mark.parametrize("job,model_type", CASES)
def test_enable_again_after_disable_routes_both_again(job: str, model_type: str) -> None:
    res = _case(job, model_type)
    again = res["reenable"]
    assert again["logits_rel"] <= FP32["rel"]
    if not _cpu_unrouted(job, model_type):
        assert any(k.endswith(":triton") and n for k, n in again["calls"].items()), again["calls"]
    assert again["liger_forwards"] == res["liger_then_enable"]["liger_forwards"]


@pytest.mark.parametrize("job,model_type", CASES)
def test_explain_notes_a_model_built_before_liger_class_level_patch(job: str, model_type: str) -> None:
    """Liger's documented pitfall: its class-level call does not reach a model built before it."""
    res = _case(job, model_type)
    stale = res["built_before_liger"]
    assert not any(not name.startswith("<root>") for name in stale["liger_forwards"]), stale
    assert any("Liger's class-level patch replaced" in n and "after this model was built" in n
               for n in stale["notes"]), stale["notes"]


def test_fla_gated_norm_composes_with_liger() -> None:
    """With fla-core importable, enable() also routes GatedDeltaNet's gated RMSNorm to FLA's fused
    kernel (norm_route); Liger's RMSNorm leaves that class alone and both run."""
    res = _case("5.17.0+fla", "qwen3_5_text")
    for order in ORDERS:
        assert res[order]["calls"].get("gated_rmsnorm:fla", 0) > 0, res[order]["calls"]
        norm = [r for r in res[order]["explain"] if r["op"] == "gated_rmsnorm"]
        assert norm and all(r["impl"].startswith("fla fused_norm_gate") for r in norm), norm


def test_liger_refuses_transformers_4_57_as_a_finding() -> None:
    """liger-kernel 0.8.5's monkey_patch.py raises ImportError below transformers 5.0: on 4.57
    there is nothing to compose with (apply_liger says so in one line)."""
    if _skip_reason("4.57.6"):
        pytest.skip(_skip_reason("4.57.6"))
    out = worker("4.57.6")
    assert out["transformers"] == "4.57.6"
    assert "requires transformers >= 5.0.0" in out.get("liger_import_error", ""), out


def test_liger_imports_on_a_machine_without_cuda() -> None:
    """liger_kernel and its patch functions import with CPU torch (no CUDA): the doctor's and
    bench's checks can run anywhere; only its kernels need a GPU (or the interpreter)."""
    code = ("import torch, liger_kernel, liger_kernel.transformers as lt; "
            "assert not torch.cuda.is_available(); "
            "print(callable(lt.apply_liger_kernel_to_qwen3_5), callable(lt.apply_liger_kernel_to_falcon_h1))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, CUDA_VISIBLE_DEVICES=""))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["True", "True"]


def test_explain_never_calls_liger_fast_on_cpu_tensors() -> None:
    """Liger's ops patched onto a CPU model are in place but cannot run there (its Triton kernels
    need a GPU): explain() names them, says why, and does not count them fast."""
    code = ("import sys; sys.path.insert(0, " + repr(str(SUPPORT)) + "); from matrix_worker import build; import fastpath, json; "
            "from liger_kernel.transformers import apply_liger_kernel_to_qwen3_5 as apply; "
            "m = build('qwen3_5_text'); apply(model=m); "
            "print(json.dumps([r for r in fastpath.explain(m).rows if r['impl'].startswith('liger')]))")
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    env.pop("TRITON_INTERPRET", None)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env,
                          cwd=str(ROOT))
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = json.loads(proc.stdout.strip().splitlines()[-1])
    assert rows, "no Liger row: the patch did not apply"
    assert all(not r["fast"] and "need a GPU" in r["impl"] for r in rows), rows


@pytest.mark.gpu
def test_gpu_both_orders_every_family() -> None:  # pragma: no cover - device only
    """The same worker on CUDA tensors (no interpreter, no adaptations), fp32 with TF32 off."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]))
    env.pop("TRITON_INTERPRET", None)
    # FLA and Dao hidden: the reference is transformers' torch path (FLA's gated backward refuses
    # Hopper with Triton < 3.7.1, FLA #640, and transformers binds FLA itself when importable)
    proc = subprocess.run([sys.executable, str(WORKER), "--families", ALL, "--device", "cuda",
                           "--hide", "fla,causal_conv1d,causal_conv1d_cuda", "--liger-alone"],
                          capture_output=True, text=True, env=env, timeout=900, cwd=str(ROOT))
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    for model_type, res in out["families"].items():
        if res.get("absent"):
            continue
        assert "error" not in res, (model_type, res.get("traceback"))
        # fastpath adds no error of its own: the composed steps stay within verify's fp32 limits or
        # within twice what Liger alone brings (Liger's kernels are not fp32-exact on every family)
        alone = res["liger_alone"]
        rel_limit = max(FP32["rel"], 2 * alone["logits_rel"])
        grad_limit = max(FP32["grad_rel"], 2 * alone["grad_rel_max"])
        for order in ORDERS:
            step = res[order]
            assert step["logits_rel"] <= rel_limit and step["grad_rel_max"] <= grad_limit, (
                model_type, order, step, {"liger_alone": {k: alone[k] for k in ("logits_rel", "grad_rel_max")}})
            assert LIGER_NODES <= set(step["nodes"]), (model_type, order, step["nodes"])
            assert any(k.endswith(":triton") for k in step["calls"]), (model_type, order, step["calls"])
        assert res["liger_then_enable_restored"] == [] and res["after_disable_changed_not_liger"] == []
