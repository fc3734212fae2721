"""Host <- device synchronisations a piece of work makes on a GPU, by the Python line that asked.

A sync in the middle of a step leaves the GPU idle while the host launches the next kernels, so
a step whose kernels add up to less than its wall time usually has one. torch's sync debug mode
(`torch.cuda.set_sync_debug_mode`, https://pytorch.org/docs/stable/generated/torch.cuda.set_sync_debug_mode.html)
warns at each synchronising call; the warning's location is the Python line that made it.
"""

from __future__ import annotations

import collections
import warnings
from collections.abc import Callable
from typing import Any


def sync_points(run: Callable[[], Any], top: int = 30) -> list[dict[str, Any]]:
    """[{where: "file:line", what: first line of the warning, count}] of one `run()` (CUDA only)."""
    import torch

    seen: collections.Counter[tuple[str, str]] = collections.Counter()

    def note(message: Any, category: Any, filename: str, lineno: int, file: Any = None, line: Any = None) -> None:
        seen[(f"{filename}:{lineno}", str(message).splitlines()[0][:120])] += 1

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        previous, warnings.showwarning = warnings.showwarning, note
        torch.cuda.set_sync_debug_mode(1)
        try:
            run()
        finally:
            torch.cuda.set_sync_debug_mode(0)
            warnings.showwarning = previous
    return [{"where": where, "what": what, "count": n} for (where, what), n in seen.most_common(top)]
