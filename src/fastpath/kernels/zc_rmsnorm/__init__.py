"""Qwen3.5 / Qwen3-Next zero-centred RMSNorm, y = rmsnorm(x) * (1 + w), one kernel each way.

interface.py (entry points: zc_rmsnorm, and add_zc_rmsnorm, the decoder's residual add fused into
it; torch custom ops with autograd and dispatch),
fwd_bwd.py (the forward and backward kernels over strided rows), naive.py (the spec).
May import: the kernels' shared modules and fastpath.shared. Routed by routing/zc_norm_route.py and
routing/add_norm_route.py.
"""
