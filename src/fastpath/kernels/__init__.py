"""Compiler-free kernels (Triton) for causal depthwise conv1d, with a float reference beside them.

Layout of this package:
- reference.py: plain-torch float reference (the spec the kernels are tested against).
- conv1d_rows.py: channel-last fwd/bwd (sliding rows, each element loaded once) - the fast path.
- conv1d_fwd.py / conv1d_bwd.py: 2D-tile fwd/bwd, used for contiguous (B, D, L) inputs.
- conv1d_update.py / varlen_states.py: decode update (one-token step kernel + general kernel),
  varlen state gather. conv1d_common.py: shared tap loads / SiLU.
- causal_conv1d.py: torch custom ops (compile-friendly), autograd, and the triton/reference dispatch.
- counters.py: which implementation ran, for `fastpath explain`/tests.
Nothing here imports triton at package import time.
"""
