"""Partial rotate-half rotary position embedding (Qwen3.5's gated attention), one kernel each way.

interface.py (entry point: rotary, a torch custom op with autograd and dispatch), fwd_bwd.py (the
forward and backward kernels over (B, H, L, D) views with any strides), naive.py (the spec).
May import: the kernels' shared modules and fastpath.shared. Routed by routing/gates_route.py.
"""
