"""The pip line fastpath prints for a missing extra names where this installation came from,
even when a source tree with setuptools' build-time egg-info sits ahead of site-packages on
sys.path (a benchmark script that puts src/ first did exactly that inside the test run)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

CODE = ("import sys; sys.path[:0] = {front!r}\n"
        "from fastpath.shared.extras import install_line; print(install_line('bench'))\n")


def _line(front: list[str]) -> str:
    proc = subprocess.run([sys.executable, "-c", CODE.format(front=front)], capture_output=True,
                          text=True, timeout=60, check=True)
    return proc.stdout.strip()


def test_a_shadowing_egg_info_does_not_hide_the_recorded_checkout(tmp_path: Path) -> None:
    plain = _line([])
    if plain == 'pip install "fastpath-kit[bench]"':
        pytest.skip("fastpath-kit here was not installed from a checkout (no PEP 610 file URL)")
    shadow = tmp_path / "src"
    info = shadow / "fastpath_kit.egg-info"
    info.mkdir(parents=True)
    (info / "PKG-INFO").write_text("Metadata-Version: 2.1\nName: fastpath-kit\nVersion: 0.1.0\n")
    assert plain.startswith('pip install "/') and plain.endswith('[bench]"'), plain
    assert _line([str(shadow)]) == plain


def test_without_any_record_the_line_names_the_distribution(tmp_path: Path) -> None:
    """A wheel install has no direct_url.json: the line names fastpath-kit (a subprocess whose
    only fastpath-kit metadata is a bare dist-info; the package itself comes from src/)."""
    site = tmp_path / "site"
    info = site / "fastpath_kit-0.1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fastpath-kit\nVersion: 0.1.0\n")
    src = Path(__file__).resolve().parents[2] / "src"
    code = ("import sys; sys.path[:] = [p for p in sys.path if 'site-packages' not in p]\n"
            + CODE.format(front=[str(site), str(src)]))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == 'pip install "fastpath-kit[bench]"'
