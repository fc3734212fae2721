"""GatedDeltaNet's gated RMSNorm routed to FLA's fused Triton op (fastpath/routing/norm_route.py).

In-process (the system python, no fla): the probe that decides "same function" accepts
transformers' classes and rejects near misses (positive controls: `1 + weight`, gate before the
norm, eps outside the root, a different gate), which classes are candidates, FASTPATH_FLA_NORM,
explain()'s row and enable()'s summary without FLA.

In subprocesses with fla-core on sys.path (.venvs/fla, scripts/setup_fla.sh; kept out of this
interpreter so transformers does not bind FLA for other tests) and TRITON_INTERPRET=1, so FLA's
Triton kernels run on CPU tensors:
* op: FLA's rms_norm_gated against float64 autograd, output and the gradients of x, gate and
  weight, hypothesis over rows/width/dtype/eps/activation; in fp16/bf16 FLA's output is no
  further from float64 than transformers' eager class (the one rounding difference, see
  norm_route; the same check on CUDA is marked gpu).
* model: tiny random-weight Qwen3.5 and Qwen3-Next (grouped value heads), fp32 and bf16, forward
  + backward under enable() with FASTPATH_FLA_NORM=torch and =auto: every layer's hidden states,
  the logits and every parameter gradient within `fastpath verify`'s tolerances
  (models/compare.py, with its fp32 gradient oracle in bf16); the norm's calls are counted,
  explain() names the route, and disable() puts transformers' forward back.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

transformers = pytest.importorskip("transformers")

from repo_paths import ROOT, SUPPORT, fla_path, venv_missing, venv_python  # noqa: E402

import fastpath  # noqa: E402
from fastpath.routing import norm_route  # noqa: E402
from fastpath.routing.engine import is_enabled  # noqa: E402
from fastpath.shared.errors import FastpathError, UsageError  # noqa: E402

GDN = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
           num_attention_heads=2, num_key_value_heads=1, head_dim=16,
           linear_num_value_heads=4, linear_num_key_heads=2, linear_key_head_dim=8,
           linear_value_head_dim=16, linear_conv_kernel_dim=4,
           layer_types=["linear_attention", "full_attention", "linear_attention"])
MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=32)


@pytest.fixture(autouse=True)
def _always_disable(monkeypatch):
    monkeypatch.delenv(norm_route.ENV_MODE, raising=False)
    fastpath.disable()
    yield
    fastpath.disable()


# --------------------------------------------------------------------------- the probe
@pytest.mark.parametrize(("family", "name"), [("qwen3_5", "Qwen3_5RMSNormGated"),
                                             ("qwen3_next", "Qwen3NextRMSNormGated"),
                                             ("qwen3_5_moe", "Qwen3_5MoeRMSNormGated")])
def test_transformers_gated_norms_compute_flas_function(family: str, name: str) -> None:
    import importlib

    cls = getattr(importlib.import_module(f"transformers.models.{family}.modeling_{family}"), name)
    activation, why = norm_route.same_function(cls, cls.forward)
    assert why is None and activation == "silu"


class _Base(torch.nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def _rms(self, x: torch.Tensor, eps: float) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


class OnePlusWeightRMSNormGated(_Base):  # Qwen3.5's *plain* RMSNorm scales by (1 + weight)
    def forward(self, x, gate):
        return (1 + self.weight) * self._rms(x.float(), self.variance_epsilon) * torch.nn.functional.silu(gate)


class GateFirstRMSNormGated(_Base):  # Mamba-2 style: gate, then normalise
    def forward(self, x, gate):
        return self.weight * self._rms(x * torch.nn.functional.silu(gate), self.variance_epsilon)


class EpsOutsideRMSNormGated(_Base):
    def forward(self, x, gate):
        return self.weight * x / (x.pow(2).mean(-1, keepdim=True).sqrt() + self.variance_epsilon) * \
            torch.nn.functional.silu(gate)


class SaysSiluGatesSigmoidRMSNormGated(_Base):
    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__(hidden_size, eps)
        self.activation = "silu"

    def forward(self, x, gate):
        return self.weight * self._rms(x, self.variance_epsilon) * torch.sigmoid(gate)


class SigmoidRMSNormGated(SaysSiluGatesSigmoidRMSNormGated):  # Kimi / GLM-5 style, fp32 weight
    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__(hidden_size, eps)
        self.activation = "sigmoid"


class EpsElsewhereRMSNormGated(_Base):
    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__(hidden_size)
        self.variance_epsilon, self.eps = 1e-6, eps

    def forward(self, x, gate):  # the right function, but its eps is not where the route reads it
        return self.weight * self._rms(x, self.eps) * torch.nn.functional.silu(gate)


@pytest.mark.parametrize(("cls", "words"), [
    (OnePlusWeightRMSNormGated, "rel. error"),
    (GateFirstRMSNormGated, "rel. error"),
    (EpsOutsideRMSNormGated, "rel. error"),
    (SaysSiluGatesSigmoidRMSNormGated, "rel. error"),
    (EpsElsewhereRMSNormGated, "variance_epsilon"),
], ids=lambda v: v.__name__ if isinstance(v, type) else v)
def test_probe_rejects_a_different_function(cls: type, words: str) -> None:
    activation, why = norm_route.same_function(cls, cls.forward)
    assert activation is None and why is not None and words in why and cls.__name__ in why


def test_probe_follows_the_declared_activation() -> None:
    assert norm_route.same_function(SigmoidRMSNormGated, SigmoidRMSNormGated.forward) == ("sigmoid", None)


def test_candidates_are_the_norms_gated_delta_net_builds() -> None:
    from transformers.models.mamba2 import modeling_mamba2
    from transformers.models.qwen3_5 import modeling_qwen3_5

    assert norm_route.gdn_norm_classes(modeling_qwen3_5) == [modeling_qwen3_5.Qwen3_5RMSNormGated]
    assert norm_route.gdn_norm_classes(modeling_mamba2) == []  # its gated norm is gate-first


def test_fits_only_what_the_kernel_takes(monkeypatch) -> None:
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5RMSNormGated

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    norm = Qwen3_5RMSNormGated(16)
    x = torch.randn(5, 16)
    assert norm_route.fits(norm, x, torch.randn(5, 16), "silu")
    assert not norm_route.fits(norm, x, torch.randn(5, 16, dtype=torch.bfloat16), "silu")
    assert not norm_route.fits(norm, x, torch.randn(5, 8), "silu")
    assert not norm_route.fits(norm, x.double(), torch.randn(5, 16).double(), "silu")
    assert not norm_route.fits(norm, x, None, "silu")
    norm.activation = "sigmoid"  # proven for silu only
    assert not norm_route.fits(norm, x, torch.randn(5, 16), "silu")
    monkeypatch.delenv("TRITON_INTERPRET")
    assert not norm_route.fits(Qwen3_5RMSNormGated(16), x, torch.randn(5, 16), "silu")


def test_route_is_on_by_default_and_torch_turns_it_off(monkeypatch) -> None:
    monkeypatch.delenv(norm_route.ENV_MODE, raising=False)
    assert norm_route.route_mode() == "auto"
    status = norm_route.detect_norm()
    if fla_path() == "":  # this interpreter imports fla: the default routes
        assert status.route and "FASTPATH_FLA_NORM=torch turns it off" in status.reason
    else:
        assert not status.route and "fla is not installed" in status.reason
    monkeypatch.setenv(norm_route.ENV_MODE, "torch")
    assert norm_route.detect_norm().reason == "FASTPATH_FLA_NORM=torch"


def test_bad_env_value_is_a_usage_error(monkeypatch) -> None:
    monkeypatch.setenv(norm_route.ENV_MODE, "fused")
    with pytest.raises(UsageError, match="FASTPATH_FLA_NORM"):
        fastpath.enable(warn=False)
    assert not is_enabled()


@pytest.mark.skipif(fla_path() == "", reason="fla is importable in this interpreter")
def test_without_fla_the_norm_stays_eager_and_says_why(monkeypatch) -> None:
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    monkeypatch.setenv(norm_route.ENV_MODE, "auto")
    model = Qwen3_5ForCausalLM(Qwen3_5TextConfig(**GDN))
    report = fastpath.enable(warn=False)
    assert report.gated_norm == "torch" and "fla is not installed" in report.gated_norm_reason
    assert "gated RMSNorm -> torch" in report.summary()
    rows = [r for r in fastpath.explain(model).rows if r["op"] == norm_route.OP]
    assert len(rows) == 2 and all(not r["fast"] and "fla is not installed" in r["impl"] for r in rows)
    fastpath.disable()
    monkeypatch.setenv(norm_route.ENV_MODE, "fla")
    with pytest.raises(FastpathError, match="FASTPATH_FLA_NORM=fla"):
        fastpath.enable(warn=False)


# --------------------------------------------------------------------------- FLA in a subprocess
def _run_worker(mode: str, timeout: int = 900, interpret: bool = True, python: str = sys.executable) -> dict:
    path = fla_path()
    if path is None:
        pytest.skip("fla not installed (run scripts/setup_fla.sh; it installs to .venvs/fla)")
    env = dict(os.environ)
    env[norm_route.ENV_MODE] = "auto"  # the route under test (the default; set in case the caller turned it off)
    env.pop("TRITON_INTERPRET", None)
    if interpret:  # CPU tensors, FLA's kernels in the interpreter (no GPU even where there is one)
        env.update(TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (path, str(ROOT / "src"), str(SUPPORT), env.get("PYTHONPATH", "")) if p)
    proc = subprocess.run([python, __file__, mode], env=env, capture_output=True, text=True,
                          cwd=str(ROOT), timeout=timeout)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    assert proc.returncode == 0 and lines, f"worker failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    result = json.loads(lines[-1])
    if "import_error" in result:
        pytest.skip(f"fla does not import here: {result['import_error']}")
    return result


def test_fla_op_matches_float64_forward_and_gradients() -> None:
    res = _run_worker("op")
    assert res["failure"] is None, res["failure"]
    assert res["examples"] >= 20
    _assert_fla_rounds_no_worse(res)
    assert res["compiled_calls"] == 0 and res["eager_calls"] == 1 and res["compiled_diff"] < 1e-5, res


def _assert_fla_rounds_no_worse(res: dict) -> None:
    """FLA rounds once, transformers' class several times: FLA is the nearer to float64, and
    both are within a few rounding steps of it (measured: fp16 2.1e-4 vs 3.6e-4, bf16 1.7e-3
    vs 2.9e-3)."""
    for name, unit in (("float16", 2.0**-11), ("bfloat16", 2.0**-8)):
        assert res[f"{name}_fla_err"] <= res[f"{name}_eager_err"], res
        assert res[f"{name}_eager_err"] < 2 * unit, res
        assert res[f"{name}_fla_dtype"] == f"torch.{name}", res


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_fla_op_rounding_on_the_gpu() -> None:  # pragma: no cover - device only
    res = _run_worker("rounding_gpu", interpret=False)
    _assert_fla_rounds_no_worse(res)


@pytest.fixture(scope="module")
def model_results() -> dict:
    return _run_worker("model")


@pytest.mark.parametrize("case", ["qwen3_5_text-fp32", "qwen3_5_text-bf16", "qwen3_next-fp32", "qwen3_next-bf16"])
def test_model_route_on_off_within_verify_tolerances(model_results: dict, case: str) -> None:
    res = model_results[case]
    assert "error" not in res, res
    assert res["norm_calls_off"] == 0 and res["norm_calls_on"] == res["gdn_layers"], res
    assert res["fla_ran"], "route on gave bit-identical outputs: FLA's kernel did not run"
    bad = [d for d in res["diffs"] if not d["ok"]]
    assert not bad, bad
    bad_grads = [g for g in res["grads"] if not g["ok"]]
    assert not bad_grads, bad_grads
    assert len(res["grads"]) == res["n_params"]
    assert all(r["impl"] == "fla fused_norm_gate (interpreter)" and r["fast"] for r in res["rows_on"])
    assert all(r["impl"] == "torch (eager; FASTPATH_FLA_NORM=torch)" for r in res["rows_off"])
    assert res["restored"] and res["rows_after_disable"] == ["torch (eager)"] * res["gdn_layers"]


MATRIX = ["4.57.6", "5.12.1", "5.23.0", "5.25.0"]  # 5.17.0 is this interpreter's (tests above)


@pytest.mark.parametrize("version", MATRIX)
def test_route_across_transformers_versions(version: str) -> None:
    """<=5.14 builds FLA's own FusedRMSNormGated only on a CUDA machine; elsewhere, and from 5.15
    always, the eager class is what runs, and the route takes it (fp32, forward + backward)."""
    python = venv_python(version)
    if not python.exists():
        pytest.skip(venv_missing(version))
    results = _run_worker("matrix", python=str(python))
    assert set(results) >= {"qwen3_next-fp32"}, results
    for case, res in results.items():
        assert "error" not in res, (case, res)
        assert res["norm_calls_off"] == 0 and res["norm_calls_on"] == res["gdn_layers"], (case, res)
        assert all(d["ok"] for d in res["diffs"]) and all(g["ok"] for g in res["grads"]), (case, res)
        assert all(r["impl"] == "fla fused_norm_gate (interpreter)" for r in res["rows_on"]), (case, res)
        assert res["restored"], case


def _assert_verify_passed(res: dict) -> None:
    assert res["ok"] and res["verdict"] in ("PASS", "SLOW"), res["problems"]
    # 2 GatedDeltaNet layers x (forward + prefill + 2 cached decode steps) went through FLA's norm
    assert res["fast_calls"].get(f"{norm_route.OP}:fla", 0) >= 2 * 4, res["fast_calls"]
    assert f"{norm_route.OP}:fla" not in res["reference_calls"], res["reference_calls"]


def test_fastpath_verify_passes_with_the_route() -> None:
    """fp32 on CPU. Not bf16: the Triton 3.9 interpreter converts fp32 to bf16 by truncation
    (measured: FLA's bf16 stores equal the truncated fp32 result bit for bit; GPUs round to
    nearest), a bias that verify's A_log/dt_bias gradients (sums over every token) pick up.
    With FLA's bf16 output rounded to nearest instead, bf16 verify passes on CPU too; the real
    bf16 run is the gpu test below."""
    _assert_verify_passed(_run_worker("verify-fp32"))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_fastpath_verify_bf16_with_the_route_gpu() -> None:  # pragma: no cover - device only
    _assert_verify_passed(_run_worker("verify-bf16-cuda", interpret=False))


# --------------------------------------------------------------------------- worker side
def _worker_op() -> dict:
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from fastpath.routing.patch_registry import PatchRegistry

    norm_route.interpreter_single_config(PatchRegistry())
    fla_fn = norm_route.detect_norm().fn
    assert fla_fn is not None
    tol = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.5e-2}
    seen = []

    @settings(max_examples=24, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(rows=st.integers(1, 97), width=st.sampled_from([8, 24, 64, 100, 128, 640]),
           dtype=st.sampled_from([torch.float32, torch.float16, torch.bfloat16]),
           eps=st.sampled_from([1e-6, 1e-5, 1e-2]), act=st.sampled_from(["silu", "sigmoid"]),
           lead=st.sampled_from([(), (2,), (1, 3)]), seed=st.integers(0, 2**16))
    def check(rows, width, dtype, eps, act, lead, seed) -> None:
        gen = torch.Generator().manual_seed(seed)
        shape = (*lead, rows, width)
        scale = torch.logspace(-2, 0.5, rows).unsqueeze(-1)  # rows whose mean square is near eps too
        x = (torch.randn(shape, generator=gen) * scale).to(dtype).requires_grad_()
        gate = (2 * torch.randn(shape, generator=gen)).to(dtype).requires_grad_()
        weight = (torch.randn(width, generator=gen)).to(dtype).requires_grad_()
        dy = torch.randn(shape, generator=gen).to(dtype)
        y = fla_fn(x, gate, weight, None, activation=act, eps=eps)
        y.backward(dy)
        x64, g64, w64 = (t.detach().double().requires_grad_() for t in (x, gate, weight))
        gated = g64 * torch.sigmoid(g64) if act == "silu" else torch.sigmoid(g64)
        ref = x64 * torch.rsqrt(x64.square().mean(-1, keepdim=True) + eps) * w64 * gated
        ref.backward(dy.double())
        assert y.dtype == dtype and y.shape == x.shape
        for name, got, want in (("y", y, ref), ("dx", x.grad, x64.grad), ("dgate", gate.grad, g64.grad),
                                ("dweight", weight.grad, w64.grad)):
            assert got.dtype == dtype, (name, got.dtype)
            err = ((got.double() - want).norm() / want.norm()).item()
            assert err <= tol[dtype], (name, err, shape, dtype, eps, act)
        seen.append(1)

    failure = None
    try:
        check()
    except Exception as exc:
        failure = f"{type(exc).__name__}: {exc}"
    return {"failure": failure, "examples": len(seen), **_rounding("cpu", fla_fn), **_compiled()}


def _compiled() -> dict:
    """torch.compile(fullgraph=True) of a routed norm: traced through transformers' forward (inductor
    fuses it), no graph break, FLA not called while compiled; eager calls still take FLA."""
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5RMSNormGated

    from fastpath.kernels.counters import CALLS

    fastpath.enable(warn=False)
    try:
        norm = Qwen3_5RMSNormGated(16)
        x, gate = torch.randn(5, 16), torch.randn(5, 16)
        CALLS.clear()
        compiled = torch.compile(norm, fullgraph=True, backend="eager")(x, gate)
        calls_compiled = CALLS[f"{norm_route.OP}:fla"]
        eager = norm(x, gate)
        return {"compiled_calls": calls_compiled, "eager_calls": CALLS[f"{norm_route.OP}:fla"],
                "compiled_diff": float((compiled - eager).abs().max())}
    finally:
        fastpath.disable()


def _rounding(device: str, fla_fn) -> dict:
    """Distance to float64 of transformers' eager class and of FLA's op, fp16 and bf16, at a
    GatedDeltaNet-like shape (the one difference between them is intermediate rounding).
    The Triton interpreter converts fp32 to bf16 by truncation (GPUs round to nearest), so on CPU
    FLA's bf16 result is taken as what the GPU stores: its fp32 result on the same bf16 values,
    rounded to nearest by torch."""
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5RMSNormGated

    out = {}
    for dtype in (torch.float16, torch.bfloat16):
        gen = torch.Generator().manual_seed(7)
        x = torch.randn(2048, 128, generator=gen).to(dtype).to(device)
        gate = torch.randn(2048, 128, generator=gen).to(dtype).to(device)
        norm = Qwen3_5RMSNormGated(128, eps=1e-6).to(dtype).to(device)
        with torch.no_grad():
            norm.weight.copy_(1 + 0.3 * torch.randn(128, generator=gen))
            eager = norm(x, gate)  # no enable() in this worker: transformers' own forward
            if device == "cpu" and dtype == torch.bfloat16:
                fla = fla_fn(x.float(), gate.float(), norm.weight.float(), None, activation="silu", eps=1e-6)
                fla = fla.to(dtype)
            else:
                fla = fla_fn(x, gate, norm.weight, None, activation="silu", eps=1e-6)
            x64, g64, w64 = x.double(), gate.double(), norm.weight.double()
            ref = x64 * torch.rsqrt(x64.square().mean(-1, keepdim=True) + 1e-6) * w64 * torch.nn.functional.silu(g64)
        name = str(dtype).removeprefix("torch.")
        out[f"{name}_eager_err"] = ((eager.double() - ref).norm() / ref.norm()).item()
        out[f"{name}_fla_err"] = ((fla.double() - ref).norm() / ref.norm()).item()
        out[f"{name}_fla_dtype"] = str(fla.dtype)
    return out


def _config_file(model_type: str) -> str:
    """A tiny config as a JSON file, the form `fastpath verify` builds models from."""
    import tempfile

    cfg = {"model_type": model_type, **GDN, **(MOE if model_type == "qwen3_next" else {})}
    fd, path = tempfile.mkstemp(suffix=f"-tiny-{model_type}.json")
    with os.fdopen(fd, "w") as fh:
        json.dump(cfg, fh)
    return path


def _build(model_type: str, dtype: str) -> torch.nn.Module:
    """verify's own builder (transformers' init, zero tensors given noise), then the gated norms'
    weights moved off their initial ones so the weight really scales."""
    from fastpath.models.build import build_model

    path = _config_file(model_type)
    try:
        model = build_model(path, dtype=dtype, device="cpu", seed=0).model
    finally:
        os.unlink(path)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for m in model.modules():
            if type(m).__name__.endswith("RMSNormGated"):
                m.weight.copy_(1 + 0.3 * torch.randn(m.weight.shape, generator=gen))
    return model


def _run(model: torch.nn.Module, ids: torch.Tensor) -> tuple[list[torch.Tensor], dict[str, torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    # the next-token loss computed here, from the logits: this test is about the norm, and a call
    # with labels would take enable()'s fused LM head + cross-entropy, which returns no logits
    out = model(ids, output_hidden_states=True, use_cache=False)
    logits = out.logits
    torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1).float(), ids[:, 1:].flatten()).backward()
    states = [h.detach() for h in out.hidden_states] + [logits.detach()]
    return states, {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def _under_enable(mode: str, model: torch.nn.Module, ids: torch.Tensor) -> tuple:
    """_run with enable() and FASTPATH_FLA_NORM=mode: states, grads, FLA norm calls, explain rows."""
    from fastpath.kernels.counters import CALLS

    os.environ[norm_route.ENV_MODE] = mode
    fastpath.enable(warn=False)
    try:
        CALLS.clear()
        states, grads = _run(model, ids)
        rows = [r for r in fastpath.explain(model).rows if r["op"] == norm_route.OP]
        return states, grads, CALLS[f"{norm_route.OP}:fla"], rows
    finally:
        fastpath.disable()


def _worker_model(dtypes: tuple[str, ...] = ("fp32", "bf16")) -> dict:
    import copy

    from transformers import CONFIG_MAPPING

    from fastpath.models.compare import TOLERANCES, compare, compare_grads

    ids = torch.randint(3, 64, (2, 37), generator=torch.Generator().manual_seed(2))
    out: dict = {}

    for model_type in ("qwen3_5_text", "qwen3_next"):
        if model_type not in CONFIG_MAPPING:  # 4.57 has no Qwen3.5
            continue
        for label in dtypes:
            dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[label]
            res: dict = {}
            try:
                model = _build(model_type, label)
                model.train()
                gdn = [m for m in model.modules() if type(m).__name__.endswith("GatedDeltaNet")]
                res["gdn_layers"] = len(gdn)
                norm_cls = type(gdn[0].norm)
                original = norm_cls.__dict__["forward"]
                oracle = None
                if dtype != torch.float32:  # verify's fp32 gradient oracle: the reference path in fp32
                    oracle = _under_enable("torch", copy.deepcopy(model).float(), ids)[1]
                ref_states, ref_grads, res["norm_calls_off"], res["rows_off"] = _under_enable("torch", model, ids)
                states, grads, res["norm_calls_on"], res["rows_on"] = _under_enable("auto", model, ids)
                res["restored"] = norm_cls.__dict__["forward"] is original
                res["rows_after_disable"] = [r["impl"] for r in fastpath.explain(model).rows
                                             if r["op"] == norm_route.OP]
                tol = TOLERANCES[label]
                names = [f"hidden_states[{i}]" for i in range(len(states) - 1)] + ["logits"]
                res["diffs"] = [vars(compare(n, f, r, tol)) for n, f, r in zip(names, states, ref_states, strict=True)]
                res["grads"] = [vars(g) for g in compare_grads(grads, ref_grads, tol, oracle)]
                res["n_params"] = sum(1 for _ in model.parameters())
                res["fla_ran"] = any(not torch.equal(a, b) for a, b in zip(states, ref_states, strict=True))
            except Exception as exc:
                import traceback

                res["error"] = f"{type(exc).__name__}: {exc}\n{traceback.format_exc()[-2000:]}"
            out[f"{model_type}-{label}"] = res
    return out


def _worker_verify(dtype: str, device: str) -> dict:
    """`fastpath verify` itself, in a process where nothing imported fla or transformers' modeling
    yet: its reference path hides FLA while building (transformers' torch code), the fast path is
    enable() with the route."""
    from fastpath.proof.run_paths import verify_model

    path = _config_file("qwen3_5_text")
    try:
        result = verify_model(path, dtype=dtype, seq_len=24, batch=2, backward=True, decode_tokens=3,
                              device=device)
    finally:
        os.unlink(path)
    # "ok": the same function; the verdict adds whether every op ran a fast kernel (SLOW on a CPU:
    # FLA's delta rule runs on CUDA tensors only)
    return {"ok": result.matches, "verdict": result.verdict, "problems": result.problems,
            "fast_calls": result.fast_calls,
            "reference_calls": result.reference_calls,
            "layers": [(d.name, d.rel, d.token_rel_max) for d in result.layers]}


def _worker(mode: str) -> None:
    import warnings

    __import__("interpreter_speed").install()  # tests/support is on this worker's PYTHONPATH
    warnings.filterwarnings("ignore")
    try:
        if not mode.startswith("verify"):  # verify must find fla unimported (see _worker_verify)
            import fla.modules.fused_norm_gate  # noqa: F401
    except Exception as exc:
        print(json.dumps({"import_error": f"{type(exc).__name__}: {exc}"}))
        return
    modes = {"op": _worker_op, "model": _worker_model, "matrix": lambda: _worker_model(("fp32",)),
             "verify-fp32": lambda: _worker_verify("fp32", "cpu"),
             "verify-bf16-cuda": lambda: _worker_verify("bf16", "cuda"),
             "rounding_gpu": lambda: _rounding("cuda", norm_route.detect_norm().fn)}
    print(json.dumps(modes[mode](), default=str))


if __name__ == "__main__":
    _worker(sys.argv[1])
