"""fastpath's zero-centred RMSNorm (kernels/zc_rmsnorm), y = rmsnorm(x) * (1 + w), against its
float64 reference and against transformers' own Qwen3_5RMSNorm / Qwen3NextRMSNorm modules.

On CPU the Triton kernels run under TRITON_INTERPRET=1 (skipped otherwise): forward, dx and dw on
never-zero inputs and weights, fp32/fp16/bf16 x with fp32 or x-dtype weights, contiguous, row-
strided (a slice of a wider output, read in place), transposed-leading-dims and column-strided x
(copied), contiguous, strided and stride-0 broadcast weights, several leading shapes and a
hypothesis sweep; the reference fallback (no interpreter, float64, rows wider than MAX_WIDTH) and
its one-time warning; the custom ops' fake implementations and registered autograd under
torch.compile with no graph break. The same for add_zc_rmsnorm (the decoder's residual add fused
in): s bit for bit torch's own add, y and the gradients (dx = ds + the norm's, given to x and the
residual) against float64 and against transformers' add-then-module sequence, with ds absent too.
The `gpu` group checks Qwen3.5-27B sizes on the device.
Precision rule in fp16/bf16: no further from float64 than twice transformers' module's own
distance (both round a float32 result once); in fp32 within 1e-6 of the module (only the order of
the row sum differs).
"""

from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from kernel_checks import compiled_matches_eager  # noqa: E402

from fastpath.kernels.counters import CALLS  # noqa: E402
from fastpath.kernels.zc_rmsnorm import naive  # noqa: E402
from fastpath.kernels.zc_rmsnorm.interface import (  # noqa: E402
    MAX_WIDTH,
    add_zc_rmsnorm,
    add_zc_rmsnorm_bwd,
    add_zc_rmsnorm_fwd,
    zc_rmsnorm,
    zc_rmsnorm_bwd,
    zc_rmsnorm_fwd,
)

INTERP = os.environ.get("TRITON_INTERPRET") == "1"
needs_interp = pytest.mark.skipif(not INTERP, reason="runs the Triton kernels: needs TRITON_INTERPRET=1")
# error bound relative to the reference's largest magnitude: one rounding of a float32 result
# (2^-9 bf16, 2^-12 fp16, with room), float32 accumulation over short rows
TOL = {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 4e-3}
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
X_LAYOUTS = ["contiguous", "row-strided", "transposed", "col-strided"]
W_LAYOUTS = ["contiguous", "strided", "broadcast"]


def _never_zero(t: torch.Tensor) -> torch.Tensor:
    return t + 0.05 * torch.where(t < 0, -1.0, 1.0)


def _x(shape: tuple[int, ...], dtype: torch.dtype, layout: str, gen: torch.Generator) -> torch.Tensor:
    """x of `shape` in `layout`, never zero, row RMS from ~1e-2 to ~1e2; whatever the view does
    not cover in its buffer is NaN, so a read outside the view shows in every result."""
    *lead, width = shape
    scale = torch.exp(2 * torch.randn(*lead, 1, generator=gen))
    values = (_never_zero(torch.randn(*shape, generator=gen)) * scale).to(dtype)
    if layout == "row-strided":  # q_norm's input: one half of each head of q_proj's output
        out = torch.full((*lead, 2 * width), float("nan"), dtype=dtype)[..., :width]
    elif layout == "transposed" and len(lead) >= 2:
        out = torch.empty(lead[1], lead[0], *lead[2:], width, dtype=dtype).transpose(0, 1)
    elif layout == "col-strided":
        out = torch.full((*lead, width, 2), float("nan"), dtype=dtype)[..., 0]
    else:
        return values
    return out.copy_(values)


def _w(width: int, dtype: torch.dtype, layout: str, gen: torch.Generator) -> torch.Tensor:
    if layout == "broadcast":
        return _never_zero(0.5 * torch.randn(1, generator=gen)).to(dtype).expand(width)
    if layout == "strided":
        return _never_zero(0.5 * torch.randn(2 * width, generator=gen)).to(dtype)[::2]
    return _never_zero(0.5 * torch.randn(width, generator=gen)).to(dtype)


def _close(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype, what: str, scale: float | None = None) -> None:
    assert got.dtype == dtype, f"{what}: dtype {got.dtype}, want {dtype}"
    err = (got.double() - want).abs().max().item() if got.numel() else 0.0
    if scale is None:
        scale = want.abs().max().item() if want.numel() else 1.0
    assert err <= TOL[dtype] * (scale or 1.0), f"{what}: max error {err:.3e} vs scale {scale:.3e}"


def _check(shape, dtype, x_layout="contiguous", w_dtype=torch.float32, w_layout="contiguous",
           eps=1e-6, seed=0) -> None:
    gen = torch.Generator().manual_seed(seed)
    x = _x(shape, dtype, x_layout, gen)
    w = _w(shape[-1], w_dtype, w_layout, gen)
    dy = _never_zero(torch.randn(shape, generator=gen)).to(dtype)
    xl = x.detach().clone().requires_grad_(True) if x_layout == "contiguous" else x.detach().requires_grad_(True)
    base = w.detach()[:1].clone() if w_layout == "broadcast" else w.detach().clone()
    wl = base.requires_grad_(True)
    w_in = wl.expand(shape[-1]) if w_layout == "broadcast" else wl
    y = zc_rmsnorm(xl, w_in, eps)
    assert y.shape == x.shape and y.is_contiguous()
    _close(y, naive.zc_rmsnorm_ref(x, w, eps), dtype, "y")
    y.backward(dy)
    _close_grads(x, w, dy, eps, {"dx": xl.grad}, wl.grad, w_layout)


def _close_grads(x, w, dy, eps, dx_grads: dict, dw_grad, w_layout: str, ds=None) -> None:
    """The norm's input gradients (plus ds, the gradient reaching its input from elsewhere, when
    given) and its weight gradient against float64 at input x."""
    want_dx, want_dw = naive.zc_rmsnorm_bwd_ref(x, w, dy, eps)
    # dx = r * (dy * g - xh * mean(dy * g * xh)): two terms of size |r * dy * g| that cancel when a
    # row is short (width 1: dx ~ eps), so its error is bounded relative to the terms
    x64 = x.double()
    r = torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + eps)
    terms = (r * dy.double() * (1 + w.double())).abs().max().item()
    if ds is not None:
        want_dx = want_dx + ds.double()
        terms = max(terms, ds.double().abs().max().item())
    for name, grad in dx_grads.items():
        _close(grad, want_dx, x.dtype, name, scale=max(terms, want_dx.abs().max().item()))
    # dw sums dy * xh over rows (and, for a broadcast weight, over columns): bounded relative to
    # the sum of the terms' magnitudes, which cancel too
    dw_terms = (dy.double() * x64 * r).abs().reshape(-1, x.shape[-1]).sum(0)
    if w_layout == "broadcast":
        want_dw, dw_terms = want_dw.sum().reshape(1), dw_terms.sum()
    _close(dw_grad, want_dw, w.dtype, "dw", scale=dw_terms.max().item())


@needs_interp
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("x_layout", X_LAYOUTS)
def test_kernel_matches_float64(dtype: torch.dtype, x_layout: str) -> None:
    CALLS.clear()
    _check((3, 5, 48), dtype, x_layout, w_dtype=torch.float32, seed=1)
    assert CALLS["zc_rmsnorm_fwd:triton"] == 1 and CALLS["zc_rmsnorm_bwd:triton"] == 1
    assert not CALLS["zc_rmsnorm_fwd:reference"] and not CALLS["zc_rmsnorm_bwd:reference"]


@needs_interp
@pytest.mark.parametrize("w_layout", W_LAYOUTS)
@pytest.mark.parametrize("w_dtype", ["x", torch.float32])
def test_weight_dtypes_and_layouts(w_layout: str, w_dtype) -> None:
    dtype = torch.bfloat16
    _check((2, 7, 40), dtype, "row-strided", w_dtype=dtype if w_dtype == "x" else w_dtype, w_layout=w_layout, seed=2)


@needs_interp
@pytest.mark.parametrize("shape", [(1,), (5,), (33, 1), (70, 24), (2, 3, 4, 96), (1, 1, 1, 300)])
def test_leading_shapes_and_widths(shape: tuple[int, ...]) -> None:
    """One element, one row, rows of width 1, many short rows per program (BLOCK_M > 1), a
    width that is not a power of two, rows spread over several backward programs."""
    _check(shape, torch.float32, "contiguous", seed=3)


@needs_interp
def test_widest_row_the_kernel_takes() -> None:
    CALLS.clear()
    _check((2, MAX_WIDTH), torch.bfloat16, "contiguous", seed=4)
    assert CALLS["zc_rmsnorm_fwd:triton"] == 1 and CALLS["zc_rmsnorm_bwd:triton"] == 1


def _module_and_ours(cls, dtype, w_dtype, seed):
    """(x, module output, our output, module grads, our grads) for one module instance."""
    gen = torch.Generator().manual_seed(seed)
    shape = (4, 9, 64)
    x = _x(shape, dtype, "contiguous", gen)
    dy = _never_zero(torch.randn(shape, generator=gen)).to(dtype)
    module = cls(shape[-1], eps=1e-6).to(w_dtype)
    with torch.no_grad():
        module.weight.copy_(_w(shape[-1], torch.float32, "contiguous", gen))
    xm = x.clone().requires_grad_(True)
    ym = module(xm)
    ym.backward(dy)
    w = module.weight.detach().clone().requires_grad_(True)
    xo = x.clone().requires_grad_(True)
    yo = zc_rmsnorm(xo, w, module.eps)
    yo.backward(dy)
    return x, module.weight.detach(), dy, (ym, xm.grad, module.weight.grad), (yo, xo.grad, w.grad)


@needs_interp
@pytest.mark.parametrize("cls_name", ["qwen3_5.modeling_qwen3_5.Qwen3_5RMSNorm",
                                      "qwen3_next.modeling_qwen3_next.Qwen3NextRMSNorm"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_matches_transformers_module(cls_name: str, dtype: torch.dtype) -> None:
    """fp32: the module's result to 1e-6 relative (forward) / 1e-5 (gradients: the module
    differentiates rsqrt, pow and mean separately). fp16/bf16 (module weight in x's dtype, as in a
    half-precision model): no further from float64 than twice the module's own distance."""
    import importlib

    mod_name, cls_attr = cls_name.rsplit(".", 1)
    cls = getattr(importlib.import_module(f"transformers.models.{mod_name}"), cls_attr)
    x, w, dy, theirs, ours = _module_and_ours(cls, dtype, dtype, seed=5)
    want = (naive.zc_rmsnorm_ref(x, w, 1e-6), *naive.zc_rmsnorm_bwd_ref(x, w, dy, 1e-6))
    for name, t, o, ref in zip(("y", "dx", "dw"), theirs, ours, want, strict=True):
        assert o.dtype == t.dtype and o.shape == t.shape, name
        if dtype == torch.float32:
            tol = 1e-6 if name == "y" else 1e-5
            assert (o - t).abs().max() <= tol * t.abs().max(), name
        else:
            d_ours = (o.double() - ref).abs().max().item()
            d_theirs = (t.double() - ref).abs().max().item()
            assert d_ours <= 2 * d_theirs + 1e-12, f"{name}: {d_ours:.3e} vs module {d_theirs:.3e}"


@needs_interp
@pytest.mark.parametrize("dtype", DTYPES)
def test_bit_for_bit_with_the_module_where_the_row_sum_is_exact(dtype: torch.dtype) -> None:
    """Small integers times a power of two per row, widths a power of two: the sum of squares is
    exact in any order and sum * (1/H) equals sum / H, so the only freedom left is the op order
    and the casts, and the output must equal transformers' module bit for bit (weight of either
    sign, fp32 or x's dtype). Other widths differ in the last bit where torch's CPU mean divides by
    H and the kernel multiplies by fl(1/H), as torch's CUDA mean does."""
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5RMSNorm

    gen = torch.Generator().manual_seed(11)
    for width, w_dtype in ((64, torch.float32), (256, dtype)):
        sign = torch.where(torch.rand(300, width, generator=gen) < 0.5, -1.0, 1.0)
        x = torch.randint(1, 9, (300, width), generator=gen) * sign
        x = (x * 2.0 ** torch.randint(-6, 6, (300, 1), generator=gen)).to(dtype)
        module = Qwen3_5RMSNorm(width, eps=1e-6).to(w_dtype)
        with torch.no_grad():
            module.weight.copy_(_w(width, torch.float32, "contiguous", gen))
            assert torch.equal(zc_rmsnorm(x, module.weight, 1e-6), module(x)), (width, w_dtype)


def test_reference_path_on_cpu_is_the_module_bit_for_bit(monkeypatch) -> None:
    """Without the interpreter a CPU call takes the float32 reference: transformers' own sequence
    of torch ops, so fp32 and bf16 outputs equal the module's exactly."""
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5RMSNorm

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    for dtype in (torch.float32, torch.bfloat16):
        CALLS.clear()
        _check((3, 4, 24), dtype, "transposed", seed=6)
        assert CALLS["zc_rmsnorm_fwd:reference"] == 1 and CALLS["zc_rmsnorm_bwd:reference"] == 1
        gen = torch.Generator().manual_seed(7)
        x = _x((5, 32), dtype, "row-strided", gen)
        module = Qwen3_5RMSNorm(32, eps=1e-5)
        with torch.no_grad():
            module.weight.copy_(_w(32, torch.float32, "contiguous", gen))
            assert torch.equal(zc_rmsnorm(x, module.weight, 1e-5), module(x))


@needs_interp
def test_unsupported_cases_fall_back_with_one_warning() -> None:
    """float64 and rows wider than MAX_WIDTH take the reference, saying so (once per reason)."""
    CALLS.clear()
    with pytest.warns(RuntimeWarning, match="float32, float16, bfloat16"):
        x = _never_zero(torch.randn(3, 16, dtype=torch.float64))
        w = _never_zero(torch.randn(16, dtype=torch.float64))
        y = zc_rmsnorm(x, w, 1e-6)
    assert y.dtype == torch.float64 and CALLS["zc_rmsnorm_fwd:reference"] == 1
    assert (y - naive.zc_rmsnorm_ref(x, w, 1e-6)).abs().max() < 1e-5
    CALLS.clear()
    width = MAX_WIDTH + 1
    gen = torch.Generator().manual_seed(9)
    x = _x((2, width), torch.bfloat16, "contiguous", gen).requires_grad_(True)
    w = _w(width, torch.float32, "contiguous", gen).requires_grad_(True)
    with pytest.warns(RuntimeWarning, match=f"rows wider than {MAX_WIDTH}"):
        y = zc_rmsnorm(x, w, 1e-6)
        y.float().sum().backward()
    assert CALLS["zc_rmsnorm_fwd:reference"] == 1 and CALLS["zc_rmsnorm_bwd:reference"] == 1
    _close(y, naive.zc_rmsnorm_ref(x.detach(), w.detach(), 1e-6), torch.bfloat16, "y")


def test_empty_input_and_bad_shapes() -> None:
    x = torch.empty(0, 8, requires_grad=True)
    w = torch.randn(8, requires_grad=True)
    y = zc_rmsnorm(x, w)
    y.sum().backward()
    assert y.shape == (0, 8) and torch.equal(w.grad, torch.zeros(8))
    with pytest.raises(ValueError, match="must be \\(H,\\)"):
        zc_rmsnorm(torch.randn(2, 8), torch.randn(7))
    with pytest.raises(ValueError, match="must be \\(H,\\)"):
        zc_rmsnorm(torch.tensor(1.0), torch.randn(1))
    with pytest.raises(ValueError, match="floating point"):
        zc_rmsnorm(torch.ones(2, 4, dtype=torch.int32), torch.randn(4))


@needs_interp
def test_hypothesis_sweep() -> None:
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    @settings(max_examples=16, deadline=None, suppress_health_check=list(HealthCheck))
    @given(lead=st.lists(st.integers(1, 9), min_size=1, max_size=3), width=st.integers(1, 260),
           dtype=st.sampled_from(DTYPES), x_layout=st.sampled_from(X_LAYOUTS),
           w_layout=st.sampled_from(W_LAYOUTS), w_same=st.booleans(),
           eps=st.sampled_from([1e-6, 1e-5, 0.1]), seed=st.integers(0, 999))
    def sweep(lead, width, dtype, x_layout, w_layout, w_same, eps, seed):
        w_dtype = dtype if w_same else torch.float32
        _check((*lead, width), dtype, x_layout, w_dtype=w_dtype, w_layout=w_layout, eps=eps, seed=seed)

    sweep()


def test_fake_implementations_and_schema() -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x = torch.empty(2, 5, 16, dtype=torch.bfloat16).transpose(0, 1)
        y = zc_rmsnorm_fwd(x, torch.empty(16), 1e-6)
        assert y.shape == x.shape and y.dtype == torch.bfloat16 and y.is_contiguous()
        dx, dw = zc_rmsnorm_bwd(x, torch.empty(16, dtype=torch.bfloat16).expand(16), x, 1e-6)
        assert dx.shape == x.shape and dx.dtype == torch.bfloat16 and dw.shape == (16,) and dw.is_contiguous()
        assert dw.dtype == torch.bfloat16
    args = (torch.randn(3, 8), torch.randn(8), 1e-6)
    torch.library.opcheck(zc_rmsnorm_fwd, args, test_utils=("test_schema", "test_faketensor"))
    torch.library.opcheck(zc_rmsnorm_bwd, (args[0], args[1], torch.randn(3, 8), 1e-6),
                          test_utils=("test_schema", "test_faketensor"))


def test_compiled_has_no_graph_break_and_matches_eager() -> None:
    """One graph, no break; the aot_eager compile runs the registered autograd and agrees."""
    gen = torch.Generator().manual_seed(10)
    inputs = (_never_zero(torch.randn(2, 6, 24, generator=gen)), _never_zero(torch.randn(24, generator=gen)))
    compiled_matches_eager(lambda x, w: zc_rmsnorm(x, w, 1e-6).float().square().sum(), inputs, "zc_rmsnorm_bwd")


# ---------------------------------------------------------------- add_zc_rmsnorm
def _check_add(shape, dtype, x_layout="contiguous", r_layout="contiguous", w_dtype=torch.float32,
               w_layout="contiguous", eps=1e-6, seed=0, use_s=True) -> None:
    """s = r + x bit for bit torch's add; y, dx (= dr) and dw against float64 at that rounded s,
    with the gradient reaching s from its other use (ds) added when `use_s`, absent otherwise."""
    gen = torch.Generator().manual_seed(seed)
    x, r = _x(shape, dtype, x_layout, gen), _x(shape, dtype, r_layout, gen)
    w = _w(shape[-1], w_dtype, w_layout, gen)
    dy = _never_zero(torch.randn(shape, generator=gen)).to(dtype)
    ds = _never_zero(torch.randn(shape, generator=gen)).to(dtype)
    xl, rl = x.detach().requires_grad_(True), r.detach().requires_grad_(True)
    base = w.detach()[:1].clone() if w_layout == "broadcast" else w.detach().clone()
    wl = base.requires_grad_(True)
    s, y = add_zc_rmsnorm(xl, rl, wl.expand(shape[-1]) if w_layout == "broadcast" else wl, eps)
    s_torch = r + x
    assert s.is_contiguous() and y.is_contiguous() and torch.equal(s, s_torch)
    _close(y, naive.zc_rmsnorm_ref(s_torch, w, eps), dtype, "y")
    loss = (y.float() * dy.float()).sum() + ((s.float() * ds.float()).sum() if use_s else 0.0)
    loss.backward()
    _close_grads(s_torch, w, dy, eps, {"dx": xl.grad, "dresidual": rl.grad}, wl.grad, w_layout,
                 ds=ds if use_s else None)


@needs_interp
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("x_layout", X_LAYOUTS)
def test_add_kernel_matches_float64(dtype: torch.dtype, x_layout: str) -> None:
    CALLS.clear()
    r_layout = X_LAYOUTS[(X_LAYOUTS.index(x_layout) + 1) % len(X_LAYOUTS)]  # x and r laid out differently
    _check_add((3, 5, 48), dtype, x_layout, r_layout, seed=21)
    assert CALLS["add_zc_rmsnorm_fwd:triton"] == 1 and CALLS["add_zc_rmsnorm_bwd:triton"] == 1
    assert not CALLS["add_zc_rmsnorm_fwd:reference"] and not CALLS["add_zc_rmsnorm_bwd:reference"]


@needs_interp
@pytest.mark.parametrize("w_layout", W_LAYOUTS)
@pytest.mark.parametrize("use_s", [True, False], ids=["s-used", "s-unused"])
def test_add_weight_layouts_and_an_unused_sum(w_layout: str, use_s: bool) -> None:
    """An unused s gives no ds (autograd passes None): dx is the norm's gradient alone."""
    _check_add((2, 7, 40), torch.bfloat16, "row-strided", "contiguous", w_dtype=torch.bfloat16,
               w_layout=w_layout, seed=22, use_s=use_s)


@needs_interp
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_add_no_worse_than_transformers_add_then_module(dtype: torch.dtype) -> None:
    """Against the decoder's own `residual + x` then Qwen3_5RMSNorm (module weight in x's dtype),
    autograd summing the two gradients of s: s and y equal, dx / dresidual / dw no further from
    float64 than twice that sequence's distance (ours rounds dx once, theirs twice)."""
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5RMSNorm

    gen = torch.Generator().manual_seed(23)
    shape = (4, 9, 64)
    x, r = _x(shape, dtype, "contiguous", gen), _x(shape, dtype, "contiguous", gen)
    dy, ds = (_never_zero(torch.randn(shape, generator=gen)).to(dtype) for _ in range(2))
    module = Qwen3_5RMSNorm(shape[-1], eps=1e-6).to(dtype)
    with torch.no_grad():
        module.weight.copy_(_w(shape[-1], torch.float32, "contiguous", gen))
    w = module.weight.detach()

    def run(fn):
        xl, rl, wl = x.clone().requires_grad_(True), r.clone().requires_grad_(True), w.clone().requires_grad_(True)
        s, y = fn(xl, rl, wl)
        torch.autograd.backward((s, y), (ds, dy))
        return s, y, xl.grad, rl.grad, wl.grad

    def theirs(xl, rl, wl):
        s = rl + xl
        return s, torch.func.functional_call(module, {"weight": wl}, (s,))  # the module's forward, wl its weight

    t_out = run(theirs)
    o_out = run(lambda xl, rl, wl: add_zc_rmsnorm(xl, rl, wl, 1e-6))
    x64, r64, w64 = (t.double().requires_grad_(True) for t in (x, r, w))
    s64 = x64 + r64
    y64 = naive.zc_rmsnorm_ref(s64, w64, 1e-6)
    torch.autograd.backward((s64, y64), (ds.double(), dy.double()))
    assert torch.equal(o_out[0], t_out[0]) and torch.equal(o_out[1], t_out[1])
    for name, o, t, ref in zip(("dx", "dresidual", "dw"), o_out[2:], t_out[2:], (x64.grad, r64.grad, w64.grad),
                               strict=True):
        d_ours, d_theirs = ((g.double() - ref).abs().max().item() for g in (o, t))
        assert d_ours <= 2 * d_theirs + 1e-12, f"{name}: {d_ours:.3e} vs transformers' {d_theirs:.3e}"


def test_add_reference_path_on_cpu_is_transformers_bit_for_bit(monkeypatch) -> None:
    """Without the interpreter: torch's add, then the float32 reference (the module's op sequence)."""
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5RMSNorm

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    CALLS.clear()
    _check_add((3, 4, 24), torch.bfloat16, "transposed", "row-strided", seed=24)
    assert CALLS["add_zc_rmsnorm_fwd:reference"] == 1 and CALLS["add_zc_rmsnorm_bwd:reference"] == 1
    gen = torch.Generator().manual_seed(25)
    x, r = _x((5, 32), torch.bfloat16, "row-strided", gen), _x((5, 32), torch.bfloat16, "contiguous", gen)
    module = Qwen3_5RMSNorm(32, eps=1e-5)
    with torch.no_grad():
        module.weight.copy_(_w(32, torch.float32, "contiguous", gen))
        s, y = add_zc_rmsnorm(x, r, module.weight, 1e-5)
        assert torch.equal(s, r + x) and torch.equal(y, module(r + x))


def test_add_bad_inputs() -> None:
    w = torch.randn(8)
    with pytest.raises(ValueError, match=r"residual .* must match"):
        add_zc_rmsnorm(torch.randn(2, 8), torch.randn(3, 8), w)
    with pytest.raises(ValueError, match=r"residual .* must match"):
        add_zc_rmsnorm(torch.randn(2, 8), torch.randn(2, 8, dtype=torch.float64), w)
    with pytest.raises(ValueError, match="must be \\(H,\\)"):
        add_zc_rmsnorm(torch.randn(2, 8), torch.randn(2, 8), torch.randn(7))


@needs_interp
def test_add_hypothesis_sweep() -> None:
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    @settings(max_examples=10, deadline=None, suppress_health_check=list(HealthCheck))
    @given(lead=st.lists(st.integers(1, 7), min_size=1, max_size=3), width=st.integers(1, 200),
           dtype=st.sampled_from(DTYPES), x_layout=st.sampled_from(X_LAYOUTS), r_layout=st.sampled_from(X_LAYOUTS),
           w_layout=st.sampled_from(W_LAYOUTS), use_s=st.booleans(), eps=st.sampled_from([1e-6, 0.1]),
           seed=st.integers(0, 999))
    def sweep(lead, width, dtype, x_layout, r_layout, w_layout, use_s, eps, seed):
        _check_add((*lead, width), dtype, x_layout, r_layout, w_layout=w_layout, eps=eps, seed=seed, use_s=use_s)

    sweep()


def test_add_fake_implementations_schema_and_compile() -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x = torch.empty(2, 5, 16, dtype=torch.bfloat16).transpose(0, 1)
        s, y = add_zc_rmsnorm_fwd(x, x, torch.empty(16), 1e-6)
        assert s.shape == y.shape == x.shape and s.is_contiguous() and y.dtype == torch.bfloat16
        dx, dw = add_zc_rmsnorm_bwd(x, torch.empty(16), x, x, 1e-6)
        assert dx.shape == x.shape and dw.shape == (16,)
    x, r, w = torch.randn(3, 8), torch.randn(3, 8), torch.randn(8)
    torch.library.opcheck(add_zc_rmsnorm_fwd, (x, r, w, 1e-6), test_utils=("test_schema", "test_faketensor"))
    torch.library.opcheck(add_zc_rmsnorm_bwd, (x, w, r, x, 1e-6), test_utils=("test_schema", "test_faketensor"))
    gen = torch.Generator().manual_seed(26)
    inputs = tuple(_never_zero(torch.randn(*shape, generator=gen)) for shape in ((2, 6, 24), (2, 6, 24), (24,)))

    def step(x, r, w):
        s, y = add_zc_rmsnorm(x, r, w, 1e-6)
        return y.float().square().sum() + s.float().sum()

    compiled_matches_eager(step, inputs, "add_zc_rmsnorm_bwd")


# ---------------------------------------------------------------- device only
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
QWEN35_27B = {"hidden": 5120, "heads": 24, "head_dim": 256}  # Qwen/Qwen3.5-27B config.json


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("where", ["hidden", "q_norm", "widest"])
def test_gpu_at_27b_sizes(dtype: torch.dtype, where: str) -> None:  # pragma: no cover - device only
    """input_layernorm over (1, 4096, 5120); q_norm over (1, 4096, 24, 256) read in place from a
    (.., 24, 512) q_proj output; rows of MAX_WIDTH. Against float64, the module (the 2x rule in
    bf16, 1e-6 in fp32), and dw bitwise equal across two runs (no atomics)."""
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5RMSNorm

    gen = torch.Generator(device="cuda").manual_seed(0)
    if where == "q_norm":
        h = QWEN35_27B["head_dim"]
        x = torch.randn(1, 4096, QWEN35_27B["heads"], 2 * h, device="cuda", generator=gen).to(dtype)[..., :h]
    else:
        h = QWEN35_27B["hidden"] if where == "hidden" else MAX_WIDTH
        x = torch.randn(1, 4096 if where == "hidden" else 64, h, device="cuda", generator=gen).to(dtype)
    module = Qwen3_5RMSNorm(h).to("cuda", dtype)
    with torch.no_grad():
        module.weight.copy_(0.3 * torch.randn(h, device="cuda", generator=gen))
    dy = torch.randn(x.shape, device="cuda", generator=gen).to(dtype)
    xm = x.detach().clone().requires_grad_(True)
    ym = module(xm)
    ym.backward(dy)
    runs = []
    for _ in range(2):
        CALLS.clear()
        xo, wo = x.detach().requires_grad_(True), module.weight.detach().clone().requires_grad_(True)
        yo = zc_rmsnorm(xo, wo, module.eps)
        yo.backward(dy)
        assert CALLS["zc_rmsnorm_fwd:triton"] == 1 and CALLS["zc_rmsnorm_bwd:triton"] == 1
        runs.append((yo, xo.grad, wo.grad))
    assert torch.equal(runs[0][2], runs[1][2]) and torch.equal(runs[0][0], runs[1][0])
    w = module.weight.detach()
    want = (naive.zc_rmsnorm_ref(x, w, module.eps), *naive.zc_rmsnorm_bwd_ref(x, w, dy, module.eps))
    for name, t, o, ref in zip(("y", "dx", "dw"), (ym, xm.grad, module.weight.grad), runs[0], want, strict=True):
        if dtype == torch.float32:
            tol = 1e-6 if name == "y" else 1e-5
            assert ((o - t).abs().max() / t.abs().max()).item() <= tol, name
        else:
            d_ours = (o.double() - ref).abs().max().item()
            d_theirs = (t.double() - ref).abs().max().item()
            assert d_ours <= 2 * d_theirs + 1e-12, f"{name}: {d_ours:.3e} vs module {d_theirs:.3e}"


@pytest.mark.gpu
@needs_cuda
def test_gpu_inductor_fullgraph() -> None:  # pragma: no cover - device only
    """Inductor on the device: one graph, the custom ops inside it, gradients as eager."""
    x = torch.randn(2, 512, 5120, device="cuda", dtype=torch.bfloat16)
    w = 0.3 * torch.randn(5120, device="cuda")

    def step(x, w):
        return zc_rmsnorm(x, w, 1e-6).float().square().sum()

    outs = []
    for fn in (step, torch.compile(step, fullgraph=True)):
        xl, wl = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
        fn(xl, wl).backward()
        outs.append((xl.grad, wl.grad))
    torch.testing.assert_close(outs[0], outs[1])


@pytest.mark.gpu
@needs_cuda
def test_gpu_add_at_27b_sizes() -> None:  # pragma: no cover - device only
    """The post-attention add + norm over (1, 4096, 5120) bf16 against transformers' add then
    module: s bitwise equal to torch's add, y and every gradient within the 2x rule against
    float64 (y from the same rounded s: torch's mean and the kernel's sum reduce in different
    orders on a GPU), dx and dw bitwise across runs."""
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5RMSNorm

    h = QWEN35_27B["hidden"]
    gen = torch.Generator(device="cuda").manual_seed(1)
    x, r, dy, ds = (torch.randn(1, 4096, h, device="cuda", generator=gen).to(torch.bfloat16) for _ in range(4))
    module = Qwen3_5RMSNorm(h).to("cuda", torch.bfloat16)
    with torch.no_grad():
        module.weight.copy_(0.3 * torch.randn(h, device="cuda", generator=gen))
    w = module.weight.detach()
    xm, rm = x.clone().requires_grad_(True), r.clone().requires_grad_(True)
    sm = rm + xm
    ym = module(sm)
    torch.autograd.backward((sm, ym), (ds, dy))
    runs = []
    for _ in range(2):
        CALLS.clear()
        xo, ro, wo = x.clone().requires_grad_(True), r.clone().requires_grad_(True), w.clone().requires_grad_(True)
        so, yo = add_zc_rmsnorm(xo, ro, wo, module.eps)
        torch.autograd.backward((so, yo), (ds, dy))
        assert CALLS["add_zc_rmsnorm_fwd:triton"] == 1 and CALLS["add_zc_rmsnorm_bwd:triton"] == 1
        runs.append((so, yo, xo.grad, ro.grad, wo.grad))
    assert torch.equal(runs[0][4], runs[1][4]) and torch.equal(runs[0][2], runs[1][2])
    assert torch.equal(runs[0][0], sm)
    y64 = naive.zc_rmsnorm_ref(sm.detach().double(), w.double(), module.eps)
    d_ours, d_theirs = ((y.double() - y64).abs().max().item() for y in (runs[0][1], ym))
    assert d_ours <= 2 * d_theirs + 1e-12, f"y: {d_ours:.3e} vs transformers' {d_theirs:.3e}"
    x64, r64, w64 = (t.double().requires_grad_(True) for t in (x, r, w))
    s64 = x64 + r64
    torch.autograd.backward((s64, naive.zc_rmsnorm_ref(s64, w64, module.eps)), (ds.double(), dy.double()))
    for name, o, t, ref in zip(("dx", "dresidual", "dw"), runs[0][2:], (xm.grad, rm.grad, module.weight.grad),
                               (x64.grad, r64.grad, w64.grad), strict=True):
        d_ours, d_theirs = ((g.double() - ref).abs().max().item() for g in (o, t))
        assert d_ours <= 2 * d_theirs + 1e-12, f"{name}: {d_ours:.3e} vs transformers' {d_theirs:.3e}"
