"""Which implementation a call takes: Triton on CUDA (or on CPU under TRITON_INTERPRET=1), else the
float reference. Kept tiny because the decode update calls it every token."""

from __future__ import annotations

import os
import warnings
from functools import cache

import torch

TRITON_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@cache
def _triton_importable() -> bool:
    try:
        import triton  # noqa: F401
    except Exception:
        return False
    return True


def triton_interpreter_on() -> bool:
    """TRITON_INTERPRET=1: Triton runs kernels on CPU tensors (how the tests exercise them)."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def cuda_capability() -> tuple[int, int] | None:
    """The current CUDA device's compute capability, or None without a usable CUDA device."""
    try:
        if torch.cuda.is_available():
            major, minor = torch.cuda.get_device_capability()
            return int(major), int(minor)
    except Exception:  # a broken driver reads as "no CUDA device", never as a crash in enable()
        return None
    return None


def use_triton(x: torch.Tensor) -> bool:
    """True when `x`'s device can run our Triton kernels right now."""
    if x.is_cuda:
        return _triton_importable()
    if x.device.type == "cpu" and triton_interpreter_on():
        return _triton_importable()
    return False


def warn_fallback(op: str, why: str, family: str = "causal_conv1d") -> None:
    """Say (once per reason) that a supported-by-reference combination skips the kernel."""
    _warn_once(family, op, why)


@cache
def _warn_once(family: str, op: str, why: str) -> None:
    warnings.warn(
        f"fastpath {family} {op}: {why}; using the (slower) torch reference",
        RuntimeWarning,
        stacklevel=4,
    )


def dtypes_fit(op: str, family: str, *tensors: torch.Tensor | None) -> bool:
    """Every given tensor has a dtype the Triton kernels take; else warn once (the reference runs)."""
    if any(t is not None and t.dtype not in TRITON_DTYPES for t in tensors):
        warn_fallback(op, "a dtype the kernel does not take (float32, float16, bfloat16)", family)
        return False
    return True
