"""Dao-AILab causal-conv1d 1.7.0 public surface, backed by fastpath's Triton kernels.

Usable as `sys.modules["causal_conv1d"]` (it imports its own submodules relatively), so
transformers, mamba_ssm and friends that `import causal_conv1d` get compiler-free kernels.
Holds causal_conv1d_interface (causal_conv1d_fn, causal_conv1d_update), causal_conv1d_varlen and
cpp_functions, each over kernels/causal_conv1d with Dao's names and argument order.
May import: kernels, shared. Imported by routing (the conv route, and the `causal_conv1d`
stand-in it installs for mamba_ssm) and by users as `fastpath.causal_conv1d`.
"""

__version__ = "1.7.0"
__fastpath__ = True

from fastpath.shared.extras import raise_one_line as _raise_one_line
from fastpath.shared.extras import requirement_error as _requirement_error

if _requirement_error("kernels") is not None:  # no torch: one line with the pip command, exit 2
    _raise_one_line(_requirement_error("kernels"))

from .causal_conv1d_interface import causal_conv1d_fn, causal_conv1d_update

__all__ = ["__fastpath__", "__version__", "causal_conv1d_fn", "causal_conv1d_update"]
