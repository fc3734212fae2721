"""Tensors that end (or begin) at an inaccessible page, for memory-safety tests on CPU.

Under TRITON_INTERPRET=1 a Triton kernel's loads and stores run on host memory, unmasked lanes
included, so a kernel that reads or writes one element past a tensor faults at once when the next
page is PROT_NONE (an mprotect'ed guard page; the same idea as Electric Fence). The tests run such
kernels in a subprocess: a SIGSEGV names the case instead of killing pytest. Linux only (libc mmap).
"""

from __future__ import annotations

import ctypes
import mmap
from typing import Literal

import torch

_PROT_NONE = 0
_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                       ctypes.c_long]
_libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_KEEP: list[object] = []  # the mappings live as long as the process (tests are short subprocesses)


def guarded_empty(shape: tuple[int, ...], dtype: torch.dtype,
                  side: Literal["end", "start"] = "end") -> torch.Tensor:
    """A contiguous tensor whose last byte is followed (side="end") or whose first byte is
    preceded (side="start") by a PROT_NONE page."""
    page = mmap.PAGESIZE
    numel = 1
    for n in shape:
        numel *= n
    nbytes = max(numel * torch.empty((), dtype=dtype).element_size(), 1)
    data_pages = -(-nbytes // page)
    total = (data_pages + 2) * page  # a guard page on each side
    addr = _libc.mmap(None, total, mmap.PROT_READ | mmap.PROT_WRITE,
                      mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
    if addr in (None, ctypes.c_void_p(-1).value):
        raise OSError(ctypes.get_errno(), "mmap failed")
    for guard in (addr, addr + (data_pages + 1) * page):
        if _libc.mprotect(guard, page, _PROT_NONE) != 0:
            raise OSError(ctypes.get_errno(), "mprotect failed")
    start = addr + page if side == "start" else addr + (data_pages + 1) * page - nbytes
    buf = (ctypes.c_char * nbytes).from_address(start)
    _KEEP.append(buf)
    return torch.frombuffer(buf, dtype=dtype, count=numel).view(shape)


def guarded_copy(t: torch.Tensor, side: Literal["end", "start"] = "end") -> torch.Tensor:
    """`t`'s values in a guarded contiguous tensor of the same shape and dtype."""
    out = guarded_empty(tuple(t.shape), t.dtype, side)
    out.copy_(t)
    return out
