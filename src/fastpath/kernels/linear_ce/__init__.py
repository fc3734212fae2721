"""LM head + cross-entropy without the (N, V) logits, each GEMM once.

interface.py (entry point: linear_cross_entropy, a torch custom op with autograd and dispatch),
fwd_bwd.py (per-row cross-entropy and its gradient over one chunk of logits, in one kernel),
naive.py (the spec).
May import: the kernels' shared modules and fastpath.shared. Routed by routing/lm_head_route.py.
"""
