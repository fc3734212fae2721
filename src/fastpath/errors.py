"""Errors that the CLI turns into one-line messages and exit codes."""

from __future__ import annotations


class FastpathError(Exception):
    """Base class: the message is shown as one line, never a traceback."""

    exit_code = 1


class UsageError(FastpathError):
    """Bad command-line usage or bad input (unknown preset, malformed config): exit 2."""

    exit_code = 2


class TargetError(FastpathError):
    """A remote target could not be probed (unreachable, timed out, no output)."""

    exit_code = 1


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message ("" when it has none): reports stay one line."""
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else ""
