"""Call counters: which implementation each kernel entry point used.

Keys are "<op>:<impl>", op in {fwd, bwd, update, varlen_states}, impl in {triton, reference}.
Tests and `fastpath explain` read this to prove the fast path actually ran.
"""

from __future__ import annotations

from collections import Counter

CALLS: Counter[str] = Counter()


def reset() -> None:
    """Forget all counts (tests call this before exercising a path)."""
    CALLS.clear()
