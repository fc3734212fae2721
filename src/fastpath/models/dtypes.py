"""Dtype and device names as the CLI takes them ('bf16', 'auto', 'cuda:1') -> torch objects.

Shared by verify, bench and capture, so each flag means the same thing in every command.
"""

from __future__ import annotations

from typing import Any

from fastpath.shared.errors import UsageError

DTYPE_NAMES: dict[str, str] = {
    "bf16": "bfloat16",
    "bfloat16": "bfloat16",
    "fp16": "float16",
    "float16": "float16",
    "half": "float16",
    "fp32": "float32",
    "float32": "float32",
    "float": "float32",
}


def torch_dtype(name: str) -> Any:
    """'bf16' | 'fp16' | 'fp32' (and long spellings) -> torch.dtype; UsageError otherwise."""
    import torch

    key = DTYPE_NAMES.get(str(name).strip().lower())
    if key is None:
        raise UsageError(f"unknown dtype {name!r}; use bf16, fp16 or fp32")
    return getattr(torch, key)


def dtype_label(dtype: Any) -> str:
    """torch.bfloat16 -> 'bf16' (for reports)."""
    return {"torch.bfloat16": "bf16", "torch.float16": "fp16", "torch.float32": "fp32"}.get(
        str(dtype), str(dtype)
    )


def resolve_dtype(name: str, device: str | None) -> str:
    """--dtype auto: bf16 on a GPU, fp32 on CPU (where bf16 matmuls are slow and less exact)."""
    if name != "auto":
        return name
    return "bf16" if resolve_device(device).type == "cuda" else "fp32"


def resolve_device(name: str | None) -> Any:
    """'auto' (CUDA when available) | 'cpu' | 'cuda[:N]' | 'meta' -> torch.device."""
    import torch

    if name in (None, "", "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError) as exc:
        raise UsageError(f"bad device {name!r}: {exc}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UsageError(f"device {name!r} asked for, but torch {torch.__version__} sees no CUDA GPU")
    return device
