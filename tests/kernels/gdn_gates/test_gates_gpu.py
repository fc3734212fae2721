"""The fused glue ops at Qwen3.5-27B sizes on the GPU (device only): GatedDeltaNet gates over
B*L = 4096 x 48 value heads, the attention output gate over 24 heads x 256 read from a q_proj-shaped
(B, L, 24, 512) output, forward and every gradient against float64, bf16 and fp32; and one
27B-shaped GatedDeltaNet layer + gated attention layer, enable() vs the reference path."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

TOL = {torch.float32: 1e-5, torch.bfloat16: 1.2e-2}


def _rel(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.double() - want).abs().max() / want.abs().max().clamp_min(1e-30)).item()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("batch", [1, 2])
def test_gdn_gates_at_27b_size(dtype: torch.dtype, batch: int) -> None:  # pragma: no cover - device only
    from fastpath.kernels.counters import CALLS
    from fastpath.kernels.gdn_gates import naive
    from fastpath.kernels.gdn_gates.interface import gdn_gates

    gen = torch.Generator(device="cuda").manual_seed(0)
    heads, length = 48, 4096
    ab = torch.randn(batch, length, 2 * heads, device="cuda", generator=gen).to(dtype) * 4
    a, b = ab[..., :heads], ab[..., heads:]  # strided, like two projections' slices
    a_log = torch.randn(heads, device="cuda", generator=gen).to(dtype)
    dt_bias = torch.randn(heads, device="cuda", generator=gen).to(dtype)
    leaves = [t.detach().clone().requires_grad_(True) for t in (a, b, a_log, dt_bias)]
    CALLS.clear()
    g, beta = gdn_gates(*leaves)
    dg = torch.randn(g.shape, device="cuda", generator=gen)
    dbeta = torch.randn(beta.shape, device="cuda", generator=gen).to(dtype)
    torch.autograd.backward([g, beta], [dg, dbeta])
    assert CALLS["gdn_gates_fwd:triton"] == 1 and CALLS["gdn_gates_bwd:triton"] == 1
    want_g, want_beta = naive.gdn_gates_ref(a, b, a_log, dt_bias)
    assert _rel(g, want_g) <= TOL[torch.float32 if dtype == torch.float32 else dtype]
    assert _rel(beta, want_beta) <= TOL[dtype]
    for leaf, ref in zip(leaves, naive.gdn_gates_bwd_ref(a, b, a_log, dt_bias, dg, dbeta), strict=True):
        assert _rel(leaf.grad, ref) <= TOL[dtype] * (4 if leaf.dim() == 1 else 1)  # sums of 4096 rows


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_sigmoid_gate_at_27b_size(dtype: torch.dtype) -> None:  # pragma: no cover - device only
    from fastpath.kernels.counters import CALLS
    from fastpath.kernels.sigmoid_gate import naive
    from fastpath.kernels.sigmoid_gate.interface import sigmoid_gate

    gen = torch.Generator(device="cuda").manual_seed(1)
    heads, head_dim, length = 24, 256, 4096
    q_out = torch.randn(1, length, heads, 2 * head_dim, device="cuda", generator=gen).to(dtype)
    gate = q_out[..., head_dim:]  # the second half of each head: a strided view, read in place
    x = torch.randn(1, length, heads, head_dim, device="cuda", generator=gen).to(dtype)
    xl, gl = x.clone().requires_grad_(True), gate.detach().requires_grad_(True)
    assert not gl.is_contiguous()
    CALLS.clear()
    out = sigmoid_gate(xl, gl)
    dout = torch.randn(out.shape, device="cuda", generator=gen).to(dtype)
    out.backward(dout)
    assert CALLS["sigmoid_gate_fwd:triton"] == 1 and CALLS["sigmoid_gate_bwd:triton"] == 1
    assert _rel(out, naive.sigmoid_gate_ref(x, gate)) <= TOL[dtype]
    want_dx, want_dg = naive.sigmoid_gate_bwd_ref(x, gate, dout)
    assert _rel(xl.grad, want_dx) <= TOL[dtype] and _rel(gl.grad, want_dg) <= TOL[dtype]


def test_27b_layers_route_and_match_the_reference() -> None:  # pragma: no cover - device only
    """Two 27B-shaped layers (one GatedDeltaNet, one gated attention), bf16, B=1, L=2048:
    enable()'s routed forwards against enable(glue=False), output and input gradient, within the
    bf16 tolerance verify uses for a layer (relative L2 <= 2e-2)."""
    from fastpath.kernels.counters import CALLS
    from fastpath.models.build import build_model
    from fastpath.routing import gates_route
    from fastpath.routing.engine import disable, enable

    built = build_model("qwen3.5-27b", layers=4, dtype="bf16", device="cuda", seed=0)
    layers = built.model.model.layers
    gdn = next(m.linear_attn for m in layers if hasattr(m, "linear_attn"))
    attn = next(m.self_attn for m in layers if hasattr(m, "self_attn"))
    gen = torch.Generator(device="cuda").manual_seed(2)
    x = torch.randn(1, 2048, 5120, device="cuda", generator=gen, dtype=torch.bfloat16)
    pos = torch.arange(2048, device="cuda").view(1, 1, -1).expand(3, 1, -1)  # (t, h, w) positions of text
    cos_sin = built.model.model.rotary_emb(x, pos)

    def run() -> list[torch.Tensor]:
        outs = []
        for layer, args in ((gdn, ()), (attn, (cos_sin, None))):
            inp = x.clone().requires_grad_(True)
            out = layer(inp, *args)
            out = out[0] if isinstance(out, tuple) else out
            out.float().square().mean().backward()
            outs += [out.detach(), inp.grad]
        return outs

    try:  # the reference: enable() without the glue (FLA's #640 guard is handled there, not in bare FLA)
        enable(warn=False, glue=False)
        want = run()
        report = enable(warn=False)
        assert report.glue == gates_route.IMPL
        CALLS.clear()
        got = run()
        assert CALLS["gdn_gates_fwd:triton"] == 1 and CALLS["sigmoid_gate_fwd:triton"] == 1, dict(CALLS)
    finally:
        disable()
    for g, w in zip(got, want, strict=True):
        rel = ((g.double() - w.double()).norm() / w.double().norm()).item()
        assert rel <= 2e-2, rel
