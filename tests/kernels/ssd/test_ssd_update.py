"""selective_state_update (Mamba-2 decode step): the Triton kernel against the float64 spec
(kernels/ssd/naive.selective_state_update_ref) over every option mamba_ssm's signature has.

On CPU the kernel runs under TRITON_INTERPRET=1 (scripts/test.sh exports it), tiny shapes.
"""

from __future__ import annotations

import os

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fastpath.kernels.counters import CALLS, reset
from fastpath.kernels.ssd.naive import selective_state_update_ref
from fastpath.kernels.ssd.update import selective_state_update

ON_GPU = torch.cuda.is_available()
DEVICE = "cuda" if ON_GPU else "cpu"
needs_triton = pytest.mark.skipif(
    not ON_GPU and os.environ.get("TRITON_INTERPRET") != "1",
    reason="exercises the Triton kernel: needs CUDA or TRITON_INTERPRET=1",
)
TOL = {torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


def make_case(seed: int, batch: int, nheads: int, ngroups: int, dim: int, dstate: int,
              dtype: torch.dtype, state_dtype: torch.dtype, tied: bool, dt_bias: str, d_skip: str,
              has_z: bool, pool: bool, heads: bool) -> dict:
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(*shape, generator=g) * scale).to(dtype)

    rows = batch + 2 if pool else batch
    case: dict = {"state": (torch.randn(rows, nheads, dim, dstate, generator=g)).to(state_dtype),
                  "x": rnd(batch, nheads, dim)}
    if tied:  # transformers' decode call: per-head values expanded with stride 0
        case["dt"] = rnd(batch, nheads, 1, scale=0.5).expand(batch, nheads, dim)
        case["A"] = (-torch.rand(nheads, 1, 1, generator=g) * 2).expand(nheads, dim, dstate)
    else:
        case["dt"] = rnd(batch, nheads, dim, scale=0.5)
        case["A"] = -torch.rand(nheads, dim, dstate, generator=g) * 2
    case["B"] = rnd(batch, ngroups, dstate)
    case["C"] = rnd(batch, ngroups, dstate)
    case["dt_bias"] = {"none": None, "head": torch.randn(nheads, generator=g) * 0.5,
                       "channel": torch.randn(nheads, dim, generator=g) * 0.5}[dt_bias]
    if tied and case["dt_bias"] is not None:
        case["dt_bias"] = torch.randn(nheads, 1, generator=g).expand(nheads, dim) * 0.5
    case["D"] = {"none": None, "head": torch.randn(nheads, generator=g),
                 "channel": torch.randn(nheads, dim, generator=g)}[d_skip]
    case["z"] = rnd(batch, nheads, dim) if has_z else None
    case["state_batch_indices"] = (torch.randperm(rows, generator=g)[:batch].to(torch.int32)
                                   if pool else None)
    if not heads:  # mamba_ssm's head-less form: one head, groups collapse
        case = {k: _headless(k, v) for k, v in case.items()}
    return case


def _headless(name: str, t: torch.Tensor | None) -> torch.Tensor | None:
    if t is None or name == "state_batch_indices":
        return t
    axis = {"state": 1, "x": 1, "dt": 1, "z": 1, "B": 1, "C": 1, "A": 0, "D": 0, "dt_bias": 0}[name]
    return t.select(axis, 0)


def to(case: dict, device: str, dtype: torch.dtype | None = None) -> dict:
    out = {}
    for k, v in case.items():
        if v is None:
            out[k] = None
        elif k == "state_batch_indices":
            out[k] = v.to(device)
        else:
            out[k] = v.to(device=device, dtype=dtype or v.dtype)
    return out


def run(fn, case: dict, softplus: bool) -> tuple[torch.Tensor, torch.Tensor]:
    c = dict(case)
    state = c.pop("state").clone()
    out = fn(state, c.pop("x"), c.pop("dt"), c.pop("A"), c.pop("B"), c.pop("C"), dt_softplus=softplus, **c)
    return out, state


@needs_triton
@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**16),
    batch=st.integers(1, 3),
    heads_groups=st.sampled_from([(1, 1), (2, 1), (2, 2), (4, 2), (6, 3)]),
    dim=st.integers(1, 9),
    dstate=st.sampled_from([1, 3, 8, 16, 17]),
    dtype=st.sampled_from([torch.float32, torch.float16, torch.bfloat16]),
    state_fp32=st.booleans(),
    tied=st.booleans(),
    dt_bias=st.sampled_from(["none", "head", "channel"]),
    d_skip=st.sampled_from(["none", "head", "channel"]),
    has_z=st.booleans(),
    softplus=st.booleans(),
    pool=st.booleans(),
    heads=st.booleans(),
)
def test_matches_float64_spec(seed, batch, heads_groups, dim, dstate, dtype, state_fp32, tied, dt_bias,
                              d_skip, has_z, softplus, pool, heads):
    nheads, ngroups = heads_groups
    if not heads:
        nheads = ngroups = 1
    case = make_case(seed, batch, nheads, ngroups, dim, dstate, dtype,
                     torch.float32 if state_fp32 else dtype, tied, dt_bias, d_skip, has_z, pool, heads)
    ref_case = to(case, "cpu", torch.float64)
    for name in ("D", "dt_bias"):  # per-head (nheads,) is our extension: the spec takes (nheads, dim)
        if heads and ref_case[name] is not None and ref_case[name].dim() == 1:
            ref_case[name] = ref_case[name][:, None].expand(nheads, dim)
    ref_out, ref_state = run(selective_state_update_ref, ref_case, softplus)
    reset()
    out, state = run(selective_state_update, to(case, DEVICE), softplus)
    assert CALLS["ssd_update:triton"] == 1
    assert out.dtype == dtype and out.shape == case["x"].shape
    tol = TOL[dtype]
    scale = max(1.0, float(ref_out.abs().max()))
    torch.testing.assert_close(out.double().cpu(), ref_out, atol=tol * scale, rtol=tol)
    s_tol = TOL[case["state"].dtype]
    torch.testing.assert_close(state.double().cpu(), ref_state, atol=s_tol * max(1.0, float(ref_state.abs().max())),
                               rtol=s_tol)


@needs_triton
def test_padding_rows_leave_the_pool_alone():
    """A negative state_batch_indices entry is a padding row: output 0, no state written."""
    case = make_case(3, 3, 4, 2, 5, 8, torch.float32, torch.float32, True, "head", "channel", True, True, True)
    case["state_batch_indices"] = torch.tensor([2, -1, 0], dtype=torch.int32)
    before = case["state"].clone()
    out, state = run(selective_state_update, to(case, DEVICE), True)
    assert float(out[1].abs().max()) == 0.0
    assert torch.equal(state[[1, 3, 4]].cpu(), before[[1, 3, 4]])  # untouched rows, padding's included
    valid = dict(case, x=case["x"][[0, 2]], dt=case["dt"][[0, 2]], B=case["B"][[0, 2]], C=case["C"][[0, 2]],
                 z=case["z"][[0, 2]], state_batch_indices=torch.tensor([2, 0], dtype=torch.int32))
    ref_out, ref_state = run(selective_state_update_ref, to(valid, "cpu", torch.float64), True)
    torch.testing.assert_close(out[[0, 2]].double().cpu(), ref_out, atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(state.double().cpu(), ref_state, atol=2e-5, rtol=2e-5)


def test_reference_path_without_triton(monkeypatch):
    """CPU tensors without the interpreter take the float spec, padding rows included."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    case = make_case(5, 3, 2, 1, 4, 8, torch.float32, torch.float32, False, "channel", "channel", True, True, True)
    case["state_batch_indices"] = torch.tensor([-1, 4, 1], dtype=torch.int32)
    before = case["state"].clone()
    reset()
    out, state = run(selective_state_update, case, True)
    assert CALLS["ssd_update:reference"] == 1 and CALLS["ssd_update:triton"] == 0
    assert float(out[0].abs().max()) == 0.0
    assert torch.equal(state[[0, 2, 3]], before[[0, 2, 3]])


@pytest.mark.parametrize("dim", [3, 4])  # dim == nheads: a (nheads,) vector broadcast on dim fits
def test_reference_path_takes_per_head_d_and_dt_bias(monkeypatch, dim):
    """float64 goes to the spec, which must read (nheads,) D / dt_bias per head like the kernel."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    case = to(make_case(7, 2, 4, 2, dim, 5, torch.float32, torch.float32, False, "head", "head",
                        True, False, True), "cpu", torch.float64)
    reset()
    out, state = run(selective_state_update, case, True)
    assert CALLS["ssd_update:reference"] == 1
    channel = dict(case, D=case["D"][:, None].expand(4, dim),
                   dt_bias=case["dt_bias"][:, None].expand(4, dim))
    want, want_state = run(selective_state_update_ref, channel, True)
    torch.testing.assert_close(out, want, atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(state, want_state, atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("change, match", [
    (lambda c: c.update(A=c["A"][:, :, :-1]), "A"),
    (lambda c: c.update(B=c["B"][:, :, :-1]), "B/C"),
    (lambda c: c.update(D=torch.ones(3)), "D"),
    (lambda c: c.update(state=c["state"][:-1]), "state batch"),
    (lambda c: c.update(state_batch_indices=torch.zeros(5, dtype=torch.int32)), "state_batch_indices"),
])
def test_bad_shapes_raise_a_clear_error(change, match):
    case = make_case(1, 2, 4, 2, 3, 4, torch.float32, torch.float32, False, "head", "head", False, False, True)
    change(case)
    with pytest.raises(ValueError, match=match):
        run(selective_state_update, case, False)


def test_ngroups_must_divide_heads():
    case = make_case(1, 2, 4, 2, 3, 4, torch.float32, torch.float32, False, "none", "none", False, False, True)
    case["B"] = torch.randn(2, 3, 4)
    case["C"] = torch.randn(2, 3, 4)
    with pytest.raises(ValueError, match="ngroups"):
        run(selective_state_update, case, False)


@needs_triton
def test_state_size_beyond_the_kernel_falls_back_with_a_warning():
    case = make_case(2, 1, 1, 1, 2, 300, torch.float32, torch.float32, True, "head", "channel", False, False, True)
    reset()
    with pytest.warns(RuntimeWarning, match="dstate 300"):
        out, _ = run(selective_state_update, to(case, DEVICE), True)
    assert CALLS["ssd_update:reference"] == 1 and CALLS["ssd_update:triton"] == 0
    ref_case = to(case, "cpu", torch.float64)
    ref_out, _ = run(selective_state_update_ref, ref_case, True)
    torch.testing.assert_close(out.double().cpu(), ref_out, atol=1e-5, rtol=1e-5)
