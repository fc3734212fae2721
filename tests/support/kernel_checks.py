"""What the kernel tests (tests/kernels/...) share: the relative error they judge by, the
selective scan's random inputs, and the torch.compile check of an op's registered autograd."""

from __future__ import annotations

import torch


def rel_err(got: torch.Tensor, ref: torch.Tensor) -> float:
    """|got - ref| / |ref| over the whole tensor (in float64), after checking the shape and that
    every value is finite."""
    assert got.shape == ref.shape, (got.shape, ref.shape)
    assert torch.isfinite(got).all(), "non-finite value in result"
    got, ref = got.double(), ref.double()
    return ((got - ref).norm() / ref.norm().clamp_min(1e-12)).item()


def sscan_fwd_counter(impl: str = "triton") -> str:
    """The CALLS key a Mamba-1 scan forward bumps: the Triton forward FASTPATH_SSCAN_FWD picks,
    or ss_fwd:<impl> for the reference or a named variant ("triton-seq")."""
    from fastpath.kernels.selective_scan.interface import FWD_COUNTERS, fwd_kernel

    return FWD_COUNTERS[fwd_kernel()] if impl == "triton" else f"ss_fwd:{impl}"


def sscan_bwd_counter(impl: str = "triton") -> str:
    """The CALLS key a Mamba-1 scan backward bumps: the Triton backward FASTPATH_SSCAN_BWD picks,
    or ss_bwd:<impl> for the reference."""
    from fastpath.kernels.selective_scan.interface import BWD_COUNTERS, bwd_kernel

    return BWD_COUNTERS[bwd_kernel()] if impl == "triton" else f"ss_bwd:{impl}"


def selective_scan_inputs(batch, dim, nstate, length, layout, groups, seed, dtype):
    """Random inputs of selective_scan_fn rounded to `dtype` (A, D, delta_bias float32, as
    transformers passes); B and C "shared", "grouped" or (anything else) time-invariant."""
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape, scale=1.0, dt=dtype):
        return (torch.randn(*shape, generator=g, dtype=torch.float64) * scale).to(dt)

    if layout == "shared":
        B, C = rnd(batch, nstate, length), rnd(batch, nstate, length)
    elif layout == "grouped":
        B, C = rnd(batch, groups, nstate, length), rnd(batch, groups, nstate, length)
    else:  # time-invariant
        B, C = rnd(dim, nstate), rnd(dim, nstate)
    return {
        "u": rnd(batch, dim, length),
        "delta": rnd(batch, dim, length, scale=0.8),
        "A": -(torch.rand(dim, nstate, generator=g, dtype=torch.float64) * 1.5 + 0.2).float(),
        "B": B,
        "C": C,
        "D": rnd(dim, dt=torch.float32),
        "z": rnd(batch, dim, length),
        "delta_bias": rnd(dim, scale=0.5, dt=torch.float32),
    }


def compiled_matches_eager(step, inputs: tuple[torch.Tensor, ...], bwd_calls: str) -> None:
    """`step(*inputs)` -> a scalar: torch._dynamo.explain sees one graph and no break, and
    torch.compile(fullgraph=True, backend="aot_eager") runs the registered autograd (one backward
    call counted under `bwd_calls`:triton or :reference) with gradients equal to eager's."""
    import torch._dynamo

    from fastpath.kernels.counters import CALLS

    def leaves():
        return [t.clone().requires_grad_(True) for t in inputs]

    torch._dynamo.reset()
    report = torch._dynamo.explain(step)(*leaves())
    assert report.graph_break_count == 0, report.break_reasons
    assert report.graph_count == 1
    grads = []
    for fn in (step, torch.compile(step, fullgraph=True, backend="aot_eager")):
        xs = leaves()
        CALLS.clear()
        fn(*xs).backward()
        assert CALLS[f"{bwd_calls}:triton"] + CALLS[f"{bwd_calls}:reference"] == 1
        grads.append([x.grad for x in xs])
    torch.testing.assert_close(grads[0], grads[1], rtol=0, atol=0)
