"""The time-sequential selective-scan forward (fwd_seq.py, FASTPATH_SSCAN_FWD=seq) against
the float64 step loop of naive.py, and against the default chunked kernel.

On CPU the kernel runs under TRITON_INTERPRET=1 at tiny shapes. The seq forward writes only
(out, last_state): the backward recomputes its chunk states itself (fwd_chunked.chunk_states), so a
training call under FASTPATH_SSCAN_FWD=seq is checked end to end (forward by the seq kernel,
gradients by the usual backward) against autograd of the reference. Call counters prove which
kernel ran.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kernel_checks import rel_err
from kernel_checks import selective_scan_inputs as make_inputs

from fastpath.kernels.counters import CALLS
from fastpath.kernels.dispatch import use_triton
from fastpath.kernels.selective_scan.fwd_chunked import selective_scan_fwd_triton
from fastpath.kernels.selective_scan.fwd_seq import SEQ_SWEEP, selective_scan_fwd_seq_triton
from fastpath.kernels.selective_scan.interface import FWD_ENV, fwd_kernel, selective_scan_fn
from fastpath.kernels.selective_scan.naive import selective_scan_ref
from fastpath.shared.errors import UsageError

ON_CPU_TRITON = use_triton(torch.empty(0))  # TRITON_INTERPRET=1


@pytest.fixture(autouse=True)
def _cpu_cases_need_the_interpreter(request):
    """The cases on CPU tensors need the interpreter; the `gpu` group needs only CUDA (a
    module-wide skip on CPU tensors would skip it under `pytest -m gpu` on a GPU host)."""
    if request.node.get_closest_marker("gpu") is None and not ON_CPU_TRITON:
        pytest.skip("runs the kernels on CPU tensors: needs TRITON_INTERPRET=1")

TOL = {torch.float32: 1e-4, torch.bfloat16: 3e-2}


def check(monkeypatch, t, dtype, *, softplus=True, last=True, views=False):
    monkeypatch.setenv(FWD_ENV, "seq")
    if views:  # transformers' channel-last views
        t = {k: (v.transpose(-1, -2).contiguous().transpose(-1, -2) if v.dim() == 3 else v)
             for k, v in t.items()}
    CALLS.clear()
    got = selective_scan_fn(**t, delta_softplus=softplus, return_last_state=last)
    assert CALLS["ss_fwd:triton-seq"] == 1 and CALLS["ss_fwd:triton"] == 0, dict(CALLS)
    ref = selective_scan_ref(**{k: None if v is None else v.double() for k, v in t.items()},
                             delta_softplus=softplus,
                             return_last_state=last)
    if last:
        (out, state), (rout, rstate) = got, ref
        assert state.dtype == torch.float32
        assert rel_err(state, rstate) < TOL[dtype]
    else:
        out, rout = got, ref
    assert out.dtype == dtype
    assert rel_err(out, rout) < TOL[dtype]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("layout,groups", [("shared", 1), ("grouped", 2), ("invariant", 1)])
def test_seq_matches_reference(monkeypatch, dtype, layout, groups):
    # time-invariant B/C make one group per channel (one program each): keep that one short
    dim, length = (6, 13) if layout == "invariant" else (16, 37)
    t = make_inputs(2, dim, 8, length, layout, groups, seed=1, dtype=dtype)
    check(monkeypatch, t, dtype, views=layout == "shared")


@pytest.mark.parametrize("drop", ["D", "z", "delta_bias", "all"])
@pytest.mark.parametrize("softplus", [True, False])
def test_seq_options(monkeypatch, drop, softplus):
    t = make_inputs(1, 8, 4, 23, "shared", 1, seed=2, dtype=torch.float32)
    for k in (("D", "z", "delta_bias") if drop == "all" else (drop,)):
        t[k] = None
    check(monkeypatch, t, torch.float32, softplus=softplus, last=drop != "z")


@settings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck))
@given(batch=st.integers(1, 2), groups=st.sampled_from([1, 2]), dpg=st.integers(1, 12),
       nstate=st.sampled_from([1, 3, 4, 16]), length=st.integers(1, 48),
       dtype=st.sampled_from([torch.float32, torch.bfloat16]), seed=st.integers(0, 2**16))
def test_seq_property_sweep(monkeypatch, batch, groups, dpg, nstate, length, dtype, seed):
    """Odd channel counts (masked lanes), N not a power of two, L from 1."""
    t = make_inputs(batch, groups * dpg, nstate, length, "grouped", groups, seed, dtype)
    check(monkeypatch, t, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_seq_equals_chunked_kernel(dtype):
    """Same contract as the chunked kernel: out and last_state agree to float32 rounding."""
    t = make_inputs(1, 32, 16, 24, "grouped", 2, seed=3, dtype=dtype)
    args = (t["u"], t["delta"], t["A"], t["B"], t["C"], t["D"], t["z"], t["delta_bias"], True)
    o1, s1 = selective_scan_fwd_seq_triton(*args)
    o2, s2 = selective_scan_fwd_triton(*args)
    assert o1.dtype == o2.dtype == dtype and o1.is_contiguous()
    assert rel_err(s1, s2) < 1e-5
    assert rel_err(o1, o2) < (1e-5 if dtype == torch.float32 else 1e-2)


def test_seq_training_gradients(monkeypatch):
    """FASTPATH_SSCAN_FWD=seq in training: the seq forward plus the usual backward (which
    recomputes its own chunk states) gives the reference's gradients, last_state's included."""
    monkeypatch.setenv(FWD_ENV, "seq")
    t = make_inputs(1, 8, 4, 19, "shared", 1, seed=4, dtype=torch.float32)
    got_in = {k: v.clone().requires_grad_() for k, v in t.items()}
    ref_in = {k: v.double().requires_grad_() for k, v in t.items()}
    CALLS.clear()
    out, last = selective_scan_fn(**got_in, delta_softplus=True, return_last_state=True)
    assert CALLS["ss_fwd:triton-seq"] == 1
    rout, rlast = selective_scan_ref(**ref_in, delta_softplus=True, return_last_state=True)
    g = torch.Generator().manual_seed(5)
    dout = torch.randn(out.shape, generator=g, dtype=torch.float64)
    dlast = torch.randn(last.shape, generator=g, dtype=torch.float64)
    got = torch.autograd.grad((out, last), list(got_in.values()),
                              (dout.float(), dlast.float()))
    ref = torch.autograd.grad((rout, rlast), list(ref_in.values()), (dout, dlast))
    for name, a, b in zip(got_in, got, ref, strict=True):
        assert rel_err(a, b) < 1e-4, name


def test_env_dispatch(monkeypatch):
    monkeypatch.delenv(FWD_ENV, raising=False)
    assert fwd_kernel() == "tile"
    t = make_inputs(1, 4, 4, 9, "shared", 1, seed=6, dtype=torch.float32)
    CALLS.clear()
    selective_scan_fn(**t, delta_softplus=True)
    assert CALLS["ss_fwd:triton-tile"] == 1 and CALLS["ss_fwd:triton-seq"] == 0
    monkeypatch.setenv(FWD_ENV, " SEQ ")
    assert fwd_kernel() == "seq"
    monkeypatch.setenv(FWD_ENV, "parallel")
    with pytest.raises(UsageError, match="FASTPATH_SSCAN_FWD='parallel'"):
        selective_scan_fn(**t, delta_softplus=True)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("cfg", SEQ_SWEEP)
def test_seq_gpu_falcon_shapes(cfg):
    """Compiled for the device at Falcon-Mamba-7B's width (D = 8192, N = 16), bf16, the layouts
    transformers passes (u, z channel-last views; B/C (B, N, L) views and contiguous): every
    SEQ_SWEEP config equals the float64 reference and the chunked kernel."""
    g = torch.Generator(device="cuda").manual_seed(7)
    batch, dim, nstate, length = 2, 8192, 16, 512
    bf = torch.bfloat16

    def r(*s, scale=1.0, dtype=bf):
        return (torch.randn(*s, generator=g, device="cuda") * scale).to(dtype)

    for contiguous_bc in (False, True):
        Bv, Cv = (r(batch, length, nstate).transpose(1, 2) for _ in "BC")
        if contiguous_bc:
            Bv, Cv = Bv.contiguous(), Cv.contiguous()
        t = {"u": r(batch, length, dim).transpose(1, 2), "delta": r(batch, dim, length) - 1.0,
             "A": -torch.exp(r(dim, nstate, scale=0.5, dtype=torch.float32)),
             "B": Bv[:, None], "C": Cv[:, None], "D": r(dim, dtype=torch.float32),
             "z": r(batch, length, dim).transpose(1, 2),
             "delta_bias": r(dim, scale=0.3, dtype=torch.float32)}
        args = (t["u"], t["delta"], t["A"], t["B"], t["C"], t["D"], t["z"], t["delta_bias"], True)
        out, last = selective_scan_fwd_seq_triton(*args, config=cfg)
        out2, last2 = selective_scan_fwd_triton(*args)
        ref_out, ref_last = selective_scan_ref(*(a.double() for a in args[:8]),
                                               delta_softplus=True, return_last_state=True)
        assert rel_err(out, ref_out) < 2e-2 and rel_err(last, ref_last) < 1e-4
        assert rel_err(out, out2) < 1e-2 and rel_err(last, last2) < 1e-5
