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


ROOMS = ("shared", "doctor", "kernels", "causal_conv1d", "routing", "models", "proof", "capture")

# What each room may import from the others (README: Architecture). Floors, bottom to top:
# shared -> kernels -> causal_conv1d (the Dao-compatible public face) -> routing -> models ->
# proof | capture; the doctor stands apart on shared alone (it runs on login nodes and image
# builders without torch).
MAY_IMPORT = {
    "shared": set(),
    "doctor": {"shared"},
    "kernels": {"shared"},
    "causal_conv1d": {"kernels", "shared"},
    "routing": {"kernels", "causal_conv1d", "shared"},
    "models": {"kernels", "routing", "shared"},
    "proof": {"kernels", "routing", "models", "shared"},
    "capture": {"kernels", "routing", "models", "shared"},
}
# The package root's own modules: the public face (__init__), the command line and its entry.
ROOT_MODULES = {"__init__.py", "__main__.py", "_version.py", "cli.py"}


def test_every_module_is_in_a_room_or_the_root():
    """The rules below see every file: a module outside the rooms would escape them."""
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG)
        assert rel.parts[0] in ROOMS or (len(rel.parts) == 1 and rel.name in ROOT_MODULES), rel
    data = {p.name for p in PKG.iterdir() if p.is_dir() and p.name != "__pycache__"} - set(ROOMS)
    assert data == {"presets"} and not list((PKG / "presets").rglob("*.py")), data


def test_the_root_imports_rooms_only_inside_functions():
    """cli.py and the package root import the rooms lazily (`import fastpath` stays light): at
    module level, only the shared layer, _version and (for __main__) cli."""
    for name in ROOT_MODULES:
        tree = ast.parse((PKG / name).read_text())
        for node in tree.body:
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("fastpath"):
                assert node.module.startswith(("fastpath.shared", "fastpath._version", "fastpath.cli")), \
                    (name, node.module)


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
    code = ("import sys, fastpath, fastpath.cli, fastpath.shared.known_issues; "
            "print(sorted(m for m in ('torch', 'triton', 'transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_every_fastpath_import_names_a_module_or_package_of_the_tree():
    """A moved module leaves no import behind (relative ones included), even inside functions."""
    for path in sorted(PKG.rglob("*.py")):
        for name in _imports(path):
            parts = name.split(".")
            if parts[0] != "fastpath":
                continue
            base = PKG.parent.joinpath(*parts)
            found = base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()
            assert found, f"{path.relative_to(PKG)} imports {name}"
