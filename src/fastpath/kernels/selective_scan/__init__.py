"""Mamba-1 ops (mamba_ssm's selective_scan_fn, selective_state_update and mamba_inner_fn).

interface.py (entry point: selective_scan_fn over torch custom ops) with the Triton scans
(fwd_chunked.py, fwd_seq.py, fwd_tile.py, bwd.py, bwd_seq.py); update.py, the decode step
on the Mamba-2 update kernel (kernels/ssd/update.py); inner.py, the fused training op
composed of fastpath's ops; naive.py, the float references and runtime fallback.
May import: other kernel ops (ssd, causal_conv1d), the kernels' shared modules, fastpath.shared.
"""
