"""A captured hidden state's health facts in one pass: finite, non-zero, not constant, not the
same at every position, and its mean per-token norm.

interface.py (entry point: state_stats), fwd.py (the one-pass Triton reduction), naive.py (the
spec). May import: the kernels' shared modules and fastpath.shared. Used by capture/checks.py.
"""
