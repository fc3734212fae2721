"""Depthwise causal conv1d (+ optional SiLU): forward, backward, the decode update, varlen states.

interface.py is the entry point (torch custom ops, autograd, Triton-or-reference dispatch) over
the Triton kernels: fwd_bwd_rows.py for channel-last inputs, fwd_tile.py / bwd_tile.py for the
rest (both through launchers.py, with common.py), update.py (decode) and varlen.py; naive.py is
the float reference, after Dao's 1.7.0 `*_ref` functions. The engine behind `fastpath.causal_conv1d`.
May import: the kernels' shared modules (dispatch, counters, compiled_launch) and fastpath.shared.
"""
