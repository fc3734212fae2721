"""The float32 last state after a long sequence is no further from float64 than twice the
distance of the reference (naive.py, mamba_ssm's selective_scan_ref semantics) in float32.

mamba_ssm's own test file, its sequence lengths widened to the list it leaves commented out,
failed 37 cases on the H200 on this tensor alone (fastpath 2-4.5x the reference's distance at
L >= 256): the chunked forward took each decay as exp2(delta * A * log2 e), whose rounding (the
product's, then the SFU's approximate exp2) is biased, and a state that decays over thousands of
steps accumulates the bias. The interpreter shows the same (2.9x at L = 512 before the fix).
Inputs as upstream draws them: u, delta, B, C, z in bf16 (or fp16); A, D, delta_bias float32.
"""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl
from kernel_checks import sscan_fwd_counter

from fastpath.kernels.counters import CALLS
from fastpath.kernels.dispatch import triton_interpreter_on, use_triton
from fastpath.kernels.selective_scan.fwd_chunked import softplus
from fastpath.kernels.selective_scan.interface import selective_scan_fn
from fastpath.kernels.selective_scan.naive import selective_scan_ref

DEVICE = "cpu" if triton_interpreter_on() or not torch.cuda.is_available() else "cuda"
pytestmark = pytest.mark.skipif(
    not use_triton(torch.empty(0, device=DEVICE)),
    reason="exercises the Triton kernels: needs CUDA or TRITON_INTERPRET=1",
)
# (dim, length): small under the interpreter, upstream's longest on the GPU
SHAPE = (4, 512) if DEVICE == "cpu" else (64, 4096)


def _inputs(dtype: torch.dtype, seed: int, varying: bool) -> dict[str, torch.Tensor]:
    dim, length = SHAPE
    nstate = 16
    g = torch.Generator().manual_seed(seed)

    def rand(*shape: int) -> torch.Tensor:
        return torch.rand(*shape, generator=g)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g)

    bc_shape = (1, nstate, length) if varying else (dim, nstate)
    out = {"u": randn(1, dim, length).to(dtype), "delta": (0.5 * rand(1, dim, length)).to(dtype),
           "A": -0.5 * rand(dim, nstate), "B": randn(*bc_shape), "C": randn(*bc_shape),
           "D": randn(dim), "z": randn(1, dim, length).to(dtype), "delta_bias": 0.5 * rand(dim)}
    if varying:
        out["B"], out["C"] = out["B"].to(dtype), out["C"].to(dtype)
    return {k: v.to(DEVICE) for k, v in out.items()}


@triton.jit
def _apply_softplus(X, Y, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(Y + offs, softplus(tl.load(X + offs, mask=mask)), mask=mask)


def _distance(got: torch.Tensor, exact: torch.Tensor) -> tuple[float, float]:
    diff = got.double() - exact
    return diff.abs().max().item(), (diff.norm() / exact.norm()).item()


@pytest.mark.parametrize("varying", [True, False], ids=["varying-BC", "invariant-BC"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_last_state_after_a_long_sequence(dtype: torch.dtype, varying: bool) -> None:
    """Worst case over three draws (one element's max_abs is a noisy statistic: the reference
    itself lands from 0.6e-6 to 4e-6 from float64 across draws); before exp_precise the ratios
    reached 2.1-2.4 under the interpreter, after it they stay at or below 1.02."""
    fast, ref = [], []
    for seed in (5, 6, 7):
        inputs = _inputs(dtype, seed=seed, varying=varying)
        CALLS.clear()
        _, state = selective_scan_fn(**inputs, delta_softplus=True, return_last_state=True)
        assert CALLS[sscan_fwd_counter()] == 1, dict(CALLS)
        assert state.dtype == torch.float32
        _, ref_state = selective_scan_ref(**inputs, delta_softplus=True, return_last_state=True)
        exact = {k: v.double() for k, v in inputs.items()}
        _, exact_state = selective_scan_ref(**exact, delta_softplus=True, return_last_state=True)
        fast.append(_distance(state, exact_state))
        ref.append(_distance(ref_state, exact_state))
    for i, metric in enumerate(("max_abs", "rel_l2")):
        worst_fast, worst_ref = max(f[i] for f in fast), max(r[i] for r in ref)
        assert worst_fast <= 2 * worst_ref, (metric, fast, ref)


def test_delta_softplus_within_a_few_ulp_of_float64() -> None:
    """fwd_chunked.softplus (every forward and the backward's recompute of delta' use it) on a
    dense sweep of [-80, 30] and random trained-bias-like values: within 3.5 ulp of float64's
    softplus, 0.5 ulp on average; the identity above 20 exact; NaN kept. Only FMAs, adds and
    Triton's log (libdevice's on the GPU) are involved, so the interpreter computes what the GPU
    does. The SFU's exp2 it used before left mamba_ssm's wide grid 3 float32 last states ~2x
    further from float64 than the reference's, all with softplus of delta + bias."""
    g = torch.Generator().manual_seed(3)
    sweep = torch.linspace(-80, 30, 20001 if DEVICE == "cpu" else 2_000_001)
    x = torch.cat([sweep, torch.randn(20000, generator=g) * 3 - 4, torch.tensor([float("nan")])]).to(DEVICE)
    y = torch.empty_like(x)
    _apply_softplus[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
    assert torch.isnan(y[-1])
    x, y = x[:-1].cpu(), y[:-1].cpu()
    exact = torch.nn.functional.softplus(x.double())
    ulp = (torch.nextafter(exact.float(), torch.tensor(float("inf"))) - exact.float()).double()
    err = (y.double() - exact).abs() / ulp
    assert err.max().item() <= 3.5 and err.mean().item() <= 0.5, (err.max().item(), err.mean().item())
    assert torch.equal(y[x > 20], x[x > 20])
