"""The reference path kept honest: transformers' torch fallback, whatever compiled peers exist.

verify and bench compare the reference with the fast path (routing.engine enable/disable),
capture re-checks its rows on it (routing.engine.suspended); all three need the reference to
be the *torch fallback* on every machine, also where Dao's causal-conv1d or FLA is installed.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any

# The compiled packages transformers would bind instead of its torch fallbacks.
COMPILED_PEERS = ("causal_conv1d", "causal_conv1d_cuda", "fla")


@contextlib.contextmanager
def hidden_compiled_peers() -> Any:
    """While the model is built, make Dao causal-conv1d and FLA unimportable.

    Why: transformers 5.15+ binds causal_conv1d / FLA once, when it imports a modeling module,
    and disable() restores that binding. With the peers hidden at that moment the reference is
    the torch fallback, the spec, on every machine (with FLA bound instead, the reference
    backward even raises on Hopper with Triton < 3.7.1, FLA #640). They are importable again
    afterwards, so enable() can still route the gated delta rule to FLA. A modeling module
    imported before this keeps its binding; verify reports the reference's routes either way.
    """
    hidden = [name for name in COMPILED_PEERS if name not in sys.modules]
    for name in hidden:
        sys.modules[name] = None  # type: ignore[assignment]
    try:
        yield
    finally:
        for name in hidden:
            if sys.modules.get(name, False) is None:
                del sys.modules[name]
