"""Qwen3.5 / Qwen3-Next zero-centred RMSNorm, y = rmsnorm(x) * (1 + w), one kernel each way (see interface.py)."""
