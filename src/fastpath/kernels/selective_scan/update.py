"""mamba_ssm's Mamba-1 decode step, its signature, on the Mamba-2 update kernel:

    selective_state_update(state, x, dt, A, B, C, D=None, z=None, dt_bias=None,
                           dt_softplus=False, state_batch_indices=None)

The Triton kernel is kernels/ssd/update.py's, called with a head per group of channels; what
it does not take runs naive.selective_state_update_ref, with a warning naming the reason.
"""

from __future__ import annotations

import torch
from torch import Tensor

from fastpath.kernels.counters import CALLS
from fastpath.kernels.dispatch import TRITON_DTYPES, use_triton, warn_fallback
from fastpath.kernels.selective_scan import naive as reference
from fastpath.kernels.selective_scan.interface import FAMILY


def _check_update(state: Tensor, x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor,
                  D: Tensor | None, z: Tensor | None, dt_bias: Tensor | None,
                  state_batch_indices: Tensor | None) -> None:
    if state.dim() != 3 or x.dim() != 2:
        raise ValueError(f"selective_state_update (Mamba-1): state must be (batch, dim, dstate) "
                         f"and x (batch, dim), got {tuple(state.shape)} and {tuple(x.shape)}")
    batch, dim = x.shape
    nstate = state.shape[2]
    if state.shape[1] != dim:
        raise ValueError(f"selective_state_update: state {tuple(state.shape)} does not match "
                         f"x {tuple(x.shape)}")
    if state_batch_indices is None and state.shape[0] != batch:
        raise ValueError(f"selective_state_update: state batch {state.shape[0]} != x batch "
                         f"{batch} (pass state_batch_indices for a pooled cache)")
    if state_batch_indices is not None and tuple(state_batch_indices.shape) != (batch,):
        raise ValueError(f"selective_state_update: state_batch_indices must be ({batch},), got "
                         f"{tuple(state_batch_indices.shape)}")
    if dt.shape != x.shape or (z is not None and z.shape != x.shape):
        raise ValueError("selective_state_update: dt and z must have x's shape")
    if tuple(A.shape) != (dim, nstate):
        raise ValueError(f"selective_state_update: A {tuple(A.shape)} != {(dim, nstate)}")
    for name, M in (("B", B), ("C", C)):
        if tuple(M.shape) != (batch, nstate) and not (
            M.dim() == 3 and M.shape[0] == batch and M.shape[2] == nstate and M.shape[1] > 0
            and dim % M.shape[1] == 0
        ):
            raise ValueError(f"selective_state_update: {name} must be ({batch}, {nstate}) or "
                             f"({batch}, groups, {nstate}), got {tuple(M.shape)}")
    for name, t in (("D", D), ("dt_bias", dt_bias)):
        if t is not None and tuple(t.shape) != (dim,):
            raise ValueError(f"selective_state_update: {name} must be ({dim},), got "
                             f"{tuple(t.shape)}")


def _update_unsupported(state: Tensor, x: Tensor, A: Tensor, *tensors: Tensor | None) -> str | None:
    if not use_triton(x):
        return f"no Triton device for {x.device.type} tensors (CUDA, or TRITON_INTERPRET=1)"
    if A.is_complex():
        return "complex A (the kernel takes real A)"
    from fastpath.kernels.ssd.update import MAX_DSTATE as UPDATE_MAX_DSTATE

    if state.shape[-1] > UPDATE_MAX_DSTATE:
        return f"state size N={state.shape[-1]} (the kernel takes N <= {UPDATE_MAX_DSTATE})"
    for t in (state, x, A, *tensors):
        if t is not None and t.dtype not in TRITON_DTYPES:
            return f"dtype {t.dtype} (the kernel takes float32/float16/bfloat16)"
    if state.numel() >= 2**31:
        return "a tensor with >= 2**31 elements"
    return None


def selective_state_update(
    state: Tensor,
    x: Tensor,
    dt: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    D: Tensor | None = None,
    z: Tensor | None = None,
    dt_bias: Tensor | None = None,
    dt_softplus: bool = False,
    state_batch_indices: Tensor | None = None,
) -> Tensor:
    """One decode step of the Mamba-1 recurrence, mamba_ssm's signature, in place on `state`.

    state (batch|pool, dim, N) (any strides: Zamba passes a per-head view of its cache),
    x/dt/z (batch, dim), A (dim, N), B/C (batch, N) or grouped (batch, G, N), D/dt_bias (dim,).
    Returns out (batch, dim) in x's dtype. The 4-D (with heads) form is mamba_ssm's Mamba-2 call;
    fastpath.kernels.ssd.update takes it. The Triton kernel is the one the Mamba-2 update
    uses (kernels/ssd/update.py) with a single head of `dim` rows and full (dim, N) A.
    A negative state_batch_indices entry marks a padding row: output 0, no state touched; so
    does one past the pool (the kernel never indexes outside `state`; no host-side check, which
    would sync the device every token).
    """
    _check_update(state, x, dt, A, B, C, D, z, dt_bias, state_batch_indices)
    Bg = B if B.dim() == 3 else B[:, None]
    Cg = C if C.dim() == 3 else C[:, None]
    why = _update_unsupported(state, x, A, dt, B, C, D, z, dt_bias)
    if why is None:
        from fastpath.kernels.ssd.update import selective_state_update_triton

        CALLS["ss_update:triton"] += 1
        heads = Bg.shape[1]  # a group of channels per head: (batch, G, dim / G, N)

        def split(t: Tensor | None, axis: int) -> Tensor | None:
            return None if t is None else t.unflatten(axis, (heads, -1))

        out = selective_state_update_triton(
            split(state, 1), split(x, 1), split(dt, 1), split(A, 0), Bg, Cg, split(D, 0),
            split(z, 1), split(dt_bias, 0), bool(dt_softplus), state_batch_indices,
        )
        return out.flatten(1, 2)
    if use_triton(x):
        warn_fallback("update", why, family=FAMILY)
    CALLS["ss_update:reference"] += 1
    return _update_reference(state, x, dt, A, Bg, Cg, D, z, dt_bias, dt_softplus,
                             state_batch_indices)


def _update_reference(state, x, dt, A, Bg, Cg, D, z, dt_bias, dt_softplus, idx) -> Tensor:
    """The reference step, groups expanded to channels, in place like the kernel."""
    dim = x.shape[1]
    groups = Bg.shape[1]
    Bc = Bg.repeat_interleave(dim // groups, dim=1)  # (batch, dim, N)
    Cc = Cg.repeat_interleave(dim // groups, dim=1)
    keep = None if idx is None else ((idx >= 0) & (idx < state.shape[0])).nonzero().flatten()
    if keep is not None and keep.numel() < x.shape[0]:
        out = torch.zeros_like(x)
        pick = lambda t: None if t is None else t[keep]  # noqa: E731
        out[keep] = _update_reference(state, x[keep], dt[keep], A, Bg[keep], Cg[keep], D,
                                      pick(z), dt_bias, dt_softplus, idx[keep])
        return out
    # heads = channels: state (batch, dim, 1, N), x (batch, dim, 1), A (dim, 1, N), B/C per head
    rows = state if idx is None else state[idx.long()]
    out = reference.selective_state_update_ref(
        rows[:, :, None], x[..., None], dt[..., None], A[:, None], Bc, Cc,
        D=None if D is None else D[:, None], z=None if z is None else z[..., None],
        dt_bias=None if dt_bias is None else dt_bias[:, None], dt_softplus=dt_softplus,
    )
    if idx is not None:
        with torch.no_grad():
            state[idx.long()] = rows
    return out[..., 0]
