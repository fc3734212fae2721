"""fastpath's partial rotate-half RoPE (kernels/rotary) against its float64 reference and against
transformers' own `apply_rotary_pos_emb`.

On CPU the Triton kernels run under TRITON_INTERPRET=1 (skipped otherwise): the output and x's
gradient in fp32 / fp16 / bf16 (cos / sin in another float dtype too), x contiguous, a transpose
view of (B, L, H, D) (what the attention hands over), row-strided in a NaN-filled buffer (a read
outside the view shows as NaN), cos / sin contiguous, expanded over the batch (stride 0) or
row-strided; full rotary (R == D), partial (R < D), R == 2; gradcheck; a hypothesis sweep; the
reference fallback and its one-time warning; one-line errors, cos requiring grad refused; the
custom ops' fake implementations and registered autograd under torch.compile with no graph break.
The `gpu` tests check Qwen3.5-27B's attention (24 query / 4 key heads of 256, R = 64) at L = 4096.
"""

from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from kernel_checks import compiled_matches_eager  # noqa: E402

from fastpath.kernels.counters import CALLS  # noqa: E402
from fastpath.kernels.rotary import naive  # noqa: E402
from fastpath.kernels.rotary.interface import rotary, rotary_bwd, rotary_fwd  # noqa: E402

INTERP = os.environ.get("TRITON_INTERPRET") == "1"
needs_interp = pytest.mark.skipif(not INTERP, reason="runs the Triton kernels: needs TRITON_INTERPRET=1")
# error bound relative to the reference's terms' largest magnitude: one rounding of a float32 result
TOL = {torch.float32: 2e-6, torch.float16: 1e-3, torch.bfloat16: 8e-3}
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
X_LAYOUTS = ["contiguous", "transposed", "row-strided"]
CS_LAYOUTS = ["contiguous", "expanded", "row-strided"]


def _x(shape: tuple[int, int, int, int], dtype: torch.dtype, layout: str, gen: torch.Generator) -> torch.Tensor:
    """(B, H, L, D) values in `dtype` laid out as `layout`; whatever a view does not cover in its
    buffer is NaN."""
    b, h, length, d = shape
    values = torch.randn(shape, generator=gen).to(dtype)
    if layout == "transposed":
        return values.transpose(1, 2).contiguous().transpose(1, 2)
    if layout == "row-strided":  # half of a wider (B, L, H, 2D) buffer, seen as (B, H, L, D)
        buf = torch.full((b, length, h, 2 * d), float("nan"), dtype=dtype)
        view = buf[..., :d].transpose(1, 2)
        return view.copy_(values)
    return values


def _table(shape: tuple[int, int, int], dtype: torch.dtype, layout: str, gen: torch.Generator) -> torch.Tensor:
    b, length, r = shape
    if layout == "expanded":  # one position table for the whole batch (stride 0)
        return torch.randn(1, length, r, generator=gen).to(dtype).expand(b, length, r)
    values = torch.randn(shape, generator=gen).to(dtype)
    if layout == "row-strided":
        return torch.full((b, length, r + 3), float("nan"), dtype=dtype)[..., :r].copy_(values)
    return values


def _close(got: torch.Tensor, want: torch.Tensor, scale: float, dtype: torch.dtype, what: str) -> None:
    assert got.dtype == dtype, f"{what}: dtype {got.dtype}, want {dtype}"
    assert bool(torch.isfinite(got).all()), f"{what}: non-finite values (a read outside a view?)"
    err = (got.double() - want).abs().max().item() if got.numel() else 0.0
    assert err <= TOL[dtype] * (scale or 1.0), f"{what}: max error {err:.3e} vs scale {scale:.3e}"


def _check(shape, rot: int, dtype, x_layout="contiguous", cs_layout="contiguous", cs_dtype=None,
           dout_layout="contiguous", seed: int = 0) -> None:
    gen = torch.Generator().manual_seed(seed)
    b, _, length, _ = shape
    x = _x(shape, dtype, x_layout, gen)
    cos = _table((b, length, rot), cs_dtype or dtype, cs_layout, gen)
    sin = _table((b, length, rot), cs_dtype or dtype, cs_layout, gen)
    dout = _x(shape, dtype, dout_layout, gen)
    xl = x.detach().requires_grad_(True)
    out = rotary(xl, cos, sin)
    assert out.shape == torch.Size(shape) and out.is_contiguous()
    # the terms' scale: |x| |cos| + |x| |sin| (a result may cancel to far below it)
    terms = x.double().abs().max().item() * (cos.double().abs().max().item() + sin.double().abs().max().item())
    _close(out, naive.rotary_ref(x, cos, sin), terms, dtype, "out")
    out.backward(dout)
    dterms = dout.double().abs().max().item() * (cos.double().abs().max().item() + sin.double().abs().max().item())
    _close(xl.grad, naive.rotary_bwd_ref(dout, cos, sin), dterms, dtype, "dx")


@needs_interp
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("x_layout", X_LAYOUTS)
def test_kernel_matches_float64(dtype: torch.dtype, x_layout: str) -> None:
    CALLS.clear()
    _check((2, 3, 5, 24), 8, dtype, x_layout, cs_layout="row-strided", dout_layout=x_layout, seed=1)
    assert CALLS["rotary_fwd:triton"] == 1 and CALLS["rotary_bwd:triton"] == 1
    assert not CALLS["rotary_fwd:reference"] and not CALLS["rotary_bwd:reference"]


@needs_interp
@pytest.mark.parametrize(("width", "rot"), [(16, 16), (16, 2), (24, 8), (6, 4), (2, 2)],
                         ids=["full", "r2", "partial", "odd-half", "tiny"])
@pytest.mark.parametrize("cs_layout", CS_LAYOUTS)
def test_rotary_widths_and_table_layouts(width: int, rot: int, cs_layout: str) -> None:
    """Full rotary (R == D), the smallest R, partial R < D (half of R not a power of two), stride-0
    and row-strided cos / sin."""
    _check((2, 2, 3, width), rot, torch.float32, "transposed", cs_layout, seed=2)


@needs_interp
@pytest.mark.parametrize(("dtype", "cs_dtype"), [(torch.bfloat16, torch.float32), (torch.float32, torch.bfloat16),
                                                 (torch.float16, torch.bfloat16)])
def test_tables_in_another_dtype(dtype: torch.dtype, cs_dtype: torch.dtype) -> None:
    """cos / sin in another float dtype than x: read as they are, the result in x's dtype."""
    _check((1, 2, 4, 32), 16, dtype, "transposed", "expanded", cs_dtype=cs_dtype, seed=3)


@needs_interp
def test_wide_heads_tile_over_columns() -> None:
    """A head wider than one column tile (1024): the rotate-half partner lies in another tile."""
    _check((1, 1, 2, 2100), 2048, torch.float32, "row-strided", seed=4)


@needs_interp
def test_gradcheck() -> None:
    """x's gradient is the forward's adjoint (float32 through the kernel: the op is linear in x, so
    finite differences with a large step are exact up to float32 rounding)."""
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(1, 2, 3, 10, generator=gen).transpose(1, 2).contiguous().transpose(1, 2).requires_grad_(True)
    cos, sin = torch.randn(1, 3, 6, generator=gen), torch.randn(1, 3, 6, generator=gen)
    with pytest.warns(UserWarning, match="double precision"):
        assert torch.autograd.gradcheck(lambda t: rotary(t, cos, sin), (x,), eps=1e-2, atol=1e-4, rtol=1e-3)
    xd = x.detach().double().requires_grad_(True)
    assert torch.autograd.gradcheck(lambda t: naive.rotary_ref(t, cos.double(), sin.double()), (xd,))


@needs_interp
def test_matches_transformers_apply_rotary_pos_emb() -> None:
    """The spec is transformers' Qwen3.5 function: q and k through it and through the op agree
    (float32), partial rotary on a (B, L, H, D) projection seen as (B, H, L, D)."""
    module = pytest.importorskip("transformers.models.qwen3_5.modeling_qwen3_5")
    gen = torch.Generator().manual_seed(6)
    q = torch.randn(2, 5, 4, 16, generator=gen).transpose(1, 2)
    k = torch.randn(2, 5, 2, 16, generator=gen).transpose(1, 2)
    angles = torch.rand(2, 5, 4, generator=gen) * 6
    cos, sin = torch.cat((angles, angles), -1).cos(), torch.cat((angles, angles), -1).sin()
    want_q, want_k = module.apply_rotary_pos_emb(q, k, cos, sin)
    torch.testing.assert_close(rotary(q, cos, sin), want_q, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(rotary(k, cos, sin), want_k, rtol=1e-6, atol=1e-6)


def test_reference_path_on_cpu(monkeypatch) -> None:
    """Without the interpreter a CPU call takes the float32 reference, counted as such."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    for dtype in (torch.float32, torch.bfloat16):
        CALLS.clear()
        _check((2, 2, 3, 12), 8, dtype, "row-strided", "expanded", seed=7)
        assert CALLS["rotary_fwd:reference"] == 1 and CALLS["rotary_bwd:reference"] == 1
        assert not CALLS["rotary_fwd:triton"]


@needs_interp
def test_float64_falls_back_with_one_warning() -> None:
    CALLS.clear()
    gen = torch.Generator().manual_seed(8)
    x, cos, sin = torch.randn(1, 2, 3, 8, generator=gen).double(), torch.randn(1, 3, 4).double(), torch.randn(1, 3, 4)
    with pytest.warns(RuntimeWarning, match="float32, float16, bfloat16"):
        out = rotary(x, cos, sin)
    assert out.dtype == torch.float64 and CALLS["rotary_fwd:reference"] == 1
    assert (out - naive.rotary_ref(x, cos, sin)).abs().max() < 1e-5


def test_empty_input_and_bad_arguments() -> None:
    x = torch.empty(2, 3, 0, 8, requires_grad=True)
    out = rotary(x, torch.empty(2, 0, 4), torch.empty(2, 0, 4))
    out.sum().backward()
    assert out.shape == (2, 3, 0, 8) and x.grad.shape == (2, 3, 0, 8)
    x = torch.randn(2, 3, 5, 8)
    cs = torch.randn(2, 5, 4)
    with pytest.raises(ValueError, match=r"must be \(B, H, L, D\)"):
        rotary(torch.randn(3, 5, 8), cs, cs)
    with pytest.raises(ValueError, match="must both be"):
        rotary(x, cs, torch.randn(2, 5, 6))
    with pytest.raises(ValueError, match="R even"):
        rotary(x, torch.randn(2, 5, 3), torch.randn(2, 5, 3))
    with pytest.raises(ValueError, match="<= D = 8"):
        rotary(x, torch.randn(2, 5, 10), torch.randn(2, 5, 10))
    with pytest.raises(ValueError, match=r"\(2, 5, R\)"):
        rotary(x, torch.randn(1, 5, 4), torch.randn(1, 5, 4))
    with pytest.raises(ValueError, match="floating point"):
        rotary(x.int(), cs, cs)
    with pytest.raises(ValueError, match="must not require grad"):
        rotary(x.requires_grad_(True), cs.clone().requires_grad_(True), cs)


@needs_interp
def test_hypothesis_sweep() -> None:
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    @settings(max_examples=16, deadline=None, suppress_health_check=list(HealthCheck))
    @given(b=st.integers(1, 3), h=st.integers(1, 5), length=st.integers(1, 9), half=st.integers(1, 40),
           extra=st.integers(0, 40), dtype=st.sampled_from(DTYPES), cs_dtype=st.sampled_from(DTYPES),
           x_layout=st.sampled_from(X_LAYOUTS), cs_layout=st.sampled_from(CS_LAYOUTS),
           dout_layout=st.sampled_from(X_LAYOUTS), seed=st.integers(0, 999))
    def sweep(b, h, length, half, extra, dtype, cs_dtype, x_layout, cs_layout, dout_layout, seed):
        _check((b, h, length, 2 * half + extra), 2 * half, dtype, x_layout, cs_layout, cs_dtype, dout_layout, seed)

    sweep()


def test_fake_implementations_and_schema() -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x = torch.empty(2, 5, 3, 16, dtype=torch.bfloat16).transpose(1, 2)
        out = rotary_fwd(x, torch.empty(2, 5, 8), torch.empty(2, 5, 8))
        assert out.shape == x.shape and out.dtype == torch.bfloat16 and out.is_contiguous()
        dx = rotary_bwd(out, torch.empty(2, 5, 8), torch.empty(2, 5, 8))
        assert dx.shape == x.shape and dx.dtype == torch.bfloat16 and dx.is_contiguous()
    args = (torch.randn(1, 2, 3, 8).transpose(1, 2), torch.randn(1, 2, 4), torch.randn(1, 2, 4))
    torch.library.opcheck(rotary_fwd, args, test_utils=("test_schema", "test_faketensor"))
    torch.library.opcheck(rotary_bwd, args, test_utils=("test_schema", "test_faketensor"))


def test_compiled_has_no_graph_break_and_matches_eager() -> None:
    """One graph, no break; the aot_eager compile runs the registered autograd and agrees."""
    gen = torch.Generator().manual_seed(10)
    cos, sin = torch.randn(2, 6, 4, generator=gen), torch.randn(2, 6, 4, generator=gen)
    x = torch.randn(2, 6, 3, 8, generator=gen).transpose(1, 2)
    compiled_matches_eager(lambda t: rotary(t, cos, sin).square().sum(), (x,), "rotary_bwd")


# ---------------------------------------------------------------- device only

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("heads", [24, 4], ids=["q", "k"])
def test_gpu_at_27b_attention_size(dtype: torch.dtype, heads: int) -> None:  # pragma: no cover - device only
    """Qwen3.5-27B's attention (Qwen/Qwen3.5-27B config.json: 24 query / 4 key-value heads of 256,
    partial_rotary_factor 0.25: R = 64) over 4096 positions: q / k a transpose view of the
    (B, L, H, D) norm output, cos / sin expanded over the batch; output and x's gradient against
    float64, and no further from it than twice transformers' eager arithmetic in the model dtype."""
    gen = torch.Generator().manual_seed(12)
    b, length, d, r = 1, 4096, 256, 64
    x = torch.randn(b, length, heads, d, generator=gen).to(dtype).cuda().transpose(1, 2)
    angles = torch.rand(1, length, r // 2, generator=gen) * length
    emb = torch.cat((angles, angles), -1)
    cos, sin = emb.cos().to(dtype).cuda().expand(b, -1, -1), emb.sin().to(dtype).cuda().expand(b, -1, -1)
    dout = torch.randn(b, heads, length, d, generator=gen).to(dtype).cuda()
    xl = x.detach().requires_grad_(True)
    CALLS.clear()
    out = rotary(xl, cos, sin)
    out.backward(dout)
    assert CALLS["rotary_fwd:triton"] == 1 and CALLS["rotary_bwd:triton"] == 1
    want_out, want_dx = naive.rotary_ref(x, cos, sin), naive.rotary_bwd_ref(dout, cos, sin)
    scale = x.double().abs().max().item() * 2
    _close(out, want_out, scale, dtype, "out")
    _close(xl.grad, want_dx, dout.double().abs().max().item() * 2, dtype, "dx")
    if dtype != torch.float32:
        xe = x.detach().requires_grad_(True)
        c, s = cos.unsqueeze(1), sin.unsqueeze(1)
        rot, keep = xe[..., :r], xe[..., r:]
        eager = torch.cat((rot * c + torch.cat((-rot[..., r // 2:], rot[..., : r // 2]), -1) * s, keep), -1)
        eager.backward(dout)
        for name, ours, theirs, ref in (("out", out, eager, want_out), ("dx", xl.grad, xe.grad, want_dx)):
            d_ours = (ours.double() - ref).abs().max().item()
            d_theirs = (theirs.double() - ref).abs().max().item()
            assert d_ours <= 2 * d_theirs + 1e-12, f"{name}: {d_ours:.3e} vs eager {d_theirs:.3e}"
