"""What every class-forward route to one of fastpath's own fused kernels promises, checked for
each (routing/zc_norm_route.py: Qwen3.5's zero-centred RMSNorm; routing/swiglu_route.py: the gated
MLP's silu(gate) * up; routing/add_norm_route.py: the decoder layer's residual add fused into its
post-attention norm, switched on with its FASTPATH_* variable set to auto) on a tiny random Qwen3.5: the routed model computes what transformers
computes (loss and every gradient, float32 and bfloat16), explain() shows every routed module,
disable() restores the class exactly; suspended() runs transformers' forward and resumes; CPU tensors without the interpreter keep transformers' forward bit for bit (explain()
says why); its FASTPATH_* switch turns the route off with explain() saying so, a bad value is a
usage error; mode `fastpath` without Triton makes enable() fail in one line.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from repo_paths import ROOT  # noqa: E402
from test_zc_norm_route import tiny_qwen3_5  # noqa: E402

import fastpath  # noqa: E402
from fastpath.kernels.counters import CALLS  # noqa: E402
from fastpath.routing import add_norm_route, swiglu_route, zc_norm_route  # noqa: E402
from fastpath.routing.engine import suspended  # noqa: E402
from fastpath.shared.errors import UsageError  # noqa: E402

INTERP = os.environ.get("TRITON_INTERPRET") == "1"
IDS = torch.randint(3, 64, (2, 9), generator=torch.Generator().manual_seed(0))


@dataclass(frozen=True)
class Case:
    route: object        # the route module
    report_field: str    # its EnableReport field
    calls: str           # the prefix of its kernel counters
    cls: str             # the Qwen3.5 class it routes
    layers: frozenset    # the tiny model's modules of that class
    summary: str         # its line in enable()'s summary when it routes
    rows_when_off: bool = True  # explain() rows for its modules with the route off (an optional fusion has none)


CASES = {
    "zc_norm": Case(zc_norm_route, "zc_norm", "zc_rmsnorm", "Qwen3_5RMSNorm", frozenset({
        "model.layers.0.input_layernorm", "model.layers.0.post_attention_layernorm",
        "model.layers.1.input_layernorm", "model.layers.1.post_attention_layernorm",
        "model.layers.1.self_attn.q_norm", "model.layers.1.self_attn.k_norm", "model.norm"}),
        "zero-centred RMSNorm -> fastpath-triton"),
    "swiglu": Case(swiglu_route, "swiglu", "swiglu", "Qwen3_5MLP",
                   frozenset({"model.layers.0.mlp", "model.layers.1.mlp"}), "gated MLP silu(gate) * up -> fastpath-triton"),
    "add_norm": Case(add_norm_route, "add_norm", "add_zc_rmsnorm", "Qwen3_5DecoderLayer",
                     frozenset({"model.layers.0", "model.layers.1"}), "residual add + post-attention norm -> fastpath-triton",
                     rows_when_off=False),
}
each_route = pytest.mark.parametrize("case", list(CASES.values()), ids=list(CASES))


@pytest.fixture(autouse=True)
def _always_disable():
    fastpath.disable()
    yield
    fastpath.disable()


def _step(model):
    model.zero_grad(set_to_none=True)
    out = model(input_ids=IDS, labels=IDS, use_cache=False)
    out.loss.backward()
    return out.loss.detach(), {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def _rel(a, b) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30))


def _rows(model, case: Case):
    return [r for r in fastpath.explain(model).rows if r["op"] == case.route.OP]


def _ran(case: Case) -> bool:
    return any(k.startswith(case.calls) for k in CALLS)


@pytest.mark.skipif(not INTERP, reason="runs the fused kernels: needs TRITON_INTERPRET=1")
@each_route
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_routed_model_matches_transformers_and_disable_restores(case: Case, dtype, tol, monkeypatch) -> None:
    from transformers.models.qwen3_5 import modeling_qwen3_5

    monkeypatch.setenv(case.route.ENV_MODE, "auto")
    cls = getattr(modeling_qwen3_5, case.cls)
    original = cls.__dict__["forward"]
    model = tiny_qwen3_5(dtype=dtype)
    ref_loss, ref_grads = _step(model)
    report = fastpath.enable(warn=False)
    assert getattr(report, case.report_field) == case.route.IMPL
    assert case.route.ENV_MODE in getattr(report, f"{case.report_field}_reason")
    assert case.summary in report.summary()
    assert hasattr(cls.forward, case.route.ROUTE_ATTR)
    CALLS.clear()
    loss, grads = _step(model)
    n = len(case.layers)
    assert CALLS[f"{case.calls}_fwd:triton"] == n and CALLS[f"{case.calls}_bwd:triton"] == n
    assert not any(k.startswith(case.calls) and k.endswith(":reference") for k in CALLS), dict(CALLS)
    assert _rel(loss, ref_loss) <= tol and set(grads) == set(ref_grads)
    for name, g in ref_grads.items():
        assert _rel(grads[name], g) <= (1e-4 if dtype == torch.float32 else 5e-2), name
    rows = _rows(model, case)
    assert {r["layer"] for r in rows} == case.layers and {r["layer_type"] for r in rows} == {case.cls}
    assert all(r["fast"] and r["impl"] == "fastpath-triton (interpreter)" for r in rows), rows
    fastpath.disable()
    assert cls.__dict__["forward"] is original
    assert case.route.SKIP_ATTR not in cls.__dict__ and case.route.ACTIVE is None
    CALLS.clear()
    loss, grads = _step(model)
    assert torch.equal(loss, ref_loss) and all(torch.equal(grads[n], g) for n, g in ref_grads.items())
    assert not CALLS and not _rows(model, case)


@pytest.mark.skipif(not INTERP, reason="runs the fused kernels: needs TRITON_INTERPRET=1")
@each_route
def test_suspended_runs_transformers_forward_and_resumes(case: Case, monkeypatch) -> None:
    monkeypatch.setenv(case.route.ENV_MODE, "auto")
    model = tiny_qwen3_5()
    with torch.no_grad():
        ref = model(IDS).logits
    fastpath.enable(warn=False)
    with suspended():
        CALLS.clear()
        with torch.no_grad():
            assert torch.equal(model(IDS).logits, ref)
        assert not _ran(case)
    CALLS.clear()
    with torch.no_grad():
        model(IDS)
    assert CALLS[f"{case.calls}_fwd:triton"] == len(case.layers)


@each_route
def test_cpu_without_interpreter_keeps_transformers_bit_for_bit(case: Case, monkeypatch) -> None:
    """The reference: the same enable() with this route off (the conv route on CPU runs fastpath's
    torch reference, which is not transformers' bits; only this route is under test)."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    model = tiny_qwen3_5()
    monkeypatch.setenv(case.route.ENV_MODE, "torch")
    fastpath.enable(warn=False)
    ref_loss, ref_grads = _step(model)
    monkeypatch.setenv(case.route.ENV_MODE, "auto")
    fastpath.enable(warn=False)
    CALLS.clear()
    loss, grads = _step(model)
    assert not _ran(case), dict(CALLS)
    assert torch.equal(loss, ref_loss) and all(torch.equal(grads[n], g) for n, g in ref_grads.items())
    rows = _rows(model, case)
    assert {r["layer"] for r in rows} == case.layers
    assert all(not r["fast"] and r["impl"] == "torch (cpu tensors; fastpath routed for CUDA)" for r in rows)


@each_route
def test_env_switch_turns_the_route_off_and_explain_says_so(case: Case, monkeypatch) -> None:
    from transformers.models.qwen3_5 import modeling_qwen3_5

    cls = getattr(modeling_qwen3_5, case.cls)
    env = case.route.ENV_MODE
    monkeypatch.setenv(env, "torch")
    report = fastpath.enable(warn=False)
    assert getattr(report, case.report_field) == "torch"
    assert getattr(report, f"{case.report_field}_reason") == f"{env}=torch"
    assert not hasattr(cls.forward, case.route.ROUTE_ATTR)
    rows = _rows(tiny_qwen3_5(), case)
    assert len(rows) == (len(case.layers) if case.rows_when_off else 0)
    assert all(not r["fast"] and r["impl"] == f"torch (eager; {env}=torch)" for r in rows)
    fastpath.disable()
    assert case.route.SKIP_ATTR not in cls.__dict__
    monkeypatch.setenv(env, "fast-please")
    with pytest.raises(UsageError, match=env):
        fastpath.enable(warn=False)


def enable_without_triton(tmp_path, switches: dict[str, str]) -> str:
    """What enable() raises (its type and message) in a process whose triton does not import,
    with the FASTPATH_* `switches` set; fails the test if enable() succeeds."""
    (tmp_path / "triton").mkdir()
    (tmp_path / "triton" / "__init__.py").write_text("raise ImportError('no triton here')\n")
    code = ("import fastpath, sys\n"
            "try:\n    fastpath.enable(warn=False)\n"
            "except Exception as exc:\n    print(type(exc).__name__, exc); sys.exit(0)\n"
            "sys.exit(1)\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT / "src")]), **switches)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300,
                          cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


@each_route
def test_fastpath_mode_needs_the_kernel(case: Case, tmp_path) -> None:
    """<ENV>=fastpath with no Triton: enable() fails in one line instead of going slow."""
    others = {c.route.ENV_MODE: "torch" for c in CASES.values() if c is not case}
    out = enable_without_triton(tmp_path, {**others, case.route.ENV_MODE: "fastpath"})
    assert f"{case.route.ENV_MODE}=fastpath" in out and "does not import" in out, out
