"""Puts tests/support (the shared workers, fakes and paths) on sys.path for every test folder,
gives the run Python's own Ctrl-C handling back when it was started with SIGINT ignored, and spares
the Triton interpreter a listing it repeats on every call (tests/support/interpreter_speed.py).

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

import pytest

SUPPORT = str(Path(__file__).resolve().parent / "support")
if SUPPORT not in sys.path:
    sys.path.insert(0, SUPPORT)

if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# the Triton interpreter's per-call listing of tl's builtins, done once (tests/support/interpreter_speed.py)
__import__("interpreter_speed").install()


# Seconds each heavy test file takes on 2 cores (about: the sum of its tests in a full run's
# --durations report, 2 workers, less the cuts measured since; only the order matters).
# scripts/test.sh runs `--dist loadfile --no-loadscope-reorder`: files go to the two workers in
# collection order. A heavy file collected late (xdist's default order puts files with many tests
# first, and these have few) leaves one worker running it alone while the other sits idle: heavy
# ones first, longest first, keep both workers busy to the end. Other files keep their order.
HEAVY_FILES = {
    "tests/routing/test_enable_matrix.py": 600,
    "tests/routing/test_norm_route.py": 240,
    "tests/routing/test_liger_compose.py": 230,
    "tests/capture/test_capture.py": 220,
    "tests/kernels/test_kernel_compile_check.py": 200,
    "tests/routing/test_mamba_matrix.py": 170,
    "tests/routing/test_hub_wrappers_script.py": 160,
    "tests/kernels/selective_scan/test_benchmark_selective_scan_sweep.py": 100,
    "tests/proof/test_first_contact_findings.py": 75,
    "tests/proof/test_cold_start.py": 74,
    "tests/proof/test_model_profile.py": 58,
    "tests/routing/test_mamba1_matrix.py": 51,
    "tests/capture/test_capture_speed.py": 50,
}


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config,
                                   items: list[pytest.Item]) -> None:
    """Heavy files first, longest first; a stable sort, so each file's items stay together and in
    order, and every xdist worker computes the same order."""
    items.sort(key=lambda item: -HEAVY_FILES.get(item.nodeid.split("::", 1)[0], 0))
