"""Stores that round float32 to the pointee dtype the way a GPU does, also under Triton's CPU
interpreter, shared by the kernels whose tests measure rounding error in bfloat16."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def store_rounded(ptrs, v, mask, RNE: tl.constexpr):
    """Store float32 `v` in the pointee dtype. GPUs round to nearest even; Triton's CPU
    interpreter truncates float32 -> bfloat16 (its create_fp_trunc drops the low bits:
    triton/runtime/interpreter.py), which doubles the rounding error the tests measure, so with
    RNE (set only under the interpreter) the rounding is done by hand, bit for bit the GPU's."""
    if RNE and ptrs.dtype.element_ty == tl.bfloat16:
        bits = v.to(tl.uint32, bitcast=True)
        bits += 0x7FFF + ((bits >> 16) & 1)
        tl.store(ptrs, (bits >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True), mask=mask)
    else:
        tl.store(ptrs, v.to(ptrs.dtype.element_ty), mask=mask)


@triton.jit
def rounded_like(v, ptrs, RNE: tl.constexpr):
    """float32 `v` rounded to the pointee dtype and back, in registers: the value a store to `ptrs`
    then a load would give (round to nearest even also under the interpreter, as store_rounded)."""
    if RNE and ptrs.dtype.element_ty == tl.bfloat16:
        bits = v.to(tl.uint32, bitcast=True)
        bits += 0x7FFF + ((bits >> 16) & 1)
        return (bits & 0xFFFF0000).to(tl.float32, bitcast=True)
    else:
        return v.to(ptrs.dtype.element_ty).to(tl.float32)
