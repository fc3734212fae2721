"""The Mamba-1 kernels compiled for a CUDA device at real shapes, against float64.

Falcon-Mamba-7B / Mamba-2.8B channel counts (D = 8192 / 5120, N = 16), sequences up to 4096,
bf16 and fp32, every option, the transposed views transformers passes, a gradient into
last_state; every tile config the benchmark sweeps, and both adjoint-scan variants (tl.flip, the
default, and tl.associative_scan(reverse=True), which has had GPU miscompiles: triton-lang/triton
#4362, #8412); the decode step at B = 64; mamba_inner_fn with Falcon-Mamba's RMSNorm weights.
"""

from __future__ import annotations

import pytest
import torch
from kernel_checks import sscan_bwd_counter, sscan_fwd_counter

from fastpath.kernels.counters import CALLS
from fastpath.kernels.selective_scan import bwd, fwd_chunked
from fastpath.kernels.selective_scan.inner import mamba_inner_fn
from fastpath.kernels.selective_scan.interface import selective_scan_fn
from fastpath.kernels.selective_scan.naive import mamba_inner_ref, selective_scan_ref
from fastpath.kernels.selective_scan.update import selective_state_update

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
TOL = {torch.float32: 2e-4, torch.bfloat16: 2e-2}
NAMES = ("u", "delta", "A", "B", "C", "D", "z", "delta_bias")
SWEEP = bwd.SWEEP_CONFIGS


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    assert torch.isfinite(a).all()
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def case(batch, dim, length, dtype, groups=0, seed=0):
    """Inputs in the kernel's dtypes (A, D, delta_bias float32, as transformers passes them)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    r = lambda *s, scale=1.0: torch.randn(*s, generator=g, device="cuda") * scale  # noqa: E731
    bc = (batch, groups, 16, length) if groups else (batch, 16, length)
    t = {
        "u": r(batch, dim, length).to(dtype),
        "delta": r(batch, dim, length, scale=0.5).to(dtype) - 2.0,  # softplus ~0.1: real dt
        "A": -torch.exp(r(dim, 16, scale=0.5)),
        "B": r(*bc).to(dtype),
        "C": r(*bc).to(dtype),
        "D": r(dim),
        "z": r(batch, dim, length).to(dtype),
        "delta_bias": r(dim, scale=0.3),
    }
    return t


def as_views(t: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """u, z as (B, L, D).transpose views and B/C as (B, L, N).transpose, like transformers."""
    out = dict(t)
    for k in ("u", "z", "B", "C"):
        if t[k].dim() == 3:
            out[k] = t[k].transpose(1, 2).contiguous().transpose(1, 2)
    return out


def check(t, dtype, views=False, grads=True):
    ins = {k: v.clone().requires_grad_() for k, v in (as_views(t) if views else t).items()}
    ref = {k: v.double().requires_grad_() for k, v in t.items()}
    CALLS.clear()
    out, last = selective_scan_fn(**ins, delta_softplus=True, return_last_state=True)
    rout, rlast = selective_scan_ref(**ref, delta_softplus=True, return_last_state=True)
    assert CALLS[sscan_fwd_counter()] == 1
    assert rel(out, rout) < TOL[dtype], rel(out, rout)
    assert rel(last, rlast) < TOL[dtype]
    if not grads:
        return
    g = torch.Generator(device="cuda").manual_seed(9)
    dout = torch.randn(out.shape, generator=g, device="cuda")
    dlast = torch.randn(last.shape, generator=g, device="cuda")
    names = list(ins)
    got = torch.autograd.grad((out.float() * dout).sum() + (last * dlast).sum(),
                              [ins[k] for k in names])
    want = torch.autograd.grad((rout * dout.double()).sum() + (rlast * dlast.double()).sum(),
                               [ref[k] for k in names])
    assert CALLS[sscan_bwd_counter()] == 1
    for name, a, b in zip(names, got, want, strict=True):
        assert rel(a, b) < 2 * TOL[dtype], f"d{name}: {rel(a, b):.2e}"


@pytest.mark.parametrize(("batch", "dim", "length"), [(1, 8192, 4096), (2, 5120, 1024)])
def test_bf16_falcon_and_mamba_shapes_forward_and_backward(batch, dim, length):
    check(case(batch, dim, length, torch.bfloat16), torch.bfloat16, views=True)


def test_fp32_grouped():
    check(case(2, 2048, 777, torch.float32, groups=4, seed=1), torch.float32)


def test_forward_only_long_batch():
    check(case(8, 1024, 4096, torch.bfloat16, seed=2), torch.bfloat16, grads=False)


@pytest.mark.parametrize("config", SWEEP)
def test_every_swept_config(config):
    t = case(1, 1024, 1000, torch.float32, seed=3)
    B4, C4 = t["B"][:, None], t["C"][:, None]
    args = (t["u"], t["delta"], t["A"], B4, C4, t["D"], t["z"], t["delta_bias"], True)
    out, last = fwd_chunked.selective_scan_fwd_triton(*args, config=config[:3])
    rout, rlast = selective_scan_ref(*(a.double() for a in args[:8]), True, True)
    assert rel(out, rout) < 2e-4 and rel(last, rlast) < 2e-4
    ref = [a.double().requires_grad_() for a in args[:8]]
    ro, _ = selective_scan_ref(*ref, True, True)
    dout = torch.randn_like(t["u"])
    want = torch.autograd.grad((ro * dout.double()).sum(), ref)
    got = bwd.selective_scan_bwd_triton(dout, None, *args, config=config)
    for name, a, b in zip(NAMES, got, want, strict=True):
        assert rel(a, b) < 4e-4, f"{config} d{name}: {rel(a, b):.2e}"


def test_decode_update_b64():
    g = torch.Generator(device="cuda").manual_seed(4)
    batch, dim, n = 64, 8192, 16
    r = lambda *s: torch.randn(*s, generator=g, device="cuda")  # noqa: E731
    state = r(batch, dim, n).to(torch.bfloat16)
    x, dt, z = (r(batch, dim).to(torch.bfloat16) for _ in range(3))
    A, D, bias = -torch.exp(r(dim, n) * 0.5), r(dim), r(dim)
    B, C = r(batch, n).to(torch.bfloat16), r(batch, n).to(torch.bfloat16)
    s0 = state.double()
    dtp = torch.nn.functional.softplus(dt.double() + bias.double())
    new = s0 * torch.exp(dtp[..., None] * A.double()) + (dtp * x.double())[..., None] * B.double()[:, None]
    want = ((new * C.double()[:, None]).sum(-1) + D.double() * x.double()) * torch.nn.functional.silu(z.double())
    CALLS.clear()
    out = selective_state_update(state, x, dt, A, B, C, D, z=z, dt_bias=bias, dt_softplus=True)
    assert CALLS["ss_update:triton"] == 1
    assert rel(out, want) < 2e-2 and rel(state, new) < 2e-2


def test_mamba_inner_falcon_shape_with_rms_weights():
    g = torch.Generator(device="cuda").manual_seed(5)
    hidden, dim, rank, n, width, length = 1024, 2048, 64, 16, 4, 1024
    r = lambda *s, scale=1.0: torch.randn(*s, generator=g, device="cuda") * scale  # noqa: E731
    bf = torch.bfloat16
    t = [r(1, 2 * dim, length).to(bf), r(dim, 1, width, scale=0.5).to(bf), r(dim, scale=0.1).to(bf),
         r(rank + 2 * n, dim, scale=dim ** -0.5).to(bf), r(dim, rank, scale=rank ** -0.5).to(bf),
         r(hidden, dim, scale=dim ** -0.5).to(bf), None, -torch.exp(r(dim, n, scale=0.5))]
    kw = {"D": r(dim), "delta_bias": r(dim, scale=0.3) - 2.0,
          "b_rms_weight": torch.ones(n, device="cuda"), "c_rms_weight": torch.ones(n, device="cuda"),
          "dt_rms_weight": torch.ones(dim, device="cuda"), "b_c_dt_rms_eps": 1e-6}
    got_in = [a.clone().requires_grad_() if a is not None else None for a in t]
    ref_in = [a.double().requires_grad_() if a is not None else None for a in t]
    got = mamba_inner_fn(*got_in, None, None, **kw)
    want = mamba_inner_ref(*ref_in, None, None, **{k: (v.double() if torch.is_tensor(v) else v)
                                                   for k, v in kw.items()})
    assert rel(got, want) < 3e-2
    dout = torch.randn(want.shape, generator=g, device="cuda", dtype=torch.float64)
    present = [i for i, a in enumerate(t) if a is not None]
    ga = torch.autograd.grad((got.double() * dout).sum(), [got_in[i] for i in present])
    gb = torch.autograd.grad((want * dout).sum(), [ref_in[i] for i in present])
    for i, a, b in zip(present, ga, gb, strict=True):
        assert rel(a, b) < 6e-2, f"input {i}: {rel(a, b):.2e}"
