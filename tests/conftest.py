"""Puts tests/support (the shared workers, fakes and paths) on sys.path for every test folder, and
gives the run Python's own Ctrl-C handling back when it was started with SIGINT ignored.

Why the second: a shell starts a background job (`cmd &`, nohup, some CI runners) with SIGINT
ignored, and Python then keeps it ignored, in pytest and in every child it starts. The tests that
send SIGINT (capture's and the doctor's interrupt handling) would then measure nothing. Installing
Python's default handler here makes SIGINT a KeyboardInterrupt in this process, and children start
with the default disposition again (exec resets a handled signal, not an ignored one).
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path

SUPPORT = str(Path(__file__).resolve().parent / "support")
if SUPPORT not in sys.path:
    sys.path.insert(0, SUPPORT)

if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
