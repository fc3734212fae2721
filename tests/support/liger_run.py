"""A fresh interpreter on CPU with Liger's kernels adapted to Triton's interpreter
(liger_interpreter.install), running a snippet that prints one JSON line: what the bench and
verify +Liger tests (tests/proof/test_liger_*.py) run their configurations in."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

from repo_paths import ROOT, SRC, SUPPORT

PREAMBLE = f"""
import json, sys
sys.path.insert(0, {str(SUPPORT)!r})
from liger_interpreter import install
install()
"""


def run_with_liger(code: str) -> Any:
    """Run PREAMBLE + code under TRITON_INTERPRET=1 (Hub offline) and read its last stdout line."""
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(SRC), HF_HUB_OFFLINE="1")
    proc = subprocess.run([sys.executable, "-c", PREAMBLE + code], capture_output=True, text=True,
                          env=env, timeout=900, cwd=str(ROOT))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])
