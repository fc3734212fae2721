"""Linear layers of one input: the input's gradient accumulated inside the GEMMs (interface.py)."""
