"""The route table (routing/routes.py) is what enable(), disable(), suspended(), explain() and
EnableReport run: every entry is well formed, each routed op belongs to one route, the entries'
decisions are the report's, and a route added to the table is patched, explained, suspended and
undone with no other change (a route defined here, on a module this test writes)."""

from __future__ import annotations

import dataclasses
import importlib
import sys
from types import ModuleType
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import fastpath
from fastpath.routing import engine as tf_routing
from fastpath.routing import routes
from fastpath.routing.routes import ROUTES, Route, Session


@pytest.fixture(autouse=True)
def _always_disable():
    fastpath.disable()
    yield
    fastpath.disable()


def test_every_entry_is_a_frozen_route_with_a_unique_name_and_unique_ops() -> None:
    names = [r.name for r in ROUTES]
    assert len(set(names)) == len(names)
    ops = [op for r in ROUTES for op in r.ops]
    # one op name two routes own: Mamba-1's and Mamba-2's decode update (explain tells them apart
    # by the layer's module)
    assert {op for op in ops if ops.count(op) > 1} == {"selective_state_update"}, ops
    for r in ROUTES:
        assert isinstance(r, Route) and callable(r.detect)
        with pytest.raises(dataclasses.FrozenInstanceError):
            r.name = "other"  # type: ignore[misc]
    assert set(routes.SUMMARY_ORDER) == set(names)
    # the Hub wrappers are seen through before any route reads a global; the conv recomputes the
    # <=5.14 gates after every route that sets kernel globals
    assert names[0] == "hub_kernels"
    assert names.index("causal_conv1d") > max(names.index(n) for n in ("mamba_ssd", "mamba1_scan",
                                                                         "gated_delta_rule", "kda"))
    assert routes.route_of_op("zc_rmsnorm") == "zc_norm" and routes.route_of_op("rmsnorm") is None


def test_the_report_is_filled_from_the_table_decisions() -> None:
    report = fastpath.enable(warn=False)
    session = tf_routing._STATE.session  # type: ignore[union-attr]
    assert set(session.decisions) == {r.name for r in ROUTES}
    assert report.zc_norm == session.decisions["zc_norm"].impl
    assert report.glue == session.decisions["glue"].impl
    assert report.mamba_ssd == session.decisions["mamba_ssd"].impl
    assert report.gated_norm == session.decisions["gated_norm"].impl
    summary = report.summary()
    for r in ROUTES:
        for line in r.summary(report):
            assert line.strip().split()[0] in summary


_MODULE = '''
def kernel(x):
    return x + 1
'''


def test_one_table_entry_is_a_whole_route(tmp_path, monkeypatch) -> None:
    """A route added to the table: enable() detects, installs and patches it (modules found and
    modules imported later), explain() shows its rows, suspended() and disable() undo it."""
    (tmp_path / "fake_modeling.py").write_text(_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("fake_modeling")
    original = module.kernel
    seen: list[str] = []

    @dataclasses.dataclass
    class Decision:
        route: bool = True

    def patch(mod: ModuleType, d: Decision, s: Session) -> None:
        seen.append(mod.__name__)
        s.registry.set_attr(mod, "kernel", lambda x: x + 2)

    def rows(layer: Any, device: str) -> list[tuple[str, str, bool]]:
        return [("toy_op", "toy kernel", True)] if type(layer).__name__.endswith("DecoderLayer") else []

    toy = Route("toy", ("toy_op",), lambda s: Decision(), patch=patch, explain_layer=rows)
    monkeypatch.setattr(routes, "ROUTES", (*ROUTES, toy))
    monkeypatch.setattr(tf_routing, "ROUTES", routes.ROUTES)
    monkeypatch.setattr(tf_routing, "discover_modeling_modules", lambda: ["fake_modeling"])
    fastpath.enable(warn=False)
    assert seen == ["fake_modeling"] and module.kernel(1) == 3
    from test_zc_norm_route import tiny_qwen3_5

    table = fastpath.explain(tiny_qwen3_5())
    assert {r["layer"] for r in table.rows if r["op"] == "toy_op"} == {"model.layers.0", "model.layers.1"}
    with tf_routing.suspended():
        assert module.kernel is original
    assert module.kernel(1) == 3
    fastpath.disable()
    assert module.kernel is original
    del sys.modules["fake_modeling"]
