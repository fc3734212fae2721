"""The `fastpath` command line: one sub-command per module, imported only when used.

Each command module exposes `add_arguments(parser)` and `main(args) -> int`, and keeps its
top-level imports light (no torch), so `fastpath --help` and `fastpath doctor` stay fast on a
login node without torch.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from fastpath._version import __version__
from fastpath.shared.errors import FastpathError

# command name -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "doctor": ("fastpath.doctor.doctor_cli", "diagnose the CUDA toolchain, kernel stack and a model's plan"),
    "run": ("fastpath.routing.run_cli", "run a Python program with fastpath.enable() applied"),
    "verify": ("fastpath.proof.verify_cli", "prove the fast path computes the same function on a model"),
    "bench": ("fastpath.proof.bench_cli", "time reference vs fast path on a model"),
    "capture": ("fastpath.capture.capture_cli", "dump a target's hidden states for EAGLE-3 drafter training, checked"),
    "warmup": ("fastpath.proof.warmup_cli", "compile and autotune a model's Triton kernels into the cache, once"),
}


class _Parser(argparse.ArgumentParser):
    """argparse that exits 2 with a one-line message (its default prints usage too)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"fastpath: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="fastpath", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"fastpath {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name, (module_name, help_text) in COMMANDS.items():
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:  # a command not built yet must not break the others
            if exc.name != module_name:
                raise
            continue
        cmd = sub.add_parser(name, help=help_text, description=help_text)
        module.add_arguments(cmd)
        cmd.set_defaults(_module=module)
    return parser


def _printable(exc: BaseException) -> str:
    """An error message as one inert, secret-free line: messages quote target output, file
    contents and prefixes, which may hold escapes (`\x1b[2J`) or passwords (`sshpass -p X`)."""
    from fastpath.shared.plain_text import plain
    from fastpath.shared.redact import redact_text

    return plain(redact_text(str(exc)[:8192]), 2000)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    try:
        return int(args._module.main(args))
    except FastpathError as exc:
        print(f"fastpath {args.command}: error: {_printable(exc)}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print(f"fastpath {args.command}: interrupted", file=sys.stderr)
        return 130
