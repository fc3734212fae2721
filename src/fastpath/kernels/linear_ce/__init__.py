"""LM head + cross-entropy without the (N, V) logits, each GEMM once (see interface.py)."""
