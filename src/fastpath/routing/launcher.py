"""The environment that makes every Python process of a program call fastpath.enable(), with no
change to its code: what `fastpath run -- CMD ...` (routing/run_cli.py) executes the command in.

How: prepend a directory holding fastpath's `sitecustomize.py` to PYTHONPATH and set
FASTPATH_ENABLE=1, then exec the command. Every Python process started below it (the command
itself, torchrun's workers, their children) imports `sitecustomize` at start-up, which calls
enable() when that process first imports transformers, and then chains to any sitecustomize
that was already on the path. Environment variables are inherited, so the whole process tree is
covered without touching its code.
"""

from __future__ import annotations

import os
from pathlib import Path

ENABLE_ENV = "FASTPATH_ENABLE"
BOOTSTRAP_DIR = Path(__file__).resolve().parent / "_bootstrap"


def launch_environment(base: dict[str, str] | None = None, *, warn: bool = True) -> dict[str, str]:
    """The environment a command runs in: bootstrap dir first on PYTHONPATH, FASTPATH_ENABLE=1.

    The user's entries keep their order, empty ones included: an empty PYTHONPATH entry (`:x`,
    `x:`) means the current directory, which the program may rely on."""
    env = dict(os.environ if base is None else base)
    current = env.get("PYTHONPATH", "")
    parts = current.split(os.pathsep) if current else []
    boot = str(BOOTSTRAP_DIR)
    parts = [boot] + [p for p in parts if p != boot]
    env["PYTHONPATH"] = os.pathsep.join(parts)
    env[ENABLE_ENV] = "1"
    if not warn:
        env["FASTPATH_ENABLE_QUIET"] = "1"
    return env
