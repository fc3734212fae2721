"""Mamba-1's selective scan as torch custom ops, and mamba_ssm's public scan on top of them (same
name, argument order and return conventions):

    selective_scan_fn(u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False,
                      return_last_state=False)

mamba_ssm's other two Mamba-1 functions sit beside it: the decode step in update.py
(selective_state_update) and the fused training op in inner.py (mamba_inner_fn).

Ops (namespace "fastpath"), one place that validates, dispatches (Triton or the float reference)
and defines autograd:
- selective_scan_fwd(u, delta, A, B, C, D, z, delta_bias, delta_softplus, return_last_state)
      -> (out, last_state)   B/C each (dim, N) or (batch, G, N, L); last_state empty when not
      asked
- selective_scan_bwd(dout, dlast_state, [u, delta, A, B, C, D, z, delta_bias], delta_softplus)
      -> [du, ddelta, dA, dB, dC, dD, dz, ddelta_bias]   (empty tensors for absent inputs)
Kernels: FASTPATH_SSCAN_FWD picks the forward (fwd_kernel: "tile", fwd_tile.py, the default, or
"chunked", "seq", "tile-poly"), FASTPATH_SSCAN_BWD the backward
(bwd_kernel: "seq", bwd_seq.py, the default, or "chunked", bwd.py), read at every call.
Semantics and the float64 spec: naive.py. Unlike mamba_ssm, a gradient flowing into last_state
is honoured. What the kernels do not take (complex A, N > MAX_DSTATE, float64, no Triton device)
runs the reference, with a warning naming the reason (dispatch.warn_fallback).
"""

from __future__ import annotations

import os

import torch
from torch import Tensor

from fastpath.kernels.counters import CALLS
from fastpath.kernels.dispatch import TRITON_DTYPES, use_triton, warn_fallback
from fastpath.kernels.selective_scan import naive as reference
from fastpath.shared.errors import UsageError

FAMILY = "selective_scan"
FWD_ENV = "FASTPATH_SSCAN_FWD"
# FASTPATH_SSCAN_FWD's values -> the call counter each one bumps (tests check which ran);
# the first is the default
FWD_COUNTERS = {"tile": "ss_fwd:triton-tile", "chunked": "ss_fwd:triton",
                "seq": "ss_fwd:triton-seq", "tile-poly": "ss_fwd:triton-tile-poly"}
FWD_KERNELS = tuple(FWD_COUNTERS)
BWD_ENV = "FASTPATH_SSCAN_BWD"
# FASTPATH_SSCAN_BWD's values -> the call counter each one bumps
BWD_COUNTERS = {"chunked": "ss_bwd:triton", "seq": "ss_bwd:triton-seq"}
BWD_KERNELS = tuple(BWD_COUNTERS)
MAX_DSTATE = 64  # the kernels hold (chunk, channels, N) fp32 tiles in registers
KERNELS_READY = True


def _empty(like: Tensor) -> Tensor:
    return like.new_empty(0)


def triton_unsupported(u: Tensor, A: Tensor, *tensors: Tensor | None) -> str | None:
    """Why the Triton scan cannot take this call (None when it can): one answer for the
    dispatcher here and for explain()."""
    if not use_triton(u):
        return f"no Triton device for {u.device.type} tensors (CUDA, or TRITON_INTERPRET=1)"
    if not KERNELS_READY:
        return "the Triton selective-scan kernels are not in this build yet"
    if A.is_complex():
        return "complex A (the kernels take real A)"
    if A.shape[-1] > MAX_DSTATE:
        return f"state size N={A.shape[-1]} (the kernels take N <= {MAX_DSTATE})"
    for t in (u, A, *tensors):
        if t is not None and t.dtype not in TRITON_DTYPES:
            return f"dtype {t.dtype} (the kernels take float32/float16/bfloat16)"
    for t in (u, A, *tensors):
        if t is not None and element_span(t) >= 2**31:
            return "a tensor spanning >= 2**31 elements (the kernels index in int32)"
    return None


def element_span(t: Tensor) -> int:
    """One past the farthest element a kernel reaches from t's data pointer through its strides
    (its numel when contiguous; more for a view into a larger buffer): the kernels' offsets
    are int32 products of indices and strides, so this must stay below 2**31."""
    if t.numel() == 0:
        return 0
    return 1 + sum((size - 1) * abs(stride) for size, stride in zip(t.shape, t.stride(),
                                                                     strict=True))


def _use_triton(op: str, u: Tensor, A: Tensor, *tensors: Tensor | None) -> bool:
    why = triton_unsupported(u, A, *tensors)
    if why is not None:
        warn_fallback(op, why, family=FAMILY)
        return False
    return True


def fwd_kernel() -> str:
    """The forward kernel FASTPATH_SSCAN_FWD picks, read at every call: "tile" (default,
    fwd_tile.py: time walked in registers, the output moved as (channels, steps) tiles; it
    passes mamba_ssm's widened test_selective_scan.py grid and runs a training step's scan
    1.3-1.5x faster than "chunked" on an H200, BENCHMARKS.md Sessions 30-31), "chunked" (the
    associative-scan kernel of fwd_chunked.py, the default before), "seq" (fwd_seq.py, time
    walked per program) or "tile-poly" (the tile walk with the SFU's exponentials: faster, but
    its float32 last state fails mamba_ssm's bar). Anything else is a UsageError."""
    value = os.environ.get(FWD_ENV, "").strip().lower() or "tile"
    if value not in FWD_KERNELS:
        raise UsageError(f"{FWD_ENV}={value!r}: expected one of {', '.join(FWD_KERNELS)}")
    return value


def fwd_launcher(kernel: str):
    """The Triton forward launcher of a FWD_KERNELS name: (u, delta, A, B, C, D, z, delta_bias,
    delta_softplus) -> (out, last_state), the contract of fwd_chunked.selective_scan_fwd_triton."""
    if kernel == "seq":
        from fastpath.kernels.selective_scan.fwd_seq import selective_scan_fwd_seq_triton

        return selective_scan_fwd_seq_triton
    if kernel in ("tile", "tile-poly"):
        from functools import partial

        from fastpath.kernels.selective_scan import fwd_tile

        config = fwd_tile.TILE_POLY_CONFIG if kernel == "tile-poly" else None
        return partial(fwd_tile.selective_scan_fwd_tile_triton, config=config)
    from fastpath.kernels.selective_scan.fwd_chunked import selective_scan_fwd_triton

    return selective_scan_fwd_triton


def bwd_kernel() -> str:
    """The backward kernel FASTPATH_SSCAN_BWD picks, read at every call: "seq" (default,
    bwd_seq.py: time walked step by step, chunks in parallel, a sequential combine; about 2x the
    chunked one's speed on an H100, BENCHMARKS.md) or "chunked" (bwd.py: chunk states
    recomputed by the chunked forward, associative scans per chunk). Anything else is a
    UsageError."""
    value = os.environ.get(BWD_ENV, "").strip().lower() or "seq"
    if value not in BWD_KERNELS:
        raise UsageError(f"{BWD_ENV}={value!r}: expected one of {', '.join(BWD_KERNELS)}")
    return value


def bwd_launcher(kernel: str):
    """The Triton backward launcher of a BWD_KERNELS name, with the contract of
    bwd.selective_scan_bwd_triton."""
    if kernel == "seq":
        from fastpath.kernels.selective_scan.bwd_seq import selective_scan_bwd_seq_triton

        return selective_scan_bwd_seq_triton
    from fastpath.kernels.selective_scan.bwd import selective_scan_bwd_triton

    return selective_scan_bwd_triton


def _state_dtype(u: Tensor) -> torch.dtype:
    return torch.float64 if u.dtype == torch.float64 else torch.float32


# ---------------------------------------------------------------- forward
@torch.library.custom_op("fastpath::selective_scan_fwd", mutates_args=())
def selective_scan_fwd(
    u: Tensor,
    delta: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    D: Tensor | None,
    z: Tensor | None,
    delta_bias: Tensor | None,
    delta_softplus: bool,
    return_last_state: bool,
) -> tuple[Tensor, Tensor]:
    if _use_triton("scan fwd", u, A, delta, B, C, D, z, delta_bias):
        kernel = fwd_kernel()
        CALLS[FWD_COUNTERS[kernel]] += 1
        selective_scan_fwd_triton = fwd_launcher(kernel)
        out, last = selective_scan_fwd_triton(u, delta, A, B, C, D, z, delta_bias, delta_softplus)
    else:
        CALLS["ss_fwd:reference"] += 1
        with torch.no_grad():
            out, last = reference.selective_scan_ref(
                u, delta, A, B, C, D, z, delta_bias, delta_softplus, return_last_state=True
            )
        last = last.to(_state_dtype(u))
    return out, (last if return_last_state else _empty(u))


@selective_scan_fwd.register_fake
def _fwd_fake(u, delta, A, B, C, D, z, delta_bias, delta_softplus, return_last_state):
    out = torch.empty_like(u, memory_format=torch.contiguous_format)
    if not return_last_state:
        return out, u.new_empty(0)
    return out, u.new_empty((u.shape[0], u.shape[1], A.shape[1]), dtype=_state_dtype(u))


def _fwd_setup_context(ctx, inputs, output) -> None:
    ctx.save_for_backward(*inputs[:8])
    ctx.delta_softplus, ctx.return_last = inputs[8:]


def _fwd_backward(ctx, dout, dlast):
    inputs = list(ctx.saved_tensors)
    if dout is None:
        dout = torch.zeros_like(inputs[0])
    if not ctx.return_last or dlast is None or dlast.numel() == 0:
        dlast = None
    grads = selective_scan_bwd(dout, dlast, inputs, ctx.delta_softplus)
    return (*(g if t is not None else None for g, t in zip(grads, inputs, strict=True)),
            None, None)


selective_scan_fwd.register_autograd(_fwd_backward, setup_context=_fwd_setup_context)


# ---------------------------------------------------------------- backward
@torch.library.custom_op("fastpath::selective_scan_bwd", mutates_args=())
def selective_scan_bwd(
    dout: Tensor,
    dlast_state: Tensor | None,
    inputs: list[Tensor | None],
    delta_softplus: bool,
) -> list[Tensor]:
    """Gradients of (u, delta, A, B, C, D, z, delta_bias), one each, in that order."""
    u, delta, A, B, C, D, z, delta_bias = inputs
    if _use_triton("scan bwd", u, A, delta, B, C, D, z, delta_bias, dout, dlast_state):
        kernel = bwd_kernel()
        CALLS[BWD_COUNTERS[kernel]] += 1
        grads = bwd_launcher(kernel)(dout, dlast_state, u, delta, A, B, C, D, z, delta_bias,
                                     delta_softplus)
    else:
        CALLS["ss_bwd:reference"] += 1
        grads = _reference_bwd(dout, dlast_state, inputs, delta_softplus)
    return [
        _empty(u) if g is None or t is None else g.to(t.dtype)
        for g, t in zip(grads, inputs, strict=True)
    ]


def _reference_bwd(dout, dlast, inputs, delta_softplus):
    """Gradients of the reference by torch.func.vjp (plain autograd does not record below the
    custom op's autograd key; functorch's transform does)."""
    present = [i for i, t in enumerate(inputs) if t is not None]

    def run(*given):
        args = list(inputs)
        for i, t in zip(present, given, strict=True):
            args[i] = t
        return reference.selective_scan_ref(*args, delta_softplus=delta_softplus,
                                            return_last_state=True)

    (out, last), vjp = torch.func.vjp(run, *(inputs[i] for i in present))
    dlast = torch.zeros_like(last) if dlast is None else dlast.to(last.dtype)
    grads = vjp((dout.to(out.dtype), dlast))
    result: list[Tensor | None] = [None] * len(inputs)
    for i, g in zip(present, grads, strict=True):
        result[i] = g
    return result


@selective_scan_bwd.register_fake
def _bwd_fake(dout, dlast_state, inputs, delta_softplus):
    return [torch.empty_like(t) if t is not None else _empty(inputs[0]) for t in inputs]


# ---------------------------------------------------------------- public face
def _check_bc(name: str, M: Tensor, batch: int, dim: int, nstate: int, length: int,
              complex_a: bool) -> None:
    steps = 2 * length if complex_a else length
    if M.dim() == 2:
        if tuple(M.shape) != (dim, nstate):
            raise ValueError(f"{name} (time-invariant) must be ({dim}, {nstate}), got "
                             f"{tuple(M.shape)}")
        return
    if M.dim() == 3 and tuple(M.shape) == (batch, nstate, steps):
        return
    if M.dim() == 4 and M.shape[0] == batch and tuple(M.shape[2:]) == (nstate, steps):
        if M.shape[1] == 0 or dim % M.shape[1]:
            raise ValueError(f"{name}: dim {dim} is not a multiple of its {M.shape[1]} groups")
        return
    raise ValueError(f"{name} must be ({dim}, {nstate}), ({batch}, {nstate}, {steps}) or "
                     f"({batch}, groups, {nstate}, {steps}), got {tuple(M.shape)}")


def check_scan(u: Tensor, delta: Tensor, A: Tensor, B: Tensor, C: Tensor, D: Tensor | None,
               z: Tensor | None, delta_bias: Tensor | None) -> None:
    """The one validation of a scan call: each problem as one clear ValueError (mamba_ssm
    asserts, or reads out of bounds)."""
    if u.dim() != 3:
        raise ValueError(f"u must be (batch, dim, seqlen), got {tuple(u.shape)}")
    batch, dim, length = u.shape
    if length == 0:
        raise ValueError("seqlen must be >= 1 (u has an empty length axis)")
    if delta.shape != u.shape:
        raise ValueError(f"delta {tuple(delta.shape)} must match u {tuple(u.shape)}")
    if A.dim() != 2 or A.shape[0] != dim or A.shape[1] == 0:
        raise ValueError(f"A must be ({dim}, dstate), got {tuple(A.shape)}")
    nstate = A.shape[1]
    _check_bc("B", B, batch, dim, nstate, length, A.is_complex())
    _check_bc("C", C, batch, dim, nstate, length, A.is_complex())
    if D is not None and tuple(D.shape) != (dim,):
        raise ValueError(f"D must be ({dim},), got {tuple(D.shape)}")
    if z is not None and z.shape != u.shape:
        raise ValueError(f"z {tuple(z.shape)} must match u {tuple(u.shape)}")
    if delta_bias is not None and tuple(delta_bias.shape) != (dim,):
        raise ValueError(f"delta_bias must be ({dim},), got {tuple(delta_bias.shape)}")


def _grouped(M: Tensor) -> Tensor:
    """B or C as the ops take it, without copying: (batch, N, L) gets a group axis; a
    time-invariant (dim, N) and a grouped (batch, G, N, L) pass as they are (the kernels read
    each of B and C in its own layout: fwd_chunked.bc_layout)."""
    return M.unsqueeze(1) if M.dim() == 3 else M


def selective_scan_fn(
    u: Tensor,
    delta: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    D: Tensor | None = None,
    z: Tensor | None = None,
    delta_bias: Tensor | None = None,
    delta_softplus: bool = False,
    return_last_state: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    """mamba_ssm's Mamba-1 selective scan (naive.py states the semantics).

    u/delta/z (batch, dim, L) in any layout (transformers passes transposed views); A (dim, N);
    B/C (batch, N, L), (batch, G, N, L) or time-invariant (dim, N); D/delta_bias (dim,).
    Returns out (batch, dim, L) in u's dtype; (out, last_state) with return_last_state,
    last_state (batch, dim, N) float32.
    """
    check_scan(u, delta, A, B, C, D, z, delta_bias)
    if A.is_complex():
        warn_fallback("scan", "complex A (the kernels take real A)", family=FAMILY)
        CALLS["ss_fwd:reference"] += 1
        return reference.selective_scan_ref(u, delta, A, B, C, D, z, delta_bias, delta_softplus,
                                            return_last_state)
    out, last = selective_scan_fwd(u, delta, A, _grouped(B), _grouped(C), D, z, delta_bias,
                                   bool(delta_softplus), bool(return_last_state))
    return (out, last) if return_last_state else out
