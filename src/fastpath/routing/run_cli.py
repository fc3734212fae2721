"""`fastpath run -- CMD ...` arguments and entry point: check the command and the FASTPATH_*
switches once, here, then exec CMD in routing/launcher.py's environment, so every Python process
of it runs with fastpath.enable() applied."""

from __future__ import annotations

import argparse
import os
import shutil
import sys

from fastpath.routing.launcher import launch_environment
from fastpath.shared.errors import UsageError


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
