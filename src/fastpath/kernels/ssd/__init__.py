"""Mamba-2 state-space (SSD) ops: the chunked scan (Triton forward and backward, float reference
fallback), with float64-capable torch specs of the decode update and the fused split-conv op in
naive.py."""

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
