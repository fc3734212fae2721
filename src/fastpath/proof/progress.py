"""Progress of long verify / bench work, on stderr (stdout stays clean for --json).

In a terminal: a rich status line with a spinner and the elapsed time. Piped or redirected:
one plain line per stage, `[  12.3s] verify: reference path: forward`, so logs show where the
time went. Every stage line says how long the previous one took.
"""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO


class Stages:
    """Context manager; call it with a stage description each time the work moves on."""

    def __init__(self, command: str, stream: TextIO | None = None, rich: bool | None = None) -> None:
        self.command = command
        self.stream = stream if stream is not None else sys.stderr
        self.rich = self.stream.isatty() if rich is None else rich
        self.start = time.perf_counter()
        self.current: str | None = None
        self._status: Any = None

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def __enter__(self) -> Stages:
        if self.rich:
            from rich.console import Console

            self._status = Console(file=self.stream).status(f"{self.command}: starting", spinner="dots")
            self._status.__enter__()
        return self

    def __call__(self, stage: str) -> None:
        self.current = stage
        line = f"[{self.elapsed():7.1f}s] {self.command}: {stage}"
        if self._status is not None:
            self._status.console.print(line, style="dim", markup=False, highlight=False)
            self._status.update(line)
        else:
            print(_wrapped(line, "            "), file=self.stream, flush=True)

    def note(self, text: str) -> None:
        """A line that stays (the size estimate, a warning), in both modes; wrapped at word
        boundaries to the terminal's width (COLUMNS), continuation lines indented."""
        if self._status is not None:
            self._status.console.print(text, markup=False, highlight=False)
        else:
            print(_wrapped(f"{self.command}: {text}", "  "), file=self.stream, flush=True)

    def __exit__(self, *exc: object) -> None:
        if self._status is not None:
            self._status.__exit__(None, None, None)
            self._status = None
        if exc[0] is None:
            done = f"[{self.elapsed():7.1f}s] {self.command}: done"
            if self.rich:
                from rich.console import Console

                Console(file=self.stream).print(done, markup=False, highlight=False)
            else:
                print(done, file=self.stream, flush=True)


def _wrapped(text: str, indent: str) -> str:
    """`text` wrapped at word boundaries to the terminal's width (COLUMNS), never cutting a word."""
    import shutil
    import textwrap

    return "\n".join(textwrap.wrap(text, shutil.get_terminal_size().columns, subsequent_indent=indent,
                                   break_long_words=False, break_on_hyphens=False)) or text
