"""Errors that the CLI turns into one-line messages and exit codes."""

from __future__ import annotations


class FastpathError(Exception):
    """Base class: the message is shown as one line, never a traceback."""

    exit_code = 1


class UsageError(FastpathError):
    """Bad command-line usage or bad input (unknown preset, malformed config): exit 2."""

    exit_code = 2


class TargetError(FastpathError):
    """A target could not be diagnosed (unreachable, timed out, probe failed, no facts): exit 3."""

    exit_code = 3


def first_line(exc: BaseException, *, with_type: bool = False) -> str:
    """The first line of an exception's message, so reports stay one line.

    An exception without a message is named by its class; with_type prefixes the class name
    ("ValueError: bad shape") where the kind of failure matters to the reader.
    """
    lines = str(exc).strip().splitlines()
    name = exc.__class__.__name__
    if not lines:
        return name
    return f"{name}: {lines[0]}" if with_type else lines[0]
