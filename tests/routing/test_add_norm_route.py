"""What is particular to the route of the decoder layer's residual add + post-attention norm
(routing/add_norm_route.py): it is off unless asked for (enable()'s summary says why, explain()
shows no slow row for it); the rewrite keeps
transformers' file and line numbers; decoder forwards it cannot rewrite (other statements, the
statements twice, closure variables, a decorator that does not close over what it wraps) are left
alone with the reason, one it can (a functools.wraps decorator) keeps its decorator; a norm with a
forward hook keeps the separate add and norm; transformers 5.25's decorated forward (the default
stack) and 5.12's are rewritten and compute what the unfused route computes. The routed model
against transformers, disable(), suspended(), CPU tensors without the interpreter and the switch:
test_class_routes.py, for every class-forward route.
"""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
import traceback

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from repo_paths import ROOT, SUPPORT, venv_missing, venv_python  # noqa: E402
from test_zc_norm_route import tiny_qwen3_5  # noqa: E402

import fastpath  # noqa: E402
from fastpath.kernels.counters import CALLS  # noqa: E402
from fastpath.routing import add_norm_route  # noqa: E402
from fastpath.routing.patch_registry import PatchRegistry  # noqa: E402

INTERP = os.environ.get("TRITON_INTERPRET") == "1"
needs_interp = pytest.mark.skipif(not INTERP, reason="runs the fused kernels: needs TRITON_INTERPRET=1")
IDS = torch.randint(3, 64, (2, 9), generator=torch.Generator().manual_seed(0))
LAYERS = {"model.layers.0", "model.layers.1"}


@pytest.fixture(autouse=True)
def _always_disable():
    fastpath.disable()
    yield
    fastpath.disable()


def _decoder_class():
    from transformers.models.qwen3_5 import modeling_qwen3_5

    return modeling_qwen3_5.Qwen3_5DecoderLayer


def test_off_by_default_and_explain_says_why(monkeypatch) -> None:
    monkeypatch.delenv(add_norm_route.ENV_MODE, raising=False)
    original = _decoder_class().__dict__["forward"]
    report = fastpath.enable(warn=False)
    assert report.add_norm == "torch" and report.add_norm_reason.startswith("off by default")
    assert f"{add_norm_route.ENV_MODE}=auto" in report.add_norm_reason
    assert _decoder_class().__dict__["forward"] is original
    summary = " ".join(report.summary().split())  # lines wrap at the terminal's width
    assert f"residual add + post-attention norm -> torch ({report.add_norm_reason})" in summary
    # off, the layers have no row: the add is torch's, the norm still the norm route's (not a slow path)
    explanation = fastpath.explain(tiny_qwen3_5())
    assert not [r for r in explanation.rows if r["op"] == add_norm_route.OP]
    assert all(r["fast"] for r in explanation.rows if r["op"] == "zc_rmsnorm")


@needs_interp
def test_the_rewrite_keeps_transformers_file_and_lines(monkeypatch) -> None:
    """A failure inside the rewritten forward points at transformers' own line of the call."""
    import linecache

    cls = _decoder_class()
    original = cls.__dict__["forward"]
    monkeypatch.setenv(add_norm_route.ENV_MODE, "auto")
    fastpath.enable(warn=False)
    routed = cls.__dict__["forward"]
    assert routed is not original and hasattr(routed, add_norm_route.ROUTE_ATTR)
    assert routed.__code__.co_filename == original.__code__.co_filename
    model = tiny_qwen3_5()

    def fail(*_a, **_k):
        raise RuntimeError("mixer failed")

    monkeypatch.setattr(model.model.layers[0].linear_attn, "forward", fail)
    with pytest.raises(RuntimeError, match="mixer failed") as info:
        model(IDS)
    frame = next(f for f in traceback.extract_tb(info.tb) if f.name == "forward"
                 and f.filename == original.__code__.co_filename and "linear_attn" in (f.line or ""))
    assert "self.linear_attn(" in linecache.getline(frame.filename, frame.lineno)


_LOOKALIKES = '''
import functools

import torch
from torch import nn

CALLED = []


class Norm(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(d))

    def forward(self, x):
        return x * (1 + self.weight)


class _Base(nn.Module):
    def __init__(self, d=8):
        super().__init__()
        self.post_attention_layernorm = Norm(d)
        self.mlp = nn.Identity()


class OtherOrderDecoderLayer(_Base):
    def forward(self, hidden_states):
        residual = hidden_states
        hidden_states = hidden_states + residual
        residual = hidden_states
        hidden_states = self.post_attention_layernorm(hidden_states)
        return residual + self.mlp(hidden_states)


class TwiceDecoderLayer(_Base):
    def forward(self, hidden_states):
        residual = hidden_states
        hidden_states = residual + hidden_states
        residual = hidden_states
        hidden_states = self.post_attention_layernorm(hidden_states)
        hidden_states = residual + hidden_states
        residual = hidden_states
        hidden_states = self.post_attention_layernorm(hidden_states)
        return residual + hidden_states


def _closure_class():
    scale = 2.0

    class ClosureDecoderLayer(_Base):
        def forward(self, hidden_states):
            residual = hidden_states * scale
            hidden_states = residual + hidden_states
            residual = hidden_states
            hidden_states = self.post_attention_layernorm(hidden_states)
            return residual + hidden_states

    return ClosureDecoderLayer


ClosureDecoderLayer = _closure_class()
ClosureDecoderLayer.__module__ = __name__


class _ObjectWrapper:
    def __init__(self, fn):
        self.__wrapped__ = fn

    def __get__(self, obj, owner=None):
        return functools.partial(self.__wrapped__, obj)


def counted(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        CALLED.append(fn.__name__)
        return fn(*args, **kwargs)

    return wrapper


class ObjectWrappedDecoderLayer(_Base):
    @_ObjectWrapper
    def forward(self, hidden_states):
        residual = hidden_states
        hidden_states = residual + hidden_states
        residual = hidden_states
        hidden_states = self.post_attention_layernorm(hidden_states)
        return residual + hidden_states


class DecoratedDecoderLayer(_Base):
    @counted
    def forward(self, hidden_states):
        residual = hidden_states * 0.5
        hidden_states = residual + hidden_states
        residual = hidden_states
        hidden_states = self.post_attention_layernorm(hidden_states)
        hidden_states = self.mlp(hidden_states)
        return residual + hidden_states
'''


def test_decoder_forwards_it_cannot_rewrite_are_left_alone_with_the_reason(tmp_path, monkeypatch) -> None:
    import importlib

    (tmp_path / "add_norm_lookalikes.py").write_text(_LOOKALIKES)
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("add_norm_lookalikes")
    names = {c.__name__ for c in add_norm_route.candidates(module)}
    assert names == {"OtherOrderDecoderLayer", "TwiceDecoderLayer", "ClosureDecoderLayer",
                     "ObjectWrappedDecoderLayer", "DecoratedDecoderLayer"}
    forwards = {name: getattr(module, name).__dict__["forward"] for name in names}
    reg = PatchRegistry()
    status = add_norm_route.AddNormStatus(True, "test")
    reg.set_attr(add_norm_route, "ACTIVE", status)
    try:
        add_norm_route.patch_module(module, status, reg)
        why = {name: getattr(module, name).__dict__.get(add_norm_route.SKIP_ATTR) for name in names}
        assert "exactly once" in why["OtherOrderDecoderLayer"]
        assert "twice" in why["TwiceDecoderLayer"]
        assert "closure variables" in why["ClosureDecoderLayer"]
        assert "cannot be rebuilt" in why["ObjectWrappedDecoderLayer"]
        assert why["DecoratedDecoderLayer"] is None
        for name in names - {"DecoratedDecoderLayer"}:
            assert getattr(module, name).__dict__["forward"] is forwards[name]
        # rewritten, decorator kept: the wrapper still runs, the layer still computes its function
        layer = module.DecoratedDecoderLayer()
        routed = type(layer).__dict__["forward"]
        assert routed is not forwards["DecoratedDecoderLayer"] and hasattr(routed, add_norm_route.ROUTE_ATTR)
        x = torch.randn(3, 8)
        module.CALLED.clear()
        got = layer(x)
        assert module.CALLED == ["forward"]
        s = x * 0.5 + x
        assert torch.equal(got, s + s)  # the norm here is not zero-centred-routed: the original statements ran
    finally:
        reg.undo()
    assert all(getattr(module, n).__dict__["forward"] is forwards[n] for n in names)
    assert all(add_norm_route.SKIP_ATTR not in getattr(module, n).__dict__ for n in names)


@needs_interp
def test_a_hooked_norm_keeps_the_separate_add_and_norm(monkeypatch) -> None:
    """A forward hook on post_attention_layernorm must see its call: the fused op would skip it."""
    monkeypatch.setenv(add_norm_route.ENV_MODE, "auto")
    model = tiny_qwen3_5()
    seen = []
    model.model.layers[1].post_attention_layernorm.register_forward_hook(lambda m, i, o: seen.append(o.shape))
    fastpath.enable(warn=False)
    CALLS.clear()
    with torch.no_grad():
        model(IDS)
    assert seen == [(2, 9, 32)]
    assert CALLS["add_zc_rmsnorm_fwd:triton"] == 1  # layer 0 fused, layer 1 (hooked) not


_ON_A_VERSION = textwrap.dedent("""
    import json, os, torch
    from matrix_worker import build  # tests/support is on PYTHONPATH
    import fastpath
    from fastpath.kernels.counters import CALLS
    ids = torch.randint(3, 64, (2, 7), generator=torch.Generator().manual_seed(0))
    model = build(os.environ["MODEL_TYPE"])

    def step():
        model.zero_grad(set_to_none=True)
        out = model(input_ids=ids, labels=ids, use_cache=False)
        out.loss.backward()
        return out.loss.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]

    out = {}
    for mode in ("torch", "auto"):
        os.environ["FASTPATH_ADD_NORM"] = mode
        report = fastpath.enable(warn=False)
        CALLS.clear()
        out[mode] = step()
        out[mode + "_calls"] = CALLS["add_zc_rmsnorm_fwd:triton"]
        out[mode + "_report"] = report.add_norm
        fastpath.disable()
    (l0, g0), (l1, g1) = out.pop("torch"), out.pop("auto")
    out["loss_diff"] = float((l0 - l1).abs())
    out["grad_rel"] = max(float((a - b).norm() / b.norm().clamp_min(1e-30)) for a, b in zip(g1, g0))
    out["decorated"] = hasattr(type(model.model.layers[0]).forward, "__wrapped__")
    print(json.dumps(out))
""")


@needs_interp
@pytest.mark.parametrize("version,model_type", [("default", "qwen3_5_text"), ("default", "qwen3_next"),
                                               ("5.12.1", "qwen3_5_text")])
def test_rewrite_on_other_transformers_releases(version: str, model_type: str) -> None:
    """5.25 (today's default stack) wraps the forward in deprecate_kwarg; 5.12 does not; Qwen3-Next's
    decoder (a sparse-MoE MLP whose output it unpacks) has the same three statements."""
    python = venv_python(version)
    if not python.exists():
        pytest.skip(venv_missing(version))
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(SUPPORT)]),
               TRITON_INTERPRET="1", MODEL_TYPE=model_type)
    proc = subprocess.run([str(python), "-c", _ON_A_VERSION], capture_output=True, text=True, env=env,
                          cwd=str(ROOT), timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["auto_report"] == "fastpath-triton" and out["torch_report"] == "torch", out
    assert out["auto_calls"] == 2 and out["torch_calls"] == 0, out
    assert out["loss_diff"] <= 1e-5 and out["grad_rel"] <= 1e-4, out
    if version == "default":
        assert out["decorated"]
