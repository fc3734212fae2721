"""Compiler-free kernels (Triton), one subpackage per op, each with its float reference beside it.

Ops: causal_conv1d (the engine of the `fastpath.causal_conv1d` face), ssd (Mamba-2),
selective_scan (Mamba-1), gated_delta_rule (a torch dqkwg for FLA #640), gdn_gates,
sigmoid_gate, zc_rmsnorm, linear_ce. An op's entry point is its interface.py (torch custom ops
with fake implementations, autograd, validation, the Triton-or-reference dispatch); its Triton
kernels sit in modules by strategy, and naive.py is the float64 spec the tests check against and
the runtime fallback (with a warning). Shared by the ops: dispatch (cuda_capability decides the
device once; which implementation a call takes), counters (which one ran, read by explain() and
verify), compiled_launch, layout, rounding.
May import: shared only; never routing, models, proof, capture or doctor. No triton at import.
"""
