"""The sigmoid output gate as torch custom ops: out = x * sigmoid(gate), one kernel each way.

x and gate have one shape (..., width) and may be strided views (the gated attention's gate is
the second half of each head of the q_proj output); out is contiguous in their promoted dtype.
Ops (namespace "fastpath"): sigmoid_gate_fwd(x, gate) -> out and sigmoid_gate_bwd(x, gate, dout)
-> (dx, dgate), with fake implementations and registered autograd (no graph break under
torch.compile; kernels/binary_op.py registers them). Where the
Triton kernel cannot run, the float32 reference in naive.py does (a one-time warning says why
when a kernel could otherwise have run).
"""

from __future__ import annotations

import torch
from torch import Tensor

from fastpath.kernels.binary_op import binary_op, check_pair
from fastpath.kernels.counters import CALLS
from fastpath.kernels.dispatch import dtypes_fit, use_triton
from fastpath.kernels.layout import as_rows as _rows
from fastpath.kernels.sigmoid_gate import naive

FAMILY = "sigmoid_gate"




def _triton_ok(op: str, *tensors: Tensor) -> bool:
    if not use_triton(tensors[0]):
        return False
    return dtypes_fit(op, FAMILY, *tensors)


def fwd_impl(x: Tensor, gate: Tensor) -> Tensor:
    check_pair("sigmoid_gate", ("x", "gate"), x, gate)
    dtype = torch.promote_types(x.dtype, gate.dtype)
    if x.numel() and _triton_ok("fwd", x, gate):
        from fastpath.kernels.sigmoid_gate.fwd_bwd import gate_fwd

        CALLS["sigmoid_gate_fwd:triton"] += 1
        return gate_fwd(_rows(x), _rows(gate), dtype).view(x.shape)
    CALLS["sigmoid_gate_fwd:reference"] += 1
    return naive.sigmoid_gate_ref(x, gate, compute=torch.float32).to(dtype).contiguous()


def bwd_impl(x: Tensor, gate: Tensor, dout: Tensor) -> tuple[Tensor, Tensor]:
    if x.numel() and _triton_ok("bwd", x, gate, dout):
        from fastpath.kernels.sigmoid_gate.fwd_bwd import gate_bwd

        CALLS["sigmoid_gate_bwd:triton"] += 1
        dx, dg = gate_bwd(_rows(x), _rows(gate), _rows(dout))
        return dx.view(x.shape), dg.view(gate.shape)
    CALLS["sigmoid_gate_bwd:reference"] += 1
    dx, dg = naive.sigmoid_gate_bwd_ref(x, gate, dout, compute=torch.float32)
    return dx.to(x.dtype).contiguous(), dg.to(gate.dtype).contiguous()


_OP = binary_op("sigmoid_gate", fwd_impl, bwd_impl)
sigmoid_gate_fwd, sigmoid_gate_bwd = _OP.fwd, _OP.bwd


def sigmoid_gate(x: Tensor, gate: Tensor) -> Tensor:
    """x * sigmoid(gate): the custom op while torch.compile traces, otherwise the implementation
    directly, under autograd only when a gradient is wanted (kernels/binary_op.py)."""
    return _OP.call(x, gate)
