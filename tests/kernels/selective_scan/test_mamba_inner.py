"""mamba_inner_fn (Mamba-1's fused training op) against a float64 composition.

The expected value is written out here from plain torch (F.conv1d, matmuls, an RMSNorm, a step
loop), independently of naive.py; gradients of every differentiable input are compared. With
the Triton kernels (TRITON_INTERPRET=1 on CPU) the call counters prove the scan kernel ran.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from kernel_checks import sscan_bwd_counter, sscan_fwd_counter

from fastpath.kernels.counters import CALLS
from fastpath.kernels.dispatch import use_triton
from fastpath.kernels.selective_scan.inner import mamba_inner_fn
from fastpath.kernels.selective_scan.naive import mamba_inner_ref

IMPL = "triton" if use_triton(torch.empty(0)) else "reference"
BATCH, DIM, N, RANK, WIDTH, LENGTH, HIDDEN = 2, 6, 4, 3, 4, 9, 5


def rms(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def composed(xz, conv_w, conv_b, x_proj, dt_proj, out_w, out_b, A, D, delta_bias,
             b_rms=None, c_rms=None, dt_rms=None, eps=1e-6):
    """The whole op in float64 from first principles (mamba_ssm's order of the norms)."""
    x, z = xz.chunk(2, dim=1)
    x = F.silu(F.conv1d(F.pad(x, (WIDTH - 1, 0)), conv_w, conv_b, groups=DIM))
    dbl = x.transpose(1, 2) @ x_proj.t()  # (B, L, r + 2N)
    delta = dbl[..., :RANK] @ dt_proj.t()  # (B, L, dim)
    B, C = dbl[..., RANK:RANK + N], dbl[..., RANK + N:]
    if dt_rms is not None:
        delta = rms(delta, dt_rms, eps)
    if b_rms is not None:
        B, C = rms(B, b_rms, eps), rms(C, c_rms, eps)
    delta = F.softplus(delta + delta_bias)  # (B, L, dim); values stay below 20 here
    h = torch.zeros(BATCH, DIM, N, dtype=xz.dtype)
    ys = []
    for t in range(LENGTH):
        h = torch.exp(delta[:, t, :, None] * A) * h + (delta[:, t] * x[:, :, t])[..., None] * B[:, t, None]
        ys.append((h * C[:, t, None]).sum(-1))
    y = (torch.stack(ys, -1) + D[:, None] * x) * F.silu(z)
    return y.transpose(1, 2) @ out_w.t() + out_b


def make(seed=0, rms_weights=False):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s, scale=1.0: torch.randn(*s, generator=g, dtype=torch.float64) * scale  # noqa: E731
    t = {
        "xz": r(BATCH, 2 * DIM, LENGTH),
        "conv_w": r(DIM, 1, WIDTH, scale=0.5),
        "conv_b": r(DIM, scale=0.2),
        "x_proj": r(RANK + 2 * N, DIM, scale=0.4),
        "dt_proj": r(DIM, RANK, scale=0.5),
        "out_w": r(HIDDEN, DIM, scale=0.4),
        "out_b": r(HIDDEN, scale=0.1),
        "A": -(torch.rand(DIM, N, generator=g, dtype=torch.float64) + 0.2),
        "D": r(DIM),
        "delta_bias": r(DIM, scale=0.3),
    }
    if rms_weights:
        t.update(b_rms=r(N).abs() + 0.5, c_rms=r(N).abs() + 0.5, dt_rms=r(DIM).abs() + 0.5)
    return t


def call(t, **over):
    kw = {k: t[k] for k in ("b_rms", "c_rms", "dt_rms") if k in t}
    return mamba_inner_fn(
        t["xz"], t["conv_w"], t["conv_b"], t["x_proj"], t["dt_proj"], t["out_w"], t["out_b"],
        t["A"], None, None, t["D"], delta_bias=t["delta_bias"], delta_softplus=True,
        b_rms_weight=kw.get("b_rms"), c_rms_weight=kw.get("c_rms"),
        dt_rms_weight=kw.get("dt_rms"), b_c_dt_rms_eps=1e-5, **over,
    )


def rel(a, b):
    return float((a.double() - b).norm() / b.norm())


@pytest.mark.parametrize("rms_weights", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_mamba_inner_forward_and_gradients(rms_weights, dtype):
    ref = make(seed=int(rms_weights), rms_weights=rms_weights)
    # the op sees the model's dtype for activations and weights, float32 for A, D, delta_bias
    low = {k: v.to(torch.float32 if k in ("A", "D", "delta_bias") else dtype) for k, v in ref.items()}
    ref = {k: v.double().requires_grad_() for k, v in low.items()}
    got_in = {k: v.clone().requires_grad_() for k, v in low.items()}
    CALLS.clear()
    got = call(got_in)
    want = composed(*(ref[k] for k in ("xz", "conv_w", "conv_b", "x_proj", "dt_proj", "out_w",
                                       "out_b", "A", "D", "delta_bias")),
                    b_rms=ref.get("b_rms"), c_rms=ref.get("c_rms"), dt_rms=ref.get("dt_rms"),
                    eps=1e-5)
    assert CALLS[sscan_fwd_counter(IMPL)] == 1, dict(CALLS)
    assert got.shape == (BATCH, LENGTH, HIDDEN) and got.dtype == dtype
    tol = 1e-4 if dtype == torch.float32 else 4e-2
    assert rel(got, want) < tol
    dout = torch.randn(want.shape, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    names = list(ref)
    gg = torch.autograd.grad((got.double() * dout).sum(), [got_in[k] for k in names])
    rg = torch.autograd.grad((want * dout).sum(), [ref[k] for k in names])
    assert CALLS[sscan_bwd_counter(IMPL)] == 1, dict(CALLS)
    for name, a, b in zip(names, gg, rg, strict=True):
        assert rel(a, b) < 3 * tol, f"d{name}: {rel(a, b):.2e}"


def test_naive_composition_matches_first_principles():
    """naive.mamba_inner_ref (the fallback and spec) is the same function, float64."""
    t = make(seed=4, rms_weights=True)
    got = mamba_inner_ref(t["xz"], t["conv_w"], t["conv_b"], t["x_proj"], t["dt_proj"],
                          t["out_w"], t["out_b"], t["A"], None, None, t["D"], t["delta_bias"],
                          b_rms_weight=t["b_rms"], c_rms_weight=t["c_rms"],
                          dt_rms_weight=t["dt_rms"], b_c_dt_rms_eps=1e-5)
    want = composed(*(t[k] for k in ("xz", "conv_w", "conv_b", "x_proj", "dt_proj", "out_w",
                                     "out_b", "A", "D", "delta_bias")),
                    b_rms=t["b_rms"], c_rms=t["c_rms"], dt_rms=t["dt_rms"], eps=1e-5)
    assert rel(got, want) < 1e-12


def test_bad_xz_and_checkpoint_level_are_one_line_errors():
    t = make()
    with pytest.raises(ValueError, match="xz must be"):
        call({**t, "xz": t["xz"][:, :-1]})
    with pytest.raises(ValueError, match="checkpoint_lvl"):
        call(t, checkpoint_lvl=2)


# ---------------------------------------------------------------- mamba_ssm's B / C options
def inner_case(var_b: bool, var_c: bool, complex_a: bool = False, seed: int = 11):
    """mamba_ssm's test_mamba_inner_fn inputs at small sizes: x_proj makes only the varying B/C
    (2 rows per state with complex A); conv weights, A, a time-invariant B/C, D, delta_bias
    float64 here, lowered per call."""
    g = torch.Generator().manual_seed(seed)
    r = lambda *s, scale=1.0: torch.randn(*s, generator=g, dtype=torch.float64) * scale  # noqa: E731
    per = N * (2 if complex_a else 1)
    t = {
        "xz": r(BATCH, 2 * DIM, LENGTH),
        "conv_w": r(DIM, 1, 3, scale=0.5),
        "conv_b": r(DIM, scale=0.2),
        "x_proj": r(RANK + (var_b + var_c) * per, DIM, scale=0.4),
        "dt_proj": r(DIM, RANK, scale=0.5),
        "out_w": r(HIDDEN, DIM, scale=0.4),
        "A": -(torch.rand(DIM, N, generator=g, dtype=torch.float64) * 0.5 + 0.1),
        "D": r(DIM),
        "delta_bias": r(DIM, scale=0.3),
    }
    if complex_a:
        t["A"] = torch.complex(t["A"], r(DIM, N))
    if not var_b:
        t["B"] = torch.complex(r(DIM, N), r(DIM, N)) if complex_a else r(DIM, N)
    if not var_c:
        t["C"] = torch.complex(r(DIM, N), r(DIM, N)) if complex_a else r(DIM, N)
    return t


def inner(fn, t):
    return fn(t["xz"], t["conv_w"], t["conv_b"], t["x_proj"], t["dt_proj"], t["out_w"], None,
              t["A"], t.get("B"), t.get("C"), t["D"], delta_bias=t["delta_bias"],
              delta_softplus=True)


WEIGHTS32 = ("conv_w", "conv_b", "A", "B", "C", "D", "delta_bias")  # mamba_ssm's test dtypes


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("var_b", "var_c"), [(False, True), (True, False), (False, False)])
def test_time_invariant_b_or_c(var_b, var_c, dtype):
    """A time-invariant (dim, N) B and/or C given to mamba_inner_fn (mamba_ssm's
    is_variable_B/C = False): output and every gradient against float64 (these gave wrong
    outputs and an out-of-bounds read through the scan)."""
    t = inner_case(var_b, var_c)
    low = {k: v.to(torch.float32 if k in WEIGHTS32 else dtype) for k, v in t.items()}
    got_in = {k: v.clone().requires_grad_() for k, v in low.items()}
    ref_in = {k: v.double().requires_grad_() for k, v in low.items()}
    CALLS.clear()
    got = inner(mamba_inner_fn, got_in)
    assert CALLS[sscan_fwd_counter(IMPL)] == 1, dict(CALLS)
    want = inner(mamba_inner_ref, ref_in)
    tol = 1e-4 if dtype == torch.float32 else 4e-2
    assert got.dtype == dtype and rel(got, want) < tol
    dout = torch.randn(want.shape, generator=torch.Generator().manual_seed(3),
                       dtype=torch.float64)
    names = list(low)
    gg = torch.autograd.grad((got.double() * dout).sum(), [got_in[k] for k in names])
    rg = torch.autograd.grad((want * dout).sum(), [ref_in[k] for k in names])
    for name, a, b in zip(names, gg, rg, strict=True):
        assert a.dtype == low[name].dtype and rel(a, b) < 3 * tol, f"d{name}: {rel(a, b):.2e}"


@pytest.mark.parametrize(("var_b", "var_c"), [(True, True), (False, True)])
def test_complex_a_takes_the_reference_with_a_warning(var_b, var_c):
    """mamba_ssm's wtype=complex64: the scan runs its reference (warned once), output equal to
    the float64 composition."""
    from fastpath.kernels import dispatch

    t = inner_case(var_b, var_c, complex_a=True, seed=2)
    low = {k: v.to(torch.complex64 if v.is_complex() else torch.float32) for k, v in t.items()}
    dispatch._warn_once.cache_clear()
    CALLS.clear()
    with pytest.warns(RuntimeWarning, match="complex A"):
        got = inner(mamba_inner_fn, low)
    assert CALLS["ss_fwd:reference"] == 1, dict(CALLS)
    want = inner(mamba_inner_ref, t)
    assert rel(got, want) < 1e-4


def test_x_proj_rows_must_match_the_varying_b_and_c():
    t = inner_case(False, True)
    t["x_proj"] = t["x_proj"][:-1]
    with pytest.raises(ValueError, match="x_proj_weight must be") as info:
        inner(mamba_inner_fn, t)
    assert "\n" not in str(info.value)
