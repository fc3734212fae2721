"""Which optional dependencies each feature needs, and the one line that says how to get them.

`pip install fastpath-kit` is the doctor alone (rich, packaging). The kernels, enable(), verify
and `fastpath run` need torch (and Triton for the kernels to be fast); bench also draws a chart
with matplotlib. Decided here once, read by the CLI commands, the lazy API in fastpath/__init__
and the Dao-compatible face, so a missing package is always one line naming the exact
`pip install` (exit 2), never a ModuleNotFoundError traceback.
"""

from __future__ import annotations

import importlib.util
import sys
from typing import Any

from fastpath.shared.errors import UsageError

DIST = "fastpath-kit"

# feature -> (what the user called, the extra that brings it, modules it cannot work without)
FEATURES: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "kernels": ("fastpath.causal_conv1d", "kernels", ("torch",)),
    "enable": ("fastpath.enable()", "kernels", ("torch",)),
    "run": ("fastpath run", "kernels", ("torch",)),
    "explain": ("fastpath.explain()", "kernels", ("torch",)),
    "verify": ("fastpath verify", "kernels", ("torch", "transformers")),
    "warmup": ("fastpath warmup", "kernels", ("torch", "transformers")),
    "bench": ("fastpath bench", "bench", ("torch", "transformers")),
    "chart": ("bench's chart", "bench", ("matplotlib",)),
    "capture": ("fastpath capture", "capture", ("torch", "transformers", "safetensors")),
    "liger": ("Liger Kernel composition (bench's +liger configurations, verify --liger)", "train",
              ("torch", "transformers", "liger_kernel")),
}


class MissingDependency(UsageError, ModuleNotFoundError):
    """An optional dependency is absent. A UsageError (exit 2 from the CLI) and an ImportError
    (what callers of an API already catch for missing packages)."""

    def __init__(self, message: str, module: str) -> None:
        super().__init__(message)
        self.name = module


def install_line(extra: str) -> str:
    """The pip line that adds `extra` to this installation. fastpath-kit is not on PyPI: an
    install from a checkout (`pip install .`, `-e .`) records the folder in its PEP 610
    direct_url.json, and the line names that folder; otherwise the distribution's name."""
    return f'pip install "{_install_source()}[{extra}]"'


def _install_source() -> str:
    """The checkout folder pip recorded, from the first fastpath-kit metadata that has a PEP 610
    record. A source tree on sys.path ahead of site-packages also holds setuptools' build-time
    `src/fastpath_kit.egg-info` (no direct_url.json): that copy must not hide the installed one."""
    import json
    from importlib import metadata
    from urllib.parse import unquote, urlparse

    try:
        found = list(metadata.distributions(name=DIST))
    except Exception:
        return DIST
    for dist in found:
        try:
            url = json.loads(dist.read_text("direct_url.json") or "{}").get("url", "")
        except Exception:
            continue
        parsed = urlparse(url)
        if parsed.scheme == "file" and parsed.path:
            return unquote(parsed.path)
    return DIST


def missing_modules(modules: tuple[str, ...]) -> list[str]:
    """Modules of `modules` that cannot be imported here (None entries in sys.modules count)."""
    out = []
    for name in modules:
        if name in sys.modules:
            if sys.modules[name] is None:
                out.append(name)
            continue
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            out.append(name)
    return out


def requirement_error(feature: str) -> MissingDependency | None:
    """The error `require(feature)` would raise, or None when everything is importable."""
    display, extra, modules = FEATURES[feature]
    missing = missing_modules(modules)
    if not missing:
        return None
    what = " and ".join(missing)
    verb = "is" if len(missing) == 1 else "are"
    return MissingDependency(f"{display} needs {what}, which {verb} not installed; run: {install_line(extra)}",
                             missing[0])


def require(feature: str) -> None:
    """Raise MissingDependency (one line: what is missing and the pip command) when needed."""
    error = requirement_error(feature)
    if error is not None:
        raise error


def require_for_api(feature: str) -> None:
    """require() for a public API call: when the error reaches the top of a script uncaught, it is
    printed as one line and the process exits with status 2 instead of a traceback."""
    error = requirement_error(feature)
    if error is None:
        return
    raise_one_line(error)


def raise_one_line(error: MissingDependency) -> None:
    """Raise `error`; if it reaches the top of a script uncaught, one line and exit 2."""
    _install_one_line_hook()
    raise error


def _install_one_line_hook() -> None:
    previous = sys.excepthook
    if getattr(previous, "__fastpath_one_line__", False):
        return

    def hook(kind: type[BaseException], value: BaseException, tb: Any) -> None:
        if not isinstance(value, MissingDependency):
            previous(kind, value, tb)
            return
        print(f"fastpath: error: {value}", file=sys.stderr)
        if hasattr(sys, "ps1") or sys.flags.interactive:
            return  # an interactive session keeps running
        sys.stdout.flush()
        sys.stderr.flush()
        import os

        os._exit(2)

    hook.__fastpath_one_line__ = True  # type: ignore[attr-defined]
    sys.excepthook = hook
