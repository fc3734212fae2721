"""Start-up hook put on PYTHONPATH by `fastpath run`: fastpath.enable() in every Python process.

Python imports the first `sitecustomize` on sys.path at start-up. This one (1) arranges for
fastpath.enable() to run the moment `transformers` is first imported (so processes that never
touch transformers, e.g. pip or a torchrun agent, do not pay for importing torch), and then
(2) executes the next `sitecustomize` further down sys.path, so one the environment already had
(distro, conda, a cluster's) keeps working. Environment variables are inherited, so children and
grandchildren (torchrun workers, DataLoader workers spawned fresh) get the same treatment.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys

_TRIGGER = "transformers"


def _enable_now() -> None:
    try:
        from fastpath.routing.engine import enable

        enable(warn=os.environ.get("FASTPATH_ENABLE_QUIET", "") != "1")
    except Exception as exc:  # never break the user's program at start-up
        print(f"fastpath run: enable() failed in pid {os.getpid()}: {type(exc).__name__}: {exc}",
              file=sys.stderr)


class _EnableOnTransformersImport(importlib.abc.MetaPathFinder):
    """Runs enable() right after the top-level `transformers` package has executed."""

    def find_spec(self, fullname, path, target=None):  # type: ignore[no-untyped-def]
        if fullname != _TRIGGER:
            return None
        sys.meta_path.remove(self)  # one shot; also avoids recursion below
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            _enable_now()
            return spec
        inner = spec.loader

        class _Loader(importlib.abc.Loader):
            def create_module(self, spec):  # type: ignore[no-untyped-def]
                return inner.create_module(spec)

            def exec_module(self, module):  # type: ignore[no-untyped-def]
                inner.exec_module(module)
                _enable_now()

            def __getattr__(self, name):  # type: ignore[no-untyped-def]
                return getattr(inner, name)

        spec.loader = _Loader()
        return spec


def _install() -> None:
    if os.environ.get("FASTPATH_ENABLE", "") not in ("1", "true", "yes"):
        return
    if _TRIGGER in sys.modules:
        _enable_now()
    else:
        sys.meta_path.insert(0, _EnableOnTransformersImport())


def _chain_next_sitecustomize() -> None:
    """Run the `sitecustomize` Python would have imported without us, found the way the import
    system finds it (a .py, a sourceless .pyc, a package, an empty entry meaning the current
    directory), and make it *the* `sitecustomize` module: `import sitecustomize` in the program
    then sees the user's attributes, not ours."""
    import importlib.machinery

    here = os.path.dirname(os.path.abspath(__file__))
    rest = [entry for entry in sys.path if os.path.abspath(entry or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    ours = sys.modules.get("sitecustomize")
    sys.modules["sitecustomize"] = module  # the import of us returns what sys.modules holds
    try:
        spec.loader.exec_module(module)
    except BaseException:
        if ours is not None:
            sys.modules["sitecustomize"] = ours
        raise


_install()
_chain_next_sitecustomize()
