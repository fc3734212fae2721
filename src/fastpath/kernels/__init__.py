"""Compiler-free kernels (Triton), each op with its float64 reference beside it.

One subpackage per op family, each shaped the same way: `interface.py` (torch custom ops with fake
implementations, autograd, validation, and the Triton-or-reference dispatch), the Triton kernels by
strategy in their own modules, and `naive.py` (the float64 spec the tests check against, also the
runtime fallback for combinations a kernel does not take, with a warning):
- causal_conv1d/: depthwise causal conv1d forward, backward, decode update, varlen states (the
  engine behind the Dao-compatible face `fastpath.causal_conv1d`).
- gated_delta_rule/: the gated delta rule's dq/dk/dw/dg backward piece for Hopper (FLA #640).
- ssd/: Mamba-2's chunked state-space scan, its state update and the fused split-conv-scan op.
- selective_scan/: Mamba-1's selective scan, its state update and mamba_inner_fn.
Shared: dispatch (Triton or reference, and the fallback warning), counters (which implementation
ran, read by explain() and verify), compiled_launch (cached calls into Triton's launcher).
Never imports routing, models, proof, capture or doctor; nothing here imports triton at package
import time.
"""
