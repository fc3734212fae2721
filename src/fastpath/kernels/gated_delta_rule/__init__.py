"""The gated delta rule's backward piece that FLA refuses on Hopper with Triton [3.4, 3.7.1)
(fla-org/flash-linear-attention#640), for fastpath's FLA route.

interface.py is the entry point (chunk_bwd_dqkwg and unsupported_reason, put into FLA by
routing/fla_backend.py); dqkwg.py holds them: FLA's `chunk_bwd_dqkwg` recomputed in PyTorch
(batched matmuls, no Triton, so it is named after the FLA function it replaces, not a pass);
naive.py is the token-by-token gated delta rule it is checked against.
May import: the kernels' shared modules and fastpath.shared.
"""
