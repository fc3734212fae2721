"""Every selective-scan forward FASTPATH_SSCAN_FWD names (tile, the default; chunked, seq,
tile-poly) against the float64 step loop of naive.py, and the others against the chunked kernel.

On CPU the kernels run under TRITON_INTERPRET=1 at tiny shapes (the tile kernel's SFU logarithm
is PTX, so there it takes Triton's log2; the GPU group at the end checks the PTX path at
Falcon-Mamba-7B's width). Inputs are random, never zeros; call counters prove which kernel ran.
Cases: float32/bfloat16/float16; shared, grouped and time-invariant B/C; every option; odd L
(a partial last chunk); channel counts that leave a partial channel block; N not a power of
two; transformers' channel-last views, strided slices and stride-0 broadcasts; every config
the benchmark sweeps; training through each forward plus the usual backward.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import triton
import triton.language as tl
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kernel_checks import rel_err
from kernel_checks import selective_scan_inputs as make_inputs

from fastpath.kernels.counters import CALLS
from fastpath.kernels.dispatch import use_triton
from fastpath.kernels.selective_scan.fwd_chunked import selective_scan_fwd_triton
from fastpath.kernels.selective_scan.fwd_tile import (
    TILE_CONFIG,
    TILE_POLY_SWEEP,
    TILE_SWEEP,
    exp2_poly,
    exp_split,
    full_config,
    selective_scan_fwd_tile_triton,
    tile_along_time,
    time_segments,
)
from fastpath.kernels.selective_scan.interface import (
    FWD_COUNTERS,
    FWD_ENV,
    fwd_kernel,
    selective_scan_fn,
)
from fastpath.kernels.selective_scan.naive import selective_scan_ref
from fastpath.shared.errors import UsageError

ON_CPU_TRITON = use_triton(torch.empty(0))  # TRITON_INTERPRET=1


@pytest.fixture(autouse=True)
def _cpu_cases_need_the_interpreter(request):
    """The cases on CPU tensors need the interpreter; the `gpu` group needs only CUDA (so
    `pytest -m gpu` runs it on a GPU host without TRITON_INTERPRET)."""
    if request.node.get_closest_marker("gpu") is None and not ON_CPU_TRITON:
        pytest.skip("runs the kernels on CPU tensors: needs TRITON_INTERPRET=1")


VARIANTS = ("tile", "chunked", "seq", "tile-poly")
TOL = {torch.float32: 1e-4, torch.float16: 6e-3, torch.bfloat16: 3e-2}
ALL_TILE_CONFIGS = tuple(dict.fromkeys(TILE_SWEEP + TILE_POLY_SWEEP))


def _interpreted_alike(cfg: tuple) -> tuple:
    """What of a config the interpreter sees: STAGES only shapes the GPU's code (a pipelined
    loop runs the same steps), so configs that differ only there are one case on CPU."""
    cfg = full_config(cfg)
    return cfg[:5] + cfg[6:]


# the CPU sweep: one config per interpreter-distinct kind (the GPU test compiles every one)
CPU_TILE_CONFIGS = tuple({_interpreted_alike(c): c for c in reversed(ALL_TILE_CONFIGS)}.values())


def channel_last(t: torch.Tensor) -> torch.Tensor:
    """The same values as transformers' (B, L, D).transpose(1, 2) view."""
    return t.transpose(-1, -2).contiguous().transpose(-1, -2)


def check(monkeypatch, variant, t, dtype, *, softplus=True, last=True):
    """selective_scan_fn under FASTPATH_SSCAN_FWD=variant against the float64 reference."""
    monkeypatch.setenv(FWD_ENV, variant)
    CALLS.clear()
    got = selective_scan_fn(**t, delta_softplus=softplus, return_last_state=last)
    ran = {k: v for k, v in CALLS.items() if k.startswith("ss_fwd:")}
    assert ran == {FWD_COUNTERS[variant]: 1}, dict(CALLS)
    ref = selective_scan_ref(**{k: None if v is None else v.double() for k, v in t.items()},
                             delta_softplus=softplus, return_last_state=last)
    if last:
        (out, state), (rout, rstate) = got, ref
        assert state.dtype == torch.float32
        assert rel_err(state, rstate) < TOL[dtype]
    else:
        out, rout = got, ref
    assert out.dtype == dtype and out.is_contiguous()
    assert rel_err(out, rout) < TOL[dtype]


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("layout,groups", [("shared", 1), ("grouped", 2), ("invariant", 1)])
def test_matches_reference(monkeypatch, variant, dtype, layout, groups):
    # time-invariant B/C make one group per channel (one program each): keep that one short
    dim, length = (6, 13) if layout == "invariant" else (24, 37)
    t = make_inputs(2, dim, 8, length, layout, groups, seed=1, dtype=dtype)
    if layout == "shared":  # transformers: u and z channel-last views
        t["u"], t["z"] = channel_last(t["u"]), channel_last(t["z"])
    check(monkeypatch, variant, t, dtype)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("drop", ["D", "z", "delta_bias", "all", "none"])
@pytest.mark.parametrize("softplus", [True, False])
def test_options(monkeypatch, variant, drop, softplus):
    t = make_inputs(1, 8, 4, 23, "shared", 1, seed=2, dtype=torch.float32)
    for k in {"all": ("D", "z", "delta_bias"), "none": ()}.get(drop, (drop,)):
        t[k] = None
    check(monkeypatch, variant, t, torch.float32, softplus=softplus, last=drop != "z")


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("how", ["channel_last", "strided", "broadcast", "time_broadcast"])
def test_strides(monkeypatch, variant, how):
    """Non-contiguous and stride-0 inputs: each of u/delta/z is read through its own strides
    (tiles along L where L is its contiguous axis, rows of channels otherwise)."""
    t = make_inputs(2, 12, 5, 19, "shared", 1, seed=3, dtype=torch.bfloat16)
    if how == "channel_last":  # every (batch, dim, L) input and B/C channel/N-last
        t = {k: channel_last(v) if v is not None and v.dim() == 3 else v for k, v in t.items()}
    elif how == "strided":  # every other element along L, and along channels
        for k in ("u", "delta", "z"):
            wide = torch.repeat_interleave(torch.repeat_interleave(t[k], 2, dim=2), 2, dim=1)
            t[k] = wide[:, ::2, ::2]
            assert t[k].stride(2) == 2
        t["B"] = torch.repeat_interleave(t["B"], 3, dim=2)[..., ::3]
    elif how == "broadcast":  # one batch row shared through stride 0
        for k in ("u", "delta", "z", "B", "C"):
            t[k] = t[k][:1].expand(2, *t[k].shape[1:])
    else:  # one value of delta and of B per channel / state for every step
        t["delta"] = t["delta"][..., :1].expand(-1, -1, 19)
        t["C"] = t["C"][..., :1].expand(-1, -1, 19)
    check(monkeypatch, variant, t, torch.bfloat16)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("length", [1, 7, 8, 9, 16, 33])
def test_lengths(monkeypatch, variant, length):
    """L below, at and past one tile (8 bf16 steps): whole chunks, a partial one, or both."""
    t = make_inputs(1, 16, 3, length, "grouped", 2, seed=length, dtype=torch.bfloat16)
    check(monkeypatch, variant, t, torch.bfloat16)


@pytest.mark.parametrize("cfg", CPU_TILE_CONFIGS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_every_swept_tile_config(cfg, dtype):
    """Every config the benchmark sweeps equals the reference (a partial channel block: 20
    channels a group; N = 6 padded to 8; a partial last chunk)."""
    t = make_inputs(1, 40, 6, 21, "grouped", 2, seed=4, dtype=dtype)
    t["u"] = channel_last(t["u"])
    args = (t["u"], t["delta"], t["A"], t["B"], t["C"], t["D"], t["z"], t["delta_bias"], True)
    out, last = selective_scan_fwd_tile_triton(*args, config=cfg)
    ref_out, ref_last = selective_scan_ref(*(a.double() for a in args[:8]), delta_softplus=True,
                                           return_last_state=True)
    assert out.dtype == dtype
    assert rel_err(out, ref_out) < TOL[dtype] and rel_err(last, ref_last) < 1e-4


@pytest.mark.parametrize("variant", [v for v in VARIANTS if v != "chunked"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_equals_chunked_kernel(monkeypatch, variant, dtype):
    """Same contract as the chunked kernel: out and last_state agree to float32 rounding."""
    t = make_inputs(1, 32, 16, 24, "grouped", 2, seed=5, dtype=dtype)
    args = (t["u"], t["delta"], t["A"], t["B"], t["C"], t["D"], t["z"], t["delta_bias"], True,
            True)
    monkeypatch.setenv(FWD_ENV, variant)
    o1, s1 = selective_scan_fn(*args)
    o2, s2 = selective_scan_fwd_triton(*args[:9])
    assert o1.dtype == o2.dtype == dtype
    assert rel_err(s1, s2) < 1e-5
    assert rel_err(o1, o2) < (1e-5 if dtype == torch.float32 else 1e-2)


@pytest.mark.parametrize("variant", VARIANTS)
def test_training_gradients(monkeypatch, variant):
    """Each forward plus the usual backward (which recomputes its own chunk states) gives the
    reference's gradients, last_state's included."""
    monkeypatch.setenv(FWD_ENV, variant)
    t = make_inputs(1, 8, 4, 19, "shared", 1, seed=6, dtype=torch.float32)
    got_in = {k: v.clone().requires_grad_() for k, v in t.items()}
    ref_in = {k: v.double().requires_grad_() for k, v in t.items()}
    CALLS.clear()
    out, last = selective_scan_fn(**got_in, delta_softplus=True, return_last_state=True)
    assert CALLS[FWD_COUNTERS[variant]] == 1
    rout, rlast = selective_scan_ref(**ref_in, delta_softplus=True, return_last_state=True)
    g = torch.Generator().manual_seed(7)
    dout = torch.randn(out.shape, generator=g, dtype=torch.float64)
    dlast = torch.randn(last.shape, generator=g, dtype=torch.float64)
    got = torch.autograd.grad((out, last), list(got_in.values()), (dout.float(), dlast.float()))
    ref = torch.autograd.grad((rout, rlast), list(ref_in.values()), (dout, dlast))
    for name, a, b in zip(got_in, got, ref, strict=True):
        assert rel_err(a, b) < 1e-4, name


@settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck))
@given(variant=st.sampled_from(VARIANTS), batch=st.integers(1, 2),
       layout=st.sampled_from(["shared", "grouped", "invariant"]), groups=st.sampled_from([1, 2]),
       dpg=st.integers(1, 12), nstate=st.sampled_from([1, 3, 4, 16]),
       length=st.integers(1, 40), dtype=st.sampled_from([torch.float32, torch.bfloat16]),
       flags=st.integers(0, 31), seed=st.integers(0, 2**16))
def test_property_sweep(variant, batch, layout, groups, dpg, nstate, length, dtype, flags, seed):
    """Odd channel counts (masked lanes), N not a power of two, L from 1, every option."""
    groups = groups if layout == "grouped" else 1
    if layout == "invariant":
        dpg = min(dpg, 4)
    t = make_inputs(batch, groups * dpg, nstate, length, layout, groups, seed, dtype)
    bits = [bool(flags >> i & 1) for i in range(5)]
    for k, keep in zip(("D", "z", "delta_bias"), bits[:3], strict=True):
        if not keep:
            t[k] = None
    if seed % 2:
        t["u"] = channel_last(t["u"])
    with pytest.MonkeyPatch.context() as mp:
        check(mp, variant, t, dtype, softplus=bits[3], last=bits[4])


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("where", ["delta", "u", "B"])
def test_nan_propagates_like_the_reference(monkeypatch, variant, where):
    """A NaN input gives NaN exactly where the reference has them (never a silent number: the
    polynomial exp2 keeps NaN too, and fwd_chunked.softplus passes a NaN delta through where the
    GPU's min(NaN, 20) would have made it 20; the interpreter's numpy min propagates NaN, so the
    GPU run of this test is the one that checks that)."""
    t = make_inputs(1, 8, 4, 19, "shared", 1, seed=10, dtype=torch.float32)
    if where == "B":
        t["B"][0, 2, 11] = float("nan")
    else:
        t[where][0, 3, 11] = float("nan")
    monkeypatch.setenv(FWD_ENV, variant)
    out, last = selective_scan_fn(**t, delta_softplus=True, return_last_state=True)
    rout, rlast = selective_scan_ref(**{k: v.double() for k, v in t.items()},
                                     delta_softplus=True, return_last_state=True)
    assert rout.isnan().any()
    assert torch.equal(out.isnan(), rout.isnan()) and torch.equal(last.isnan(), rlast.isnan())


def test_env_dispatch(monkeypatch):
    monkeypatch.delenv(FWD_ENV, raising=False)
    assert fwd_kernel() == "tile"
    for name in FWD_COUNTERS:
        monkeypatch.setenv(FWD_ENV, f" {name.upper()} ")
        assert fwd_kernel() == name
    monkeypatch.setenv(FWD_ENV, "tiled")
    with pytest.raises(UsageError, match="FASTPATH_SSCAN_FWD='tiled': expected one of tile, chunked"):
        fwd_kernel()


def test_bad_config_is_one_line_error():
    t = make_inputs(1, 4, 2, 5, "shared", 1, seed=8, dtype=torch.float32)
    with pytest.raises(ValueError, match="tile forward config") as info:
        selective_scan_fwd_tile_triton(t["u"], t["delta"], t["A"], t["B"][:, None],
                                       t["C"][:, None], None, None, None, False,
                                       config=(32, 12, 1, 0, False))
    assert "\n" not in str(info.value)
    for cfg in ((32, 0, 1, 0, 0, -1), (32, 0, 1, 0, 0, 2, -1), (32, 0, 1, 0, 0, 2, 1, 4),
                (32, 0, 1, 0), (32, 0, 1, 0, 0, 2, 9, 1, 0)):  # STAGES, SEGMENTS, PRECISE, lengths
        with pytest.raises(ValueError, match="tile forward config") as info:
            selective_scan_fwd_tile_triton(t["u"], t["delta"], t["A"], t["B"][:, None],
                                           t["C"][:, None], None, None, None, False, config=cfg)
        assert "\n" not in str(info.value)


def test_tile_along_time_reads_the_contiguous_axis():
    x = torch.empty(2, 8, 16)
    assert tile_along_time(x) and not tile_along_time(channel_last(x))
    assert tile_along_time(x[:, :1]) and not tile_along_time(channel_last(x)[..., :1])


@triton.jit
def _exp_kernel(X, Y, n, BLOCK: tl.constexpr, SPLIT: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(X + offs, mask=mask, other=0.0)
    tl.store(Y + offs, exp_split(x) if SPLIT else exp2_poly(x), mask=mask)


def _exp(x: torch.Tensor, split: bool) -> torch.Tensor:
    """exp_split(x) (split) or exp2_poly(x), elementwise, one program."""
    y = torch.empty_like(x)
    _exp_kernel[(1,)](x, y, x.numel(), BLOCK=triton.next_power_of_2(x.numel()), SPLIT=split)
    return y


def test_exp2_poly_is_float32_accurate():
    """The FMA-pipe exp2: relative error within 3e-7 over the normal range (MUFU.EX2 is ~2 ulp),
    0 at and below 2^-127 (flush to zero), inf from 2^128, exact at integers."""
    x = torch.cat([torch.linspace(-126.0, 127.0, 2000), torch.tensor([-0.5, 0.5, 0.0, 3.0])])
    y = _exp(x, split=False)
    ref = torch.exp2(x.double())
    assert ((y.double() - ref).abs() / ref).max().item() < 3e-7
    assert y[-1].item() == 8.0 and y[-2].item() == 1.0
    edge = torch.tensor([-1000.0, -127.0, 128.0, 1000.0, float("-inf"), float("inf"),
                         float("nan"), -126.5])
    ye = _exp(edge, split=False)
    assert ye[:6].tolist() == [0.0, 0.0, float("inf"), float("inf"), 0.0, float("inf")]
    assert ye[6].isnan() and 0.0 <= ye[7].item() < 2.0**-126


def test_exp_split_is_float32_accurate():
    """exp_split against float64 e^x (the interpreter's exp2 is numpy's, ~1 ulp): within 2 ulp
    over the decays' range and unbiased (the mean signed error a small fraction of an ulp: the
    correction puts back x log2(e)'s rounding); the edges saturate like exp, NaN stays NaN."""
    g = torch.Generator().manual_seed(3)
    x = torch.cat([-torch.rand(4000, generator=g) * 80.0, torch.rand(96, generator=g) * 80.0])
    y = _exp(x, split=True)
    ref = torch.exp(x.double())
    ulp = torch.tensor(np.spacing(y.numpy()), dtype=torch.float64)
    err = (y.double() - ref) / ulp
    assert err.abs().max().item() <= 2.0 and abs(err.mean().item()) < 0.1
    edge = torch.tensor([-1000.0, 1000.0, float("-inf"), float("inf"), float("nan"), 0.0, -0.0])
    ye = _exp(edge, split=True)
    assert ye[:4].tolist() == [0.0, float("inf"), 0.0, float("inf")]
    assert ye[4].isnan() and ye[5].item() == 1.0 and ye[6].item() == 1.0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("cfg", (None, *ALL_TILE_CONFIGS))
def test_tile_gpu_falcon_shapes(cfg):
    """Compiled for the device at Falcon-Mamba-7B's width (D = 8192, N = 16), bf16, the layouts
    transformers passes (u, z channel-last views; B/C (B, N, L) views; delta contiguous) and all
    L-contiguous: every swept config equals the float64 reference and the chunked kernel,
    including the SFU logarithm the interpreter never runs."""
    g = torch.Generator(device="cuda").manual_seed(9)
    batch, dim, nstate, length = 2, 8192, 16, 517  # odd: a partial last chunk
    bf = torch.bfloat16

    def r(*s, scale=1.0, dtype=bf):
        return (torch.randn(*s, generator=g, device="cuda") * scale).to(dtype)

    for tf_layout in (True, False):
        u, z = r(batch, length, dim).transpose(1, 2), r(batch, length, dim).transpose(1, 2)
        if not tf_layout:
            u, z = u.contiguous(), z.contiguous()
        Bv, Cv = (r(batch, length, nstate).transpose(1, 2) for _ in "BC")
        t = {"u": u, "delta": r(batch, dim, length) - 1.0,
             "A": -torch.exp(r(dim, nstate, scale=0.5, dtype=torch.float32)),
             "B": Bv[:, None], "C": Cv[:, None], "D": r(dim, dtype=torch.float32), "z": z,
             "delta_bias": r(dim, scale=0.3, dtype=torch.float32)}
        args = (t["u"], t["delta"], t["A"], t["B"], t["C"], t["D"], t["z"], t["delta_bias"], True)
        out, last = selective_scan_fwd_tile_triton(*args, config=cfg)
        out2, last2 = selective_scan_fwd_triton(*args)
        ref_out, ref_last = selective_scan_ref(*(a.double() for a in args[:8]),
                                               delta_softplus=True, return_last_state=True)
        assert rel_err(out, ref_out) < 2e-2 and rel_err(last, ref_last) < 1e-4
        assert rel_err(out, out2) < 1e-2 and rel_err(last, last2) < 1e-5


# ---------------------------------------------------------------- the tile forward's time segments
def _tile_run(t, cfg, softplus=True):
    args = (t["u"], t["delta"], t["A"], t["B"], t["C"], t["D"], t["z"], t["delta_bias"], softplus)
    return args, selective_scan_fwd_tile_triton(*args, config=cfg)


@pytest.mark.parametrize("segments,length", [(2, 3), (5, 21), (3, 37)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("layout,groups", [("shared", 1), ("grouped", 2), ("invariant", 1)])
def test_time_segments_match_the_reference(segments, length, dtype, layout, groups):
    """Cut into segments (a states pass, the combine, an outputs pass from each entering state),
    the forward equals the float64 reference as the one-segment walk does, and stays within
    float32 rounding of it (a length below one chunk runs one segment; partial last chunks;
    20 channels a group leave a partial channel block)."""
    t = make_inputs(2, 20 * groups, 6, length, layout, groups, seed=length + segments, dtype=dtype)
    t["u"] = channel_last(t["u"])
    args, (out, last) = _tile_run(t, (16, 0, 1, 0, 0, 0, segments))
    _, (out1, last1) = _tile_run(t, (16, 0, 1, 0, 0, 0, 1))
    ref_out, ref_last = selective_scan_ref(*(a.double() for a in args[:8]), delta_softplus=True,
                                           return_last_state=True)
    assert out.dtype == dtype and out.is_contiguous() and last.dtype == torch.float32
    assert rel_err(out, ref_out) < TOL[dtype] and rel_err(last, ref_last) < 1e-5
    assert rel_err(last, last1) < 1e-6
    assert rel_err(out, out1) < (1e-6 if dtype == torch.float32 else TOL[dtype] / 4)


@pytest.mark.parametrize("drop", ["D", "z", "delta_bias", "softplus"])
def test_time_segments_every_option(drop):
    """Each option off in turn, three segments, stride-0 (broadcast) B over the batch."""
    t = make_inputs(2, 8, 4, 30, "shared", 1, seed=11, dtype=torch.float32)
    t["B"] = t["B"][:1].expand_as(t["B"])
    if drop != "softplus":
        t[drop] = None
    args, (out, last) = _tile_run(t, (8, 0, 1, 0, 0, 0, 3), softplus=drop != "softplus")
    ref_out, ref_last = selective_scan_ref(
        *(None if a is None else a.double() for a in args[:8]), delta_softplus=args[8],
        return_last_state=True)
    assert rel_err(out, ref_out) < 1e-5 and rel_err(last, ref_last) < 1e-5


@settings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck))
@given(segments=st.integers(0, 7), batch=st.integers(1, 2),
       layout=st.sampled_from(["shared", "grouped", "invariant"]), dpg=st.integers(1, 12),
       nstate=st.sampled_from([1, 3, 16]), length=st.integers(1, 70),
       dtype=st.sampled_from([torch.float32, torch.bfloat16]), stages=st.sampled_from([0, 2]),
       seed=st.integers(0, 2**16))
def test_time_segments_property_sweep(segments, batch, layout, dpg, nstate, length, dtype,
                                      stages, seed):
    """Any segment count (0: auto, which on CPU tensors cuts nothing this short), lengths from
    1, masked channels and states, staged loops: the reference's numbers."""
    groups = 2 if layout == "grouped" else 1
    t = make_inputs(batch, groups * dpg, nstate, length, layout, groups, seed, dtype)
    args, (out, last) = _tile_run(t, (0, 0, 1, 0, 0, stages, segments))
    ref_out, ref_last = selective_scan_ref(*(a.double() for a in args[:8]), delta_softplus=True,
                                           return_last_state=True)
    assert rel_err(out, ref_out) < TOL[dtype] and rel_err(last, ref_last) < 1e-5


@pytest.mark.parametrize("where", ["delta", "u", "B"])
def test_time_segments_nan_propagates_like_the_reference(where):
    """A NaN in the first segment reaches later segments through the combine (its end state and
    decay product) exactly where the reference's NaNs are."""
    t = make_inputs(1, 8, 4, 30, "shared", 1, seed=10, dtype=torch.float32)
    if where == "B":
        t["B"][0, 2, 5] = float("nan")
    else:
        t[where][0, 3, 5] = float("nan")
    _, (out, last) = _tile_run(t, (8, 0, 1, 0, 0, 0, 3))
    rout, rlast = selective_scan_ref(**{k: v.double() for k, v in t.items()},
                                     delta_softplus=True, return_last_state=True)
    assert rout.isnan().any() and rout[..., -1].isnan().any()
    assert torch.equal(out.isnan(), rout.isnan()) and torch.equal(last.isnan(), rlast.isnan())


def test_time_segments_auto():
    """Auto (SEGMENTS 0) keeps the grid within 4 warps per SM sub-partition, rounding down, in
    segments of >= 8 chunks: an H100's 132 SMs at (1, 4096), D = 8192, 32 channels a warp (256
    warps) get 8 segments, 16 a warp (512 warps) 4; batch 8 (2048 warps) none; a short sequence
    none. Given counts are kept up to the whole chunks."""
    cpu = torch.device("cpu")  # 132 SMs assumed off the GPU
    assert time_segments(0, 512, 256, cpu) == 8
    assert time_segments(0, 512, 512, cpu) == 4
    assert time_segments(0, 512, 2048, cpu) == 1
    assert time_segments(0, 15, 512, cpu) == 1
    assert time_segments(0, 512, 10**6, cpu) == 1
    assert time_segments(1, 512, 512, cpu) == 1
    assert time_segments(4, 3, 512, cpu) == 3
    assert time_segments(4, 0, 512, cpu) == 1


# ------------------------------------------------------------------- the tile forward's PRECISE
def _last_state_ratios(device: str, config: tuple, length: int, dim: int = 8,
                       seeds: int = 4) -> list[float]:
    """mamba_ssm's failing kind (time-invariant B and C, softplus, bias, z, 16-bit inputs,
    float32 weights): the tile forward's last state's distance from float64 over the float32
    reference's (mamba_ssm's judge asks <= 2), one per seed."""
    ratios = []
    for seed in range(seeds):
        g = torch.Generator().manual_seed(seed)
        nstate, it = 16, torch.bfloat16

        def r(*shape, scale=1.0, positive=False, g=g):
            x = torch.rand(*shape, generator=g) if positive else torch.randn(*shape, generator=g)
            return (x * scale).to(device)

        args = (r(1, dim, length).to(it), r(1, dim, length, scale=0.5, positive=True).to(it),
                -r(dim, nstate, scale=0.5, positive=True), r(dim, nstate), r(dim, nstate),
                r(dim), r(1, dim, length).to(it), r(dim, scale=0.5, positive=True))
        _, last = selective_scan_fwd_tile_triton(*args, True, config=config)
        want = selective_scan_ref(*(a.double() for a in args), delta_softplus=True,
                                  return_last_state=True)[1]
        ref32 = selective_scan_ref(*args, delta_softplus=True, return_last_state=True)[1]
        ratios.append(rel_err(last, want) / rel_err(ref32, want))
    return ratios


@pytest.mark.parametrize("precise", [1, 2, 3], ids=["exp_precise", "exp_split", "chunk_corrected"])
def test_precise_last_state_within_the_reference_bar(precise):
    """PRECISE 1 (the default: the chunked kernel's softplus and exp_precise decays), 2 (that
    softplus, exp_split decays) and 3 (2 with each chunk's carried state put back by one
    exp_precise) keep the last state within mamba_ssm's 2x bar. The interpreter's
    exp2 is numpy's (~1 ulp, unbiased), not the GPU's ex2.approx, so here this checks that the
    precise paths compute the right thing; the GPU test below is the one that can tell them
    from the SFU config."""
    assert TILE_CONFIG[7] == 1
    ratios = _last_state_ratios("cpu", (*TILE_CONFIG[:7], precise), 256, dim=32, seeds=2)
    assert max(ratios) <= 2.0, ratios


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("precise", [1, pytest.param(2, marks=pytest.mark.xfail(
    reason="exp_split's decays: 6.3x the reference's distance at one of 8 seeds on an H200, "
           "likely ex2.approx's own error compounding (BENCHMARKS.md)")), pytest.param(3, marks=pytest.mark.xfail(
    strict=False, reason="not yet run on a GPU: whether one exp_precise a chunk keeps ex2.approx's "
                         "error within the bar is what this measures (XPASS: it does)"))],
    ids=["exp_precise", "exp_split", "chunk_corrected"])
def test_precise_last_state_gpu(precise):
    """The same bar compiled for the GPU, where the SFU config's ex2.approx and lg2.approx
    failed it in mamba_ssm's own file (PRECISE 1 passed it there, on an H100 and an H200)."""
    ratios = _last_state_ratios("cuda", (*TILE_CONFIG[:7], precise), 1134, seeds=8)
    assert max(ratios) <= 2.0, ratios
