"""Where things are, for tests at any depth and for the workers here: the repository root (the
folder holding pyproject.toml), src/, this support folder, the side-by-side venvs and fla."""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

SUPPORT = Path(__file__).resolve().parent
ROOT = next(p for p in SUPPORT.parents if (p / "pyproject.toml").is_file())
SRC = ROOT / "src"
BENCHMARKS = ROOT / "benchmarks"
# scripts/setup_transformers_matrix.sh, setup_clients.sh, setup_fla.sh install here
VENVS = Path(os.environ.get("FASTPATH_VENVS", ROOT / ".venvs"))


def import_benchmark(name: str) -> ModuleType:
    """benchmarks/<name>.py as a module, sys.path restored after the import: the scripts put
    benchmarks/ and src/ first on it, and a source tree ahead of site-packages changes what
    importlib.metadata finds for every later test in the process."""
    saved = list(sys.path)
    sys.path.insert(0, str(BENCHMARKS))
    try:
        return importlib.import_module(name)
    finally:
        sys.path[:] = saved


def fla_aside() -> str | None:
    """fla-core installed aside (FASTPATH_FLA_PATH, or .venvs/fla from scripts/setup_fla.sh; never
    into the test interpreter): the directory to put on sys.path, None if there is none."""
    env = os.environ.get("FASTPATH_FLA_PATH")
    for cand in ([env] if env else []) + [str(ROOT / ".venvs" / "fla")]:
        if cand and (Path(cand) / "fla" / "__init__.py").is_file():
            return cand
    return None


def fla_path() -> str | None:
    """Directory to put on sys.path for fla, '' if this python has it, None if absent."""
    aside = fla_aside()
    if aside is not None:
        return aside
    return "" if importlib.util.find_spec("fla") is not None else None


def venv_python(version: str) -> Path:
    """The interpreter of `.venvs/tf-<version>` (it may not exist: see venv_missing)."""
    return VENVS / f"tf-{version}" / "bin" / "python"


def venv_missing(version: str) -> str:
    """The skip reason of a test whose `.venvs/tf-<version>` is absent: the reason its setup script
    left in `.venvs/tf-<version>.unbuilt` (scripts/setup_default_stack.sh on a short disk), else
    which script builds it."""
    unbuilt = VENVS / f"tf-{version}.unbuilt"
    if unbuilt.is_file():
        return f"transformers {version} venv not built: {unbuilt.read_text().strip()}"
    script = "setup_default_stack.sh" if version == "default" else "setup_transformers_matrix.sh"
    return f"transformers {version} venv missing (run scripts/{script})"
