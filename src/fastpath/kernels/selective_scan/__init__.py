"""Mamba-1 ops (mamba_ssm's selective_scan_fn, selective_state_update, mamba_inner_fn): the
selective scan as Triton kernels (forward and backward) with the float references of naive.py
beside them; the decode step shares the Mamba-2 update kernel (kernels/ssd/state_update.py)."""
