"""Entry points of the gated delta rule op: what routing (routing/fla_backend.py) and the
benchmarks import, so every op folder is entered through its interface.py.

The implementation stays in dqkwg.py (PyTorch, no Triton: FLA's gated `chunk_bwd_dqkwg`
recomputed with batched matmuls where FLA refuses its kernel, fla-org/flash-linear-attention#640);
this module only re-exports it, so importing it costs what importing dqkwg.py costs.
"""

from __future__ import annotations

from fastpath.kernels.gated_delta_rule.dqkwg import (
    MATMUL_PATHS,
    chunk_bwd_dqkwg,
    floor_seconds,
    prepare_chunk_indices,
    unsupported_reason,
)

__all__ = [
    "MATMUL_PATHS",
    "chunk_bwd_dqkwg",
    "floor_seconds",
    "prepare_chunk_indices",
    "unsupported_reason",
]
