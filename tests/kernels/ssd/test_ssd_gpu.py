"""The chunked scan's compiled Triton kernels at real shapes on a CUDA device, against float64.

Nemotron-H-like heads (P=64, N=128, chunk 128, 8 groups; fewer heads to stay quick), bf16 and
fp32, every option, packed sequences. With MAMBA_SRC pointing at a mamba_ssm source tree (the
folder holding mamba_ssm/, einops importable), also compares against mamba_ssm's own Triton op
option by option (loaded without running its package root; see benchmarks/ssd.py).
"""

from __future__ import annotations

import os

import pytest
import torch
from repo_paths import import_benchmark

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

H, P, G, N, CHUNK = 32, 64, 8, 128, 128
NAMES = ("x", "dt", "A", "B", "C", "D", "z", "dt_bias", "initial_states")
TOL = {torch.float32: 2e-4, torch.bfloat16: 2e-2}


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    assert torch.isfinite(a).all()
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def inputs(batch: int, seqlen: int, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator(device="cuda").manual_seed(seed)

    def rnd(*shape, scale=1.0):
        return torch.randn(*shape, generator=g, device="cuda", dtype=torch.float64) * scale

    return {
        "x": rnd(batch, seqlen, H, P), "dt": rnd(batch, seqlen, H, scale=0.5),
        "A": -(torch.rand(H, generator=g, device="cuda", dtype=torch.float64) * 4 + 0.5),
        "B": rnd(batch, seqlen, G, N, scale=0.3), "C": rnd(batch, seqlen, G, N, scale=0.3),
        "D": rnd(H, P), "z": rnd(batch, seqlen, H, P), "dt_bias": rnd(H, scale=0.5) - 2,
        "initial_states": rnd(batch, H, P, N, scale=0.3),
    }


def packed_seq_idx(batch: int, seqlen: int) -> torch.Tensor:
    seq = torch.zeros(batch, seqlen, dtype=torch.int32, device="cuda")
    for cut in (seqlen // 3, seqlen // 3 + 200, seqlen - 77):
        seq[:, cut:] += 1
    return seq


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("packed", [False, True])
def test_scan_matches_float64_at_real_shapes(dtype, packed):
    from fastpath.kernels.counters import CALLS
    from fastpath.kernels.ssd import mamba_chunk_scan_combined, ssd_chunked_ref

    batch, seqlen = 2, 1000  # ragged last chunk on purpose
    t = inputs(batch, seqlen)
    seq = packed_seq_idx(batch, seqlen) if packed else None
    kw = {"seq_idx": seq, "dt_softplus": True, "dt_limit": (0.001, 0.5)}
    low = {k: v.to(dtype).requires_grad_() for k, v in t.items()}
    low["A"] = t["A"].float().requires_grad_()
    low["dt_bias"] = t["dt_bias"].float().requires_grad_()
    low["D"] = t["D"].float().requires_grad_()
    # the float64 reference at the very inputs the kernel sees (rounded to `dtype`): the judge of
    # the kernel's arithmetic, not of the inputs' rounding
    ref = {k: low[k].detach().double().requires_grad_() for k in t}
    CALLS.clear()
    out, final = mamba_chunk_scan_combined(
        *(low[k] for k in NAMES[:5]), CHUNK, **{k: low[k] for k in NAMES[5:]},
        return_final_states=True, **kw,
    )
    rout, rfinal = ssd_chunked_ref(*(ref[k] for k in NAMES[:5]), CHUNK,
                                   **{k: ref[k] for k in NAMES[5:]}, **kw)
    assert CALLS["ssd_fwd:triton"] == 1
    assert rel(out, rout) < TOL[dtype] and rel(final, rfinal) < TOL[dtype]
    g = torch.Generator(device="cuda").manual_seed(1)
    gout = torch.randn(rout.shape, generator=g, device="cuda", dtype=rout.dtype)
    gfinal = torch.randn(rfinal.shape, generator=g, device="cuda", dtype=rfinal.dtype)
    got = torch.autograd.grad([out, final], [low[k] for k in NAMES],
                              [gout.to(dtype), gfinal.float()])
    want = torch.autograd.grad([rout, rfinal], [ref[k] for k in NAMES], [gout.to(dtype).double(), gfinal])
    assert CALLS["ssd_bwd:triton"] == 1
    for name, a, b in zip(NAMES, got, want, strict=True):
        # per-head parameters sum over every token of every sequence: more rounding to absorb
        bound = TOL[dtype] * (5 if name in ("A", "D", "dt_bias") else 2)
        assert rel(a, b) < bound, (name, rel(a, b))


def _mamba():
    src = os.environ.get("MAMBA_SRC")
    if not src:
        pytest.skip("set MAMBA_SRC to a mamba_ssm source tree to compare against it")
    fn, why = import_benchmark("ssd").load_mamba(src)
    if fn is None:
        pytest.skip(f"mamba_ssm not loadable: {why}")
    return fn


@pytest.mark.parametrize(
    "opts",
    [{}, {"z": True}, {"initial_states": True, "seq_idx": True},
     {"dt_limit": (0.01, 0.3), "D": True, "dt_bias": True}],
    ids=["plain", "z", "init-seq", "limit-D-bias"],
)
def test_scan_agrees_with_mamba_ssm(opts):
    from fastpath.kernels.ssd import mamba_chunk_scan_combined

    mamba = _mamba()
    t = {k: v.to(torch.bfloat16) for k, v in inputs(1, 1500, seed=4).items()}
    kw = {k: t[k] for k in ("z", "initial_states", "D", "dt_bias") if opts.get(k)}
    if opts.get("seq_idx"):
        kw["seq_idx"] = packed_seq_idx(1, 1500)
    if "dt_limit" in opts:
        kw["dt_limit"] = opts["dt_limit"]
    args = [t[k] for k in NAMES[:5]]
    ours = mamba_chunk_scan_combined(*args, CHUNK, dt_softplus=True, return_final_states=True,
                                     **kw)
    theirs = mamba(*args, CHUNK, dt_softplus=True, return_final_states=True, **kw)
    assert rel(ours[0], theirs[0]) < 2e-2
    assert rel(ours[1], theirs[1]) < 2e-2
