"""GatedDeltaNet's decay and beta gates in one kernel each way (see interface.py)."""
