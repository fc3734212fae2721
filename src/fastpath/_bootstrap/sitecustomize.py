"""Start-up hook put on PYTHONPATH by `fastpath run`: apply fastpath.enable(), then chain.

Python imports the first `sitecustomize` it finds on sys.path; this one must not hide one the
environment already had (e.g. a distro or conda one), so after enabling it looks further down
sys.path for another `sitecustomize` and executes it. enable() itself imports no transformers:
it installs an import hook, so start-up stays cheap for processes that never use transformers.
"""

from __future__ import annotations

import importlib.util
import os
import sys


def _apply_enable() -> None:
    if os.environ.get("FASTPATH_ENABLE", "") not in ("1", "true", "yes"):
        return
    try:
        import fastpath

        fastpath.enable(warn=os.environ.get("FASTPATH_ENABLE_QUIET", "") != "1")
    except Exception as exc:  # never break the user's program at start-up
        print(f"fastpath run: enable() failed in pid {os.getpid()}: {exc}", file=sys.stderr)


def _chain_next_sitecustomize() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    for entry in sys.path:
        if not entry or os.path.abspath(entry) == here:
            continue
        candidate = os.path.join(entry, "sitecustomize.py")
        if os.path.isfile(candidate):
            spec = importlib.util.spec_from_file_location("_fastpath_chained_sitecustomize", candidate)
            if spec is None or spec.loader is None:
                return
            module = importlib.util.module_from_spec(spec)
            sys.modules["_fastpath_chained_sitecustomize"] = module
            spec.loader.exec_module(module)
            return


_apply_enable()
_chain_next_sitecustomize()
