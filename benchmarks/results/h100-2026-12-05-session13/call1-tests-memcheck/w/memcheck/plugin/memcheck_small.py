"""pytest plugin for memcheck runs: every Hypothesis test draws at most MEMCHECK_EXAMPLES
examples (its own @settings stay otherwise as written)."""

import os


def pytest_collection_modifyitems(items):
    cap = int(os.environ.get("MEMCHECK_EXAMPLES", "4"))
    try:
        from hypothesis import settings
    except ImportError:
        return
    for item in items:
        fn = getattr(item, "obj", None)
        current = getattr(fn, "_hypothesis_internal_use_settings", None)  # read at each call
        if current is not None and current.max_examples > cap:
            fn._hypothesis_internal_use_settings = settings(current, max_examples=cap)
