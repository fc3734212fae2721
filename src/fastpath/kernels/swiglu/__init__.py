"""The SwiGLU MLP's gated product, silu(gate) * up, in one kernel each way.

interface.py (entry point: silu_mul, a torch custom op with autograd and dispatch),
fwd_bwd.py (the forward and backward kernels over flat contiguous buffers), naive.py (the spec).
May import: the kernels' shared modules and fastpath.shared. Routed by routing/swiglu_route.py.
"""
