"""Dao-AILab causal-conv1d 1.7.0 public surface, backed by fastpath's Triton kernels.

Usable as `sys.modules["causal_conv1d"]` (only relative imports inside), so transformers,
mamba_ssm and friends that `import causal_conv1d` get compiler-free kernels.
"""

__version__ = "1.7.0"
__fastpath__ = True

from fastpath.shared.extras import raise_one_line as _raise_one_line
from fastpath.shared.extras import requirement_error as _requirement_error

if _requirement_error("kernels") is not None:  # no torch: one line with the pip command, exit 2
    _raise_one_line(_requirement_error("kernels"))

from .causal_conv1d_interface import causal_conv1d_fn, causal_conv1d_update

__all__ = ["__fastpath__", "__version__", "causal_conv1d_fn", "causal_conv1d_update"]
