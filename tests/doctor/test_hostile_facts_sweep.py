"""Swept: every field of the facts schema set to every wrong shape (strings,
numbers, lists, objects, null, huge numbers) still gives a diagnosis, a text report, a fleet row
and strict JSON, never an exception."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hostile_fakes import BASE_FACTS

from fastpath.doctor.diagnosis import diagnose
from fastpath.doctor.facts_check import SCHEMA
from fastpath.doctor.fleet import TargetResult, key_facts
from fastpath.doctor.inventory import Target
from fastpath.doctor.remote import arrived
from fastpath.doctor.report import render_text

WRONG = ["abc", "", "1.2.3.4.5.6.7", "-1.0", "9", -1, 0, 1e300, 2**70, True, [], {}, ["x"],
         [{}], [None], {"a": 1}, None]
RENDERED = ("abc", [None], {"a": 1})


def _base() -> dict[str, Any]:
    f = copy.deepcopy(BASE_FACTS)
    f["packages"] = {
        "causal-conv1d": {"version": "1.5", "module": "causal_conv1d",
                          "import": {"ok": False, "error_kind": "abi-mismatch", "error": "x"},
                          "so_files": [{"path": "/a.so", "sass": ["sm_90"], "ptx": []}]},
        "transformers": {"version": "4.57.0", "import": {"ok": True}}}
    f["nvcc_candidates"] = [{"path": "/usr/bin/nvcc", "kind": "nvcc", "version": "12.4",
                             "major": 12, "minor": 4, "found_by": ["PATH"]}]
    f["cuda_home"] = {"torch_would_use": "/usr/local/cuda", "how": "x", "has_nvcc": True,
                      "headers": {"cuda_runtime.h": True}, "nvcc_version": "12.4",
                      "diverge": True, "cuda_home_env": "/a", "cuda_path_env": "/b"}
    f["package_db"] = {"dpkg": [{"name": "cuda-nvcc-12-4", "version": "12.4"}], "rpm": []}
    return f


def _paths() -> list[list[Any]]:
    out: list[list[Any]] = []

    def walk(spec: Any, path: list[Any]) -> None:
        out.append(path)
        if isinstance(spec, dict):
            for k, v in spec.items():
                if not k.startswith("__"):
                    walk(v, [*path, k])
        elif isinstance(spec, tuple):
            walk(spec[1], [*path, 0 if spec[0] == "list" else "causal-conv1d"])

    for key, spec in SCHEMA.items():
        walk(spec, [key])
    return out


def _set(tree: Any, path: list[Any], value: Any) -> bool:
    for step in path[:-1]:
        if isinstance(tree, dict) and isinstance(tree.get(step), (dict, list)):
            tree = tree[step]
        elif isinstance(tree, list) and isinstance(step, int) and tree:
            tree = tree[step]
        else:
            return False
    if isinstance(tree, dict) or (isinstance(tree, list) and tree):
        tree[path[-1]] = value
        return True
    return False


@pytest.mark.parametrize("path", _paths(), ids=lambda p: ".".join(map(str, p)))
def test_wrong_shape_anywhere_is_survived(path: list[Any]) -> None:
    for value in WRONG:
        facts = _base()
        if not _set(facts, path, value):
            continue
        diagnosis = diagnose(arrived(facts), "qwen3-next")
        if value in RENDERED:  # rendering costs ~50 ms: three shapes per field
            assert render_text(diagnosis).strip()
        row = key_facts(TargetResult(Target("t", ["x"]), "ok", None, 0.1, diagnosis.facts,
                                     diagnosis))
        assert row["verdict"] in ("fast", "slow", "unknown")
        json.dumps(diagnosis.to_json(), allow_nan=False, default=str)
