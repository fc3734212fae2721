"""Mamba-2 state-space (SSD) ops and their float references.

interface.py (entry point: mamba_chunk_scan_combined over torch custom ops) with the chunked
scan's Triton kernels (fwd.py, bwd.py, varlen.py, configs fitted by shared_memory.py);
update.py (the decode step, mamba_ssm's selective_state_update); split_conv_scan.py (the
fused training op, composed of fastpath's kernels); naive.py (specs, float64-capable).
This package re-exports mamba_chunk_scan_combined and naive's references.
May import: other kernel ops (causal_conv1d), the kernels' shared modules, fastpath.shared.
"""

from fastpath.kernels.ssd.interface import mamba_chunk_scan_combined
from fastpath.kernels.ssd.naive import (
    mamba_split_conv1d_scan_ref,
    selective_state_update_ref,
    ssd_chunked_ref,
    ssd_recurrent_ref,
)

__all__ = [
    "mamba_chunk_scan_combined",
    "mamba_split_conv1d_scan_ref",
    "selective_state_update_ref",
    "ssd_chunked_ref",
    "ssd_recurrent_ref",
]
