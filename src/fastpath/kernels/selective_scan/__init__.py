"""Mamba-1 ops (mamba_ssm's selective_scan_fn, selective_state_update and mamba_inner_fn).

interface.py (entry point: selective_scan_fn over torch custom ops) with the Triton scans
(scan_fwd.py, scan_fwd_seq.py, scan_fwd_tile.py, scan_bwd.py); state_update.py, the decode step
on the Mamba-2 update kernel (kernels/ssd/update.py); inner.py, the fused training op
composed of fastpath's ops; naive.py, the float references and runtime fallback.
May import: other kernel ops (ssd, causal_conv1d), the kernels' shared modules, fastpath.shared.
"""
