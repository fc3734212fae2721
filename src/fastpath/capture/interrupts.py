"""Ctrl-C while a capture sets up: stop at the first one, at once.

Why: Python runs a SIGINT handler only between bytecodes of the main thread. Building a target
spends most of its time inside single C calls (one `normal_` over a 248k x 5120 embedding took 10 s
on a 2-core CPU; reading a checkpoint shard is one call), so the first Ctrl-C seemed to do nothing
and users pressed it again, or killed the process without being told what was kept.

While the guard is open, the C-level signal handler writes the signal number to a socket
(`signal.set_wakeup_fd`, documented for exactly this: wake another thread) and a watcher thread,
which runs as soon as the busy C call releases the GIL (torch's ops do), prints what was kept and
ends the process with status 130 (128 + SIGINT). That is only safe while nothing is being written:
the capture closes the guard before it first touches --out, and from there on Ctrl-C raises
KeyboardInterrupt between batches as usual, after the staged rows are written.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
from collections.abc import Callable
from typing import Any

_STOP = b"\x00"  # not a signal number: the guard closing


class ExitAtFirstInterrupt:
    """Context manager (main thread only; elsewhere, or with active=False, it does nothing):
    the first SIGINT prints `message()` on stderr and exits 130 at once. `close()` ends it early
    (idempotent); leaving the block closes it too."""

    def __init__(self, message: Callable[[], str], *, active: bool = True, code: int = 130) -> None:
        self.message, self.code = message, code
        self.active = active and threading.current_thread() is threading.main_thread()
        self._open = False

    def __enter__(self) -> ExitAtFirstInterrupt:
        if not self.active:
            return self
        self._reader, self._writer = socket.socketpair()
        self._writer.setblocking(False)
        self._old_fd = signal.set_wakeup_fd(self._writer.fileno(), warn_on_full_buffer=False)
        self._old_handler = signal.signal(signal.SIGINT, self._python_handler)
        self._thread = threading.Thread(target=self._watch, name="fastpath-capture-interrupt", daemon=True)
        self._thread.start()
        self._open = True
        return self

    @staticmethod
    def _python_handler(_signum: int, _frame: Any) -> None:
        """The main thread's part: nothing (the watcher ends the process)."""

    def _watch(self) -> None:
        while True:
            try:
                data = self._reader.recv(64)
            except OSError:
                return
            if not data or _STOP in data:
                return
            if signal.SIGINT in data:
                try:
                    text = self.message()
                except Exception as exc:  # the message must never keep the process alive
                    text = f"interrupted ({exc.__class__.__name__} while saying what was kept)"
                if text:
                    os.write(2, (text.rstrip("\n") + "\n").encode())
                os._exit(self.code)

    def close(self) -> None:
        if not self._open:
            return
        self._open = False
        signal.set_wakeup_fd(self._old_fd)
        signal.signal(signal.SIGINT, self._old_handler)
        try:
            self._writer.send(_STOP)
        except OSError:
            pass
        self._thread.join(timeout=5)
        self._reader.close()
        self._writer.close()

    def __exit__(self, *exc: object) -> None:
        self.close()
