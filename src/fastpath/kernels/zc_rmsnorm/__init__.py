"""Qwen3.5 / Qwen3-Next zero-centred RMSNorm, y = rmsnorm(x) * (1 + w), one kernel each way.

interface.py (entry point: zc_rmsnorm, a torch custom op with autograd and dispatch),
fwd_bwd.py (the forward and backward kernels over strided rows), naive.py (the spec).
May import: the kernels' shared modules and fastpath.shared. Routed by routing/zc_norm_route.py.
"""
