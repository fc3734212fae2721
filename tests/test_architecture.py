"""The rules of the house, checked on the source tree (README: Architecture).

Read with `ast`, so a rule breaks the build the moment an import crosses a room's wall.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "src" / "fastpath"


def _imports(path: Path) -> set[str]:
    """Every module a file imports, absolute names (relative imports resolved against fastpath)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join(path.relative_to(PKG.parent).with_suffix("").parts[:-node.level])
                names.add(f"{base}.{node.module}" if node.module else base)
            elif node.module:
                names.add(node.module)
    return names


def _room(room: str) -> list[Path]:
    return sorted((PKG / room).rglob("*.py"))


def test_rooms_exist():
    for room in ("doctor", "kernels", "routing", "proof"):
        assert (PKG / room / "__init__.py").is_file(), room


def test_probe_is_stdlib_only():
    stdlib = set(sys.stdlib_module_names)
    for name in _imports(PKG / "doctor" / "probe.py"):
        assert name.split(".")[0] in stdlib, f"probe.py imports {name}"


@pytest.mark.parametrize("path", _room("kernels"), ids=lambda p: str(p.relative_to(PKG)))
def test_kernels_never_import_routing_doctor_or_proof(path: Path):
    bad = {n for n in _imports(path)
           if n.startswith(("fastpath.routing", "fastpath.doctor", "fastpath.proof"))}
    assert not bad, f"{path.name} imports {sorted(bad)}"


@pytest.mark.parametrize("room", ["doctor", "kernels", "proof"])
def test_only_routing_touches_other_libraries_internals(room: str):
    """Outside routing/, nothing imports transformers' or FLA's internals (modeling files, ops)."""
    for path in _room(room):
        for name in _imports(path):
            assert not name.startswith(("transformers.models", "transformers.integrations",
                                        "fla.ops", "fla.modules")), f"{path} imports {name}"


def test_doctor_does_not_import_kernels_routing_or_proof():
    for path in _room("doctor"):
        bad = {n for n in _imports(path)
               if n.startswith(("fastpath.kernels", "fastpath.routing", "fastpath.proof"))}
        assert not bad, f"{path.name} imports {sorted(bad)}"


def test_import_fastpath_is_light():
    code = ("import sys, fastpath, fastpath.cli, fastpath.known_issues; "
            "print(sorted(m for m in ('torch', 'triton', 'transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
