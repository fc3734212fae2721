"""Mamba-1's decode step (selective_state_update, 3-D state) against the float64 formula.

On CPU the kernel runs under TRITON_INTERPRET=1 (scripts/test.sh exports it), tiny shapes. The
state is updated in place (also through the non-contiguous per-head view Zamba passes); the
output is checked against the formula written out here, independently of naive.py.
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

from fastpath.kernels import dispatch
from fastpath.kernels.counters import CALLS
from fastpath.kernels.dispatch import use_triton
from fastpath.kernels.selective_scan.update import selective_state_update

ON_TRITON = use_triton(torch.empty(0))
IMPL = "triton" if ON_TRITON else "reference"
TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 4e-3}


def expected(state, x, dt, A, B, C, D, z, dt_bias, softplus):
    """float64: (out, new state); B/C (batch, G, N) are repeated to channels."""
    s, x, dt, A, B, C = (t.double() for t in (state, x, dt, A, B, C))
    if B.dim() == 3:
        B = B.repeat_interleave(x.shape[1] // B.shape[1], dim=1)
        C = C.repeat_interleave(x.shape[1] // C.shape[1], dim=1)
    else:
        B, C = B[:, None], C[:, None]
    if dt_bias is not None:
        dt = dt + dt_bias.double()
    if softplus:
        dt = torch.where(dt <= 20, F.softplus(dt), dt)
    new = s * torch.exp(dt[..., None] * A) + (dt * x)[..., None] * B
    out = (new * C).sum(-1)
    if D is not None:
        out = out + D.double() * x
    if z is not None:
        out = out * F.silu(z.double())
    return out, new


def inputs(batch, dim, nstate, dtype, groups=0, seed=0):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g).to(dtype)  # noqa: E731
    bc = (batch, groups, nstate) if groups else (batch, nstate)
    return {
        "state": r(batch, dim, nstate), "x": r(batch, dim), "dt": r(batch, dim),
        "A": -(torch.rand(dim, nstate, generator=g) + 0.1), "B": r(*bc), "C": r(*bc),
        "D": torch.randn(dim, generator=g), "z": r(batch, dim), "dt_bias": torch.randn(dim, generator=g),
    }


def rel(a, b):
    return float((a.double() - b).norm() / b.norm())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("groups", [0, 2])
@pytest.mark.parametrize("options", [True, False])
def test_update_in_place_matches_the_formula(dtype, groups, options):
    t = inputs(3, 6, 5, dtype, groups=groups, seed=groups + options)
    if not options:
        t.update(D=None, z=None, dt_bias=None)
    state0 = t["state"].clone()
    want_out, want_state = expected(state0, t["x"], t["dt"], t["A"], t["B"], t["C"], t["D"],
                                    t["z"], t["dt_bias"], options)
    CALLS.clear()
    out = selective_state_update(**t, dt_softplus=options)
    assert CALLS[f"ss_update:{IMPL}"] == 1, dict(CALLS)
    assert out.shape == t["x"].shape and out.dtype == dtype
    assert rel(out, want_out) < TOL[dtype]
    assert t["state"].dtype == dtype and rel(t["state"], want_state) < TOL[dtype]


def test_zamba_per_head_view_is_updated_in_place():
    """Zamba calls the op per head with recurrent_state[:, head] (a strided view of the cache)
    and A[head], D[head], dt_bias[head] (transformers' models/zamba/modeling_zamba.py)."""
    g = torch.Generator().manual_seed(3)
    batch, heads, hd, n = 2, 3, 4, 5
    cache = torch.randn(batch, heads, hd, n, generator=g)
    before = cache.clone()
    A = -(torch.rand(heads, hd, n, generator=g) + 0.1)
    D, bias = torch.randn(heads, hd, generator=g), torch.randn(heads, hd, generator=g)
    x, dt, z = (torch.randn(heads, batch, hd, generator=g) for _ in range(3))
    B, C = torch.randn(heads, batch, n, generator=g), torch.randn(heads, batch, n, generator=g)
    for h in range(heads):
        out = selective_state_update(cache[:, h], x[h], dt[h], A[h], B[h], C[h], D[h], z=z[h],
                                     dt_bias=bias[h], dt_softplus=True)
        want_out, want_state = expected(before[:, h], x[h], dt[h], A[h], B[h], C[h], D[h], z[h],
                                        bias[h], True)
        assert rel(out, want_out) < 1e-5
        assert rel(cache[:, h], want_state) < 1e-5


def test_pooled_state_with_padding_rows():
    t = inputs(3, 4, 3, torch.float32, seed=9)
    pool = torch.randn(5, 4, 3)
    before = pool.clone()
    idx = torch.tensor([4, -1, 1])
    t.pop("state")
    out = selective_state_update(pool, **t, dt_softplus=True, state_batch_indices=idx)
    assert torch.equal(out[1], torch.zeros(4))
    for row, slot in ((0, 4), (2, 1)):
        pick = {k: (v[row:row + 1] if k in ("x", "dt", "z", "B", "C") else v) for k, v in t.items()}
        want_out, want_state = expected(before[slot:slot + 1], pick["x"], pick["dt"], pick["A"],
                                        pick["B"], pick["C"], pick["D"], pick["z"],
                                        pick["dt_bias"], True)
        assert rel(out[row:row + 1], want_out) < 1e-5
        assert rel(pool[slot:slot + 1], want_state) < 1e-5
    for slot in (0, 2, 3):
        assert torch.equal(pool[slot], before[slot])


@pytest.mark.skipif(not ON_TRITON, reason="the fallback warning is about the Triton kernel")
def test_too_large_state_falls_back_with_a_warning():
    t = inputs(1, 2, 257, torch.float32, seed=1)
    state0 = t["state"].clone()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        dispatch._warn_once.cache_clear()
        CALLS.clear()
        out = selective_state_update(**t, dt_softplus=True)
    assert CALLS["ss_update:reference"] == 1
    assert any("N=257" in str(w.message) for w in seen)
    want_out, want_state = expected(state0, t["x"], t["dt"], t["A"], t["B"], t["C"], t["D"],
                                    t["z"], t["dt_bias"], True)
    assert rel(out, want_out) < 1e-5 and rel(t["state"], want_state) < 1e-5


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"state": torch.zeros(3, 6, 5, 1)}, "state must be"),
        ({"x": torch.zeros(3, 7)}, "does not match"),
        ({"dt": torch.zeros(3, 5)}, "dt and z"),
        ({"A": torch.zeros(6, 4)}, "A "),
        ({"B": torch.zeros(3, 4)}, "B must be"),
        ({"D": torch.zeros(5)}, "D must be"),
    ],
)
def test_bad_shapes_are_one_line_errors(change, message):
    t = inputs(3, 6, 5, torch.float32)
    t.update(change)
    with pytest.raises(ValueError, match=message) as info:
        selective_state_update(**t)
    assert "\n" not in str(info.value)


def test_index_past_the_pool_is_a_no_op_not_an_out_of_bounds_access():
    """A state_batch_indices entry >= the pool size is treated like a padding row (output 0, no
    state touched) by the kernel and the reference alike: the kernel never reads or writes
    outside `state` (checking on the host would sync the device every token). The pool is a
    view into a NaN-filled buffer, so a stray read would show."""
    t = inputs(3, 4, 3, torch.float32, seed=10)
    t.pop("state")
    buf = torch.full((7, 4, 3), float("nan"))
    pool = buf[1:6]
    pool.copy_(torch.randn(5, 4, 3))
    before = buf.clone()
    idx = torch.tensor([5, 2, 900])
    out = selective_state_update(pool, **t, dt_softplus=True, state_batch_indices=idx)
    assert torch.isfinite(out).all()
    assert torch.equal(out[0], torch.zeros(4)) and torch.equal(out[2], torch.zeros(4))
    pick = {k: (v[1:2] if k in ("x", "dt", "z", "B", "C") else v) for k, v in t.items()}
    want_out, want_state = expected(before[3:4], pick["x"], pick["dt"], pick["A"], pick["B"],
                                    pick["C"], pick["D"], pick["z"], pick["dt_bias"], True)
    assert rel(out[1:2], want_out) < 1e-5 and rel(pool[2:3], want_state) < 1e-5
    changed = [i for i in range(7) if not torch.equal(buf[i].nan_to_num(), before[i].nan_to_num()) and i != 3]
    assert changed == [], changed
