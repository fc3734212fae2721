"""Known-bad combinations, each decided once as a pure function of facts.

The doctor (rules) and the routing (enable()) both ask these functions, so a report and a routing
decision can never disagree. Only `packaging` is imported: the module is light and GPU-free.
"""

from __future__ import annotations

from packaging.version import InvalidVersion, Version

FLA_ISSUE_640 = "https://github.com/fla-org/flash-linear-attention/issues/640"

# FLA's own guard (fla/utils/env.py and fla/ops/common/chunk_o.py in fla-core 0.6.0; narrowed to
# this range by FLA PR #983): Hopper with Triton in [3.4.0, 3.7.1) and no TileLang backend.
_FLA_640_LOW = Version("3.4.0")
_FLA_640_HIGH = Version("3.7.1")


def parse_version(text: str | None) -> Version | None:
    """A package version as `packaging` reads it (rc/dev/local parts kept), or None if unreadable."""
    if not text:
        return None
    try:
        return Version(str(text).strip())
    except InvalidVersion:
        return None


def fla_640(compute_capability: tuple[int, int] | None, triton_version: str | None,
            tilelang_available: bool) -> bool:
    """True where FLA refuses its gated chunk backward (`chunk_bwd_dqkwg`) because of FLA #640.

    Compared the way FLA compares (`packaging`), so 3.7.1rc1 is still affected and 3.7.1 is not.
    An unknown device or Triton version is not affected: nothing is claimed without the facts.
    """
    if compute_capability is None or tilelang_available or compute_capability[0] != 9:
        return False
    tv = parse_version(triton_version)
    return tv is not None and _FLA_640_LOW <= tv < _FLA_640_HIGH
