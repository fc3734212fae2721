"""FLA #640 is decided once (known_issues.fla_640): the doctor's verdict (rule fla-hopper-backward)
and enable()'s routing (fla_route.chunk_backward_unsafe, fla_backend.dqkwg_route_needed) must
agree on every Triton release around the guard, with and without TileLang, on sm_80/90/100.
https://github.com/fla-org/flash-linear-attention/issues/640 (guard narrowed to [3.4.0, 3.7.1)
by FLA PR #983)."""

from __future__ import annotations

import pytest
from fakeenv import seed_facts

from fastpath.doctor.diagnosis import diagnose
from fastpath.routing.fla_backend import dqkwg_route_needed
from fastpath.routing.fla_route import chunk_backward_unsafe

TRITONS = ("3.4.0", "3.6.0", "3.7.0", "3.7.1rc1", "3.7.1", "3.8.0")
AFFECTED = {"3.4.0", "3.6.0", "3.7.0", "3.7.1rc1"}  # 3.7.1rc1 sorts before 3.7.1


def _doctor_fires(cc: tuple[int, int], triton: str, tilelang: bool) -> bool:
    facts = seed_facts()
    for g in facts["gpus"]:
        g["compute_capability"] = f"{cc[0]}.{cc[1]}"
    facts["triton"]["version"] = triton
    facts["packages"]["triton"]["version"] = triton
    if tilelang:
        facts["packages"]["tilelang"] = {"version": "0.1.15", "so_files": [],
                                         "import": {"ok": True, "error_kind": None, "error": None}}
    return "fla-hopper-backward" in [f.id for f in diagnose(facts, "qwen3.5-27b").findings]


@pytest.mark.parametrize("cc", [(8, 0), (9, 0), (10, 0)])
@pytest.mark.parametrize("triton", TRITONS)
@pytest.mark.parametrize("tilelang", [False, True])
def test_doctor_and_enable_agree_on_fla_640(cc, triton, tilelang):
    doctor = _doctor_fires(cc, triton, tilelang)
    route = chunk_backward_unsafe(cc, triton, tilelang) is not None
    backend = dqkwg_route_needed(cc, triton, tilelang)
    expected = cc[0] == 9 and triton in AFFECTED and not tilelang
    assert doctor == route == backend == expected
