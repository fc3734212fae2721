"""Integrations that route other libraries (transformers) to fastpath's kernels."""
