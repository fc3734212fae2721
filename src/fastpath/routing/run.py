"""`fastpath run -- CMD ...`: run any program with fastpath.enable() applied, no code change.

How: prepend a directory holding fastpath's `sitecustomize.py` to PYTHONPATH and set
FASTPATH_ENABLE=1, then exec the command. Every Python process started below it (the command
itself, torchrun's workers, their children) imports `sitecustomize` at start-up, which calls
enable() when that process first imports transformers, and then chains to any sitecustomize
that was already on the path. Environment variables are inherited, so the whole process tree is
covered without touching its code.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

from fastpath.shared.errors import UsageError

ENABLE_ENV = "FASTPATH_ENABLE"
BOOTSTRAP_DIR = Path(__file__).resolve().parent / "_bootstrap"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--no-warn",
        action="store_true",
        help="do not print enable()'s one-line summary in each process",
    )
    parser.add_argument(
        "cmd",
        nargs=argparse.REMAINDER,
        metavar="-- COMMAND ...",
        help="the program to run, e.g. `fastpath run -- torchrun --nproc-per-node 8 train.py`",
    )


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


def main(args: argparse.Namespace) -> int:
    cmd = list(args.cmd or [])
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        raise UsageError("no command given; usage: fastpath run -- python train.py")
    from fastpath.shared.extras import require

    require("run")  # enable() in every process needs torch; say so once, here
    from fastpath.routing.routes import check_switches

    check_switches()  # a bad FASTPATH_* value stops here, not in each process of the program
    if shutil.which(cmd[0]) is None and not os.path.exists(cmd[0]):
        raise UsageError(f"command not found: {cmd[0]}")
    env = launch_environment(warn=not args.no_warn)
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvpe(cmd[0], cmd, env)
    except OSError as exc:  # e.g. not executable
        raise UsageError(f"cannot run {cmd[0]}: {exc.strerror or exc}") from None
    return 0  # unreachable: exec replaced this process
