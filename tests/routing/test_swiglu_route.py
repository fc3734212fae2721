"""What is particular to the route of the gated MLP's silu(gate_proj(x)) * up_proj(x) to fastpath's
fused kernel (routing/swiglu_route.py): only the one form of forward is a candidate, an MLP whose
act_fn is not SiLU keeps its forward and has no explain() row, and which transformers families
have candidates. The routed model against transformers, disable(), suspended(), CPU tensors
without the interpreter and FASTPATH_SWIGLU: test_class_routes.py, for every class-forward route.
"""

from __future__ import annotations

import importlib
import os

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from test_zc_norm_route import _always_disable  # noqa: E402, F401 (an autouse fixture)

from fastpath.kernels.counters import CALLS  # noqa: E402
from fastpath.routing import swiglu_route  # noqa: E402
from fastpath.routing.patch_registry import PatchRegistry  # noqa: E402

INTERP = os.environ.get("TRITON_INTERPRET") == "1"
needs_interp = pytest.mark.skipif(not INTERP, reason="runs the fused kernels: needs TRITON_INTERPRET=1")


_LOOKALIKES = '''
import torch
from torch import nn


class _Proj(nn.Module):
    def __init__(self, width=8, inter=12):
        super().__init__()
        self.gate_proj = nn.Linear(width, inter, bias=False)
        self.up_proj = nn.Linear(width, inter, bias=False)
        self.down_proj = nn.Linear(inter, width, bias=False)
        self.act_fn = nn.SiLU()


class PlainMLP(_Proj):
    """The one form: a candidate."""

    def forward(self, hidden):
        return self.down_proj(self.act_fn(self.gate_proj(hidden)) * self.up_proj(hidden))


class GeluMLP(_Proj):
    """The form, but its act_fn is GELU: a candidate whose calls keep the original."""

    def __init__(self):
        super().__init__()
        self.act_fn = nn.GELU()

    def forward(self, x):
        down_proj = self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))
        return down_proj


class SiLUActivation(nn.Module):
    """transformers' name, another function: taken by its name, it would be routed wrongly."""

    def forward(self, x):
        return torch.relu(x)


class NamedLikeSiluMLP(_Proj):
    """The form, with the look-alike activation: a candidate whose calls keep the original."""

    def __init__(self):
        super().__init__()
        self.act_fn = SiLUActivation()

    def forward(self, x):
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class SwappedMLP(_Proj):
    """act_fn on the up projection: another function."""

    def forward(self, x):
        return self.down_proj(self.act_fn(self.up_proj(x)) * self.gate_proj(x))


class ScaledMLP(_Proj):
    """Falcon-H1's multipliers: another function."""

    def forward(self, x):
        y = self.up_proj(x) * self.act_fn(self.gate_proj(x) * 0.5)
        return self.down_proj(y) * 2.0


class ExtraStepMLP(_Proj):
    """The expression, then more: another function."""

    def forward(self, x):
        y = self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))
        return y + x


class LayerIdxMLP(_Proj):
    """A second input: not the one form."""

    def forward(self, x, layer_idx=None):
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))
'''


@needs_interp
def test_only_the_one_form_is_routed_and_a_non_silu_act_keeps_its_forward(tmp_path, monkeypatch) -> None:
    (tmp_path / "swiglu_lookalikes.py").write_text(_LOOKALIKES)
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("swiglu_lookalikes")
    assert [c.__name__ for c in swiglu_route.candidates(module)] == ["PlainMLP", "GeluMLP", "NamedLikeSiluMLP"]
    reg = PatchRegistry()
    status = swiglu_route.SwigluStatus(True, "test")
    reg.set_attr(swiglu_route, "ACTIVE", status)
    originals = {c: c.__dict__["forward"] for c in (module.PlainMLP, module.GeluMLP, module.NamedLikeSiluMLP)}
    swiglu_route.patch_module(module, status, reg)
    try:
        x = torch.randn(3, 8, generator=torch.Generator().manual_seed(1))
        for cls in originals:
            torch.manual_seed(2)
            mlp = cls()
            CALLS.clear()
            with torch.no_grad():
                got, want = mlp(x), originals[cls](mlp, x)
            routed = cls is module.PlainMLP
            assert CALLS["swiglu_fwd:triton"] == int(routed), cls.__name__
            assert torch.allclose(got, want, rtol=1e-5, atol=1e-6) if routed else torch.equal(got, want)
            row = swiglu_route.describe_layer(mlp, "cuda")
            assert row == (swiglu_route.IMPL, True) if routed else row is None, row  # not SiLU: no SwiGLU product
        assert swiglu_route.describe_layer(module.SwappedMLP(), "cuda") is None
    finally:
        reg.undo()
    assert all(c.__dict__["forward"] is f for c, f in originals.items()) and swiglu_route.ACTIVE is None


def test_transformers_gated_mlps_are_the_candidates() -> None:
    """The families whose MLP is the one form, and the forms that are not (their own arithmetic)."""
    want = {"qwen3_5": ["Qwen3_5MLP"], "qwen3_5_moe": ["Qwen3_5MoeMLP"], "qwen3_next": ["Qwen3NextMLP"],
            "olmo_hybrid": ["OlmoHybridMLP"], "kimi_linear": ["KimiLinearMLP"], "bamba": ["BambaMLP"],
            "jamba": ["JambaMLP"], "zamba": ["ZambaMLP"], "falcon_h1": [], "lfm2": [], "zamba2": [],
            "granitemoehybrid": [], "nemotron_h": []}
    for name, classes in want.items():
        module = importlib.import_module(f"transformers.models.{name}.modeling_{name}")
        assert [c.__name__ for c in swiglu_route.candidates(module)] == classes, name
