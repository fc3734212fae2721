"""fastpath's PyTorch chunk_bwd_dqkwg (FLA #640 route) against FLA's Triton kernel and float64 autograd.

Three kinds of checks:
* In-process, no fla needed: the op against float64 autograd of a chunked gated linear recurrence
  with a delta-rule style ``v_new = u - w @ S`` (h, dh, dv taken from that autograd graph), and
  the pure ``dqkwg_route_needed`` policy.
* In a subprocess with fla on sys.path (scripts/setup_fla.sh installs it to .venvs/fla so that
  the system python's transformers does not start routing to fla in other tests): FLA's own
  Triton ``chunk_bwd_dqkwg`` run by the Triton interpreter on CPU tensors vs ours; and the route
  installed into FLA's backend registry, with the Hopper + Triton 3.6 guard reproduced by setting
  FLA's module flags.
* GPU only: FLA's full chunk_gated_delta_rule fwd+bwd with the route vs a float64 recurrence.
  (On CPU FLA's forward kernels do not run under the Triton interpreter, so this needs CUDA.)

Note: the Triton 3.9 interpreter returns garbage for this kernel in bfloat16 (fp16 is exact), so
bf16 is compared with FLA's fp32 result on the same bf16-representable values.
"""

from __future__ import annotations

import inspect
import itertools
import json
import math
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest
import torch
from repo_paths import ROOT, SUPPORT, fla_path

from fastpath.kernels.gated_delta_rule.interface import chunk_bwd_dqkwg
from fastpath.kernels.gated_delta_rule.naive import gated_delta_rule_reference
from fastpath.routing.fla_backend import dqkwg_route_needed
from fastpath.routing.fla_selfcheck import DqkwgConfig, SelfCheckResult, run_selfcheck
from fastpath.shared.errors import UsageError

LN2 = math.log(2.0)

# name: (B, T, H, HV, K, V, dtype, with_w, gate, state_v_first, cu_seqlens)
CASES: dict[str, tuple] = {
    "fp32_T100_grouped_w": (2, 100, 2, 4, 32, 48, "float32", True, "g", False, None),
    "fp32_T100_grouped_no_w": (2, 100, 2, 4, 32, 48, "float32", False, "g", False, None),
    "fp32_T128_K64_nk_split": (1, 128, 1, 2, 64, 32, "float32", True, "g", False, None),
    "fp32_state_v_first": (1, 90, 2, 4, 32, 48, "float32", True, "g", True, None),
    "fp32_varlen": (1, 0, 2, 4, 32, 48, "float32", True, "g", False, [0, 37, 100, 230]),
    "fp32_g_gamma": (2, 100, 2, 4, 32, 48, "float32", True, "gamma", False, None),
    "fp32_no_gate": (2, 100, 2, 4, 32, 48, "float32", True, "none", False, None),
    "fp16_T100_grouped_w": (1, 100, 2, 4, 32, 48, "float16", True, "g", False, None),
    "bf16_T100_grouped_w": (1, 100, 2, 4, 32, 48, "bfloat16", True, "g", False, None),
    "bf16_varlen": (1, 0, 1, 2, 32, 32, "bfloat16", True, "g", False, [0, 50, 171]),
}
TOL = {"float32": 1e-5, "float16": 2e-3, "bfloat16": 1e-2}


def _start_worker(mode: str, extra_env: dict[str, str] | None = None,
                  interpret: bool = True) -> subprocess.Popen | None:
    """Launch this file as a worker with fla on its sys.path (None when fla is not installed)."""
    path = fla_path()
    if path is None:
        return None
    env = dict(os.environ, **(extra_env or {}))
    env.pop("TRITON_INTERPRET", None)
    if interpret:  # CPU tensors: FLA's Triton kernels run in the interpreter
        env["TRITON_INTERPRET"] = "1"
        # On a GPU host FLA would detect the GPU at import (e.g. Hopper + Triton 3.6 arms the
        # #640 guard even for CPU tensors): these workers are about the CPU interpreter only.
        env["CUDA_VISIBLE_DEVICES"] = ""
    env["PYTHONPATH"] = os.pathsep.join(p for p in (path, str(ROOT / "src"), str(SUPPORT), env.get("PYTHONPATH", "")) if p)
    return subprocess.Popen([sys.executable, __file__, mode], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=str(ROOT))


def _result(proc: subprocess.Popen | None) -> dict:
    if proc is None:
        pytest.skip("fla not installed (run scripts/setup_fla.sh; it installs to .venvs/fla)")
    try:
        out, err = proc.communicate(timeout=600)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    lines = [ln for ln in out.splitlines() if ln.startswith("{")]
    assert proc.returncode == 0 and lines, f"worker failed:\n{out[-3000:]}\n{err[-3000:]}"
    result = json.loads(lines[-1])
    if "import_error" in result:
        pytest.skip(f"fla does not import here: {result['import_error']}")
    return result


@pytest.fixture(scope="module")
def fla_workers() -> Iterator[dict]:
    """The CPU workers run side by side (each spends seconds importing fla)."""
    procs = {"compare": _start_worker("compare"),
             # the PyTorch route itself (auto mode would hand FLA's kernel the call once it
             # passes the self-check: test_route_with_selfcheck_through_fla covers that)
             "route0": _start_worker("route", {"FLA_DISABLE_BACKEND_DISPATCH": "0",
                                               "FASTPATH_FLA_DQKWG": "torch"}),
             "route1": _start_worker("route", {"FLA_DISABLE_BACKEND_DISPATCH": "1",
                                               "FASTPATH_FLA_DQKWG": "torch"}),
             "selfcheck": _start_worker("selfcheck", {"FASTPATH_FLA_DQKWG": "auto"})}
    yield {"_procs": procs}
    for proc in procs.values():
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.communicate()


def _worker_result(workers: dict, name: str) -> dict:
    if name not in workers:
        workers[name] = _result(workers["_procs"][name])
    return workers[name]


# --------------------------------------------------------------------------- pure policy
@pytest.mark.parametrize(("cap", "triton", "tilelang", "needed"), [
    ((9, 0), "3.6.0", False, True),
    ((9, 0), "3.4.0", False, True),
    ((9, 0), "3.7.0", False, True),
    ((9, 0), "3.7.1rc1", False, True),
    ((9, 0), "3.7.1", False, False),
    ((9, 0), "3.9.0", False, False),
    ((9, 0), "3.3.1", False, False),
    ((9, 0), "3.6.0", True, False),
    ((8, 0), "3.6.0", False, False),
    ((10, 0), "3.6.0", False, False),
    ((12, 1), "3.5.0", False, False),
])
def test_route_needed(cap, triton, tilelang, needed) -> None:
    assert dqkwg_route_needed(cap, triton, tilelang) is needed


def test_route_needed_claims_nothing_for_an_unreadable_version() -> None:
    assert dqkwg_route_needed((9, 0), "three.six", False) is False


def test_install_without_fla_returns_false() -> None:
    import importlib.util

    from fastpath.routing import fla_backend

    if importlib.util.find_spec("fla") is not None:
        pytest.skip("fla is importable in this interpreter; installing would affect other tests")
    assert fla_backend.install_dqkwg_route() is False
    assert fla_backend.dqkwg_route_installed() is False
    fla_backend.uninstall_dqkwg_route()  # harmless when nothing was installed


# --------------------------------------------------------------------------- float64 autograd spec
def _autograd_case(T: int, H: int, HV: int, K: int, V: int, BT: int, seed: int) -> dict:
    """One sequence of chunked gated recurrence with v_new = u - w @ S, in float64.

    Returns the op's inputs (h, dh, dv read from the autograd graph) and the true gradients.
    """
    gen = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=gen, dtype=torch.float64)  # noqa: E731
    G = HV // H
    q, k = r(1, T, H, K).requires_grad_(), (r(1, T, H, K) * 0.3).requires_grad_()
    u, w = r(1, T, HV, V).requires_grad_(), (r(1, T, HV, K) * 0.2).requires_grad_()
    # chunk-local cumulative log decays (natural log), the form FLA's kernels receive.
    steps = -torch.rand(1, T, HV, generator=gen, dtype=torch.float64) * 0.2
    g_loc = torch.cat([steps[:, s:s + BT].cumsum(1) for s in range(0, T, BT)], 1).requires_grad_()
    do, scale = r(1, T, HV, V), 0.37
    qe, ke = q.repeat_interleave(G, 2), k.repeat_interleave(G, 2)
    state = r(1, HV, K, V) * 0.1
    hs, nexts, vnews, outs = [], [], [], []
    for s in range(0, T, BT):
        e = min(s + BT, T)
        qc, kc, gc = qe[:, s:e], ke[:, s:e], g_loc[:, s:e]
        hs.append(state)
        v_new = u[:, s:e] - torch.einsum("bthk,bhkv->bthv", w[:, s:e], state)
        v_new.retain_grad()
        vnews.append(v_new)
        att = torch.einsum("bihk,bjhk->bhij", qc, kc)
        decay = (gc.transpose(1, 2)[..., :, None] - gc.transpose(1, 2)[..., None, :])
        causal = torch.ones(e - s, e - s, dtype=torch.bool).tril()
        att = torch.where(causal, att * decay.exp(), 0.0)
        o = scale * (torch.einsum("bthk,bhkv->bthv", qc * gc.exp()[..., None], state)
                     + torch.einsum("bhij,bjhv->bihv", att, v_new))
        outs.append(o)
        g_last = gc[:, -1]                                   # [1, HV]
        kd = kc * (g_last[:, None] - gc).exp()[..., None]
        state = state * g_last.exp()[..., None, None] + torch.einsum("bthk,bthv->bhkv", kd, v_new)
        state.retain_grad()
        nexts.append(state)
    dht = r(1, HV, K, V)
    loss = (torch.cat(outs, 1) * do).sum() + (state * dht).sum()
    loss.backward()
    return {
        "q": q.detach(), "k": k.detach(), "v": torch.cat([x.detach() for x in vnews], 1),
        "do": do, "w": w.detach(), "dv": torch.cat([x.grad for x in vnews], 1),
        "h": torch.stack([x.detach() for x in hs], 1), "dh": torch.stack([x.grad for x in nexts], 1),
        "g": g_loc.detach() / LN2, "scale": scale,
        "want": {"dq": q.grad, "dk": k.grad, "dw": w.grad, "dg": g_loc.grad},
    }


def _check(got: tuple, want: dict, tol: float) -> None:
    for name, x in zip(("dq", "dk", "dw", "dg"), got, strict=True):
        ref = want[name]
        assert x.shape == ref.shape, (name, x.shape, ref.shape)
        assert x.is_contiguous(), f"{name} must be dense: FLA passes it to Triton kernels"
        err = ((x - ref).norm() / ref.norm()).item()
        assert err < tol, f"{name}: relative error {err:.2e}"


@pytest.mark.parametrize(("T", "H", "HV", "K", "V", "BT"), [
    (100, 2, 4, 16, 24, 32), (64, 1, 1, 16, 16, 64), (70, 1, 3, 8, 8, 16)])
def test_matches_float64_autograd(T, H, HV, K, V, BT) -> None:
    c = _autograd_case(T, H, HV, K, V, BT, seed=T + HV)
    got = chunk_bwd_dqkwg(q=c["q"], k=c["k"], v=c["v"], do=c["do"], h=c["h"], dh=c["dh"],
                          w=c["w"], g=c["g"], dv=c["dv"], scale=c["scale"], chunk_size=BT)
    assert got[3].dtype == torch.float32
    _check((got[0], got[1], got[2], got[3].double()), c["want"], 1e-6)


def test_varlen_matches_float64_autograd_per_sequence() -> None:
    BT, lens = 32, [45, 19, 64]
    cases = [_autograd_case(n, 2, 4, 16, 16, BT, seed=i) for i, n in enumerate(lens)]
    cat = lambda key, dim: torch.cat([c[key] for c in cases], dim)  # noqa: E731
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()])
    got = chunk_bwd_dqkwg(q=cat("q", 1), k=cat("k", 1), v=cat("v", 1), do=cat("do", 1),
                          h=cat("h", 1), dh=cat("dh", 1), w=cat("w", 1), g=cat("g", 1),
                          dv=cat("dv", 1), scale=0.37, cu_seqlens=cu, chunk_size=BT)
    want = {n: torch.cat([c["want"][n] for c in cases], 1) for n in ("dq", "dk", "dw", "dg")}
    _check((got[0], got[1], got[2], got[3].double()), want, 1e-6)


def test_unsupported_inputs_raise_not_implemented() -> None:
    q = torch.randn(1, 8, 2, 4)
    v = torch.randn(1, 8, 3, 4)
    h = torch.randn(1, 1, 3, 4, 4)
    with pytest.raises(NotImplementedError, match="multiple of"):
        chunk_bwd_dqkwg(q, q, v, v, h, h, g=torch.randn(1, 8, 3))
    v = torch.randn(1, 8, 2, 4)
    h = torch.randn(1, 1, 2, 4, 4)
    with pytest.raises(NotImplementedError, match="g_gamma together"):
        chunk_bwd_dqkwg(q, q, v, v, h, h, g=torch.randn(1, 8, 2), g_gamma=torch.randn(2))
    with pytest.raises(ValueError, match="expected"):
        chunk_bwd_dqkwg(q, q, v, v, torch.randn(1, 2, 2, 4, 4), torch.randn(1, 2, 2, 4, 4),
                        g=torch.randn(1, 8, 2))


def test_reference_recurrence_matches_chunked_state_update() -> None:
    """The recurrence used by the GPU checks: o_0 = scale * beta_0 (q_0.k_0) v_0 from zero state."""
    q, k = torch.randn(1, 3, 1, 4, dtype=torch.float64), torch.randn(1, 3, 1, 4, dtype=torch.float64)
    v, g = torch.randn(1, 3, 2, 5, dtype=torch.float64), -torch.rand(1, 3, 2, dtype=torch.float64)
    beta = torch.rand(1, 3, 2, dtype=torch.float64)
    o = gated_delta_rule_reference(q, k, v, g, beta, scale=0.5)
    want0 = 0.5 * beta[0, 0, :, None] * (q[0, 0, 0] @ k[0, 0, 0]) * v[0, 0]
    torch.testing.assert_close(o[0, 0], want0)
    assert o.shape == (1, 3, 2, 5)


def test_reference_recurrence_matches_transformers_torch_path() -> None:
    """The GPU checks' float64 spec agrees with transformers' own chunked torch implementation."""
    modeling = pytest.importorskip("transformers.models.qwen3_5.modeling_qwen3_5")
    gen = torch.Generator().manual_seed(5)
    r = lambda *s: torch.randn(*s, generator=gen, dtype=torch.float64)  # noqa: E731
    q, k, v = r(1, 70, 2, 16), torch.nn.functional.normalize(r(1, 70, 2, 16), dim=-1), r(1, 70, 2, 8)
    g = torch.nn.functional.logsigmoid(r(1, 70, 2))
    beta = torch.rand(1, 70, 2, generator=gen, dtype=torch.float64)
    # transformers >= 5.15 wraps it to dispatch to FLA when FLA imports; compare with the torch path
    torch_path = inspect.unwrap(modeling.torch_chunk_gated_delta_rule)
    want, _ = torch_path(q, k, v, g, beta)  # computes in float32
    got = gated_delta_rule_reference(q, k, v, g, beta)
    torch.testing.assert_close(got, want.to(got.dtype), rtol=1e-5, atol=1e-5)


# --------------------------------------------------------------------------- vs FLA's Triton kernel
@pytest.mark.parametrize("case", list(CASES))
def test_matches_fla_triton_kernel(fla_workers: dict, case: str) -> None:
    res = _worker_result(fla_workers, "compare")[case]
    assert "error" not in res, res.get("error")
    dtype = CASES[case][6]
    for name, info in res.items():
        assert info["shape_ok"] and info["dtype_ok"], (name, info)
        assert info["contiguous"], f"{name} must be dense: FLA passes it to Triton kernels"
        assert info["err"] < TOL[dtype], f"{case} {name}: rel err {info['err']:.2e}"
    expected = {"dq", "dk"} | ({"dw"} if CASES[case][7] else set()) | (
        {"dg"} if CASES[case][8] == "g" else set())
    assert set(res) == expected


@pytest.mark.parametrize("dispatch_disabled", ["0", "1"])
def test_route_through_fla(fla_workers: dict, dispatch_disabled: str) -> None:
    res = _worker_result(fla_workers, "route" + dispatch_disabled)
    assert res["guard_before"].startswith("Triton >= 3.4.0"), res
    assert res["installed"] is True
    assert res["calls_gated"] == 2            # via chunk_o and via gated_delta_rule.chunk
    assert res["max_err"] < 1e-5, res
    assert res["calls_after_ungated"] == 2    # ungated calls stay on FLA's kernel
    assert res["ungated_err"] < 1e-5
    assert res["guard_after_uninstall"].startswith("Triton >= 3.4.0"), res
    assert res["reinstall_calls"] == 3


# --------------------------------------------------------------------------- self-check
SMALL = dict(H=1, HV=2, K=16, V=16, BT=16, state_dtype="float32", use_w=True,
             state_v_first=False, varlen=False)


def _small_config(dtype: str = "bfloat16", **over) -> DqkwgConfig:
    return DqkwgConfig(**dict(SMALL, dtype=dtype, **over))


def _check_small(candidate, config) -> SelfCheckResult:
    return run_selfcheck(candidate, chunk_bwd_dqkwg, config, "cpu", seeds=(0, 1),
                                       n_chunks=3, batch=2)


@pytest.mark.parametrize("over", [{}, {"varlen": True}, {"state_v_first": True, "use_w": False}])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_selfcheck_accepts_a_correct_kernel(dtype, over) -> None:
    res = _check_small(chunk_bwd_dqkwg, _small_config(dtype, **over))
    assert res.passed, res.line()
    assert res.deterministic and set(res.errors) >= {"dq", "dk", "dg"}
    assert ("dw" in res.errors) is res.config.use_w


def _corrupt(out: tuple, name: str, rows: slice, factor: float) -> tuple:
    out = list(out)
    i = ("dq", "dk", "dw", "dg").index(name)
    x = out[i].clone()
    x[:, rows] *= factor
    out[i] = x
    return tuple(out)


def test_selfcheck_rejects_a_kernel_wrong_in_one_chunk() -> None:
    """Positive control: the same maths with one chunk of dk off by 30% (a race or a miscompiled
    block, the #640 shape of failure) must fail, and say which output."""
    def wrong(**kw):
        return _corrupt(chunk_bwd_dqkwg(**kw), "dk", slice(16, 32), 1.3)

    res = _check_small(wrong, _small_config("bfloat16"))
    assert not res.passed and res.reason.startswith("dk "), res.line()
    assert res.chunk_errors["dk"] > res.errors["dk"] > 0.02


def test_selfcheck_rejects_wrong_gate_handling() -> None:
    """Positive control: a kernel that ignores the gate's effect on dg (returns zeros) fails."""
    def wrong(**kw):
        dq, dk, dw, dg = chunk_bwd_dqkwg(**kw)
        return dq, dk, dw, torch.zeros_like(dg)

    res = _check_small(wrong, _small_config("float32"))
    assert not res.passed and "dg" in res.reason


def test_selfcheck_rejects_a_nondeterministic_kernel() -> None:
    calls = []

    def racy(**kw):
        calls.append(1)
        dq, dk, dw, dg = chunk_bwd_dqkwg(**kw)
        return dq, dk + 1e-6 * len(calls) * dk.abs().max(), dw, dg  # tiny, different each call

    res = _check_small(racy, _small_config("float32"))
    assert not res.passed and not res.deterministic and "repeat" in res.reason
    assert len(calls) == 3  # two seeds and the repeat


def test_selfcheck_counts_a_raising_kernel_as_failed() -> None:
    def boom(**kw):
        raise RuntimeError("Triton >= 3.4.0 and < 3.7.1 on Hopper GPUs produces incorrect results")

    res = _check_small(boom, _small_config("bfloat16"))
    assert not res.passed and res.reason.startswith("raised RuntimeError")


def test_route_policy_env_var_and_once_per_config(monkeypatch, tmp_path) -> None:
    from fastpath.routing import fla_selfcheck

    monkeypatch.setattr(fla_selfcheck, "RESULTS", {})
    monkeypatch.setattr(fla_selfcheck, "SEEDS", (0,))
    monkeypatch.setattr(fla_selfcheck, "N_CHUNKS", 2)
    monkeypatch.setenv("FASTPATH_CACHE_DIR", str(tmp_path))
    runs = []

    def candidate(**kw):
        runs.append(1)
        return chunk_bwd_dqkwg(**kw)

    call = fla_selfcheck.make_inputs(_small_config("float32"), 5, "cpu", n_chunks=2)
    monkeypatch.setenv("FASTPATH_FLA_DQKWG", "torch")
    assert fla_selfcheck.fla_allowed(call, candidate, chunk_bwd_dqkwg) is False
    assert fla_selfcheck.fla_allowed(call, None, chunk_bwd_dqkwg) is False
    monkeypatch.setenv("FASTPATH_FLA_DQKWG", "fla")
    assert fla_selfcheck.fla_allowed(call, candidate, chunk_bwd_dqkwg) is True
    assert runs == [] and not fla_selfcheck.RESULTS  # forced: nothing checked
    monkeypatch.setenv("FASTPATH_FLA_DQKWG", "auto")
    assert fla_selfcheck.fla_allowed(call, candidate, chunk_bwd_dqkwg) is True
    assert fla_selfcheck.fla_allowed(call, candidate, chunk_bwd_dqkwg) is True
    assert len(runs) == 2  # one seed + the determinism repeat, once for this configuration
    (line,) = fla_selfcheck.describe()
    assert "K=16 V=16 H=1 HV=2 BT=16 float32" in line and "PASS" in line
    facts = json.loads(fla_selfcheck.facts_path().read_text())
    assert facts["results"][0]["passed"] is True and facts["mode"] == "auto"
    monkeypatch.setenv("FASTPATH_FLA_DQKWG", "sometimes")
    with pytest.raises(UsageError, match="FASTPATH_FLA_DQKWG='sometimes'"):
        fla_selfcheck.route_mode()


def test_failed_selfcheck_warns_and_keeps_torch(monkeypatch, tmp_path) -> None:
    from fastpath.routing import fla_selfcheck

    monkeypatch.setattr(fla_selfcheck, "RESULTS", {})
    monkeypatch.setattr(fla_selfcheck, "SEEDS", (0,))
    monkeypatch.setattr(fla_selfcheck, "N_CHUNKS", 2)
    monkeypatch.setenv("FASTPATH_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("FASTPATH_FLA_DQKWG", "auto")

    def wrong(**kw):
        return _corrupt(chunk_bwd_dqkwg(**kw), "dq", slice(0, 16), -1.0)

    call = fla_selfcheck.make_inputs(_small_config("float32"), 5, "cpu", n_chunks=2)
    with pytest.warns(RuntimeWarning, match="failed the self-check"):
        assert fla_selfcheck.fla_allowed(call, wrong, chunk_bwd_dqkwg) is False
    assert "FAIL" in fla_selfcheck.describe()[0]


def test_enable_summary_and_explain_name_the_checked_configs(monkeypatch) -> None:
    from fastpath.routing import fla_route, fla_selfcheck
    from fastpath.routing.engine import EnableReport
    from fastpath.routing.explain import Explanation

    config = _small_config("bfloat16")
    monkeypatch.setattr(fla_selfcheck, "RESULTS",
                        {config: SelfCheckResult(config, True, "ok", {"dq": 1e-3}, seeds=3, chunks=16)})
    report = EnableReport("fastpath", fla_route.DQKWG_IMPL, "FLA #640 here", "5.17.0")
    assert "dqkwg K=16 V=16 H=1 HV=2 BT=16 bfloat16 h float32 w: PASS" in report.summary()
    table = Explanation(rows=[{"layer": "l0", "layer_type": "GDN", "op": "chunk_gated_delta_rule",
                               "impl": fla_route.DQKWG_IMPL, "fast": True}],
                        notes=fla_selfcheck.describe())
    assert "note: FLA gated dqkwg self-check" in str(table) and "PASS" in str(table)
    plain = EnableReport("fastpath", "fla", "safe here", "5.17.0")
    assert "dqkwg" not in plain.summary()


def test_unguarded_copy_leaves_the_original_guarded() -> None:
    """The clone sees IS_NVIDIA_HOPPER False; the original function and its module do not."""
    from fastpath.routing.fla_selfcheck import unguarded_fla_dqkwg

    namespace = {"IS_NVIDIA_HOPPER": True, "TRITON_ABOVE_3_4_0": True}
    exec(  # a function guarded the way FLA 0.6.0 guards chunk_bwd_dqkwg
        "def chunk_bwd_dqkwg(q, g=None, chunk_size=64):\n"
        "    if g is not None and IS_NVIDIA_HOPPER and TRITON_ABOVE_3_4_0:\n"
        "        raise RuntimeError('#640')\n"
        "    return q * chunk_size\n", namespace)
    original = namespace["chunk_bwd_dqkwg"]
    clone = unguarded_fla_dqkwg(original)
    assert clone is not None and clone(2, g=1) == 128 and clone(2, g=1, chunk_size=3) == 6
    with pytest.raises(RuntimeError, match="#640"):
        original(2, g=1)
    assert namespace["IS_NVIDIA_HOPPER"] is True
    assert unguarded_fla_dqkwg(lambda q: q) is None  # not FLA's guarded function: no clone


def test_route_with_selfcheck_through_fla(fla_workers: dict) -> None:
    """FLA's real kernel (Triton interpreter, fp32) behind the #640 flags: the route self-checks
    it, runs it for that configuration, and FASTPATH_FLA_DQKWG=torch switches back."""
    res = _worker_result(fla_workers, "selfcheck")
    assert res["guard_before"].startswith("Triton >= 3.4.0"), res
    assert res["passed"] is True, res
    assert res["fla_calls"] == 1 and res["torch_calls_auto"] == 0, res
    assert res["err_vs_fla"] == 0.0, res  # the route ran FLA's own kernel
    assert res["torch_calls_forced"] == 1, res
    assert "PASS" in res["describe"], res


# --------------------------------------------------------------------------- GPU end to end
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (FLA's forward kernels do not run under the CPU interpreter)")
def test_fla_chunk_gated_delta_rule_with_route_gpu() -> None:
    res = _result(_start_worker("e2e", interpret=False))
    # bf16 pipeline vs float64: FLA's own kernels land near 1e-2 here; a wrong dq/dk/dg is O(1).
    for name, err in res["errors"].items():
        assert err < 5e-2, f"{name}: rel err {err:.3e} ({res})"
    assert res["route_calls"] >= 1


# --------------------------------------------------------------------------- subprocess worker
def _single_config_autotune() -> None:
    """Trim FLA's autotuners to one config: the interpreter has no benchmarker to choose with."""
    from triton.runtime.autotuner import Autotuner

    for name, mod in list(sys.modules.items()):
        if not name.startswith("fla"):
            continue
        for obj in list(vars(mod).values()):
            for _ in range(4):
                if isinstance(obj, Autotuner) and len(obj.configs) > 1:
                    obj.configs = obj.configs[:1]
                obj = getattr(obj, "fn", None)
                if obj is None:
                    break


def _make_inputs(B, T, H, HV, K, V, dtype, with_w, gate, svf, cu, seed=0):
    gen = torch.Generator().manual_seed(seed)
    BT = 64
    if cu is not None:
        from fla.ops.utils.index import prepare_chunk_indices

        B, T = 1, cu[-1]
        cu = torch.tensor(cu)
        NT = len(prepare_chunk_indices(cu, BT))
    else:
        NT = -(-T // BT)
    dt = getattr(torch, dtype)
    r = lambda *s: torch.randn(*s, generator=gen).to(dt)  # noqa: E731
    hs = (B, NT, HV, V, K) if svf else (B, NT, HV, K, V)
    kw = dict(q=r(B, T, H, K), k=r(B, T, H, K), v=r(B, T, HV, V), do=r(B, T, HV, V),
              h=r(*hs), dh=r(*hs), w=r(B, T, HV, K) if with_w else None,
              dv=r(B, T, HV, V) if with_w else None, g=None, g_gamma=None, scale=0.37,
              state_v_first=svf, cu_seqlens=cu, chunk_size=BT)
    if gate == "g":
        kw["g"] = (-torch.rand(B, T, HV, generator=gen) * 0.3).cumsum(1) % -4.0
    elif gate == "gamma":
        kw["g_gamma"] = -torch.rand(HV, generator=gen) * 0.3
    return kw


def _rel(x: torch.Tensor, ref: torch.Tensor) -> float:
    return ((x.double() - ref.double()).norm() / ref.double().norm()).item()


def _worker_compare() -> dict:
    from fla.ops.common.chunk_o import chunk_bwd_dqkwg as fla_op

    _single_config_autotune()
    out = {}
    for case, spec in CASES.items():
        try:
            kw = _make_inputs(*spec)
            mine = chunk_bwd_dqkwg(**kw)
            if spec[6] == "bfloat16":  # interpreter bf16 is broken: reference in fp32 on same values
                up = {n: (x.float() if torch.is_tensor(x) and x.is_floating_point() else x)
                      for n, x in kw.items()}
                ref = fla_op(**up)
                ref = tuple(None if x is None else x.to(m.dtype) if m is not None else x
                            for x, m in zip(ref, mine, strict=True))
            else:
                ref = fla_op(**kw)
            res = {}
            for name, x, y in zip(("dq", "dk", "dw", "dg"), ref, mine, strict=True):
                if x is None and y is None:
                    continue
                if x is None or y is None:
                    res[name] = {"shape_ok": False, "dtype_ok": False, "err": 1.0}
                    continue
                res[name] = {"shape_ok": x.shape == y.shape, "dtype_ok": x.dtype == y.dtype,
                             "contiguous": y.is_contiguous(), "err": _rel(y, x)}
            out[case] = res
        except Exception as exc:  # report per case
            out[case] = {"error": f"{type(exc).__name__}: {exc}"}
    return out


def _worker_route() -> dict:
    import fla.ops.common.chunk_o as chunk_o
    import fla.ops.gated_delta_rule.chunk as gdr_chunk

    from fastpath.routing import fla_backend

    _single_config_autotune()
    kw = _make_inputs(1, 100, 2, 4, 32, 32, "float32", True, "g", False, None, seed=3)
    ref = chunk_o.chunk_bwd_dqkwg(**kw)
    ungated = dict(kw, g=None)
    ref_ungated = chunk_o.chunk_bwd_dqkwg(**ungated)
    # Reproduce the lent H200's environment for FLA's guard: Hopper, Triton 3.6 (< 3.7.1).
    chunk_o.IS_NVIDIA_HOPPER, chunk_o.TRITON_ABOVE_3_4_0, chunk_o.TRITON_ABOVE_3_7_1 = True, True, False
    res: dict = {}

    def guard_message() -> str:
        try:
            chunk_o.chunk_bwd_dqkwg(**kw)
        except RuntimeError as exc:
            return str(exc)
        return "no error"

    res["guard_before"] = guard_message()
    res["installed"] = fla_backend.install_dqkwg_route()
    fla_backend.install_dqkwg_route()  # idempotent
    a = chunk_o.chunk_bwd_dqkwg(**kw)
    b = gdr_chunk.chunk_bwd_dqkwg(**kw)
    res["calls_gated"] = fla_backend.ROUTE_CALLS["dqkwg:torch"]
    res["max_err"] = max(_rel(x, y) for got in (a, b) for x, y in zip(got, ref, strict=True)
                         if y is not None)
    c = gdr_chunk.chunk_bwd_dqkwg(**ungated)
    res["calls_after_ungated"] = fla_backend.ROUTE_CALLS["dqkwg:torch"]
    res["ungated_err"] = max(_rel(x, y) for x, y in zip(c, ref_ungated, strict=True) if y is not None)
    fla_backend.uninstall_dqkwg_route()
    res["guard_after_uninstall"] = guard_message()
    fla_backend.install_dqkwg_route()
    gdr_chunk.chunk_bwd_dqkwg(**kw)
    res["reinstall_calls"] = fla_backend.ROUTE_CALLS["dqkwg:torch"]
    fla_backend.uninstall_dqkwg_route()
    return res


def _worker_e2e() -> dict:
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule

    from fastpath.routing import fla_backend

    fla_backend.install_dqkwg_route()
    _single_config_autotune()  # a correctness check: autotuning every config costs minutes
    torch.manual_seed(0)
    B, T, H, HV, K, V = 1, 300, 2, 4, 64, 64
    dev = "cuda"
    q = torch.nn.functional.normalize(torch.randn(B, T, H, K, device=dev), dim=-1)
    k = torch.nn.functional.normalize(torch.randn(B, T, H, K, device=dev), dim=-1)
    v = torch.randn(B, T, HV, V, device=dev)
    g = torch.nn.functional.logsigmoid(torch.randn(B, T, HV, device=dev)) * 0.5
    beta = torch.rand(B, T, HV, device=dev)
    do = torch.randn(B, T, HV, V, device=dev)
    leaves = [x.to(torch.bfloat16).requires_grad_() for x in (q, k, v, g, beta)]
    o, _ = chunk_gated_delta_rule(*leaves)
    o.backward(do.to(torch.bfloat16))
    ref_leaves = [x.detach().double().requires_grad_() for x in leaves]
    ref = gated_delta_rule_reference(*ref_leaves)
    ref.backward(do.to(torch.bfloat16).double())
    errors = {"o": _rel(o, ref)}
    for name, x, y in zip("q k v g beta".split(), leaves, ref_leaves, strict=True):
        errors["d" + name] = _rel(x.grad, y.grad)
    # Packed sequences (cu_seqlens), as transformers passes them for padding-free training.
    bounds = [0, 100, 300]
    cu = torch.tensor(bounds, device=dev, dtype=torch.long)
    leaves = [x.detach().clone().requires_grad_() for x in leaves]
    o, _ = chunk_gated_delta_rule(*leaves, cu_seqlens=cu)
    o.backward(do.to(torch.bfloat16))
    ref_leaves = [x.detach().double().requires_grad_() for x in leaves]
    ref = torch.cat([gated_delta_rule_reference(*(x[:, a:b] for x in ref_leaves))
                     for a, b in itertools.pairwise(bounds)], 1)
    ref.backward(do.to(torch.bfloat16).double())
    errors["varlen_o"] = _rel(o, ref)
    for name, x, y in zip("q k v g beta".split(), leaves, ref_leaves, strict=True):
        errors["varlen_d" + name] = _rel(x.grad, y.grad)
    from fastpath.routing import fla_selfcheck

    return {"errors": errors, "selfcheck": fla_selfcheck.describe(),
            "route_calls": fla_backend.ROUTE_CALLS["dqkwg:torch"] + fla_backend.ROUTE_CALLS["dqkwg:fla"]}


def _worker_selfcheck() -> dict:
    import tempfile

    import fla.ops.common.chunk_o as chunk_o

    from fastpath.routing import fla_backend, fla_selfcheck

    os.environ["FASTPATH_CACHE_DIR"] = tempfile.mkdtemp()
    fla_selfcheck.SEEDS, fla_selfcheck.N_CHUNKS = (0, 1), 2  # the interpreter is slow
    _single_config_autotune()
    kw = _make_inputs(1, 100, 2, 4, 32, 32, "float32", True, "g", False, None, seed=4)
    ref = chunk_o.chunk_bwd_dqkwg(**kw)  # FLA's kernel, before the guard is armed
    chunk_o.IS_NVIDIA_HOPPER, chunk_o.TRITON_ABOVE_3_4_0, chunk_o.TRITON_ABOVE_3_7_1 = True, True, False
    res: dict = {}
    try:
        chunk_o.chunk_bwd_dqkwg(**kw)
        res["guard_before"] = "no error"
    except RuntimeError as exc:
        res["guard_before"] = str(exc)
    fla_backend.install_dqkwg_route()
    got = chunk_o.chunk_bwd_dqkwg(**kw)
    res["fla_calls"] = fla_backend.ROUTE_CALLS["dqkwg:fla"]
    res["torch_calls_auto"] = fla_backend.ROUTE_CALLS["dqkwg:torch"]
    res["err_vs_fla"] = max(_rel(x, y) for x, y in zip(got, ref, strict=True) if y is not None)
    res["passed"] = [r.passed for r in fla_selfcheck.RESULTS.values()] == [True]
    res["describe"] = " | ".join(fla_selfcheck.describe())
    os.environ["FASTPATH_FLA_DQKWG"] = "torch"
    chunk_o.chunk_bwd_dqkwg(**kw)
    res["torch_calls_forced"] = fla_backend.ROUTE_CALLS["dqkwg:torch"]
    fla_backend.uninstall_dqkwg_route()
    return res


def _worker(mode: str) -> None:
    import warnings

    __import__("interpreter_speed").install()  # tests/support is on this worker's PYTHONPATH
    warnings.filterwarnings("ignore")
    try:
        import fla.ops.common.chunk_o
        import fla.ops.gated_delta_rule  # noqa: F401
    except Exception as exc:
        print(json.dumps({"import_error": f"{type(exc).__name__}: {exc}"}))
        return
    fn = {"compare": _worker_compare, "route": _worker_route, "e2e": _worker_e2e,
          "selfcheck": _worker_selfcheck}[mode]
    print(json.dumps(fn()))


if __name__ == "__main__":
    _worker(sys.argv[1])
