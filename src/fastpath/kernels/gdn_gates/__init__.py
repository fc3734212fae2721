"""GatedDeltaNet's decay and beta gates (g, beta) in one kernel each way.

interface.py (entry point: gdn_gates, a torch custom op with autograd and dispatch),
fwd_bwd.py (the forward and backward kernels), naive.py (the spec, in a chosen float precision).
May import: the kernels' shared modules and fastpath.shared. Routed by routing/gates_route.py.
"""
