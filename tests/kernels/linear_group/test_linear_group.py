"""fastpath's linear group (kernels/linear_group): several nn.Linear of one input whose input
gradient is accumulated inside the GEMMs, against its float64 reference and against the modules
called one by one.

Pure torch GEMMs, so everything here runs on CPU without the interpreter: outputs and every
gradient (input, weights, biases) on never-zero random inputs, fp32 / fp16 / bf16, an input that
is contiguous, row-strided (a slice of a wider buffer whose rest is NaN), transposed or stride-0
broadcast, output gradients that are transposed views, with and without biases, unused outputs,
frozen weights and an input that wants no gradient; first and second derivatives by gradcheck in
float64; a hypothesis sweep; every condition that keeps the modules' own calls.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from fastpath.kernels.counters import CALLS  # noqa: E402
from fastpath.kernels.linear_group import naive  # noqa: E402
from fastpath.kernels.linear_group.interface import COUNTER, groupable, linears_of_one_input  # noqa: E402

# error relative to the float64 result's scale: a few roundings of the dtype over a K-term sum
TOL = {torch.float32: 2e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2}
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
LAYOUTS = ["contiguous", "row-strided", "transposed", "broadcast"]


def _never_zero(shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
    t = torch.randn(shape, generator=gen, dtype=torch.float64)
    return t + 0.05 * torch.where(t < 0, -1.0, 1.0)


def _linears(width: int, outs: list[int], bias: list[bool], dtype: torch.dtype, seed: int) -> list[torch.nn.Linear]:
    gen = torch.Generator().manual_seed(seed)
    mods = []
    for out, b in zip(outs, bias, strict=True):
        m = torch.nn.Linear(width, out, bias=b, dtype=dtype)
        with torch.no_grad():
            m.weight.copy_(_never_zero((out, width), gen) / width ** 0.5)
            if b:
                m.bias.copy_(_never_zero((out,), gen))
        mods.append(m)
    return mods


# Fills what a strided input's view does not cover: large and finite, not NaN, because the input
# goes only through torch's GEMMs, and on CPUs with AMX torch 2.13's bf16 matmul (oneDNN 3.12
# `brg_matmul:avx10_1_512_amx`) reads one element past an odd-length row and multiplies it by a
# zero pad (NaN * 0 = NaN in torch's own products; a large finite value contributes 0 there).
GAP = 1.0e4


def _input(values: torch.Tensor, dtype: torch.dtype, layout: str) -> torch.Tensor:
    """A leaf laid out as `layout` (batch, tokens, width); what a view does not cover is GAP."""
    b, t, w = values.shape
    if layout == "row-strided":
        x = torch.full((b, t, 2 * w), GAP, dtype=dtype)[..., :w].copy_(values)
    elif layout == "transposed":
        x = torch.empty(t, b, w, dtype=dtype).transpose(0, 1).copy_(values)
    elif layout == "broadcast":  # one token broadcast over the sequence (stride 0)
        return values[:, :1].to(dtype).expand(b, t, w).requires_grad_()
    else:
        x = values.to(dtype)
    return x.requires_grad_()


def _assert_near(got: torch.Tensor | None, want: torch.Tensor | None, dtype: torch.dtype, what: str) -> None:
    assert (got is None) == (want is None), what
    if got is None:
        return
    assert got.shape == want.shape and got.dtype == dtype, what
    scale = want.abs().max().item()
    err = (got.double() - want).abs().max().item()
    assert err <= TOL[dtype] * scale, f"{what}: error {err:.3g} over scale {scale:.3g}"


def _check(width: int, outs: list[int], bias: list[bool], used: list[bool], dtype: torch.dtype,
           layout: str, seed: int, frozen: tuple[int, ...] = (), x_grad: bool = True) -> None:
    gen = torch.Generator().manual_seed(seed + 1)
    mods = _linears(width, outs, bias, dtype, seed)
    for i in frozen:
        mods[i].requires_grad_(False)
    x = _input(_never_zero((2, 5, width), gen), dtype, layout)
    x.requires_grad_(x_grad)
    CALLS.pop(COUNTER, None)
    got = linears_of_one_input(x, mods)
    assert CALLS[COUNTER] == 1
    want = naive.linears_ref(x.detach(), [m.weight for m in mods], [m.bias for m in mods])
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        _assert_near(g, w, dtype, f"out {i}")
    # output gradients as transposed views, as a consumer that transposes (the conv's input) hands back
    douts = [_never_zero((o, 5, 2), gen).to(dtype).permute(2, 1, 0) if u else None
             for o, u in zip(outs, used, strict=True)]
    pairs = [(o, d) for o, d in zip(got, douts, strict=True) if d is not None]
    if not pairs:
        return
    torch.autograd.backward([o for o, _ in pairs], [d for _, d in pairs])
    dx, dws, dbs = naive.linears_bwd_ref(x.detach(), [m.weight.detach() for m in mods], douts, bias)
    _assert_near(x.grad, dx if x_grad else None, dtype, "dx")
    for i, m in enumerate(mods):
        live = i not in frozen and used[i]
        _assert_near(m.weight.grad, dws[i] if live else None, dtype, f"dW {i}")
        _assert_near(m.bias.grad if bias[i] else None, dbs[i] if live and bias[i] else None, dtype, f"db {i}")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_outputs_and_every_gradient_match_float64(dtype: torch.dtype, layout: str) -> None:
    # a GatedDeltaNet's four projections: wide, narrow, with and without biases
    _check(24, [40, 16, 3, 3], [False, True, False, True], [True] * 4, dtype, layout, seed=3)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_unused_outputs_frozen_weights_and_an_input_without_gradient(dtype: torch.dtype) -> None:
    _check(16, [8, 12, 4], [True, False, True], [True, False, True], dtype, "contiguous", seed=5)
    _check(16, [8, 12, 4], [True, False, True], [True, True, True], dtype, "contiguous", seed=6, frozen=(0, 2))
    _check(16, [8, 12], [True, True], [True, True], dtype, "row-strided", seed=7, x_grad=False)
    _check(16, [8, 12], [False, False], [False, True], dtype, "transposed", seed=8, frozen=(1,))


def test_forward_and_weight_gradients_are_the_modules_own_bits() -> None:
    """The forward is the modules' F.linear; the weight and bias gradients are the GEMM and row sum
    Linear's backward computes: the same bits on CPU (a GPU's GEMM may pick another algorithm for
    the other operand order). The input gradient is one rounding from float32
    where eager adds bf16 partial sums: no further from float64 than eager's."""
    gen = torch.Generator().manual_seed(11)
    dtype = torch.bfloat16
    mods = _linears(32, [48, 48], [False, True], dtype, seed=11)
    values = _never_zero((3, 7, 32), gen)
    douts = [_never_zero((3, 7, 48), gen).to(dtype) for _ in mods]
    x_eager = values.to(dtype).requires_grad_()
    eager = [m(x_eager) for m in mods]
    torch.autograd.backward(eager, douts)
    eager_grads = [(m.weight.grad.clone(), None if m.bias is None else m.bias.grad.clone()) for m in mods]
    for m in mods:
        m.zero_grad(set_to_none=True)
    x = values.to(dtype).requires_grad_()
    got = linears_of_one_input(x, mods)
    torch.autograd.backward(got, douts)
    for g, e in zip(got, eager, strict=True):
        assert torch.equal(g, e)
    for m, (dw, db) in zip(mods, eager_grads, strict=True):
        assert torch.equal(m.weight.grad, dw)
        assert db is None or torch.equal(m.bias.grad, db)
    exact, _, _ = naive.linears_bwd_ref(values, [m.weight for m in mods], douts, [False, True])
    assert (x.grad.double() - exact).abs().max() <= (x_eager.grad.double() - exact).abs().max()


def test_first_and_second_derivatives_by_gradcheck() -> None:
    gen = torch.Generator().manual_seed(2)
    x = _never_zero((2, 3, 5), gen).requires_grad_()
    w0, w1 = (_never_zero((4, 5), gen).requires_grad_(), _never_zero((6, 5), gen).requires_grad_())
    b1 = _never_zero((6,), gen).requires_grad_()
    from fastpath.kernels.linear_group.interface import _LinearGroup

    def fn(x, w0, w1, b1):
        return _LinearGroup.apply(x, w0, None, w1, b1)

    assert torch.autograd.gradcheck(fn, (x, w0, w1, b1))
    assert torch.autograd.gradgradcheck(fn, (x, w0, w1, b1))


@settings(max_examples=25, deadline=None)
@given(width=st.integers(1, 20), outs=st.lists(st.integers(1, 24), min_size=2, max_size=5),
       data=st.data(), dtype=st.sampled_from(DTYPES), layout=st.sampled_from(LAYOUTS),
       seed=st.integers(0, 2 ** 16))
def test_hypothesis_sweep(width: int, outs: list[int], data, dtype: torch.dtype, layout: str, seed: int) -> None:
    n = len(outs)
    bias = data.draw(st.lists(st.booleans(), min_size=n, max_size=n))
    used = data.draw(st.lists(st.booleans(), min_size=n, max_size=n))
    frozen = tuple(i for i in range(n) if data.draw(st.booleans()) and i > 0)
    _check(width, outs, bias, used, dtype, layout, seed, frozen=frozen, x_grad=data.draw(st.booleans()))


class _Sub(torch.nn.Linear):
    """A Linear subclass (as LoRA, quantised and FP8 layers are): its forward may be anything."""

    def forward(self, x):
        return super().forward(x) * 2


def test_what_keeps_the_modules_own_calls() -> None:
    x = torch.randn(2, 3, 8, requires_grad=True)
    a, b = torch.nn.Linear(8, 4), torch.nn.Linear(8, 5)
    assert groupable(x, (a, b))
    assert not groupable(x, (a,))  # one module: nothing to share
    with torch.no_grad():
        assert not groupable(x, (a, b))
    assert not groupable(x.detach(), (a.requires_grad_(False), b.requires_grad_(False)))
    a.requires_grad_(True), b.requires_grad_(True)
    assert groupable(x.detach(), (a, b))  # weights want gradients: still grouped
    assert not groupable(x.double(), (a, b))  # another dtype
    assert not groupable(x, (a, _Sub(8, 4)))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not groupable(x, (a, b))
    for register in (a.register_forward_hook, a.register_forward_pre_hook, a.register_full_backward_hook):
        seen: list[int] = []
        handle = register(lambda *args, seen=seen: seen.append(1))
        assert not groupable(x, (a, b))
        outs = linears_of_one_input(x, (a, b))  # the modules' own calls: the hook runs
        if register != a.register_full_backward_hook:
            assert seen
        sum(o.sum() for o in outs).backward()
        assert seen
        handle.remove()
    handle = torch.nn.modules.module.register_module_forward_hook(lambda *args: None)
    try:
        assert not groupable(x, (a, b))
    finally:
        handle.remove()
    assert groupable(x, (a, b))


def test_subclass_output_is_the_subclass_forward() -> None:
    x = torch.randn(2, 8)
    a, s = torch.nn.Linear(8, 4), _Sub(8, 4)
    CALLS.pop(COUNTER, None)
    out_a, out_s = linears_of_one_input(x, (a, s))
    assert COUNTER not in CALLS
    torch.testing.assert_close(out_s, s(x))
    torch.testing.assert_close(out_a, a(x))
