"""mamba_split_conv1d_scan_combined (the fused Mamba-2 training op) against the float64 spec
kernels/ssd/naive.mamba_split_conv1d_scan_ref: forward, final states and every gradient, over the
options mamba_ssm's signature has. On CPU the conv kernels run under TRITON_INTERPRET=1."""

from __future__ import annotations

import os

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fastpath.kernels.counters import CALLS, reset
from fastpath.kernels.ssd.naive import mamba_split_conv1d_scan_ref
from fastpath.kernels.ssd.split_conv_scan import mamba_split_conv1d_scan_combined

ON_GPU = torch.cuda.is_available()
DEVICE = "cuda" if ON_GPU else "cpu"
needs_triton = pytest.mark.skipif(
    not ON_GPU and os.environ.get("TRITON_INTERPRET") != "1",
    reason="exercises the Triton conv: needs CUDA or TRITON_INTERPRET=1",
)
GRAD_NAMES = ("zxbcdt", "conv1d_weight", "conv1d_bias", "dt_bias", "A", "D", "initial_states",
              "rmsnorm_weight", "outproj_weight", "outproj_bias")


def make_case(seed: int, batch: int, seqlen: int, nheads: int, headdim: int, ngroups: int, dstate: int,
              d_nonssm: int, width: int, d_per_channel: bool, rmsnorm: bool, outproj: bool,
              initial: bool, packed: bool) -> tuple[dict, dict]:
    g = torch.Generator().manual_seed(seed)
    dim = nheads * headdim
    conv_dim = dim + 2 * ngroups * dstate
    tensors = {
        "zxbcdt": torch.randn(batch, seqlen, 2 * d_nonssm + 2 * dim + 2 * ngroups * dstate + nheads, generator=g),
        "conv1d_weight": torch.randn(conv_dim, width, generator=g) * 0.5,
        "conv1d_bias": torch.randn(conv_dim, generator=g) * 0.1,
        "dt_bias": torch.randn(nheads, generator=g) * 0.5,
        "A": -torch.rand(nheads, generator=g) * 2 - 0.1,
        "D": torch.randn(nheads, headdim, generator=g) if d_per_channel else torch.randn(nheads, generator=g),
        "initial_states": torch.randn(batch, nheads, headdim, dstate, generator=g) if initial else None,
        "rmsnorm_weight": 1 + 0.1 * torch.randn(dim, generator=g) if rmsnorm else None,
        "outproj_weight": torch.randn(7, dim + d_nonssm, generator=g) * 0.3 if outproj else None,
        "outproj_bias": torch.randn(7, generator=g) * 0.1 if outproj else None,
    }
    seq_idx = None
    if packed:
        cut = seqlen // 2
        seq_idx = torch.tensor([[0] * cut + [1] * (seqlen - cut)] * batch, dtype=torch.int32)
    options = {"seq_idx": seq_idx, "headdim": None if d_per_channel else headdim, "ngroups": ngroups}
    return tensors, options


def forward_and_grads(fn, tensors: dict, options: dict, device: str, dtype: torch.dtype, chunk: int,
                      norm_before_gate: bool, dt_limit: tuple[float, float], seed: int):
    leaves = {k: None if v is None else v.to(device=device, dtype=dtype).requires_grad_(True)
              for k, v in tensors.items()}
    opts = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in options.items()}
    out, final = fn(leaves["zxbcdt"], leaves["conv1d_weight"], leaves["conv1d_bias"], leaves["dt_bias"],
                    leaves["A"], leaves["D"], chunk, initial_states=leaves["initial_states"],
                    dt_limit=dt_limit, return_final_states=True, activation="silu",
                    rmsnorm_weight=leaves["rmsnorm_weight"], rmsnorm_eps=1e-5,
                    outproj_weight=leaves["outproj_weight"], outproj_bias=leaves["outproj_bias"],
                    norm_before_gate=norm_before_gate, **opts)
    g = torch.Generator().manual_seed(seed + 1)
    dout = torch.randn(out.shape, generator=g).to(device=device, dtype=out.dtype)
    dfinal = torch.randn(final.shape, generator=g).to(device=device, dtype=final.dtype)
    names = [k for k in GRAD_NAMES if leaves[k] is not None]
    grads = torch.autograd.grad([out, final], [leaves[k] for k in names], [dout, dfinal])
    return out, final, dict(zip(names, grads, strict=True))


def close(got: torch.Tensor, want: torch.Tensor, tol: float, what: str) -> None:
    scale = max(1.0, float(want.detach().abs().max()))
    err = float((got.detach().double().cpu() - want.detach()).abs().max())
    assert err <= tol * scale, f"{what}: max abs err {err:.3g} > {tol:.1g} x {scale:.3g}"


@needs_triton
@settings(max_examples=12, deadline=None)
@given(
    seed=st.integers(0, 2**16),
    batch=st.integers(1, 2),
    seqlen=st.integers(3, 13),
    heads_groups=st.sampled_from([(2, 1), (2, 2), (4, 2)]),
    headdim=st.sampled_from([2, 4]),
    dstate=st.sampled_from([3, 4]),
    d_nonssm=st.sampled_from([0, 2]),
    width=st.sampled_from([2, 4]),
    d_per_channel=st.booleans(),
    rmsnorm=st.booleans(),
    norm_before_gate=st.booleans(),
    outproj=st.booleans(),
    initial=st.booleans(),
    packed=st.booleans(),
    chunk=st.sampled_from([4, 8]),
    limited=st.booleans(),
)
def test_matches_float64_spec(seed, batch, seqlen, heads_groups, headdim, dstate, d_nonssm, width, d_per_channel,
                              rmsnorm, norm_before_gate, outproj, initial, packed, chunk, limited):
    nheads, ngroups = heads_groups
    tensors, options = make_case(seed, batch, seqlen, nheads, headdim, ngroups, dstate, d_nonssm, width,
                                 d_per_channel, rmsnorm, outproj, initial, packed)
    dt_limit = (0.05, 2.0) if limited else (0.0, float("inf"))
    rest = (norm_before_gate, dt_limit, seed)
    want = forward_and_grads(mamba_split_conv1d_scan_ref, tensors, options, "cpu", torch.float64, chunk, *rest)
    reset()
    got = forward_and_grads(mamba_split_conv1d_scan_combined, tensors, options, DEVICE, torch.float32, chunk,
                            *rest)
    assert CALLS["ssd_split_conv_scan:composed"] == 1 and CALLS["fwd:triton"] >= 1
    close(got[0], want[0], 1e-4, "out")
    close(got[1], want[1], 1e-4, "final_states")
    assert set(got[2]) == set(want[2])
    for name, grad in want[2].items():
        close(got[2][name], grad, 2e-4, f"d{name}")


@needs_triton
def test_bf16_forward_close_to_float64():
    tensors, options = make_case(7, 2, 12, 4, 4, 2, 4, 0, 4, False, True, True, False, True)
    want = forward_and_grads(mamba_split_conv1d_scan_ref, tensors, options, "cpu", torch.float64, 4, False,
                             (0.0, float("inf")), 7)
    got = forward_and_grads(mamba_split_conv1d_scan_combined, tensors, options, DEVICE, torch.bfloat16, 4, False,
                            (0.0, float("inf")), 7)
    assert got[0].dtype == torch.bfloat16
    close(got[0], want[0], 5e-2, "out (bf16)")


@pytest.mark.parametrize("change, match", [
    (lambda t, o: o.update(headdim=None), "headdim"),
    (lambda t, o: t.update(zxbcdt=t["zxbcdt"][..., :-1]), "zxbcdt"),
    (lambda t, o: o.update(ngroups=3), "ngroups"),
    (lambda t, o: t.update(rmsnorm_weight=torch.ones(3)), "rmsnorm_weight"),
])
def test_bad_input_raises_a_clear_error(change, match):
    tensors, options = make_case(1, 1, 5, 4, 2, 2, 3, 0, 4, False, True, False, False, False)
    change(tensors, options)
    with pytest.raises(ValueError, match=match):
        forward_and_grads(mamba_split_conv1d_scan_combined, tensors, options, "cpu", torch.float32, 4, True,
                          (0.0, float("inf")), 1)
