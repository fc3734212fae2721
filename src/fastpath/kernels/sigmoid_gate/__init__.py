"""The gated attention's output gate, x * sigmoid(gate), in one kernel each way.

interface.py (entry point: sigmoid_gate, a torch custom op with autograd and dispatch),
fwd_bwd.py (the forward and backward kernels over strided views), naive.py (the spec).
May import: the kernels' shared modules and fastpath.shared. Routed by routing/gates_route.py.
"""
