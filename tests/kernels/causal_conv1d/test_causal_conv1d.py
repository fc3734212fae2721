"""fastpath.causal_conv1d against a float64 reference: values, gradients, state updates.

On CPU the kernels run under TRITON_INTERPRET=1 (scripts/test.sh exports it) at small shapes; on a
CUDA machine the same module runs the compiled kernels at larger shapes. Inputs are random
(never zeros) and preallocated outputs are NaN-poisoned, so unwritten elements fail loudly.
"""

from __future__ import annotations

import importlib
import os
import sys
import warnings

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fastpath.causal_conv1d as face
from fastpath.causal_conv1d import cpp_functions
from fastpath.causal_conv1d.causal_conv1d_interface import (
    causal_conv1d_fn,
    causal_conv1d_ref,
    causal_conv1d_update,
    causal_conv1d_update_ref,
)
from fastpath.causal_conv1d.causal_conv1d_varlen import (
    causal_conv1d_varlen_states,
    causal_conv1d_varlen_states_ref,
)
from fastpath.kernels.counters import CALLS
from fastpath.kernels.dispatch import use_triton

ON_GPU = torch.cuda.is_available()
DEVICE = "cuda" if ON_GPU else "cpu"
# (max batch, max dim, max seqlen) per device: the interpreter is slow, the GPU is not.
MAX_B, MAX_D, MAX_L = (4, 512, 1500) if ON_GPU else (2, 40, 48)
EXAMPLES = 60 if ON_GPU else 32
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# relative L2 error allowed, by the least precise dtype among the inputs/outputs
TOL = {torch.float32: 2e-5, torch.float16: 3e-3, torch.bfloat16: 2e-2}
EXPECTED_IMPL = "triton" if use_triton(torch.empty(0, device=DEVICE)) else "reference"
SETTINGS = settings(
    max_examples=EXAMPLES, deadline=None, derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def _tol(*dtypes: torch.dtype) -> float:
    return max(TOL[d] for d in dtypes)


def _rel_err(got: torch.Tensor, ref: torch.Tensor) -> float:
    assert got.shape == ref.shape, (got.shape, ref.shape)
    assert not torch.isnan(got).any(), "NaN in result (unwritten element?)"
    got, ref = got.double().cpu(), ref.double().cpu()
    return ((got - ref).norm() / ref.norm().clamp_min(1e-12)).item()


def _make_x(batch, dim, seqlen, dtype, channel_last, gen):
    if channel_last:  # memory (B, L, D) viewed as (B, D, L): what transformers passes
        x = torch.randn(batch, seqlen, dim, generator=gen).transpose(1, 2)
    else:
        x = torch.randn(batch, dim, seqlen, generator=gen)
    return x.to(DEVICE, dtype)


def _make_seq_idx(batch, seqlen, gen):
    """Sorted sequence ids per row with a padded (-1) tail and sometimes a padded head."""
    cuts = torch.randint(0, 3, (batch, seqlen), generator=gen).cumsum(1) // max(seqlen // 3, 1)
    seq = cuts.to(torch.int32)
    pad_tail = torch.randint(0, max(seqlen // 4, 1) + 1, (batch,), generator=gen)
    for b in range(batch):
        if pad_tail[b] > 0:
            seq[b, seqlen - int(pad_tail[b]) :] = -1
    if batch > 1 and seqlen > 2:
        seq[1, :2] = -1
    return seq.to(DEVICE)


@st.composite
def fn_cases(draw):
    return {
        "batch": draw(st.integers(1, MAX_B)),
        "dim": draw(st.integers(1, MAX_D)),
        "seqlen": draw(st.integers(1, MAX_L)),
        "width": draw(st.integers(2, 4)),
        "x_dtype": draw(st.sampled_from(DTYPES)),
        "w_dtype": draw(st.sampled_from(DTYPES)),
        "bias": draw(st.sampled_from(["none", "same", "fp32"])),
        "channel_last": draw(st.booleans()),
        "activation": draw(st.sampled_from([None, "silu", "swish"])),
        "seq_idx": draw(st.booleans()),
        "init": draw(st.booleans()),
        "final": draw(st.booleans()),
        "seed": draw(st.integers(0, 2**31 - 1)),
    }


@SETTINGS
@given(case=fn_cases())
def test_fn_forward_backward_matches_float64_reference(case):
    gen = torch.Generator().manual_seed(case["seed"])
    b, d, seqlen, w_ = case["batch"], case["dim"], case["seqlen"], case["width"]
    xdt, wdt = case["x_dtype"], case["w_dtype"]
    x = _make_x(b, d, seqlen, xdt, case["channel_last"], gen).requires_grad_()
    weight = torch.randn(d, w_, generator=gen).to(DEVICE, wdt).requires_grad_()
    bias = None
    if case["bias"] != "none":
        bdt = wdt if case["bias"] == "same" else torch.float32
        bias = torch.randn(d, generator=gen).to(DEVICE, bdt).requires_grad_()
    seq_idx = _make_seq_idx(b, seqlen, gen) if case["seq_idx"] else None
    init = None
    if case["init"]:
        init = torch.randn(b, w_ - 1, d, generator=gen).transpose(1, 2).to(DEVICE, xdt)
        init.requires_grad_()
    want_final = case["final"] and seq_idx is None
    final_out = None
    if want_final:
        final_out = torch.full((b, d, w_ - 1), float("nan"), device=DEVICE, dtype=xdt)

    CALLS.clear()
    res = causal_conv1d_fn(x, weight, bias, seq_idx, init, want_final, final_out,
                           case["activation"])
    out, final = res if want_final else (res, None)
    assert CALLS[f"fwd:{EXPECTED_IMPL}"] == 1
    assert out.stride() == x.stride() and out.dtype == xdt

    leaves = [x, weight] + [t for t in (bias, init) if t is not None]
    ref_leaves = [t.detach().double().requires_grad_() for t in leaves]
    rx, rw = ref_leaves[0], ref_leaves[1]
    rest = ref_leaves[2:]
    rb = rest.pop(0) if bias is not None else None
    rinit = rest.pop(0) if init is not None else None
    ref = causal_conv1d_ref(rx, rw, rb, rinit, want_final, None, case["activation"], seq_idx)
    ref_out, ref_final = ref if want_final else (ref, None)

    tol = _tol(xdt, wdt)
    assert _rel_err(out, ref_out) < tol
    if seq_idx is not None:
        assert (out.masked_select((seq_idx < 0).unsqueeze(1)) == 0).all()
    if want_final:
        assert _rel_err(final_out, ref_final) < tol
        assert _rel_err(final, ref_final) < tol

    dout = torch.randn(out.shape, generator=gen).to(DEVICE, xdt)
    grads_in = [dout]
    outs, ref_outs = [out], [ref_out]
    if want_final:
        dfinal = torch.randn(final.shape, generator=gen).to(DEVICE, xdt)
        grads_in.append(dfinal)
        outs.append(final)
        ref_outs.append(ref_final)
    CALLS.clear()
    got = torch.autograd.grad(outs, leaves, grads_in)
    assert CALLS[f"bwd:{EXPECTED_IMPL}"] == 1
    want = torch.autograd.grad(ref_outs, ref_leaves, [g.double() for g in grads_in])
    names = ["dx", "dweight", "dbias", "dinit"]
    names = names[:2] + [n for n, t in zip(names[2:], (bias, init), strict=True) if t is not None]
    for name, g, r, leaf in zip(names, got, want, leaves, strict=True):
        assert g.dtype == leaf.dtype, name
        # dweight/dbias sum over B*L terms: allow a little more for low precision
        err = _rel_err(g, r)
        assert err < tol * (2 if name in ("dweight", "dbias") else 1), (name, err)


@st.composite
def update_cases(draw):
    width = draw(st.integers(2, 4))
    return {
        "batch": draw(st.integers(1, 3)),
        "dim": draw(st.integers(1, MAX_D)),
        "width": width,
        "state_extra": draw(st.integers(0, 4)),  # state_len = W-1 + extra (transformers: W)
        "seqlen": draw(st.sampled_from([0, 1, 2, 3, 5])),  # 0: x is (B, D)
        "x_dtype": draw(st.sampled_from(DTYPES)),
        "w_dtype": draw(st.sampled_from(DTYPES)),
        "bias": draw(st.booleans()),
        "activation": draw(st.sampled_from([None, "silu"])),
        "circular": draw(st.booleans()),
        "indices": draw(st.booleans()),
        "seed": draw(st.integers(0, 2**31 - 1)),
    }


@SETTINGS
@given(case=update_cases())
def test_update_matches_float64_reference(case):
    gen = torch.Generator().manual_seed(case["seed"])
    b, d, w_ = case["batch"], case["dim"], case["width"]
    state_len = w_ - 1 + case["state_extra"]
    xdt = case["x_dtype"]
    shape = (b, d) if case["seqlen"] == 0 else (b, d, case["seqlen"])
    x = torch.randn(shape, generator=gen).to(DEVICE, xdt)
    weight = torch.randn(d, w_, generator=gen).to(DEVICE, case["w_dtype"])
    bias = torch.randn(d, generator=gen).to(DEVICE, case["w_dtype"]) if case["bias"] else None
    pool = b + 2 if case["indices"] else b
    state = torch.randn(pool, d, state_len, generator=gen).to(DEVICE, xdt)
    indices = None
    if case["indices"]:
        indices = torch.randperm(pool, generator=gen)[:b].to(torch.int32)
        if b > 1:
            indices[0] = -1  # a padding row
        indices = indices.to(DEVICE)
    cache_seqlens = None
    if case["circular"]:
        cache_seqlens = torch.randint(0, 3 * state_len + 2, (b,), generator=gen)
        cache_seqlens = cache_seqlens.to(DEVICE, torch.int32)
    ref_state = state.double().clone()
    before = state.clone()
    CALLS.clear()
    out = causal_conv1d_update(x, state, weight, bias, case["activation"], cache_seqlens, indices)
    assert CALLS[f"update:{EXPECTED_IMPL}"] == 1
    ref = causal_conv1d_update_ref(
        x.double(), ref_state, weight.double(), None if bias is None else bias.double(),
        case["activation"], cache_seqlens, indices,
    )
    tol = _tol(xdt, case["w_dtype"])
    assert out.shape == x.shape and out.dtype == xdt
    assert _rel_err(out, ref) < tol
    # the state is copied, not computed: it must match exactly (up to the dtype round trip)
    assert torch.equal(state.double(), ref_state.to(xdt).double())
    if indices is not None and b > 1:
        assert (out[0] == 0).all()
        untouched = [i for i in range(pool) if i not in set(indices.tolist())]
        assert torch.equal(state[untouched], before[untouched])


def test_update_transformers_decode_shape_updates_state_in_place():
    """x (B, D, 1) with a state of length W, as transformers passes it."""
    gen = torch.Generator().manual_seed(0)
    b, d, w_ = 3, 16, 4
    x = torch.randn(b, d, 1, generator=gen).to(DEVICE, torch.bfloat16)
    state = torch.randn(b, d, w_, generator=gen).to(DEVICE, torch.bfloat16)
    weight = torch.randn(d, w_, generator=gen).to(DEVICE, torch.bfloat16)
    expect_state = torch.cat([state[..., 1:], x], dim=-1)
    ref = causal_conv1d_update_ref(x.double(), state.double().clone(), weight.double(), None, "silu")
    ptr = state.data_ptr()
    out = causal_conv1d_update(x, state, weight, None, "silu")
    assert state.data_ptr() == ptr
    assert torch.equal(state, expect_state)
    assert _rel_err(out, ref) < TOL[torch.bfloat16]


def test_update_step_repeated_calls_across_alignments_and_strides():
    """The decode step relaunches a cached compiled kernel on a GPU (ops.launch): a kernel
    compiled for 16-byte-aligned pointers or stride % 16 == 0 must never be reused for inputs
    without that property. Alternate such inputs, each twice, against the float64 reference."""
    gen = torch.Generator().manual_seed(5)
    w_ = 4
    variants = []
    for d, offset, padded_row in [(32, 0, 0), (32, 1, 0), (30, 0, 0), (32, 0, 3), (32, 3, 5)]:
        # x rows of length d + padded_row, starting `offset` elements into the buffer
        buf = torch.randn(2 * (d + padded_row) + offset, generator=gen).to(DEVICE, torch.bfloat16)
        x = buf[offset:].as_strided((2, d, 1), (d + padded_row, 1, 1))
        sbuf = torch.randn(2 * d * w_ + offset, generator=gen).to(DEVICE, torch.bfloat16)
        state = sbuf[offset:].view(2, d, w_)
        weight = torch.randn(d, w_, generator=gen).to(DEVICE, torch.bfloat16)
        variants.append((x, state, weight))
    for _ in range(2):
        for x, state, weight in variants:
            ref_state = state.double().clone()
            ref = causal_conv1d_update_ref(x.double(), ref_state, weight.double(), None, "silu")
            out = causal_conv1d_update(x, state, weight, None, "silu")
            assert _rel_err(out, ref) < TOL[torch.bfloat16]
            assert torch.equal(state.double(), ref_state.to(torch.bfloat16).double())


def test_bwd_function_writes_preallocated_dx_like_mamba_ssm():
    gen = torch.Generator().manual_seed(1)
    b, d, seqlen, w_ = 2, 24, 33, 4
    x = _make_x(b, d, seqlen, torch.float32, True, gen)
    weight = torch.randn(d, w_, generator=gen, device="cpu").to(DEVICE)
    bias = torch.randn(d, generator=gen).to(DEVICE)
    dout = torch.randn(b, d, seqlen, generator=gen).to(DEVICE)
    seq_idx = _make_seq_idx(b, seqlen, gen)
    dx = torch.full_like(x, float("nan"))
    # the exact call form of mamba_ssm: (x, w, b, dout, seq_idx, None, None, dx, False, True)
    got_dx, dweight, dbias, dinit = cpp_functions.causal_conv1d_bwd_function(
        x, weight, bias, dout, seq_idx, None, None, dx, False, True
    )
    assert got_dx is dx and dinit is None
    leaves = [t.double().requires_grad_() for t in (x, weight, bias)]
    ref = causal_conv1d_ref(*leaves, activation="silu", seq_idx=seq_idx)
    want = torch.autograd.grad(ref, leaves, dout.double())
    for g, r in zip((dx, dweight, dbias), want, strict=True):
        assert _rel_err(g, r) < TOL[torch.float32]


def test_fwd_function_writes_final_states_out():
    gen = torch.Generator().manual_seed(2)
    x = _make_x(2, 16, 2, torch.float32, True, gen)  # L < W-1: final state reaches the init
    weight = torch.randn(16, 4, generator=gen).to(DEVICE)
    init = torch.randn(2, 16, 3, generator=gen).to(DEVICE)
    final = torch.full((2, 16, 3), float("nan"), device=DEVICE)
    out = cpp_functions.causal_conv1d_fwd_function(x, weight, None, None, init, final, False)
    ref, ref_final = causal_conv1d_ref(x.double(), weight.double(), None, init.double(), True)
    assert _rel_err(out, ref) < TOL[torch.float32]
    assert torch.equal(final.double(), ref_final)
    upd = cpp_functions.causal_conv1d_update_function(
        x[..., :1].contiguous(), final.clone(), weight, None, True, None, None
    )
    assert upd.shape == (2, 16, 1)


def test_weight_grads_are_deterministic():
    gen = torch.Generator().manual_seed(3)
    b, d, seqlen = 2, 32, min(MAX_L, 300)
    x = _make_x(b, d, seqlen, torch.bfloat16, True, gen).requires_grad_()
    weight = torch.randn(d, 4, generator=gen).to(DEVICE).requires_grad_()
    bias = torch.randn(d, generator=gen).to(DEVICE).requires_grad_()
    dout = torch.randn(b, d, seqlen, generator=gen).to(DEVICE, torch.bfloat16)
    prev = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        runs = []
        for _ in range(3):
            y = causal_conv1d_fn(x, weight, bias, activation="silu")
            runs.append(torch.autograd.grad(y, (x, weight, bias), dout))
    finally:
        torch.use_deterministic_algorithms(prev)
    for other in runs[1:]:
        for a, c in zip(runs[0], other, strict=True):
            assert torch.equal(a, c)


def test_varlen_states_matches_reference():
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(40, 24, generator=gen).to(DEVICE, torch.bfloat16)
    cu = torch.tensor([0, 3, 3, 20, 40], dtype=torch.int32, device=DEVICE)
    CALLS.clear()
    got = causal_conv1d_varlen_states(x, cu, 5)
    assert CALLS[f"varlen_states:{EXPECTED_IMPL}"] == 1
    want = causal_conv1d_varlen_states_ref(x, cu, 5)
    assert got.shape == (4, 24, 5) and got.stride(1) == 1
    assert torch.equal(got, want)
    assert (got[1] == 0).all()  # empty sequence
    assert (got[0, :, :2] == 0).all()  # 3 tokens in a 5-long state


def test_face_imports_as_causal_conv1d_module(monkeypatch):
    """transformers / mamba_ssm do `import causal_conv1d` and its submodules."""
    for name in list(sys.modules):
        if name == "causal_conv1d" or name.startswith("causal_conv1d."):
            monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "causal_conv1d", face)
    mod = importlib.import_module("causal_conv1d")
    assert mod.__version__ == "1.7.0" and mod.__fastpath__ is True
    cpp = importlib.import_module("causal_conv1d.cpp_functions")
    varlen = importlib.import_module("causal_conv1d.causal_conv1d_varlen")
    iface = importlib.import_module("causal_conv1d.causal_conv1d_interface")
    for fn in ("causal_conv1d_fwd_function", "causal_conv1d_bwd_function",
               "causal_conv1d_update_function"):
        assert callable(getattr(cpp, fn))
    assert callable(varlen.causal_conv1d_varlen_states)
    assert callable(iface.causal_conv1d_ref) and callable(iface.causal_conv1d_update_ref)


def test_bad_arguments_raise_clear_errors():
    x = torch.randn(1, 8, 5, device=DEVICE)
    w = torch.randn(8, 4, device=DEVICE)
    with pytest.raises(NotImplementedError, match="activation"):
        causal_conv1d_fn(x, w, activation="gelu")
    with pytest.raises(ValueError, match="weight must be"):
        causal_conv1d_fn(x, torch.randn(7, 4, device=DEVICE))
    with pytest.raises(ValueError, match="seq_idx must be"):
        causal_conv1d_fn(x, w, seq_idx=torch.zeros(1, 4, dtype=torch.int32, device=DEVICE))
    with pytest.raises(NotImplementedError, match="return_final_states"):
        causal_conv1d_fn(x, w, seq_idx=torch.zeros(1, 5, dtype=torch.int32, device=DEVICE),
                         return_final_states=True)
    with pytest.raises(ValueError, match="conv_state must be"):
        causal_conv1d_update(torch.randn(1, 8, device=DEVICE), torch.randn(1, 8, 2, device=DEVICE), w)
    with pytest.raises(ValueError, match="initial_states must be"):
        causal_conv1d_fn(x, w, initial_states=torch.randn(1, 8, 4, device=DEVICE))


def test_width_beyond_kernel_falls_back_to_reference_with_warning():
    gen = torch.Generator().manual_seed(5)
    x = _make_x(1, 8, 12, torch.float32, True, gen)
    w = torch.randn(8, 6, generator=gen).to(DEVICE)
    CALLS.clear()
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        out = causal_conv1d_fn(x, w, activation="silu")
    assert CALLS["fwd:reference"] == 1
    ref = causal_conv1d_ref(x.double(), w.double(), activation="silu")
    assert _rel_err(out, ref) < TOL[torch.float32]


def test_cpu_without_interpreter_uses_reference(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    x = torch.randn(1, 8, 6)
    w = torch.randn(8, 3)
    CALLS.clear()
    out = causal_conv1d_fn(x, w)
    assert CALLS["fwd:reference"] == 1
    assert _rel_err(out, causal_conv1d_ref(x.double(), w.double())) < TOL[torch.float32]


@pytest.mark.skipif(
    not ON_GPU and os.environ.get("TRITON_INTERPRET") != "1",
    reason="exercises the Triton path: needs CUDA or TRITON_INTERPRET=1",
)
def test_torch_compile_fullgraph_does_not_break():
    """The custom ops (with fake impls and autograd) trace into one graph."""
    gen = torch.Generator().manual_seed(6)
    x = _make_x(2, 16, 10, torch.float32, True, gen).requires_grad_()
    w = torch.randn(16, 4, generator=gen).to(DEVICE).requires_grad_()
    state = torch.randn(2, 16, 4, generator=gen).to(DEVICE)
    step = torch.randn(2, 16, generator=gen).to(DEVICE)

    def model(x, w, state, step):
        y = causal_conv1d_fn(x, w, None, activation="silu") * 2.0
        z = causal_conv1d_update(step, state, w.detach(), None, "silu")
        return y, z

    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    ref_state = state.double()
    y, z = compiled(x, w, state, step)
    y.sum().backward()
    y_ref = causal_conv1d_ref(x.detach().double(), w.detach().double(), activation="silu") * 2
    z_ref = causal_conv1d_update_ref(step.double(), ref_state, w.detach().double(), None, "silu")
    assert _rel_err(y, y_ref) < TOL[torch.float32]
    assert _rel_err(z, z_ref) < TOL[torch.float32]
    assert torch.equal(state.double(), ref_state)  # the compiled graph updated it in place
    assert x.grad is not None and w.grad is not None


@pytest.mark.parametrize("with_seq", [False, True])
def test_channel_last_chunk_boundaries(with_seq):
    """Channel-last rows kernels split L into chunks (>= 16 rows): halos, seq_idx masks, the
    initial/final state and dW partials must be right across every boundary."""
    gen = torch.Generator().manual_seed(7)
    b, d, seqlen, w_ = 2, 12, 3 * 16 + 5 if not ON_GPU else 3000, 4
    x = _make_x(b, d, seqlen, torch.float32, True, gen).requires_grad_()
    weight = torch.randn(d, w_, generator=gen).to(DEVICE).requires_grad_()
    bias = torch.randn(d, generator=gen).to(DEVICE).requires_grad_()
    init = torch.randn(b, d, w_ - 1, generator=gen).to(DEVICE).requires_grad_()
    seq_idx = None
    if with_seq:  # boundaries exactly on and next to chunk edges
        seq = torch.zeros(b, seqlen, dtype=torch.int32)
        seq[:, 16:] = 1
        seq[:, 31:] = 2
        seq[0, 33:35] = -1
        seq_idx = seq.to(DEVICE)
    res = causal_conv1d_fn(x, weight, bias, seq_idx, init, not with_seq, None, "silu")
    outs = [res] if with_seq else list(res)
    leaves = [x, weight, bias, init]
    ref_leaves = [t.detach().double().requires_grad_() for t in leaves]
    ref = causal_conv1d_ref(*ref_leaves, not with_seq, None, "silu", seq_idx)
    ref_outs = [ref] if with_seq else list(ref)
    for o, r in zip(outs, ref_outs, strict=True):
        assert _rel_err(o, r) < TOL[torch.float32]
    grads_in = [torch.randn(o.shape, generator=gen).to(DEVICE) for o in outs]
    got = torch.autograd.grad(outs, leaves, grads_in)
    want = torch.autograd.grad(ref_outs, ref_leaves, [g.double() for g in grads_in])
    for g, r in zip(got, want, strict=True):
        assert _rel_err(g, r) < TOL[torch.float32]


def test_inference_calls_skip_autograd_and_training_calls_record_it():
    """No input needs a gradient (or grad mode is off): the forward runs without any autograd
    node; otherwise one node whose backward is the same kernel path."""
    gen = torch.Generator().manual_seed(8)
    x = _make_x(1, 8, 12, torch.float32, True, gen)
    w = torch.randn(8, 4, generator=gen).to(DEVICE)
    assert causal_conv1d_fn(x, w, activation="silu").grad_fn is None
    w.requires_grad_()
    with torch.no_grad():
        assert causal_conv1d_fn(x, w, activation="silu").grad_fn is None
    y = causal_conv1d_fn(x, w, activation="silu")
    assert "ConvFunction" in type(y.grad_fn).__name__
    (gw,) = torch.autograd.grad(y.sum(), [w])
    w_ref = w.detach().double().requires_grad_()
    (gw_ref,) = torch.autograd.grad(causal_conv1d_ref(x.double(), w_ref, activation="silu").sum(),
                                    [w_ref])
    assert _rel_err(gw, gw_ref) < TOL[torch.float32]


def test_kernel_limit_is_the_dispatch_rule():
    from fastpath.kernels.causal_conv1d.interface import kernel_limit

    assert kernel_limit(4, torch.bfloat16) is None
    assert kernel_limit(2, torch.float32) is None
    assert "width 5" in kernel_limit(5, torch.float16)
    assert "float64" in kernel_limit(4, torch.float64)
