"""route_probe: a route's same-function probe runs once per class and forward in a process, on
one thread, leaving the kernel counters as they were; an exception is not kept as a verdict."""

from __future__ import annotations

import importlib

import pytest
import torch

from fastpath.kernels.counters import CALLS
from fastpath.routing import gates_route, route_probe


@pytest.fixture(autouse=True)
def _fresh_verdicts():
    route_probe.forget()
    yield
    route_probe.forget()


def test_a_verdict_is_computed_once_per_key() -> None:
    runs: list[str] = []

    def compare(answer: str | None):
        def run() -> str | None:
            runs.append(str(answer))
            assert torch.get_num_threads() == 1  # the probe's tensors are tiny
            CALLS["probe_kernel:triton"] += 1  # a kernel the probe ran: not the user's call
            return answer
        return run

    CALLS["user_kernel:triton"] = 3
    threads = torch.get_num_threads()
    assert route_probe.probed(("A", "op", 1), compare(None)) is None
    assert route_probe.probed(("A", "op", 1), compare("ignored")) is None
    assert route_probe.probed(("B", "op", 1), compare("B differs")) == "B differs"
    assert route_probe.probed(("B", "op", 1), compare(None)) == "B differs"
    assert runs == ["None", "B differs"]
    assert torch.get_num_threads() == threads
    assert CALLS["user_kernel:triton"] == 3 and CALLS["probe_kernel:triton"] == 0
    route_probe.forget()
    assert route_probe.probed(("B", "op", 1), compare(None)) is None
    CALLS.clear()


def test_an_exception_is_not_kept() -> None:
    def broken() -> str | None:
        raise RuntimeError("the probe itself failed")

    threads = torch.get_num_threads()
    with pytest.raises(RuntimeError, match="the probe itself failed"):
        route_probe.probed(("C", "op", 1), broken)
    assert torch.get_num_threads() == threads
    assert route_probe.probed(("C", "op", 1), lambda: None) is None


def test_gates_probe_once_per_class_and_forward(monkeypatch) -> None:
    """The real probe of transformers' Qwen3.5 layer: the second ask is a lookup (the comparison
    is not run again: here it would raise); a subclass whose forward computes something else is
    its own key, probed, and rejected."""
    module = importlib.import_module("transformers.models.qwen3_5.modeling_qwen3_5")
    cls = module.Qwen3_5GatedDeltaNet
    assert gates_route.same_function(cls, gates_route.OP_GATES, module) is None
    compare = gates_route._compare

    def not_again(*args):
        raise AssertionError("probed twice")

    monkeypatch.setattr(gates_route, "_compare", not_again)
    assert gates_route.same_function(cls, gates_route.OP_GATES, module) is None
    monkeypatch.setattr(gates_route, "_compare", compare)

    class Doubled(cls):
        def forward(self, hidden_states, cache_params=None, attention_mask=None, **kwargs):
            return cls.forward(self, 2 * hidden_states)

    why = gates_route.same_function(Doubled, gates_route.OP_GATES, module)
    assert why is not None and "Doubled" in why
