"""The SwiGLU gated product as torch custom ops: out = silu(gate) * up, one kernel each way.

gate and up have one shape and a floating dtype each (any strides: a non-contiguous input is
copied first, so the kernels only ever index flat contiguous buffers); out is contiguous in their
promoted dtype. Ops (namespace "fastpath"): silu_mul_fwd(gate, up) -> out and
silu_mul_bwd(gate, up, dout) -> (dgate, dup), with fake implementations and registered autograd (no
graph break under torch.compile; kernels/binary_op.py registers them). Autograd keeps gate and up
only (eager keeps silu(gate) as well).
Where the Triton kernel cannot run, the float32 reference in naive.py does (a one-time warning
says why when a kernel could otherwise have run).
"""

from __future__ import annotations

import torch
from torch import Tensor

from fastpath.kernels.binary_op import binary_op, check_pair
from fastpath.kernels.counters import CALLS
from fastpath.kernels.dispatch import dtypes_fit, use_triton
from fastpath.kernels.swiglu import naive

FAMILY = "swiglu"


def _use_kernel(op: str, *tensors: Tensor) -> bool:
    return bool(tensors[0].numel()) and use_triton(tensors[0]) and dtypes_fit(op, FAMILY, *tensors)


def fwd_impl(gate: Tensor, up: Tensor) -> Tensor:
    check_pair("silu_mul", ("gate", "up"), gate, up)
    dtype = torch.promote_types(gate.dtype, up.dtype)
    if _use_kernel("fwd", gate, up):
        from fastpath.kernels.swiglu.fwd_bwd import silu_mul_fwd

        CALLS["swiglu_fwd:triton"] += 1
        return silu_mul_fwd(gate.contiguous(), up.contiguous(), dtype)
    CALLS["swiglu_fwd:reference"] += 1
    return naive.silu_mul_ref(gate, up, compute=torch.float32).to(dtype).contiguous()


def bwd_impl(gate: Tensor, up: Tensor, dout: Tensor) -> tuple[Tensor, Tensor]:
    if dout.shape != gate.shape:
        raise ValueError(f"silu_mul: dout {tuple(dout.shape)} must have gate's shape {tuple(gate.shape)}")
    if _use_kernel("bwd", gate, up, dout):
        from fastpath.kernels.swiglu.fwd_bwd import silu_mul_bwd

        CALLS["swiglu_bwd:triton"] += 1
        return silu_mul_bwd(gate.contiguous(), up.contiguous(), dout.contiguous())
    CALLS["swiglu_bwd:reference"] += 1
    dg, du = naive.silu_mul_bwd_ref(gate, up, dout, compute=torch.float32)
    return dg.to(gate.dtype).contiguous(), du.to(up.dtype).contiguous()


# silu_mul(gate, up): the custom op while torch.compile traces, otherwise the implementation
# directly, under autograd only when a gradient is wanted
silu_mul, silu_mul_fwd, silu_mul_bwd = binary_op("silu_mul", fwd_impl, bwd_impl)
