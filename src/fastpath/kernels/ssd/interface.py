"""The chunked state-space scan (Mamba-2 SSD) as torch custom ops, plus mamba_ssm's public
`mamba_chunk_scan_combined` on top of them.

Ops (namespace "fastpath"), one place that validates, dispatches (Triton or reference) and
defines autograd so eager, autograd and torch.compile see the same thing:
- ssd_scan_fwd(x, dt, A, B, C, D, z, dt_bias, initial_states, seq_idx, chunk_size, dt_softplus,
      dt_min, dt_max, return_final_states) -> (out, final_states)
- ssd_scan_bwd(dout, dfinal_states, [x, dt, A, B, C, D, z, dt_bias, initial_states], seq_idx,
      chunk_size, dt_softplus, dt_min, dt_max) -> [dx, ddt, dA, dB, dC, dD, dz, ddt_bias,
      dinitial_states]
Custom-op schemas cannot return None: missing results are empty tensors.
Semantics (and the float64 spec) live in naive.py; outside the op schemas the optional inputs
travel as one naive.ScanOptions.
"""

from __future__ import annotations

import math
from dataclasses import replace

import torch
from torch import Tensor

from fastpath.kernels.counters import CALLS
from fastpath.kernels.dispatch import TRITON_DTYPES, use_triton, warn_fallback
from fastpath.kernels.ssd import naive as reference
from fastpath.kernels.ssd.naive import ScanOptions

MAX_CHUNK = 256  # the kernels hold a chunk's (Q, Q) decay tile in registers
MAX_HEADDIM = 256
MAX_DSTATE = 256
KERNELS_READY = True


def _empty(like: Tensor) -> Tensor:
    return like.new_empty(0)


def triton_unsupported(
    x: Tensor, B: Tensor, chunk_size: int, *tensors: Tensor | None
) -> str | None:
    """Why the Triton kernels cannot take this call (None when they can)."""
    if not use_triton(x):
        return f"no Triton device for {x.device.type} tensors (CUDA, or TRITON_INTERPRET=1)"
    if not KERNELS_READY:
        return "the Triton SSD kernels are not in this build yet"
    for t in (x, B, *tensors):
        if t is not None and t.is_floating_point() and t.dtype not in TRITON_DTYPES:
            return f"dtype {t.dtype} (the kernels take float32/float16/bfloat16)"
    if not 1 <= chunk_size <= MAX_CHUNK:
        return f"chunk_size {chunk_size} (the kernels take 1..{MAX_CHUNK})"
    if x.shape[-1] > MAX_HEADDIM:
        return f"headdim {x.shape[-1]} (the kernels take <= {MAX_HEADDIM})"
    if B.shape[-1] > MAX_DSTATE:
        return f"dstate {B.shape[-1]} (the kernels take <= {MAX_DSTATE})"
    return None


def _use_triton(op: str, x: Tensor, B: Tensor, chunk_size: int, *tensors: Tensor | None) -> bool:
    why = triton_unsupported(x, B, chunk_size, *tensors)
    if why is not None:
        warn_fallback(op, why, family="ssd")
        return False
    return True


def _limit(dt_min: float, dt_max: float) -> tuple[float, float]:
    return (float(dt_min), float(dt_max))


# ---------------------------------------------------------------- forward
@torch.library.custom_op("fastpath::ssd_scan_fwd", mutates_args=())
def ssd_scan_fwd(
    x: Tensor,
    dt: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    D: Tensor | None,
    z: Tensor | None,
    dt_bias: Tensor | None,
    initial_states: Tensor | None,
    seq_idx: Tensor | None,
    chunk_size: int,
    dt_softplus: bool,
    dt_min: float,
    dt_max: float,
    return_final_states: bool,
) -> tuple[Tensor, Tensor]:
    if _use_triton("scan fwd", x, B, chunk_size, dt, A, C, D, z, dt_bias, initial_states):
        from fastpath.kernels.ssd.fwd import ssd_scan_fwd_triton

        CALLS["ssd_fwd:triton"] += 1
        out, final = ssd_scan_fwd_triton(
            x, dt, A, B, C, D, z, dt_bias, initial_states, seq_idx, chunk_size, dt_softplus,
            _limit(dt_min, dt_max),
        )
    else:
        CALLS["ssd_fwd:reference"] += 1
        limit = _limit(dt_min, dt_max)
        opts = ScanOptions(D, z, dt_bias, initial_states, seq_idx, dt_softplus, limit)
        with torch.no_grad():
            out, final = reference.chunked_scan(x, dt, A, B, C, chunk_size, opts)
        final = final.to(torch.float64 if x.dtype == torch.float64 else torch.float32)
    return out, (final if return_final_states else _empty(x))


@ssd_scan_fwd.register_fake
def _fwd_fake(x, dt, A, B, C, D, z, dt_bias, initial_states, seq_idx, chunk_size, dt_softplus,
              dt_min, dt_max, return_final_states):
    out = torch.empty_like(x)
    if not return_final_states:
        return out, x.new_empty(0)
    batch, _, nheads, headdim = x.shape
    fdtype = torch.float64 if x.dtype == torch.float64 else torch.float32
    return out, x.new_empty((batch, nheads, headdim, B.shape[-1]), dtype=fdtype)


def _fwd_setup_context(ctx, inputs, output) -> None:
    ctx.save_for_backward(*inputs[:10])
    ctx.chunk_size, ctx.dt_softplus, ctx.dt_min, ctx.dt_max, ctx.return_final = inputs[10:]


def _fwd_backward(ctx, dout, dfinal):
    *inputs, seq_idx = ctx.saved_tensors
    if dout is None:
        dout = torch.zeros_like(inputs[0])
    if not ctx.return_final or dfinal is None or dfinal.numel() == 0:
        dfinal = None
    grads = ssd_scan_bwd(
        dout, dfinal, inputs, seq_idx, ctx.chunk_size, ctx.dt_softplus, ctx.dt_min, ctx.dt_max
    )
    # a gradient for each present input; None for the absent ones and the non-tensor arguments
    return (
        *(g if t is not None else None for g, t in zip(grads, inputs, strict=True)),
        None, None, None, None, None, None,
    )


ssd_scan_fwd.register_autograd(_fwd_backward, setup_context=_fwd_setup_context)


# ---------------------------------------------------------------- backward
@torch.library.custom_op("fastpath::ssd_scan_bwd", mutates_args=())
def ssd_scan_bwd(
    dout: Tensor,
    dfinal_states: Tensor | None,
    inputs: list[Tensor | None],
    seq_idx: Tensor | None,
    chunk_size: int,
    dt_softplus: bool,
    dt_min: float,
    dt_max: float,
) -> list[Tensor]:
    """Gradients of the forward's differentiable inputs (x, dt, A, B, C, D, z, dt_bias,
    initial_states, given as one list), one each, in that order."""
    limit = _limit(dt_min, dt_max)
    x, dt, A, B, C, D, z, dt_bias, initial_states = inputs
    if _use_triton(
        "scan bwd", x, B, chunk_size, dt, A, C, D, z, dt_bias, initial_states, dout,
        dfinal_states,
    ):
        from fastpath.kernels.ssd.bwd import ssd_scan_bwd_triton

        CALLS["ssd_bwd:triton"] += 1
        grads = ssd_scan_bwd_triton(
            dout, dfinal_states, x, dt, A, B, C, D, z, dt_bias, initial_states, seq_idx,
            chunk_size, dt_softplus, limit,
        )
    else:
        CALLS["ssd_bwd:reference"] += 1
        grads = _reference_bwd(dout, dfinal_states, inputs, seq_idx, chunk_size, dt_softplus, limit)
    return [
        _empty(x) if g is None else g.to(t.dtype) if t is not None else _empty(x)
        for g, t in zip(grads, inputs, strict=True)
    ]


def _reference_bwd(dout, dfinal, inputs, seq_idx, chunk_size, dt_softplus, limit):
    """Gradients of the chunked torch reference by torch.func.vjp (plain autograd does not
    record below the custom op's autograd key; functorch's transform does)."""
    present = [i for i, t in enumerate(inputs) if t is not None]

    def run(*given):
        args = list(inputs)
        for i, t in zip(present, given, strict=True):
            args[i] = t
        opts = ScanOptions(*args[5:], seq_idx, dt_softplus, limit)
        return reference.chunked_scan(*args[:5], chunk_size, opts)

    (out, final), vjp = torch.func.vjp(run, *(inputs[i] for i in present))
    dfinal = torch.zeros_like(final) if dfinal is None else dfinal.to(final.dtype)
    grads = vjp((dout.to(out.dtype), dfinal))
    result: list[Tensor | None] = [None] * len(inputs)
    for i, g in zip(present, grads, strict=True):
        result[i] = g
    return tuple(result)


@ssd_scan_bwd.register_fake
def _bwd_fake(dout, dfinal_states, inputs, seq_idx, chunk_size, dt_softplus, dt_min, dt_max):
    return [torch.empty_like(t) if t is not None else _empty(inputs[0]) for t in inputs]


# ---------------------------------------------------------------- public face
def check_scan(
    x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor, chunk_size: int, opts: ScanOptions
) -> ScanOptions:
    """The one validation of a scan call: shape and option errors as one clear ValueError each
    (mamba_ssm asserts). Returns opts with dt_limit as a pair of floats."""
    if x.dim() != 4:
        raise ValueError(f"x must be (batch, seqlen, nheads, headdim), got {tuple(x.shape)}")
    batch, seqlen, nheads, headdim = x.shape
    if seqlen == 0:
        raise ValueError("seqlen must be >= 1 (x has an empty length axis)")
    if B.dim() != 4 or B.shape[:2] != (batch, seqlen):
        raise ValueError(f"B must be (batch, seqlen, ngroups, dstate), got {tuple(B.shape)}")
    ngroups, dstate = B.shape[2:]
    if ngroups == 0 or nheads % ngroups:
        raise ValueError(f"nheads {nheads} is not a multiple of ngroups {ngroups}")
    if C.shape != B.shape:
        raise ValueError(f"C {tuple(C.shape)} must match B {tuple(B.shape)}")
    if dt.shape != (batch, seqlen, nheads):
        raise ValueError(f"dt must be {(batch, seqlen, nheads)}, got {tuple(dt.shape)}")
    if A.shape != (nheads,):
        raise ValueError(f"A must be ({nheads},), got {tuple(A.shape)}")
    if not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive int, got {chunk_size!r}")
    D, z, dt_bias, initial_states, seq_idx = (
        opts.D, opts.z, opts.dt_bias, opts.initial_states, opts.seq_idx
    )
    if D is not None and D.shape not in ((nheads,), (nheads, headdim)):
        raise ValueError(f"D must be ({nheads},) or ({nheads}, {headdim}), got {tuple(D.shape)}")
    if z is not None and z.shape != x.shape:
        raise ValueError(f"z {tuple(z.shape)} must match x {tuple(x.shape)}")
    if dt_bias is not None and dt_bias.shape != (nheads,):
        raise ValueError(f"dt_bias must be ({nheads},), got {tuple(dt_bias.shape)}")
    if initial_states is not None and initial_states.shape != (batch, nheads, headdim, dstate):
        raise ValueError(
            f"initial_states must be {(batch, nheads, headdim, dstate)}, "
            f"got {tuple(initial_states.shape)}"
        )
    if seq_idx is not None and seq_idx.shape != (batch, seqlen):
        raise ValueError(f"seq_idx must be {(batch, seqlen)}, got {tuple(seq_idx.shape)}")
    dt_min, dt_max = _limit(*opts.dt_limit)
    if math.isnan(dt_min) or math.isnan(dt_max) or dt_min > dt_max:
        raise ValueError(f"dt_limit must be (min, max) with min <= max, got {opts.dt_limit!r}")
    return replace(opts, dt_limit=(dt_min, dt_max))


def _scan(x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor, chunk_size: int,
          opts: ScanOptions, return_final_states: bool) -> tuple[Tensor, Tensor]:
    return ssd_scan_fwd(
        x, dt, A, B, C, opts.D, opts.z, opts.dt_bias, opts.initial_states, opts.seq_idx,
        chunk_size, opts.dt_softplus, *opts.dt_limit, return_final_states,
    )


def chunk_scan(
    x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor, chunk_size: int, opts: ScanOptions
) -> tuple[Tensor, Tensor]:
    """(out, final_states) of a checked call, options as one object (a naive.ScanFn, what
    split_conv_scan.py composes)."""
    return _scan(x, dt, A, B, C, chunk_size, check_scan(x, dt, A, B, C, chunk_size, opts), True)


def mamba_chunk_scan_combined(
    x: Tensor,
    dt: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    chunk_size: int,
    D: Tensor | None = None,
    z: Tensor | None = None,
    dt_bias: Tensor | None = None,
    initial_states: Tensor | None = None,
    seq_idx: Tensor | None = None,
    cu_seqlens: Tensor | None = None,
    dt_softplus: bool = False,
    dt_limit: tuple[float, float] = (0.0, float("inf")),
    return_final_states: bool = False,
    return_varlen_states: bool = False,
):
    """mamba_ssm's public op, same signature and return convention.

    x (B, L, H, P), dt (B, L, H), A (H,), B/C (B, L, G, N), D (H,) or (H, P), z like x,
    dt_bias (H,), initial_states (B, H, P, N), seq_idx (B, L), cu_seqlens (S+1,) (read only with
    return_varlen_states, batch 1). Returns out; (out, final_states) with return_final_states;
    (out, varlen_states) or (out, final_states, varlen_states) with return_varlen_states.
    varlen_states carry no gradient (as in mamba_ssm).
    """
    opts = ScanOptions(D, z, dt_bias, initial_states, seq_idx, dt_softplus, dt_limit)
    opts = check_scan(x, dt, A, B, C, chunk_size, opts)
    if return_varlen_states:
        if cu_seqlens is None:
            raise ValueError("return_varlen_states=True needs cu_seqlens")
        if x.shape[0] != 1:
            raise ValueError("cu_seqlens needs batch size 1 (sequences packed along the length)")
    out, final = _scan(x, dt, A, B, C, chunk_size, opts, return_final_states)
    if not return_varlen_states:
        return (out, final) if return_final_states else out
    varlen = varlen_states(x, dt, A, B, cu_seqlens, chunk_size, opts, C.dtype)
    return (out, final, varlen) if return_final_states else (out, varlen)


def varlen_states(
    x: Tensor,
    dt: Tensor,
    A: Tensor,
    B: Tensor,
    cu_seqlens: Tensor,
    chunk_size: int,
    opts: ScanOptions,
    out_dtype: torch.dtype,
) -> Tensor:
    """Final state per packed sequence, (S, H, P, N) in out_dtype; no gradient."""
    dt_bias, initial_states = opts.dt_bias, opts.initial_states
    with torch.no_grad():
        if _use_triton("varlen states", x, B, chunk_size, dt, A, dt_bias, initial_states):
            from fastpath.kernels.ssd.varlen import varlen_states_triton

            CALLS["ssd_varlen_states:triton"] += 1
            return varlen_states_triton(
                x, dt, A, B, cu_seqlens, initial_states, dt_bias, opts.dt_softplus,
                opts.dt_limit, chunk_size, out_dtype,
            )
        CALLS["ssd_varlen_states:reference"] += 1
        return reference.varlen_states_ref(
            x, dt, A, B, cu_seqlens, out_dtype, initial_states=initial_states, dt_bias=dt_bias,
            dt_softplus=opts.dt_softplus, dt_limit=opts.dt_limit,
        )
