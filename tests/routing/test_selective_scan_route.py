"""In-process checks of the Mamba-1 routing (routing/selective_scan_route.py) on the system transformers
(5.17): mamba_ssm detection on fake installed packages, the enable(mamba_ssm=...) option, exact
undo, the CPU branch without the interpreter, the 5.0-5.14 lazy-loader modules, Falcon-Mamba's
normed fused op, and that a combination the kernels refuse reaches the user as a warning.
One tiny Mamba model runs the Triton kernels under TRITON_INTERPRET=1 (logits, greedy decode, a
training step through the fused mamba_inner_fn); tests/routing/test_mamba1_matrix.py runs all four
families on every transformers version of the matrix."""

from __future__ import annotations

import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch

import fastpath
from fastpath.kernels import dispatch
from fastpath.kernels.counters import CALLS, reset
from fastpath.routing import selective_scan_route, ssd_route

transformers = pytest.importorskip("transformers")
MAMBA = "transformers.models.mamba.modeling_mamba"
FALCON = "transformers.models.falcon_mamba.modeling_falcon_mamba"
from kernel_checks import sscan_bwd_counter, sscan_fwd_counter  # noqa: E402
from matrix_worker import build_mamba1, train_step  # noqa: E402

interp = pytest.mark.skipif(not dispatch.triton_interpreter_on(), reason="needs TRITON_INTERPRET=1")


def _ids(length: int = 6, batch: int = 1, seed: int = 1) -> torch.Tensor:
    return torch.randint(3, 64, (batch, length), generator=torch.Generator().manual_seed(seed))


@pytest.fixture(autouse=True)
def _disabled():
    fastpath.disable()
    build_mamba1("mamba"), build_mamba1("falcon_mamba")  # modeling modules imported before any fake
    yield
    fastpath.disable()
    for name in [n for n in sys.modules if n == "mamba_ssm" or n.startswith("mamba_ssm.")]:
        del sys.modules[name]  # a fake package must not outlive its test


def _fake_mamba_ssm(tmp_path: Path, working: bool) -> None:
    pkg = tmp_path / "mamba_ssm"
    (pkg / "ops" / "triton").mkdir(parents=True)
    if working:
        (pkg / "__init__.py").write_text("__version__ = '2.3.0'\n")
        (pkg / "ops" / "__init__.py").write_text("")
        (pkg / "ops" / "triton" / "__init__.py").write_text("")
        (pkg / "ops" / "selective_scan_interface.py").write_text(textwrap.dedent("""
            def selective_scan_fn(*a, **k): raise RuntimeError("fake")
            def mamba_inner_fn(*a, **k): raise RuntimeError("fake")
        """))
        (pkg / "ops" / "triton" / "selective_state_update.py").write_text(
            "def selective_state_update(*a, **k): raise RuntimeError('fake')\n")
        (pkg / "ops" / "triton" / "ssd_combined.py").write_text(
            "def mamba_chunk_scan_combined(*a, **k): raise RuntimeError('fake')\n"
            "def mamba_split_conv1d_scan_combined(*a, **k): raise RuntimeError('fake')\n")
    else:  # the released 2.3.2.post1 package root without its compiled extension
        (pkg / "__init__.py").write_text("import selective_scan_cuda\n")


@pytest.mark.parametrize("working", [False, True, "no-extension"])
def test_mamba_ssm_detection(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, working: bool | str) -> None:
    _fake_mamba_ssm(tmp_path, bool(working))
    if working is True:  # a build with its compiled Mamba-1 scan
        (tmp_path / "selective_scan_cuda.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    status = selective_scan_route.detect_mamba1("auto")
    if working is True:
        assert (status.route, status.impl) == (False, "mamba_ssm") and "kept" in status.reason
    elif working == "no-extension":
        # state-spaces/mamba#977: the package imports, its selective_scan_fn raises when called
        assert (status.route, status.impl) == (True, "fastpath"), status
        assert "selective_scan_cuda" in status.reason and "mamba/pull/977" in status.reason
    else:
        assert (status.route, status.impl) == (True, "fastpath")
        assert "do not import" in status.reason and "selective_scan_cuda" in status.reason
    assert selective_scan_route.detect_mamba1("fastpath").route
    assert not selective_scan_route.detect_mamba1("off").route


def test_kept_mamba_ssm_leaves_the_wrappers_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    module = sys.modules[MAMBA]
    before = dict(vars(module))
    _fake_mamba_ssm(tmp_path, True)
    (tmp_path / "selective_scan_cuda.py").write_text("")  # its compiled Mamba-1 scan
    monkeypatch.syspath_prepend(str(tmp_path))
    report = fastpath.enable(warn=False)
    assert report.mamba1_scan == "mamba_ssm"
    assert all(vars(module)[g] is before[g] for g in selective_scan_route.op_globals(module).values())
    fastpath.disable()
    report = fastpath.enable(warn=False, mamba_ssm="fastpath")
    assert report.mamba1_scan == "fastpath"
    assert {op: getattr(vars(module)[g], selective_scan_route.ROUTE_ATTR, None)
            for op, g in selective_scan_route.op_globals(module).items()} == {op: op for op in selective_scan_route.MAMBA1_OPS}
    fastpath.disable()
    report = fastpath.enable(warn=False, mamba_ssm="off")
    assert report.mamba1_scan == "off" and any("Mamba-1" in n for n in report.notes)
    assert all(vars(module)[g] is before[g] for g in selective_scan_route.op_globals(module).values())


def test_disable_restores_every_global_exactly() -> None:
    for name in (MAMBA, FALCON):
        module = sys.modules[name]
        before = dict(vars(module))
        fastpath.enable(warn=False, mamba_ssm="fastpath")
        changed = {k for k, v in vars(module).items() if before.get(k) is not v}
        assert {"mamba_selective_scan", "mamba_selective_state_update", "mamba_inner_fn"} <= changed, name
        fastpath.disable()
        after = dict(vars(module))
        assert after.keys() == before.keys() and all(after[k] is before[k] for k in before), name


def test_cpu_without_interpreter_keeps_transformers_torch_functions(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    model = build_mamba1("mamba")
    ids = _ids()
    with torch.no_grad():
        ref = model(ids).logits
    fastpath.enable(warn=False, mamba_ssm="fastpath")
    rows = [r for r in fastpath.explain(model).rows if r["op"] in selective_scan_route.MAMBA1_OPS]
    assert {r["op"] for r in rows} == set(selective_scan_route.MAMBA1_OPS)
    assert all(r["impl"] == "torch (cpu tensors; fastpath routed for CUDA)" and not r["fast"] for r in rows)
    reset()
    with torch.no_grad():
        got = model(ids).logits
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)  # the conv reference rounds differently
    assert not any(k.startswith("ss_") for k in CALLS), dict(CALLS)


def test_route_modules_are_what_the_lazy_loader_finds() -> None:
    """5.0-5.14: lazy_load_kernel returns these; the mixers read them as the 5.12 sources do."""
    from transformers.utils.import_utils import resolve_internal_import

    for kernel, inner in selective_scan_route.LAZY_KERNELS.items():
        mod = selective_scan_route.route_module(kernel)
        found = resolve_internal_import(mod, chained_path="ops.triton.selective_state_update.selective_state_update")
        assert getattr(found, selective_scan_route.ROUTE_ATTR) == "selective_state_update"
        assert getattr(mod.selective_scan_fn, selective_scan_route.ROUTE_ATTR) == "selective_scan_fn"
        assert getattr(getattr(mod, inner), selective_scan_route.ROUTE_ATTR) == "mamba_inner_fn"
    shared = ssd_route.route_module()  # "mamba-ssm" also serves the Mamba-2 families
    selective_scan_route.route_module("mamba-ssm", shared)
    assert getattr(shared.mamba_chunk_scan_combined, ssd_route.ROUTE_ATTR) == "mamba_chunk_scan_combined"
    assert getattr(shared.selective_state_update, ssd_route.ROUTE_ATTR) == "selective_state_update"


def test_state_update_route_takes_both_state_layouts() -> None:
    """One selective_state_update serves Mamba-1 (3-D state) and Mamba-2 (4-D) callers of the shared
    lazily loaded module; each matches the float64 recurrence and updates the state in place."""
    route = selective_scan_route.make_state_update_route(None)
    gen = torch.Generator().manual_seed(0)
    for heads in (None, 2):
        lead = (2,) if heads is None else (2, heads)
        dim, n = 6, 4
        state = torch.randn(*lead, dim, n, generator=gen)
        x, dt, z = (torch.randn(*lead, dim, generator=gen) for _ in range(3))
        A = -torch.rand(*lead[1:], dim, n, generator=gen) - 0.1
        B, C = (torch.randn(2, n, generator=gen) for _ in range(2))
        D, bias = torch.randn(*lead[1:], dim, generator=gen), torch.randn(*lead[1:], dim, generator=gen)
        s64 = state.double()
        d = torch.nn.functional.softplus(dt.double() + bias.double())
        Bx = B.double().view(2, *([1] * (len(lead) - 1)), 1, n)
        Cx = C.double().view(2, *([1] * (len(lead) - 1)), 1, n)
        s64 = s64 * torch.exp(d[..., None] * A.double()) + d[..., None] * Bx * x.double()[..., None]
        want = ((s64 * Cx).sum(-1) + D.double() * x.double()) * torch.nn.functional.silu(z.double())
        out = route(state, x, dt, A, B, C, D=D, z=z, dt_bias=bias, dt_softplus=True)
        torch.testing.assert_close(out.double(), want, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(state.double(), s64, atol=1e-5, rtol=1e-5)


def test_a_refused_combination_warns_through_the_route(monkeypatch: pytest.MonkeyPatch) -> None:
    """complex A is not taken by the kernels: the route hands the call to the interface, which
    warns naming it and runs the float reference (never a silent wrong number)."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    dispatch._warn_once.cache_clear()
    route = selective_scan_route.make_scan_route(None)
    gen = torch.Generator().manual_seed(0)
    u, delta = torch.randn(1, 4, 5, generator=gen), torch.rand(1, 4, 5, generator=gen)
    A = torch.complex(-torch.rand(4, 3, generator=gen), torch.randn(4, 3, generator=gen))
    B, C = (torch.randn(1, 3, 10, generator=gen) for _ in range(2))  # complex A: (re, im) along L
    with pytest.warns(RuntimeWarning, match="complex A"):
        out = route(u, delta, A, B, C)
    assert out.shape == u.shape and torch.isfinite(out).all()


def test_falcon_mamba_training_takes_the_unfused_reference_function() -> None:
    """mamba_ssm's fused op normalises dt after dt_proj, transformers' reference path before it:
    with enable() a Falcon-Mamba training step computes the reference path's function."""
    model = build_mamba1("falcon_mamba")
    ids = _ids(length=5)
    ref_loss, ref_grads = train_step(model, ids)
    seen = []
    hook = model.backbone.layers[0].mixer.x_proj.register_forward_hook(lambda *a: seen.append(1))
    fastpath.enable(warn=False, mamba_ssm="fastpath")
    try:
        rows = {r["op"]: r for r in fastpath.explain(model).rows if r["layer"].endswith("layers.0.mixer")}
        assert rows["mamba_inner_fn"]["impl"].startswith("declined: transformers' unfused path")
        loss, grads = train_step(model, ids)
    finally:
        hook.remove()
    assert seen, "the unfused path (x_proj as a module) did not run"
    assert abs(loss - ref_loss) < 1e-5
    for name, g in ref_grads.items():
        torch.testing.assert_close(grads[name], g, atol=1e-4, rtol=1e-3)


@interp
def test_mamba_runs_fastpaths_triton_kernels_and_the_fused_training_op() -> None:
    model = build_mamba1("mamba")
    ids = _ids(length=5)
    with torch.no_grad():
        ref = model(ids).logits
        ref_gen = model.generate(ids, max_new_tokens=2, do_sample=False, pad_token_id=0)
    ref_loss, ref_grads = train_step(model, ids)
    fastpath.enable(warn=False, mamba_ssm="fastpath")
    reset()
    rows = [r for r in fastpath.explain(model).rows if r["op"] in selective_scan_route.MAMBA1_OPS]
    assert rows and all(r["impl"] == "fastpath-triton (interpreter)" and r["fast"] for r in rows), rows
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, ref, atol=1e-4, rtol=1e-4)
        gen = model.generate(ids, max_new_tokens=2, do_sample=False, pad_token_id=0)
    assert torch.equal(gen, ref_gen)
    assert CALLS[sscan_fwd_counter()] >= 1 and CALLS["ss_update:triton"] >= 1, dict(CALLS)
    seen = []
    hook = model.backbone.layers[0].mixer.x_proj.register_forward_hook(lambda *a: seen.append(1))
    reset()
    try:
        loss, grads = train_step(model, ids)
    finally:
        hook.remove()
    assert not seen, "training did not take the fused mamba_inner_fn (x_proj ran as a module)"
    assert CALLS[sscan_bwd_counter()] >= 1, dict(CALLS)
    assert abs(loss - ref_loss) < 1e-4
    for name, g in ref_grads.items():
        torch.testing.assert_close(grads[name], g, atol=1e-4, rtol=1e-3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # every global was fastpath's: nothing left behind
        fastpath.disable()
