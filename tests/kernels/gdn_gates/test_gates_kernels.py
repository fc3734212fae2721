"""fastpath's fused glue ops (kernels/gdn_gates, kernels/sigmoid_gate) against their float64
references, forward and every gradient: the Triton kernels under TRITON_INTERPRET=1 (skipped
otherwise), fp32/bf16, strided and non-contiguous inputs, a hypothesis sweep; the custom ops'
fake implementations and registered autograd (torch.compile sees no graph break)."""

from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from fastpath.kernels.counters import CALLS  # noqa: E402
from fastpath.kernels.gdn_gates import naive as gates_naive  # noqa: E402
from fastpath.kernels.gdn_gates.interface import gdn_gates, gdn_gates_fwd  # noqa: E402
from fastpath.kernels.sigmoid_gate import naive as gate_naive  # noqa: E402
from fastpath.kernels.sigmoid_gate.interface import sigmoid_gate, sigmoid_gate_fwd  # noqa: E402

INTERP = os.environ.get("TRITON_INTERPRET") == "1"
needs_interp = pytest.mark.skipif(not INTERP, reason="runs the Triton kernels: needs TRITON_INTERPRET=1")
# error bound relative to the reference's largest magnitude: fp32 accumulation / one bf16 rounding
TOL = {torch.float32: 2e-6, torch.bfloat16: 1.2e-2}


def _close(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype, what: str) -> None:
    err = (got.double() - want).abs().max().item()
    scale = want.abs().max().item() or 1.0
    assert err <= TOL[dtype] * scale, f"{what}: max error {err:.3e} vs scale {scale:.3e}"


def _gates_inputs(shape: tuple[int, ...], dtype: torch.dtype, layout: str, seed: int):
    gen = torch.Generator().manual_seed(seed)
    heads = shape[-1]
    if layout == "strided":  # slices of a wider projection output, like transformers' in_proj
        wide = torch.randn(*shape[:-1], 3 * heads, generator=gen) * 4
        a, b = wide[..., :heads], wide[..., 2 * heads:]
    elif layout == "transposed":
        a = (torch.randn(*reversed(shape), generator=gen) * 4).permute(*reversed(range(len(shape))))
        b = torch.randn(*reversed(shape), generator=gen).permute(*reversed(range(len(shape))))
    else:
        a, b = torch.randn(*shape, generator=gen) * 4, torch.randn(*shape, generator=gen) * 3
    a = a.to(dtype)
    b = b.to(dtype)
    a[(0,) * a.dim()] = 25.0  # one value above softplus's threshold (20)
    a_log = torch.randn(heads, generator=gen).to(dtype)
    dt_bias = torch.randn(heads, generator=gen).to(dtype)
    return a, b, a_log, dt_bias


def _check_gates(shape, dtype, layout, seed, with_dg=True, with_dbeta=True) -> None:
    a, b, a_log, dt_bias = _gates_inputs(shape, dtype, layout, seed)
    leaves = [t.detach().clone().requires_grad_(True) for t in (a, b, a_log, dt_bias)]
    g, beta = gdn_gates(*leaves)
    assert g.dtype == torch.float32 and beta.dtype == dtype and g.shape == a.shape == beta.shape
    want_g, want_beta = gates_naive.gdn_gates_ref(a, b, a_log, dt_bias)
    _close(g, want_g, torch.float32 if dtype == torch.float32 else dtype, "g")
    _close(beta, want_beta, dtype, "beta")
    gen = torch.Generator().manual_seed(seed + 1)
    dg = torch.randn(g.shape, generator=gen) if with_dg else None
    dbeta = torch.randn(beta.shape, generator=gen).to(dtype) if with_dbeta else None
    outs = [t for t, d in ((g, dg), (beta, dbeta)) if d is not None]
    torch.autograd.backward(outs, [d for d in (dg, dbeta) if d is not None])
    want = gates_naive.gdn_gates_bwd_ref(a, b, a_log, dt_bias, dg, dbeta)
    for leaf, ref, name in zip(leaves, want, ("da", "db", "dA_log", "ddt_bias"), strict=True):
        if (name == "db" and not with_dbeta) or (name in ("da", "dA_log", "ddt_bias") and not with_dg):
            assert leaf.grad is None or leaf.grad.abs().max() == 0, name
            continue
        assert leaf.grad.dtype == leaf.dtype
        _close(leaf.grad, ref, dtype, name)


@needs_interp
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("layout", ["contiguous", "strided", "transposed"])
def test_gdn_gates_kernel_matches_float64(dtype: torch.dtype, layout: str) -> None:
    CALLS.clear()
    _check_gates((2, 7, 6), dtype, layout, seed=3)
    assert CALLS["gdn_gates_fwd:triton"] == 1 and CALLS["gdn_gates_bwd:triton"] == 1


@needs_interp
@pytest.mark.parametrize(("with_dg", "with_dbeta"), [(True, False), (False, True)])
def test_gdn_gates_one_output_unused(with_dg: bool, with_dbeta: bool) -> None:
    _check_gates((3, 5), torch.float32, "contiguous", seed=4, with_dg=with_dg, with_dbeta=with_dbeta)


def test_gdn_gates_reference_path_on_cpu(monkeypatch) -> None:
    """Without the interpreter a CPU call takes the float32 reference (what the op does off-GPU)."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    CALLS.clear()
    _check_gates((2, 5, 3), torch.float32, "strided", seed=5)
    assert CALLS["gdn_gates_fwd:reference"] == 1 and CALLS["gdn_gates_bwd:reference"] == 1


def test_gdn_gates_bad_shapes_are_one_line_errors() -> None:
    a = torch.randn(2, 4)
    with pytest.raises(ValueError, match="must be \\(4,\\)"):
        gdn_gates(a, a, torch.randn(3), torch.randn(4))
    with pytest.raises(ValueError, match="must match"):
        gdn_gates(a, torch.randn(2, 3), torch.randn(4), torch.randn(4))


def _gate_inputs(shape, dtype, layout, seed):
    gen = torch.Generator().manual_seed(seed)
    width = shape[-1]
    if layout == "chunked":  # the gated attention's gate: second half of each head of q_proj's output
        qg = torch.randn(*shape[:-1], 2 * width, generator=gen).to(dtype)
        gate = qg[..., width:]
    else:
        gate = torch.randn(*shape, generator=gen).to(dtype) * 3
    if layout == "transposed":
        x = torch.randn(*shape[:-3], shape[-2], shape[-3], width, generator=gen).to(dtype).transpose(-3, -2)
    else:
        x = torch.randn(*shape, generator=gen).to(dtype)
    return x, gate


def _check_gate(shape, dtype, layout, seed) -> None:
    x, gate = _gate_inputs(shape, dtype, layout, seed)
    xl, gl = x.detach().clone().requires_grad_(True), gate.detach().clone().requires_grad_(True)
    out = sigmoid_gate(xl, gl)
    assert out.is_contiguous() and out.dtype == dtype and out.shape == x.shape
    _close(out, gate_naive.sigmoid_gate_ref(x, gate), dtype, "out")
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed + 1)).to(dtype)
    out.backward(dout)
    want_dx, want_dg = gate_naive.sigmoid_gate_bwd_ref(x, gate, dout)
    _close(xl.grad, want_dx, dtype, "dx")
    _close(gl.grad, want_dg, dtype, "dgate")


@needs_interp
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("layout", ["contiguous", "chunked", "transposed"])
def test_sigmoid_gate_kernel_matches_float64(dtype: torch.dtype, layout: str) -> None:
    CALLS.clear()
    _check_gate((2, 5, 3, 16), dtype, layout, seed=7)
    assert CALLS["sigmoid_gate_fwd:triton"] == 1 and CALLS["sigmoid_gate_bwd:triton"] == 1


def test_sigmoid_gate_reference_path_and_errors(monkeypatch) -> None:
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    CALLS.clear()
    _check_gate((2, 3, 2, 8), torch.float32, "chunked", seed=8)
    assert CALLS["sigmoid_gate_fwd:reference"] == 1
    with pytest.raises(ValueError, match="one shape"):
        sigmoid_gate(torch.randn(2, 3), torch.randn(3, 2))


@needs_interp
def test_hypothesis_sweep_of_both_ops() -> None:
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    @settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
    @given(rows=st.integers(1, 70), heads=st.integers(1, 40), width=st.integers(1, 80),
           dtype=st.sampled_from([torch.float32, torch.bfloat16]),
           layout=st.sampled_from(["contiguous", "strided", "transposed"]), seed=st.integers(0, 99))
    def sweep(rows, heads, width, dtype, layout, seed):
        _check_gates((rows, 1, heads) if layout == "transposed" else (rows, heads), dtype, layout, seed)
        gate_layout = {"strided": "chunked"}.get(layout, layout)
        _check_gate((1, rows, 1, width) if gate_layout == "transposed" else (rows, width), dtype, gate_layout, seed)

    sweep()


def test_fake_implementations_give_the_shapes_and_dtypes() -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        a = torch.empty(2, 5, 6, dtype=torch.bfloat16)
        g, beta = gdn_gates_fwd(a, a, torch.empty(6), torch.empty(6))
        assert g.shape == a.shape and g.dtype == torch.float32 and beta.dtype == torch.bfloat16
        out = sigmoid_gate_fwd(torch.empty(2, 3, 8, dtype=torch.bfloat16), torch.empty(2, 3, 8, dtype=torch.bfloat16))
        assert out.shape == (2, 3, 8) and out.dtype == torch.bfloat16
    torch.library.opcheck(gdn_gates_fwd, (torch.randn(3, 4), torch.randn(3, 4), torch.randn(4), torch.randn(4)),
                          test_utils=("test_schema", "test_faketensor"))
    torch.library.opcheck(sigmoid_gate_fwd, (torch.randn(3, 4), torch.randn(3, 4)),
                          test_utils=("test_schema", "test_faketensor"))


def test_compiled_glue_has_no_graph_break_and_matches_eager() -> None:
    """torch._dynamo.explain over a function that calls both ops (forward and backward through
    the registered autograd): one graph, no break."""
    import torch._dynamo

    def step(a, b, a_log, dt_bias, x, gate):
        g, beta = gdn_gates(a, b, a_log, dt_bias)
        return g.sum() + beta.float().sum() + sigmoid_gate(x, gate).sum()

    gen = torch.Generator().manual_seed(0)
    args = [torch.randn(2, 5, 4, generator=gen), torch.randn(2, 5, 4, generator=gen),
            torch.randn(4, generator=gen), torch.randn(4, generator=gen),
            torch.randn(2, 5, 8, generator=gen), torch.randn(2, 5, 16, generator=gen)[..., 8:]]
    leaves = [t.detach().clone().requires_grad_(True) for t in args]
    torch._dynamo.reset()
    report = torch._dynamo.explain(step)(*leaves)
    assert report.graph_break_count == 0, report.break_reasons
    assert report.graph_count == 1
    compiled = torch.compile(step, backend="aot_eager", fullgraph=True)
    eager_leaves = [t.detach().clone().requires_grad_(True) for t in args]
    got = compiled(*leaves)
    want = step(*eager_leaves)
    got.backward()
    want.backward()
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-5)
    for g1, g2 in zip(leaves, eager_leaves, strict=True):
        assert torch.allclose(g1.grad, g2.grad, rtol=1e-5, atol=1e-6)
