"""Mamba-1's selective scan (selective_scan_fn) against the float64 step loop of naive.py.

On CPU the Triton kernels run under TRITON_INTERPRET=1 (scripts/test.sh exports it) at tiny
shapes (the interpreter runs associative_scan element by element); every kernel case checks the
call counters so a silent fallback to the reference fails. Inputs are random (never zeros);
gradients are torch.autograd.grad of the op against autograd of the float64 reference, for every
input and for a gradient flowing into last_state too.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kernel_checks import rel_err, sscan_bwd_counter, sscan_fwd_counter

from fastpath.kernels import dispatch
from fastpath.kernels.counters import CALLS
from fastpath.kernels.dispatch import use_triton
from fastpath.kernels.selective_scan.interface import MAX_DSTATE, selective_scan_fn
from fastpath.kernels.selective_scan.naive import selective_scan_ref

ON_TRITON = use_triton(torch.empty(0))
needs_triton = pytest.mark.skipif(
    not ON_TRITON, reason="exercises the Triton kernels: needs CUDA or TRITON_INTERPRET=1"
)
# relative L2 error allowed against float64, by input dtype
TOL = {torch.float32: 1e-4, torch.float16: 6e-3, torch.bfloat16: 3e-2}
NAMES = ("u", "delta", "A", "B", "C", "D", "z", "delta_bias")


def make_case(batch, dim, nstate, length, layout="shared", groups=1, seed=0):
    """float64 inputs; delta around softplus' knee, A negative and varied per (d, n)."""
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape, scale=1.0):
        return torch.randn(*shape, generator=g, dtype=torch.float64) * scale

    if layout == "shared":
        B, C = rnd(batch, nstate, length), rnd(batch, nstate, length)
    elif layout == "grouped":
        B, C = rnd(batch, groups, nstate, length), rnd(batch, groups, nstate, length)
    else:  # time-invariant
        B, C = rnd(dim, nstate), rnd(dim, nstate)
    return {
        "u": rnd(batch, dim, length),
        "delta": rnd(batch, dim, length, scale=0.8),
        "A": -(torch.rand(dim, nstate, generator=g, dtype=torch.float64) * 1.5 + 0.2),
        "B": B,
        "C": C,
        "D": rnd(dim),
        "z": rnd(batch, dim, length),
        "delta_bias": rnd(dim, scale=0.5),
    }


def transposed(t: torch.Tensor) -> torch.Tensor:
    """The same values as a non-contiguous view (transformers passes (B, L, D).transpose)."""
    return t.transpose(-1, -2).contiguous().transpose(-1, -2)


def run_case(case, dtype, *, use_d=True, use_z=True, use_bias=True, softplus=True,
             last=True, views=False, grads=True, impl="triton"):
    opts = {"D": use_d, "z": use_z, "delta_bias": use_bias}
    ref_in = {k: v.clone().requires_grad_() for k, v in case.items() if opts.get(k, True)}
    # the kernel sees the inputs rounded to dtype (A, D, delta_bias stay float32 as in transformers)
    keep32 = ("A", "D", "delta_bias")
    low = {k: v.detach().to(torch.float32 if k in keep32 else dtype) for k, v in ref_in.items()}
    ref_in = {k: low[k].double().requires_grad_() for k in ref_in}
    got_in = {k: (transposed(v) if views and v.dim() == 3 else v).requires_grad_()
              for k, v in low.items()}
    CALLS.clear()
    got = selective_scan_fn(**got_in, delta_softplus=softplus, return_last_state=last)
    ref = selective_scan_ref(**ref_in, delta_softplus=softplus, return_last_state=last)
    assert CALLS[sscan_fwd_counter(impl)] == 1, dict(CALLS)
    tol = TOL[dtype]
    if last:
        (out, state), (rout, rstate) = got, ref
        assert state.dtype == torch.float32 and state.shape == rstate.shape
        assert rel_err(state, rstate) < tol
    else:
        out, rout = got, ref
    assert out.dtype == dtype and out.is_contiguous()
    assert rel_err(out, rout) < tol, rel_err(out, rout)
    if not grads:
        return
    g = torch.Generator().manual_seed(7)
    dout = torch.randn(rout.shape, generator=g, dtype=torch.float64)
    loss_ref = (rout * dout).sum()
    loss_got = (out.double() * dout.to(dtype).double()).sum()
    if last:
        dstate = torch.randn(rstate.shape, generator=g, dtype=torch.float64)
        loss_ref = loss_ref + (rstate * dstate).sum()
        loss_got = loss_got + (state.double() * dstate.float().double()).sum()
    names = list(ref_in)
    rgrads = torch.autograd.grad(loss_ref, [ref_in[k] for k in names])
    ggrads = torch.autograd.grad(loss_got, [got_in[k] for k in names])
    assert CALLS[sscan_bwd_counter(impl)] == 1, dict(CALLS)
    for k, gg, rg in zip(names, ggrads, rgrads, strict=True):
        assert gg.shape == got_in[k].shape and gg.dtype == got_in[k].dtype, k
        err = rel_err(gg, rg)
        assert err < 2 * tol, f"d{k}: {err:.2e}"


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("layout", ["shared", "grouped", "invariant"])
def test_forward_and_every_gradient(dtype, layout):
    case = make_case(2, 4, 4, 11, layout=layout, groups=2, seed=len(layout))
    run_case(case, dtype)


@needs_triton
@pytest.mark.parametrize(
    ("use_d", "use_z", "use_bias", "softplus", "last"),
    [
        (False, False, False, False, False),
        (True, False, True, False, True),
        (False, True, False, True, False),
        (True, True, True, True, False),
    ],
)
def test_options(use_d, use_z, use_bias, softplus, last):
    case = make_case(1, 6, 3, 13, seed=3)
    run_case(case, torch.float32, use_d=use_d, use_z=use_z, use_bias=use_bias,
             softplus=softplus, last=last)


@needs_triton
def test_transposed_views_as_transformers_passes_them():
    case = make_case(2, 8, 4, 17, seed=5)
    run_case(case, torch.bfloat16, views=True)


@needs_triton
def test_sequence_spanning_many_chunks_keeps_the_carry():
    """L well past one chunk: the state crosses chunk boundaries."""
    case = make_case(1, 4, 4, 45, seed=11)
    run_case(case, torch.float32)


@needs_triton
def test_kernel_configs_agree():
    """Other tile shapes (channels per program, chunk length, flip vs reverse scan) give the
    same numbers: the configs the benchmark sweeps are all correct."""
    from fastpath.kernels.selective_scan.bwd import selective_scan_bwd_triton
    from fastpath.kernels.selective_scan.fwd_chunked import selective_scan_fwd_triton

    c = {k: v.float() for k, v in make_case(1, 8, 4, 21, layout="grouped", groups=2).items()}
    B4, C4 = c["B"], c["C"]
    args = (c["u"], c["delta"], c["A"], B4, C4, c["D"], c["z"], c["delta_bias"], True)
    ref_out, ref_last = selective_scan_ref(*(a.double() for a in args[:8]), True, True)
    dout = torch.randn_like(c["u"])
    base = None
    for cfg in ((2, 8, 4, True), (4, 16, 2, False), (8, 32, 4, True)):
        out, last = selective_scan_fwd_triton(*args, config=cfg[:3])
        assert rel_err(out, ref_out) < 1e-5 and rel_err(last, ref_last) < 1e-5
        grads = selective_scan_bwd_triton(dout, None, *args, config=cfg)
        if base is None:
            base = grads
        else:
            for name, a, b in zip(NAMES, grads, base, strict=True):
                assert rel_err(a, b) < 1e-5, name


@needs_triton
@settings(max_examples=5, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    batch=st.integers(1, 2),
    groups=st.sampled_from([1, 2]),
    per_group=st.integers(1, 5),
    nstate=st.integers(1, 9),
    length=st.integers(1, 24),
    layout=st.sampled_from(["shared", "grouped", "invariant"]),
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
    flags=st.integers(0, 31),
    seed=st.integers(0, 2**16),
)
def test_hypothesis_sweep(batch, groups, per_group, nstate, length, layout, dtype, flags, seed):
    dim = groups * per_group
    case = make_case(batch, dim, nstate, length, layout=layout, groups=groups, seed=seed)
    bits = [bool(flags >> i & 1) for i in range(5)]
    run_case(case, dtype, use_d=bits[0], use_z=bits[1], use_bias=bits[2], softplus=bits[3],
             last=bits[4], views=seed % 2 == 0)


# ---------------------------------------------------------------- fallbacks and errors
def _caught(fn):
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        dispatch._warn_once.cache_clear()
        result = fn()
    return result, [str(w.message) for w in seen]


def test_complex_a_falls_back_to_the_reference_with_a_warning():
    """Complex A (mamba_ssm's interleaved B/C convention): the reference runs, says so, and a
    purely real complex A gives exactly 2x the real scan (y takes 2 Re)."""
    case = make_case(1, 4, 3, 9, seed=2)
    Ac = torch.complex(case["A"], torch.zeros_like(case["A"]))
    inter = lambda m: torch.stack([m, torch.zeros_like(m)], -1).flatten(-2)  # noqa: E731
    out, messages = _caught(lambda: selective_scan_fn(
        case["u"].float(), case["delta"].float(), Ac.to(torch.complex64),
        inter(case["B"]).float(), inter(case["C"]).float()))
    assert any("complex A" in m for m in messages), messages
    real = selective_scan_ref(case["u"], case["delta"], case["A"], case["B"], case["C"])
    assert rel_err(out, 2 * real) < 1e-5


@needs_triton
def test_state_too_large_falls_back_with_a_warning():
    n = MAX_DSTATE + 1
    case = make_case(1, 3, n, 5, seed=4)
    run = lambda: run_case(case, torch.float32, impl="reference")  # noqa: E731
    _, messages = _caught(run)
    assert any(f"N={n}" in m for m in messages), messages


@needs_triton
def test_float64_takes_the_reference():
    case = make_case(1, 4, 3, 7, seed=6)
    CALLS.clear()
    out = selective_scan_fn(**case, delta_softplus=True)
    assert CALLS["ss_fwd:reference"] == 1
    assert rel_err(out, selective_scan_ref(**case, delta_softplus=True)) < 1e-12


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"u": torch.zeros(2, 4)}, "u must be"),
        ({"delta": torch.zeros(1, 4, 6)}, "delta"),
        ({"A": torch.zeros(5, 3)}, "A must be"),
        ({"B": torch.zeros(1, 3, 6)}, "B must be"),
        ({"C": torch.zeros(1, 3, 3, 5)}, "C: dim 4 is not a multiple"),
        ({"D": torch.zeros(3)}, "D must be"),
        ({"z": torch.zeros(1, 4, 4)}, "z "),
        ({"delta_bias": torch.zeros(4, 1)}, "delta_bias must be"),
    ],
)
def test_bad_shapes_are_one_line_errors(change, message):
    case = {k: v.float() for k, v in make_case(1, 4, 3, 5).items()}
    case.update(change)
    with pytest.raises(ValueError, match=message) as info:
        selective_scan_fn(**case)
    assert "\n" not in str(info.value)
