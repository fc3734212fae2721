"""Compiler-free kernels (Triton), one subpackage per op, each with its float reference beside it.

Ops (13): causal_conv1d (the engine of the `fastpath.causal_conv1d` face), ssd (Mamba-2),
selective_scan (Mamba-1), gated_delta_rule (a PyTorch dqkwg for FLA's #640), gdn_gates,
sigmoid_gate, rotary (the gated attention's partial rotate-half RoPE of q and k), swiglu (the
gated MLP's silu(gate) * up), zc_rmsnorm, linear_ce, state_stats (capture's one-pass health facts
of a hidden state; no gradient), linear_group (projections of one input whose input gradient
accumulates in the GEMMs; torch GEMMs, no Triton), embedding (the token embedding's weight
gradient written in one pass).

One naming rule in every op folder, so a module's name says which pass it computes:
- interface.py: the op's entry points, what routing and the public faces import (torch custom ops
  with fake implementations, autograd, validation, the Triton-or-reference dispatch);
- naive.py: the float reference (float64 in the tests, the runtime fallback with a warning);
- Triton modules named by pass: fwd.py, bwd.py (embedding's); fwd_<strategy>.py / bwd_<strategy>.py where an op
  has several (selective_scan fwd_chunked / fwd_seq / fwd_tile, causal_conv1d fwd_tile /
  bwd_tile); fwd_bwd.py where one module holds a small op's forward and backward (gdn_gates,
  sigmoid_gate, rotary, swiglu, zc_rmsnorm, linear_ce), fwd_bwd_<strategy>.py for a strategy's pair
  (causal_conv1d fwd_bwd_rows); update.py, the decode step, state updated in place
  (selective_scan's runs ssd's update kernel); varlen.py, the per-sequence states of packed
  inputs; common.py, @triton.jit helpers several of the op's kernels share;
- host-side modules keep names that say what they are: causal_conv1d/launchers.py,
  ssd/shared_memory.py, ssd/split_conv_scan.py and selective_scan/inner.py (fused training ops
  composed of fastpath's ops), causal_conv1d/split_outputs.py (the conv of a fused projection
  written straight into its pieces), gated_delta_rule/dqkwg.py (PyTorch, named after the FLA function it
  replaces). No `triton_` prefix: every kernel module here is Triton.

Shared by the ops: dispatch (cuda_capability decides the device once; which implementation a call
takes), counters (which one ran, read by explain() and verify), compiled_launch, layout, rounding,
binary_op (the custom-op pair and autograd of an elementwise op of two inputs).
May import: shared only; never routing, models, proof, capture or doctor. No triton at import.
"""
