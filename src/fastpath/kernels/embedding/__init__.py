"""The token embedding's weight gradient in one write pass.

interface.py (entry point: embedding, a torch custom op with autograd and dispatch), bwd.py (the
Triton kernel that writes each vocabulary row once), naive.py (the spec).
May import: the kernels' shared modules and fastpath.shared. Routed by routing/embedding_route.py.
"""
