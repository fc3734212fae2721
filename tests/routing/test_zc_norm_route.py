"""What is particular to the route of Qwen3.5 / Qwen3-Next's zero-centred RMSNorm to fastpath's
fused kernel (routing/zc_norm_route.py): a class that only looks zero-centred is left alone with
the reason, transformers' classes pass the probe, and the route survives `kernels`' kernelize() on
transformers 5.25. The routed model against transformers, disable(), suspended(), CPU tensors
without the interpreter and FASTPATH_ZC_NORM: test_class_routes.py, for every class-forward route.
"""

from __future__ import annotations

import json
import os
import subprocess
import textwrap

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from repo_paths import ROOT, SUPPORT, venv_missing, venv_python  # noqa: E402

import fastpath  # noqa: E402
from fastpath.routing import zc_norm_route  # noqa: E402
from fastpath.routing.patch_registry import PatchRegistry  # noqa: E402

INTERP = os.environ.get("TRITON_INTERPRET") == "1"
# every Qwen3_5RMSNorm of the tiny model: two per decoder layer, q/k norms of its attention layer, the final norm
NORMS = {"model.layers.0.input_layernorm", "model.layers.0.post_attention_layernorm",
         "model.layers.1.input_layernorm", "model.layers.1.post_attention_layernorm",
         "model.layers.1.self_attn.q_norm", "model.layers.1.self_attn.k_norm", "model.norm"}


def tiny_qwen3_5(seed: int = 0, dtype: torch.dtype = torch.float32):
    """A tiny random Qwen3.5 whose norm weights are O(1) (transformers initialises them to 0)."""
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    cfg = Qwen3_5TextConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                            num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                            linear_num_value_heads=2, linear_num_key_heads=2, linear_key_head_dim=8,
                            linear_value_head_dim=8, layer_types=["linear_attention", "full_attention"])
    torch.manual_seed(seed)
    model = Qwen3_5ForCausalLM(cfg)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
    return model.to(dtype).eval()


def _module():
    from transformers.models.qwen3_5 import modeling_qwen3_5

    return modeling_qwen3_5


@pytest.fixture(autouse=True)
def _always_disable():
    fastpath.disable()
    yield
    fastpath.disable()


_LOOKALIKES = '''
import torch
from torch import nn


class ScaleFirstRMSNorm(nn.Module):
    """Scales by (1 + w) before normalising: says `1 + self.weight`, is another function."""

    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(dim))

    def forward(self, x):
        x = x.float() * (1.0 + self.weight.float())
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)


class FixedEpsRMSNorm(nn.Module):
    """Zero-centred, but with an eps fixed in the code instead of the instance's."""

    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(dim))

    def forward(self, x):
        out = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6)
        return (out * (1 + self.weight.float())).type_as(x)


class PlainRMSNorm(nn.Module):
    """x * rsqrt(mean(x^2) + eps) * w (Llama's): not zero-centred, not a candidate at all."""

    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.variance_epsilon = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon) * self.weight
'''


def test_a_class_that_is_not_zero_centred_is_not_routed_with_a_reason(tmp_path, monkeypatch) -> None:
    import importlib

    (tmp_path / "zc_lookalikes.py").write_text(_LOOKALIKES)
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("zc_lookalikes")
    assert [c.__name__ for c in zc_norm_route.candidates(module)] == ["ScaleFirstRMSNorm", "FixedEpsRMSNorm"]
    eps_attr, why = zc_norm_route.same_function(module.PlainRMSNorm, module.PlainRMSNorm.forward)
    assert eps_attr is None and "(1+weight)" in why
    forwards = {c: c.__dict__["forward"] for c in (module.ScaleFirstRMSNorm, module.FixedEpsRMSNorm)}
    reg = PatchRegistry()
    status = zc_norm_route.ZcNormStatus(True, "test")
    reg.set_attr(zc_norm_route, "ACTIVE", status)
    notes = zc_norm_route.patch_module(module, status, reg)
    try:
        assert len(notes) == 2 and all("not routed" in n and "rel. error" in n for n in notes), notes
        for cls, forward in forwards.items():
            assert cls.__dict__["forward"] is forward
            impl, fast = zc_norm_route.describe_layer(cls(8), "cuda")
            assert not fast and impl.startswith("torch (eager; ") and cls.__name__ in impl
        assert zc_norm_route.describe_layer(module.PlainRMSNorm(8), "cuda") is None
    finally:
        reg.undo()
    assert all(zc_norm_route.SKIP_ATTR not in c.__dict__ for c in forwards)
    assert zc_norm_route.ACTIVE is None


def test_transformers_classes_pass_the_probe() -> None:
    from transformers.models.qwen3_next import modeling_qwen3_next

    for cls in (_module().Qwen3_5RMSNorm, modeling_qwen3_next.Qwen3NextRMSNorm):
        assert zc_norm_route.same_function(cls, cls.__dict__["forward"]) == ("eps", None)


_KERNELIZE = textwrap.dedent("""
    import json, torch
    from matrix_worker import build  # tests/support is on PYTHONPATH
    import fastpath
    from fastpath.kernels.counters import CALLS
    from kernels import Mode, kernelize
    model = build("qwen3_5_text")
    ids = torch.randint(3, 64, (2, 7), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = model(ids).logits
    fastpath.enable(warn=False)
    kernelize(model, mode=Mode.INFERENCE, device="cpu")  # no Hub kernel for RMSNormZeroCentered
    CALLS.clear()
    with torch.no_grad():
        got = model(ids).logits
    out = {"calls": dict(CALLS), "diff": float((got - ref).abs().max()),
           "rows": [r for r in fastpath.explain(model).rows if r["op"] == "zc_rmsnorm"],
           "hub_name": getattr(type(model.model.norm), "kernel_layer_name", None)}
    fastpath.disable()
    with torch.no_grad():
        out["disabled_equal"] = bool(torch.equal(model(ids).logits, ref))
    print(json.dumps(out))
""")


@pytest.mark.skipif(not INTERP, reason="runs the fused kernels: needs TRITON_INTERPRET=1")
def test_route_survives_kernelize_on_transformers_525_with_kernels() -> None:
    python = venv_python("default")
    if not python.exists():
        pytest.skip(venv_missing("default"))
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(SUPPORT)]),
               TRITON_INTERPRET="1")
    env.pop("USE_HUB_KERNELS", None)
    proc = subprocess.run([str(python), "-c", _KERNELIZE], capture_output=True, text=True, env=env,
                          cwd=str(ROOT), timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["hub_name"] == zc_norm_route.HUB_NAME  # 5.25 + kernels: the class is kernelizable
    assert out["calls"].get("zc_rmsnorm_fwd:triton") == len(NORMS), out["calls"]
    assert out["diff"] <= 1e-4
    assert len(out["rows"]) == len(NORMS) and all(r["fast"] for r in out["rows"]), out["rows"]
    assert out["disabled_equal"]
