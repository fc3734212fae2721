"""Every test file and script the device harness names exists (benchmarks/device/*.sh). The
device runs them from a fresh copy of the tree with minutes of budget: a path left behind by a
rename there costs a call; here it costs a second."""

from __future__ import annotations

import re

import pytest
from repo_paths import BENCHMARKS, ROOT

SCRIPTS = sorted((BENCHMARKS / "device").glob("*.sh"))
# the folder variables the scripts define for test paths (parts.sh: k, r, p; memcheck.sh: kt)
FOLDERS = {"k": "tests/kernels", "kt": "tests/kernels", "r": "tests/routing", "p": "tests/proof"}
# paths inside state-spaces/mamba's checkout (peer.sh, pack_peer_tests.sh), not this repository
UPSTREAM = ("tests/ops/",)
PATH = re.compile(r"(?:\$(?P<var>[a-z]+)/|(?<![\w$/.-]))(?P<rel>(?:tests|benchmarks|scripts)?[\w/.-]*?"
                  r"[\w-]+\.(?:py|sh))\b")


def _named_paths(text: str) -> set[str]:
    found = set()
    for m in PATH.finditer(text):
        var, rel = m.group("var"), m.group("rel")
        if var is not None:
            if var in FOLDERS:
                found.add(f"{FOLDERS[var]}/{rel}")
        elif rel.startswith(("tests/", "benchmarks/", "scripts/")) and not rel.startswith(UPSTREAM):
            found.add(rel)
    return found


def test_the_scripts_define_the_folders_assumed_here() -> None:
    text = "\n".join(p.read_text() for p in SCRIPTS)
    for var, folder in FOLDERS.items():
        assert re.search(rf"\b{var}={re.escape(folder)}\b", text), (var, folder)


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_every_named_path_exists(script) -> None:
    named = _named_paths(script.read_text())
    missing = sorted(p for p in named if not (ROOT / p).exists())
    assert not missing, missing
