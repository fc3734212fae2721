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


ROOMS = ("doctor", "kernels", "routing", "models", "proof", "capture")

# What each room may import from the others (README: Architecture). Floors, bottom to top:
# kernels -> routing -> models -> proof | capture; the doctor stands apart (it runs on login nodes
# and image builders without torch).
MAY_IMPORT = {
    "doctor": set(),
    "kernels": set(),
    "routing": {"kernels"},
    "models": {"kernels", "routing"},
    "proof": {"kernels", "routing", "models"},
    "capture": {"kernels", "routing", "models"},
}


def test_rooms_exist():
    for room in ROOMS:
        assert (PKG / room / "__init__.py").is_file(), room


@pytest.mark.parametrize("room", ROOMS)
def test_no_import_runs_up_a_floor_or_across(room: str):
    """A room imports only the rooms below it (doctor: none), so the import graph has no circle."""
    for path in _room(room):
        for name in _imports(path):
            parts = name.split(".")
            if parts[0] != "fastpath" or len(parts) < 2 or parts[1] not in ROOMS or parts[1] == room:
                continue
            assert parts[1] in MAY_IMPORT[room], f"{path.relative_to(PKG)} imports {name}"


def test_nothing_imports_the_package_root():
    """`import fastpath` / `from fastpath import enable` inside the package would run the public
    face (and its dependency checks) from below; modules import the module that defines a thing."""
    for path in sorted(PKG.rglob("*.py")):
        if path.name == "__init__.py" and path.parent == PKG:
            continue
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                assert "fastpath" not in {a.name for a in node.names}, f"{path} imports fastpath"
            elif isinstance(node, ast.ImportFrom) and node.module == "fastpath" and not node.level:
                faces = {a.name for a in node.names} - {"causal_conv1d"}
                assert not faces, f"{path} imports {sorted(faces)} from the package root"


def test_probe_is_stdlib_only():
    stdlib = set(sys.stdlib_module_names)
    for name in _imports(PKG / "doctor" / "probe.py"):
        assert name.split(".")[0] in stdlib, f"probe.py imports {name}"


@pytest.mark.parametrize("path", _room("kernels"), ids=lambda p: str(p.relative_to(PKG)))
def test_kernels_never_import_routing_doctor_or_proof(path: Path):
    bad = {n for n in _imports(path)
           if n.startswith(("fastpath.routing", "fastpath.doctor", "fastpath.proof"))}
    assert not bad, f"{path.name} imports {sorted(bad)}"


@pytest.mark.parametrize("room", ["doctor", "kernels", "models", "proof", "capture"])
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
