"""Tensor layouts the row-wise kernels take, shared so each op does not keep its own copy."""

from __future__ import annotations

from torch import Tensor


def as_rows(t: Tensor) -> Tensor:
    """t as a (rows, last) view with unit column stride (a copy only when no such view exists)."""
    if t.dim() == 0:
        t = t.reshape(1)
    if t.stride(-1) != 1:
        t = t.contiguous()
    try:
        return t.view(-1, t.shape[-1])
    except RuntimeError:
        return t.reshape(-1, t.shape[-1])
