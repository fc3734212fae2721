"""The gated attention's output gate, x * sigmoid(gate), in one kernel each way (see interface.py)."""
