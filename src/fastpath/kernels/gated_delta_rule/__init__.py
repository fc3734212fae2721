"""The gated delta rule's backward piece that FLA refuses on Hopper with Triton [3.4, 3.7.1)
(FLA #640), for fastpath's FLA route.

dqkwg.py recomputes the outputs of FLA's `chunk_bwd_dqkwg` in PyTorch (batched matmuls, no
Triton); naive.py is the token-by-token gated delta rule it is checked against.
Entry point: dqkwg.chunk_bwd_dqkwg, put into FLA by routing/fla_backend.py.
May import: the kernels' shared modules and fastpath.shared.
"""
