"""fastpath's SwiGLU gated product (kernels/swiglu), silu(gate) * up, against its float64
reference and against transformers' own gated MLP arithmetic (`act_fn(gate) * up`).

On CPU the Triton kernels run under TRITON_INTERPRET=1 (skipped otherwise): the output and both
gradients on never-zero inputs from |g| ~ 1e-3 to ~30 (the sigmoid's saturated tails), fp32 / fp16 /
bf16 and mixed dtypes, contiguous, row-strided (a slice of a wider buffer whose rest is NaN),
transposed and stride-0 broadcast inputs (copied to contiguous first), lengths around the block
size, a hypothesis sweep; the reference fallback and its one-time warning; the custom ops' fake
implementations and registered autograd under torch.compile with no graph break. The `gpu` group
checks Qwen3.5-27B MLP sizes on the device. Precision rule in fp16/bf16: no further from float64 than
twice transformers' eager `silu(g) * u` (which rounds twice), and within one rounding of a float32
result relative to the result's scale (dgate: to the scale of the terms that cancel near silu's
minimum, g = -1.28).
"""

from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from kernel_checks import compiled_matches_eager  # noqa: E402

from fastpath.kernels.counters import CALLS  # noqa: E402
from fastpath.kernels.swiglu import naive  # noqa: E402
from fastpath.kernels.swiglu.interface import silu_mul, silu_mul_bwd, silu_mul_fwd  # noqa: E402

# the interpreter evaluates sigmoid's exp in numpy, which warns where exp(-g) overflows to inf (the
# sigmoid is then exactly 0, as on the GPU)
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")
INTERP = os.environ.get("TRITON_INTERPRET") == "1"
needs_interp = pytest.mark.skipif(not INTERP, reason="runs the Triton kernels: needs TRITON_INTERPRET=1")
# error bound relative to the reference's largest magnitude: one rounding of a float32 result
TOL = {torch.float32: 1e-6, torch.float16: 1e-3, torch.bfloat16: 8e-3}
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
LAYOUTS = ["contiguous", "row-strided", "transposed", "broadcast"]


def _values(shape: tuple[int, ...], gen: torch.Generator, spread: float) -> torch.Tensor:
    t = torch.randn(shape, generator=gen) * torch.exp(spread * torch.randn(shape, generator=gen))
    return t + 0.01 * torch.where(t < 0, -1.0, 1.0)  # never zero


def _lay(values: torch.Tensor, dtype: torch.dtype, layout: str) -> torch.Tensor:
    """`values` in `dtype` as a leaf laid out as `layout`; whatever a view does not cover in its
    buffer is NaN, so a read outside the view shows in every result."""
    *lead, width = values.shape
    if layout == "row-strided":  # one half of a wider (gate | up) projection output
        out = torch.full((*lead, 2 * width), float("nan"), dtype=dtype)[..., :width]
    elif layout == "transposed" and len(lead) >= 2:
        out = torch.empty(lead[1], lead[0], *lead[2:], width, dtype=dtype).transpose(0, 1)
    elif layout == "broadcast":  # one row broadcast over the leading dims (stride 0), or one value
        row = values.reshape(-1, width)[0] if lead else values.reshape(-1)[:1]
        return row.to(dtype).expand(*lead, width)
    else:
        return values.to(dtype)
    return out.copy_(values)


def _close(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype, what: str,
           terms: torch.Tensor | None = None) -> None:
    """Within TOL of the reference's largest magnitude, or of `terms`' (the magnitudes a result is
    summed from, where terms cancel: no arithmetic in `dtype` gets closer than their rounding),
    plus one subnormal step of `dtype` (a result below its range, silu(-120) ~ 1e-50, is 0 there)."""
    assert got.dtype == dtype, f"{what}: dtype {got.dtype}, want {dtype}"
    err = (got.double() - want).abs().max().item() if got.numel() else 0.0
    scale = (want if terms is None else terms).abs().max().item() if want.numel() else 1.0
    floor = torch.finfo(dtype).eps * torch.finfo(dtype).tiny
    assert err <= TOL[dtype] * (scale or 1.0) + floor, f"{what}: max error {err:.3e} vs scale {scale:.3e}"


def _dgate_terms(gate: torch.Tensor, up: torch.Tensor, dout: torch.Tensor) -> torch.Tensor:
    """dgate = dout * up * s * (1 + g * sigmoid(-g)): near g = -1.28 (silu's minimum) the last
    factor cancels to ~0 from terms of ~1, so its rounding is measured against 1 + |g * sigmoid(-g)|."""
    g, u, d = gate.double(), up.double(), dout.double()
    return d * u * torch.sigmoid(g) * (1 + (g * torch.sigmoid(-g)).abs())


def _check(shape, g_dtype, u_dtype=None, g_layout="contiguous", u_layout="contiguous", seed=0) -> None:
    u_dtype = u_dtype or g_dtype
    gen = torch.Generator().manual_seed(seed)
    gate = _lay(_values(shape, gen, 1.5), g_dtype, g_layout)
    up = _lay(_values(shape, gen, 0.5), u_dtype, u_layout)
    out_dtype = torch.promote_types(g_dtype, u_dtype)
    dout = _values(shape, gen, 0.5).to(out_dtype)
    gl, ul = gate.detach().requires_grad_(True), up.detach().requires_grad_(True)
    out = silu_mul(gl, ul)
    assert out.shape == torch.Size(shape) and out.is_contiguous()
    _close(out, naive.silu_mul_ref(gate, up), out_dtype, "out")
    out.backward(dout)
    want_dg, want_du = naive.silu_mul_bwd_ref(gate, up, dout)
    _close(gl.grad, want_dg, g_dtype, "dgate", _dgate_terms(gate, up, dout))
    _close(ul.grad, want_du, u_dtype, "dup")


@needs_interp
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_kernel_matches_float64(dtype: torch.dtype, layout: str) -> None:
    CALLS.clear()
    _check((3, 5, 48), dtype, g_layout=layout, u_layout="contiguous" if layout == "broadcast" else layout, seed=1)
    assert CALLS["swiglu_fwd:triton"] == 1 and CALLS["swiglu_bwd:triton"] == 1
    assert not CALLS["swiglu_fwd:reference"] and not CALLS["swiglu_bwd:reference"]


@needs_interp
@pytest.mark.parametrize(("g_dtype", "u_dtype"), [(torch.float32, torch.bfloat16), (torch.float16, torch.float32),
                                                  (torch.bfloat16, torch.float16)])
def test_mixed_dtypes_promote(g_dtype: torch.dtype, u_dtype: torch.dtype) -> None:
    _check((4, 33), g_dtype, u_dtype, u_layout="broadcast", seed=2)


@needs_interp
@pytest.mark.parametrize("shape", [(1,), (5,), (2047,), (2048,), (2049,), (3, 1500), (1, 2, 3, 700)])
def test_lengths_around_the_block(shape: tuple[int, ...]) -> None:
    """One element, a short tail, exactly one block, one over, several programs."""
    _check(shape, torch.float32, seed=3)


@needs_interp
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_no_worse_than_transformers_eager_arithmetic(dtype: torch.dtype) -> None:
    """transformers' MLP computes act_fn(gate) * up in the model dtype (silu rounded, then the
    product rounded); the fused op rounds once. The project's rule for half precision: no further
    from float64 than twice eager's distance (a single rounding can land half an ulp the other way)."""
    gen = torch.Generator().manual_seed(4)
    gate = _values((64, 96), gen, 1.5).to(dtype)
    up = _values((64, 96), gen, 0.5).to(dtype)
    dout = _values((64, 96), gen, 0.5).to(dtype)
    ge, ue = gate.clone().requires_grad_(True), up.clone().requires_grad_(True)
    theirs = torch.nn.SiLU()(ge) * ue
    theirs.backward(dout)
    go, uo = gate.clone().requires_grad_(True), up.clone().requires_grad_(True)
    ours = silu_mul(go, uo)
    ours.backward(dout)
    want = (naive.silu_mul_ref(gate, up), *naive.silu_mul_bwd_ref(gate, up, dout))
    for name, t, o, ref in zip(("out", "dgate", "dup"), (theirs, ge.grad, ue.grad), (ours, go.grad, uo.grad), want,
                               strict=True):
        d_ours = (o.double() - ref).abs().max().item()
        d_theirs = (t.double() - ref).abs().max().item()
        assert d_ours <= 2 * d_theirs + 1e-12, f"{name}: {d_ours:.3e} vs eager {d_theirs:.3e}"


def test_reference_path_on_cpu(monkeypatch) -> None:
    """Without the interpreter a CPU call takes the float32 reference, counted as such."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    for dtype in (torch.float32, torch.bfloat16):
        CALLS.clear()
        _check((3, 4, 24), dtype, g_layout="transposed", seed=6)
        assert CALLS["swiglu_fwd:reference"] == 1 and CALLS["swiglu_bwd:reference"] == 1
        assert not CALLS["swiglu_fwd:triton"]


@needs_interp
def test_float64_falls_back_with_one_warning() -> None:
    CALLS.clear()
    gen = torch.Generator().manual_seed(7)
    gate, up = _values((3, 16), gen, 1.0).double(), _values((3, 16), gen, 1.0).double()
    with pytest.warns(RuntimeWarning, match="float32, float16, bfloat16"):
        out = silu_mul(gate, up)
    assert out.dtype == torch.float64 and CALLS["swiglu_fwd:reference"] == 1
    assert (out - naive.silu_mul_ref(gate, up)).abs().max() < 1e-5


def test_empty_input_and_bad_arguments() -> None:
    gate = torch.empty(0, 8, requires_grad=True)
    up = torch.empty(0, 8, requires_grad=True)
    out = silu_mul(gate, up)
    out.sum().backward()
    assert out.shape == (0, 8) and gate.grad.shape == (0, 8)
    with pytest.raises(ValueError, match="must have one shape"):
        silu_mul(torch.randn(2, 8), torch.randn(8))
    with pytest.raises(ValueError, match="floating point"):
        silu_mul(torch.ones(2, 4, dtype=torch.int32), torch.randn(2, 4))
    with pytest.raises(ValueError, match="dout"):
        silu_mul_bwd(torch.randn(2, 4), torch.randn(2, 4), torch.randn(4, 2))


@needs_interp
def test_hypothesis_sweep() -> None:
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    @settings(max_examples=16, deadline=None, suppress_health_check=list(HealthCheck))
    @given(lead=st.lists(st.integers(1, 9), min_size=0, max_size=3), width=st.integers(1, 300),
           g_dtype=st.sampled_from(DTYPES), u_dtype=st.sampled_from(DTYPES),
           g_layout=st.sampled_from(LAYOUTS), u_layout=st.sampled_from(LAYOUTS), seed=st.integers(0, 999))
    def sweep(lead, width, g_dtype, u_dtype, g_layout, u_layout, seed):
        _check((*lead, width), g_dtype, u_dtype, g_layout, u_layout, seed=seed)

    sweep()


def test_fake_implementations_and_schema() -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        g = torch.empty(2, 5, 16, dtype=torch.bfloat16).transpose(0, 1)
        out = silu_mul_fwd(g, torch.empty(5, 2, 16, dtype=torch.float32))
        assert out.shape == g.shape and out.dtype == torch.float32 and out.is_contiguous()
        dg, du = silu_mul_bwd(g, g, g)
        assert dg.shape == du.shape == g.shape and dg.dtype == torch.bfloat16 and dg.is_contiguous()
    args = (torch.randn(3, 8), torch.randn(3, 8))
    torch.library.opcheck(silu_mul_fwd, args, test_utils=("test_schema", "test_faketensor"))
    torch.library.opcheck(silu_mul_bwd, (*args, torch.randn(3, 8)), test_utils=("test_schema", "test_faketensor"))


def test_compiled_has_no_graph_break_and_matches_eager() -> None:
    """One graph, no break; the aot_eager compile runs the registered autograd and agrees."""
    gen = torch.Generator().manual_seed(10)
    inputs = (_values((2, 6, 24), gen, 1.0), _values((2, 6, 24), gen, 1.0))
    compiled_matches_eager(lambda g, u: silu_mul(g, u).float().square().sum(), inputs, "swiglu_bwd")


# ---------------------------------------------------------------- device only

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_gpu_at_27b_mlp_size(dtype: torch.dtype) -> None:  # pragma: no cover - device only
    """Qwen3.5-27B's MLP (intermediate 17408, Qwen/Qwen3.5-27B config.json) over 4096 tokens, plus
    an odd length: output and gradients against float64, and no worse than eager torch in bf16."""
    gen = torch.Generator().manual_seed(12)
    for shape in ((1, 4096, 17408), (3, 1001)):
        gate = _values(shape, gen, 1.5).to(dtype).cuda()
        up = _values(shape, gen, 0.5).to(dtype).cuda()
        dout = _values(shape, gen, 0.5).to(dtype).cuda()
        gl, ul = gate.clone().requires_grad_(True), up.clone().requires_grad_(True)
        CALLS.clear()
        out = silu_mul(gl, ul)
        out.backward(dout)
        assert CALLS["swiglu_fwd:triton"] == 1 and CALLS["swiglu_bwd:triton"] == 1
        want = (naive.silu_mul_ref(gate, up), *naive.silu_mul_bwd_ref(gate, up, dout))
        for name, got, ref in zip(("out", "dgate", "dup"), (out, gl.grad, ul.grad), want, strict=True):
            _close(got, ref, dtype, name)
