"""The time-sequential selective-scan backward (bwd_seq.py, the default backward) against
float64 autograd of naive.py's reference, side by side with the chunked backward (bwd.py).

Every gradient (du, ddelta, dA, dB, dC, dD, dz, ddelta_bias) of the new kernel is checked on
random inputs (never zeros) under two rules: an absolute bound (relative L2 distance to float64
below 2x the forward's tolerance for the dtype, as the other scan tests) and the comparison rule:
no further from float64 than twice the chunked backward's distance on the same inputs, or twice
that of naive.py's reference run in float32 on them (where a gradient is a sum that cancels,
e.g. dA over a few steps, float32 itself is that far: the summation order decides), distances
below FLOOR counting as equal. The inputs are the layouts tests' (B and C
each time-invariant, shared or grouped; fenced in NaN buffers, transposed views, stride-0
expands), at lengths that are not multiples of the chunk, shorter than it, 1, and many chunks;
channel counts that are not multiples of BLOCK_D; a persistent grid smaller than the work.
On CPU the kernels run under TRITON_INTERPRET=1 at tiny shapes; the `gpu` case compiles them.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from kernel_checks import sscan_fwd_counter
from test_selective_scan_layouts import (
    CASES,
    DEVICE,
    LAYOUTS,
    TOL,
    cotangents,
    fenced,
    lowered,
    make,
    rel_err,
    run,
)

from fastpath.kernels.counters import CALLS
from fastpath.kernels.dispatch import use_triton
from fastpath.kernels.selective_scan import bwd_seq
from fastpath.kernels.selective_scan.bwd import selective_scan_bwd_triton
from fastpath.kernels.selective_scan.bwd_seq import (
    BWD_SEQ_CONFIG,
    BWD_SEQ_SWEEP,
    scratch_bytes,
    selective_scan_bwd_seq_triton,
)
from fastpath.kernels.selective_scan.interface import (
    BWD_ENV,
    BWD_KERNELS,
    bwd_kernel,
    selective_scan_fn,
)
from fastpath.kernels.selective_scan.naive import selective_scan_ref
from fastpath.shared.errors import UsageError

pytestmark = pytest.mark.skipif(
    not use_triton(torch.empty(0, device=DEVICE)),
    reason="exercises the Triton kernels: needs CUDA or TRITON_INTERPRET=1",
)
NAMES = ("u", "delta", "A", "B", "C", "D", "z", "delta_bias")
# distances below this count as equal, as in the layouts tests' precision rule: float32 gradients
# sit at ~1e-7, and where one is a sum that nearly cancels (dA of a channel over a few steps) the
# summation order alone moves it by ~1e-6 (seen: 1.5e-6 from the seq kernel with either decay,
# 8e-8 from the chunked one on the same inputs, and the reverse at another length)
FLOOR = 1e-5
# (BLOCK_D, T, num_warps, per_sm, precise, vector): small chunks and blocks so that tiny shapes
# cross chunk and block boundaries; per_sm 2 is 2 persistent programs under the interpreter
SMALL = (4, 4, 1, 2, False, False)


def grads(fn, given: dict, dout, dlast, softplus: bool, **kw) -> dict:
    return dict(zip(NAMES, fn(dout, dlast, *(given[k] for k in NAMES), softplus, **kw),
                    strict=True))


def compare(low: dict, given: dict, dtype, *, softplus=True, last=True, config=SMALL,
            transpose_cotangents=False, reject_overflow=False) -> dict:
    """Both backwards on `given` (the kernels' inputs: `low`'s values in any layout) against
    float64 autograd of the reference on `low`; returns {name: (new, chunked, float32
    reference) distances}."""
    batch, dim, _ = low["u"].shape
    dout, dlast = cotangents(low["u"].shape, (batch, dim, low["A"].shape[1]), dtype)
    exact = {k: None if v is None else v.double() for k, v in low.items()}
    _, _, ref = run(selective_scan_ref, exact, softplus=softplus, last=last, dout=dout,
                    dlast=dlast if last else None)
    _, _, ref32 = run(selective_scan_ref, low, softplus=softplus, last=last, dout=dout,
                      dlast=dlast if last else None)
    if reject_overflow:  # float16 past half its range: infinity is a correct rounding there
        assume(all(ref[k].abs().max() < torch.finfo(dtype).max / 2 for k in ref
                   if given[k].dtype == dtype))
    kd, kl = dout.to(dtype), (dlast.float() if last else None)
    if transpose_cotangents:
        kd = fenced(kd, transpose=True)
        kl = None if kl is None else fenced(kl, transpose=True)
    new = grads(selective_scan_bwd_seq_triton, given, kd, kl, softplus, config=config)
    old = grads(selective_scan_bwd_triton, given, kd, kl, softplus)
    dist = {}
    for k in NAMES:
        if k not in ref:
            assert new[k] is None and old[k] is None, k
            continue
        assert new[k].shape == old[k].shape == given[k].shape, k
        assert new[k].dtype == old[k].dtype, k
        dist[k] = (rel_err(new[k], ref[k]), rel_err(old[k], ref[k]), rel_err(ref32[k], ref[k]))
    loose = {k: f"{a:.2e}" for k, (a, _, _) in dist.items() if a >= 2 * TOL[dtype]}
    worse = {k: f"{a:.2e} vs chunked {b:.2e}, float32 reference {c:.2e}"
             for k, (a, b, c) in dist.items() if a > max(2 * b, 2 * c, FLOOR)}
    assert not loose and not worse, (loose, worse)
    return dist


def prepared(case: dict, dtype, *, opts=(True, True, True), fence=True, transpose=False):
    """(low, given) of a `make` case: the rounded inputs and the kernels' views of them."""
    low = lowered(case, dtype)
    low.update({k: None for k, on in zip(("D", "z", "delta_bias"), opts, strict=True) if not on})
    given = {k: (None if v is None else fenced(v, transpose and v.dim() >= 3) if fence else v)
             for k, v in low.items()}
    return low, given


def check(case: dict, dtype, *, opts=(True, True, True), fence=True, transpose=False, **kw):
    low, given = prepared(case, dtype, opts=opts, fence=fence, transpose=transpose)
    return compare(low, given, dtype, **kw)


# ---------------------------------------------------------------- dtypes and layouts
@pytest.mark.parametrize("c_layout", LAYOUTS)
@pytest.mark.parametrize("b_layout", LAYOUTS)
def test_every_layout_pair_fp32(b_layout, c_layout):
    """B and C each time-invariant (dim, N), shared (batch, N, L) or grouped (batch, G, N, L);
    6 channels in blocks of 4 (a masked block), 11 steps in chunks of 4 (a partial chunk)."""
    check(make(2, 6, 4, 11, b_layout, c_layout, seed=3 * LAYOUTS.index(b_layout)
               + LAYOUTS.index(c_layout)), torch.float32)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(("b_layout", "c_layout"),
                         [("shared", "shared"), ("grouped", "grouped"),
                          ("invariant", "shared"), ("grouped", "invariant")])
def test_low_precision(dtype, b_layout, c_layout):
    check(make(2, 4, 8, 19, b_layout, c_layout, seed=5), dtype)


def test_different_group_counts_for_b_and_c():
    """B with 2 groups and C with 4: programs tile lcm = 4 channel groups."""
    check(make(1, 8, 4, 13, "grouped", "grouped", b_groups=2, c_groups=4, seed=9),
          torch.float32)


def test_softplus_far_below_its_knee():
    """delta + bias near -11 (trained dt biases): softplus' small values and its chain rule."""
    case = make(2, 4, 8, 21, "shared", "shared", seed=21, delta_shift=-11.0)
    case["A"] = case["A"] * 2000.0
    check(case, torch.bfloat16)


# ---------------------------------------------------------------- options
@pytest.mark.parametrize(("use_d", "use_z", "use_bias", "softplus", "last"), [
    (False, False, False, False, False),
    (True, False, True, False, True),
    (False, True, False, True, False),
    (True, True, False, True, True),
    (False, False, True, True, True),
])
def test_options(use_d, use_z, use_bias, softplus, last):
    """D, z, delta_bias, softplus and a gradient into last_state each on and off."""
    check(make(1, 6, 3, 13, "shared", "grouped", seed=4), torch.float32,
          opts=(use_d, use_z, use_bias), softplus=softplus, last=last)


# ---------------------------------------------------------------- lengths, blocks, grids
@pytest.mark.parametrize(("length", "config"), [
    (1, SMALL),                          # one step
    (3, (4, 8, 1, 2, False, False)),     # shorter than a chunk
    (16, SMALL),                         # a multiple of T: four full chunks
    (37, (8, 4, 1, 3, False, False)),    # ten chunks, the last partial; 3 programs
    (9, (2, 1, 1, 4, False, False)),     # T = 1: a chunk per step
])
def test_lengths_and_chunks(length, config):
    check(make(2, 5, 4, length, "shared", "invariant", seed=length), torch.float32,
          config=config)


@pytest.mark.parametrize("config", [
    (4, 4, 1, 1, False, False),      # one persistent program takes every item (slot reuse)
    (4, 4, 1, 1000, False, False),   # a program per item
    (8, 4, 1, 2, True, False),       # exp_precise decays
    (8, 4, 1, 2, 2, False),          # exp_split decays
    (4, 4, 1, 2, False, True),       # the vector compilation (the same maths)
    BWD_SEQ_CONFIG,                  # the GPU default (T 32: one partial chunk here)
])
def test_configs(config):
    check(make(2, 6, 5, 18, "grouped", "shared", seed=8), torch.float32, config=config)


@pytest.mark.parametrize("nstate", [1, 3, 16])
def test_state_sizes(nstate):
    """N = 1, an N that is not a power of two (masked state rows), and N = 16."""
    check(make(1, 4, nstate, 10, "shared", "shared", seed=nstate), torch.float32)


# ---------------------------------------------------------------- strides
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_transposed_views_and_strided_cotangents(dtype):
    """u, delta, z, B, C as transposed views in NaN-fenced buffers (transformers' layouts), and
    dout / dlast_state as transposed views too."""
    check(make(2, 4, 4, 12, "shared", "grouped", seed=6), dtype, transpose=True,
          transpose_cotangents=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_stride_zero_inputs(dtype):
    """Stride-0 expands: u and delta over batch, B over time and batch, C over batch, z over
    time, D and delta_bias from one value. The kernels' gradients are per element of the
    expanded shapes; the reference's are taken on contiguous copies of the same values."""
    batch, dim, nstate, length = 2, 5, 4, 10
    g = torch.Generator().manual_seed(12)
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)  # noqa: E731
    base = {"u": r(1, dim, length), "delta": r(1, dim, length) * 0.8, "B": r(1, nstate, 1),
            "C": r(1, nstate, length), "D": r(1), "z": r(batch, dim, 1), "delta_bias": r(1),
            "A": -(torch.rand(dim, nstate, generator=g, dtype=torch.float64) + 0.2)}
    shapes = {"u": (batch, dim, length), "delta": (batch, dim, length),
              "B": (batch, nstate, length), "C": (batch, nstate, length), "D": (dim,),
              "z": (batch, dim, length), "delta_bias": (dim,)}
    keep32 = ("A", "D", "delta_bias")
    low = {k: v.to(DEVICE).to(torch.float32 if k in keep32 else dtype) for k, v in base.items()}
    given = {k: low[k].expand(shapes[k]) if k in shapes else low[k] for k in low}
    assert given["B"].stride(-1) == 0 and given["u"].stride(0) == 0
    compare({k: v.contiguous() for k, v in given.items()}, given, dtype)


# ---------------------------------------------------------------- property sweep
@settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck))
@given(**CASES, config=st.sampled_from([SMALL, (2, 3, 1, 1, False, False), (8, 8, 1, 3, True, False),
                                        (1, 5, 1, 2, False, True)]))
def test_property_sweep(batch, per_group, nstate, length, b_layout, c_layout, b_groups,
                        c_groups, dtype, flags, config, seed):
    """Any pair of layouts (own group counts), odd N, L from 1, each option on or off,
    transposed views or not, chunk lengths that are not powers of two."""
    case = make(batch, 2 * per_group, nstate, length, b_layout, c_layout, b_groups=b_groups,
                c_groups=c_groups, seed=seed)
    bits = [bool(flags >> i & 1) for i in range(6)]
    check(case, dtype, opts=tuple(bits[:3]), softplus=bits[3], last=bits[4],
          transpose=bits[5], config=config, reject_overflow=True)


# ---------------------------------------------------------------- selection and memory
def test_env_selects_the_backward(monkeypatch):
    """FASTPATH_SSCAN_BWD: unset is the seq backward (bwd_seq.py: its counter bumps, gradients
    equal float64's through selective_scan_fn); "chunked" runs bwd.py; anything else is a
    UsageError naming the valid values."""
    low, given = prepared(make(1, 4, 4, 9, "shared", "shared", seed=2), torch.float32)
    dout, dlast = cotangents(low["u"].shape, (1, 4, 4), torch.float32)
    exact = {k: v.double() for k, v in low.items()}
    _, _, ref = run(selective_scan_ref, exact, softplus=True, last=True, dout=dout, dlast=dlast)
    monkeypatch.delenv(BWD_ENV, raising=False)
    assert bwd_kernel() == "seq" and BWD_KERNELS == ("chunked", "seq")
    for value, counter in (("", "ss_bwd:triton-seq"), (" Chunked ", "ss_bwd:triton"),
                           ("seq", "ss_bwd:triton-seq")):
        if value:
            monkeypatch.setenv(BWD_ENV, value)
        CALLS.clear()
        _, _, got = run(selective_scan_fn, given, softplus=True, last=True, dout=dout,
                        dlast=dlast)
        assert CALLS[sscan_fwd_counter()] == 1 and CALLS[counter] == 1, dict(CALLS)
        assert sum(v for k, v in CALLS.items() if k.startswith("ss_bwd:")) == 1, dict(CALLS)
        for k in ref:
            assert rel_err(got[k], ref[k]) < 2 * TOL[torch.float32], (value, k)
    monkeypatch.setenv(BWD_ENV, "parallel")
    with pytest.raises(UsageError, match="FASTPATH_SSCAN_BWD='parallel': expected one of "
                                         "chunked, seq"):
        run(selective_scan_fn, given, softplus=True, last=True, dout=dout, dlast=dlast)


def test_scratch_stays_tens_of_megabytes(monkeypatch):
    """The persistent grid bounds phase 3's scratch: at Falcon-Mamba-7B's width (D = 8192,
    N = 16), batch 8, L = 4096 on a 132-SM H100, the default needs under 40 MiB (meant for the
    50 MB L2) and every config of the sweep under 80 MiB (a grid of one program per work item
    would need batch x dim x L x N x 4 bytes: 16 GiB)."""
    monkeypatch.setattr(bwd_seq, "_sm_count", lambda device: 132)
    sizes = {}
    for cfg in BWD_SEQ_SWEEP:
        block_d, chunk = cfg[:2]
        items = 8 * (8192 // block_d) * (4096 // chunk)
        sizes[cfg] = scratch_bytes(cfg, 16, torch.device("cuda"), items)
        assert sizes[cfg] == cfg[3] * 132 * chunk * 16 * block_d * 4
        assert sizes[cfg] <= 80 * 2**20, (cfg, sizes[cfg])
    assert sizes[BWD_SEQ_CONFIG] <= 40 * 2**20


# ---------------------------------------------------------------- compiled, on the GPU
@pytest.mark.gpu
@pytest.mark.skipif(DEVICE != "cuda", reason="compiled kernels on a CUDA device")
@pytest.mark.parametrize("config", BWD_SEQ_SWEEP)
def test_gpu_every_sweep_config(config):
    """Each sweep config compiled, bf16 and float32, transformers' layouts, a length that
    crosses many chunks (partial last chunk): the same two rules against float64."""
    for dtype in (torch.bfloat16, torch.float32):
        check(make(2, 96, 16, 1134, "shared", "shared", seed=31), dtype, transpose=True,
              config=config)
        check(make(1, 64, 16, 300, "invariant", "grouped", seed=32), dtype, config=config)
