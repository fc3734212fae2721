"""A route's same-function probe, run once per class and forward in a process.

The glue and LM-head routes check, before they replace a class's ``forward``, that fastpath's
forward computes what the original computes: a tiny float32 layer or model, forward and backward
through both, compared (gates_route, lm_head_route). The verdict depends only on the two
functions, so it is kept for the process, keyed by the class and the function object its
``forward`` is: enable() after disable(), or a second model of the same family, does not run the
probe again (each run is a forward and backward of both versions; under TRITON_INTERPRET=1 it took
a second or two per class, every enable()). A class whose ``forward`` was replaced since is a new
key, and probed.

Each probe runs on one CPU thread (its tensors are tiny; threads on a busy host cost seconds) and
leaves fastpath's kernel counters as they were: its calls are not the user's.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable

_VERDICTS: dict[tuple[Hashable, ...], str | None] = {}


def probed(key: tuple[Hashable, ...], compare: Callable[[], str | None]) -> str | None:
    """`compare()`'s verdict for `key` (None: the same function; else why not, one line), run the
    first time `key` is asked for. An exception is not a verdict: it propagates, nothing is kept."""
    if key in _VERDICTS:
        return _VERDICTS[key]
    import torch

    from fastpath.kernels.counters import CALLS

    threads, counts = torch.get_num_threads(), CALLS.copy()
    torch.set_num_threads(1)
    try:
        why = compare()
    finally:
        torch.set_num_threads(threads)
        CALLS.clear()
        CALLS.update(counts)
    _VERDICTS[key] = why
    return why


def forget() -> None:
    """Drop every kept verdict (a test that changes what a probe would see)."""
    _VERDICTS.clear()
