"""fastpath: put hybrid linear-attention models in transformers on their fast path.

`fastpath doctor` explains why a model runs the slow PyTorch fallback; `fastpath.enable()` routes
transformers to compiler-free Triton kernels; `fastpath verify` / `fastpath bench` prove it.
Heavy imports (torch, triton, transformers) happen only inside the functions that need them;
without them, a call says in one line which `pip install` brings them (fastpath/shared/extras.py).
"""

from __future__ import annotations

from typing import Any

from fastpath._version import __version__

__all__ = ["__version__", "assert_fast", "disable", "enable", "explain"]


def enable(**kwargs: Any) -> Any:
    """Route transformers' causal_conv1d (and safe FLA) calls to fastpath's kernels."""
    from fastpath.shared.extras import require_for_api

    require_for_api("enable")
    from fastpath.routing.engine import enable as _enable

    return _enable(**kwargs)


def disable() -> None:
    """Undo enable(): transformers takes the paths it would have taken without fastpath."""
    import sys

    if "fastpath.routing.engine" not in sys.modules:
        return  # enable() never ran in this process: nothing to undo
    from fastpath.routing.engine import disable as _disable

    _disable()


def explain(model: Any, width: int | None = None) -> Any:
    """For each layer of a live model, which implementation each op resolves to right now.

    str() of the result is a table that fits `width` columns (default: the terminal, else 100).
    """
    from fastpath.shared.extras import require_for_api

    require_for_api("explain")
    from fastpath.routing.engine import explain as _explain

    table = _explain(model)
    if width is not None:
        table.width = width
    return table


def assert_fast(model: Any) -> None:
    """Raise (with the explain() table) if any op of the model would take a torch fallback."""
    from fastpath.shared.extras import require_for_api

    require_for_api("explain")
    from fastpath.routing.engine import assert_fast as _assert_fast

    _assert_fast(model)
