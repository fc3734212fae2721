"""kernels/causal_conv1d/split_outputs.py: the conv of a fused projection written into its pieces.

Against a float64 reference (the conv, then the split) for the output and dx / dweight / dbias;
bit for bit against the unfused op followed by torch.split in the same dtype; x in every layout
(channel-last as transformers hands it, contiguous, row-strided), a broadcast (stride-0) weight,
no bias, no activation, pieces whose gradient never arrives; a hypothesis sweep; the custom op
through opcheck and one graph under torch.compile. On CPU the kernels run under TRITON_INTERPRET=1
at small shapes; on a GPU the same tests run the compiled kernels at larger ones.
"""

from __future__ import annotations

import pytest
import torch
import torch._dynamo
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fastpath.kernels.causal_conv1d import naive
from fastpath.kernels.causal_conv1d.interface import conv_fwd
from fastpath.kernels.causal_conv1d.split_outputs import causal_conv1d_split_fwd, conv_split
from fastpath.kernels.counters import CALLS
from fastpath.kernels.dispatch import use_triton

ON_GPU = torch.cuda.is_available()
DEVICE = "cuda" if ON_GPU else "cpu"
IMPL = "triton" if use_triton(torch.empty(0, device=DEVICE)) else "reference"
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
TOL = {torch.float32: 2e-5, torch.float16: 3e-3, torch.bfloat16: 2e-2}  # relative L2, as the conv's tests
# (batch, seqlen, sizes): GatedDeltaNet's q / k / v proportions, small on the interpreter
SHAPE = (2, 300, (64, 64, 192)) if ON_GPU else (2, 19, (8, 8, 16))
LAYOUTS = ["channel_last", "contiguous", "row_strided"]


def _x(batch: int, dim: int, seqlen: int, dtype: torch.dtype, layout: str, seed: int) -> torch.Tensor:
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    if layout == "channel_last":  # what a Linear's (B, L, D) output gives after transpose(1, 2)
        return torch.randn(batch, seqlen, dim, generator=g, device=DEVICE, dtype=dtype).transpose(1, 2)
    if layout == "contiguous":
        return torch.randn(batch, dim, seqlen, generator=g, device=DEVICE, dtype=dtype)
    wide = torch.randn(batch, seqlen, dim + 8, generator=g, device=DEVICE, dtype=dtype)
    return wide[:, :, 3:3 + dim].transpose(1, 2)  # channel-last rows with a gap between them


def _params(dim: int, width: int, dtype: torch.dtype, seed: int, *, bias: bool = True,
            broadcast: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    g = torch.Generator(device=DEVICE).manual_seed(seed + 1)
    if broadcast:  # one tap row shared by every channel: stride 0 along D
        weight = torch.randn(1, width, generator=g, device=DEVICE, dtype=dtype).expand(dim, width)
    else:
        weight = torch.randn(dim, width, generator=g, device=DEVICE, dtype=dtype) * 0.5
    b = torch.randn(dim, generator=g, device=DEVICE, dtype=dtype) if bias else None
    return weight, b


def _rel(got: torch.Tensor, ref: torch.Tensor) -> float:
    assert got.shape == ref.shape, (got.shape, ref.shape)
    assert torch.isfinite(got).all()
    got, ref = got.double().cpu(), ref.double().cpu()
    return ((got - ref).norm() / ref.norm().clamp_min(1e-12)).item()


def _reference(x, weight, bias, sizes, silu, douts):
    """float64: the conv, transpose, split; gradients by autograd through it."""
    x64 = x.detach().double().requires_grad_()
    w64 = weight.detach().double().requires_grad_()
    b64 = bias.detach().double().requires_grad_() if bias is not None else None
    y = naive.causal_conv1d_ref(x64, w64, b64, None, activation="silu" if silu else None)
    pieces = torch.split(y.transpose(1, 2), list(sizes), dim=-1)
    used = [(p, d.double()) for p, d in zip(pieces, douts, strict=True) if d is not None]
    inputs = [x64, w64] + ([b64] if b64 is not None else [])
    grads = torch.autograd.grad([p for p, _ in used], inputs, [d for _, d in used])
    return pieces, grads


def _check(x, weight, bias, sizes, silu, dtype, drop=()):
    x = x.detach().requires_grad_()
    weight = weight.detach().requires_grad_()
    bias = bias.detach().requires_grad_() if bias is not None else None
    CALLS.clear()
    outs = conv_split(x, weight, bias, sizes, silu)
    assert CALLS[f"conv_split_fwd:{IMPL}"] == 1, dict(CALLS)
    assert [tuple(o.shape) for o in outs] == [(x.shape[0], x.shape[2], n) for n in sizes]
    assert all(o.is_contiguous() and o.dtype == dtype for o in outs)
    g = torch.Generator(device=DEVICE).manual_seed(7)
    douts = [None if i in drop else torch.randn(o.shape, generator=g, device=DEVICE, dtype=dtype)
             for i, o in enumerate(outs)]
    want, want_grads = _reference(x, weight, bias, sizes, silu, douts)
    for o, w in zip(outs, want, strict=True):
        assert _rel(o, w) < TOL[dtype]
    used = [(o, d) for o, d in zip(outs, douts, strict=True) if d is not None]
    inputs = [x, weight] + ([bias] if bias is not None else [])
    grads = torch.autograd.grad([o for o, _ in used], inputs, [d for _, d in used])
    assert CALLS[f"conv_split_bwd:{IMPL}"] == 1, dict(CALLS)
    for name, got, ref in zip(("dx", "dweight", "dbias"), grads, want_grads, strict=False):
        assert _rel(got, ref) < TOL[dtype], name
    assert grads[0].stride() == torch.empty_like(x).stride()  # dx in x's own layout


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("silu", [True, False], ids=["silu", "none"])
def test_pieces_and_gradients_match_float64(dtype, layout, silu) -> None:
    batch, seqlen, sizes = SHAPE
    x = _x(batch, sum(sizes), seqlen, dtype, layout, seed=1)
    weight, bias = _params(sum(sizes), 4, dtype, seed=1)
    _check(x, weight, bias, sizes, silu, dtype)


@pytest.mark.parametrize("width", [2, 3, 4])
def test_no_bias_broadcast_weight_and_a_piece_without_gradient(width) -> None:
    batch, seqlen, sizes = SHAPE
    x = _x(batch, sum(sizes), seqlen, torch.float32, "channel_last", seed=2)
    weight, _ = _params(sum(sizes), width, torch.float32, seed=2, broadcast=True)
    _check(x, weight, None, sizes, True, torch.float32, drop=(1,))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_the_unfused_conv_then_split_bit_for_bit(dtype) -> None:
    """Per channel the same kernels as the conv: the pieces equal, not close; the gradients equal
    in float32 and, in 16-bit dtypes, within one rounding at the gradient's scale (the GPU
    backward's plan depends on D, and with it where an intermediate is rounded)."""
    batch, seqlen, sizes = SHAPE
    x = _x(batch, sum(sizes), seqlen, dtype, "channel_last", seed=3).detach().requires_grad_()
    weight, bias = (t.requires_grad_() for t in _params(sum(sizes), 4, dtype, seed=3))
    outs = conv_split(x, weight, bias, sizes, True)
    y, _ = conv_fwd(x, weight, bias, None, None, False, True)
    pieces = torch.split(y.transpose(1, 2), list(sizes), dim=-1)
    for o, p in zip(outs, pieces, strict=True):
        assert torch.equal(o, p)
    douts = [torch.randn_like(o) for o in outs]
    got = torch.autograd.grad(outs, (x, weight, bias), douts)
    want = torch.autograd.grad(pieces, (x, weight, bias), douts)
    for a, b in zip(got, want, strict=True):
        if dtype == torch.float32:
            assert torch.equal(a, b)
        else:
            eps = torch.finfo(dtype).eps
            torch.testing.assert_close(a, b, rtol=eps, atol=eps * b.abs().max().item())


def test_inference_skips_autograd() -> None:
    batch, seqlen, sizes = SHAPE
    x = _x(batch, sum(sizes), seqlen, torch.float32, "channel_last", seed=4)
    weight, bias = _params(sum(sizes), 4, torch.float32, seed=4)
    with torch.no_grad():
        outs = conv_split(x, weight.requires_grad_(), bias, sizes, True)
    assert all(o.grad_fn is None for o in outs)


def test_bad_arguments_raise_one_clear_error() -> None:
    x = _x(1, 12, 5, torch.float32, "channel_last", seed=5)
    weight, bias = _params(12, 4, torch.float32, seed=5)
    for sizes, words in (((4, 4), "sum to D = 12"), ((12, 0), "positive"), ((), "positive")):
        with pytest.raises(ValueError, match="conv_split: sizes"):
            conv_split(x, weight, bias, sizes, True)
        assert words
    with pytest.raises(ValueError, match=r"must be \(B, D, L\)"):
        conv_split(x[0], weight, bias, (12,), True)
    with pytest.raises(ValueError, match="bias"):
        conv_split(x, weight, bias[:5], (12,), True)


SWEEP = settings(max_examples=40 if ON_GPU else 15, deadline=None, derandomize=True,
                 suppress_health_check=[HealthCheck.too_slow])


@SWEEP
@given(batch=st.integers(1, 3), seqlen=st.integers(1, 200 if ON_GPU else 24),
       sizes=st.lists(st.integers(1, 48 if ON_GPU else 9), min_size=1, max_size=4),
       width=st.integers(2, 4), dtype=st.sampled_from(DTYPES), layout=st.sampled_from(LAYOUTS),
       silu=st.booleans(), bias=st.booleans(), seed=st.integers(0, 2**16))
def test_sweep(batch, seqlen, sizes, width, dtype, layout, silu, bias, seed) -> None:
    x = _x(batch, sum(sizes), seqlen, dtype, layout, seed)
    weight, b = _params(sum(sizes), width, dtype, seed, bias=bias)
    _check(x, weight, b, tuple(sizes), silu, dtype)


def test_custom_op_opcheck() -> None:
    batch, seqlen, sizes = SHAPE
    x = _x(batch, sum(sizes), seqlen, torch.float32, "channel_last", seed=6).requires_grad_()
    weight, bias = (t.requires_grad_() for t in _params(sum(sizes), 4, torch.float32, seed=6))
    torch.library.opcheck(causal_conv1d_split_fwd, (x, weight, bias, list(sizes), True))


def test_one_graph_under_torch_compile() -> None:
    batch, seqlen, sizes = SHAPE
    x = _x(batch, sum(sizes), seqlen, torch.float32, "channel_last", seed=8).detach().requires_grad_()
    weight, bias = (t.requires_grad_() for t in _params(sum(sizes), 4, torch.float32, seed=8))

    def f(x, weight, bias):
        q, k, v = conv_split(x, weight, bias, sizes, True)
        return q.sum() + 2 * k.sum() + 3 * v.sum()

    torch._dynamo.reset()
    report = torch._dynamo.explain(f)(x, weight, bias)
    assert report.graph_count == 1 and not report.break_reasons, report.break_reasons
    compiled = torch.compile(f, backend="aot_eager", fullgraph=True)
    got = torch.autograd.grad(compiled(x, weight, bias), (x, weight, bias))
    want = torch.autograd.grad(f(x, weight, bias), (x, weight, bias))
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b)
