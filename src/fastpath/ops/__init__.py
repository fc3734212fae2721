"""Compiler-free kernels (Triton) for causal depthwise conv1d, with a float reference beside them.

Layout of this package:
- reference.py: plain-torch float reference (the spec the kernels are tested against).
- conv1d_fwd.py / conv1d_bwd.py / conv1d_update.py / varlen_states.py: Triton kernels + launchers.
- causal_conv1d.py: torch custom ops (compile-friendly), autograd, and the triton/reference dispatch.
- counters.py: which implementation ran, for `fastpath explain`/tests.
Nothing here imports triton at package import time.
"""
