"""The FASTPATH_* switches (the route table's `switches`, routing/routes.check_switches): a bad
value is one UsageError naming the variable, raised by enable() before it changes anything and
by verify, bench and capture before any work (a kernel's switch used to be read first at the
kernel's first call, after verify's whole reference side had run)."""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from tiny_configs import QWEN35_2L

import fastpath
import fastpath.routing
from fastpath.kernels.selective_scan import interface as sscan
from fastpath.routing import engine
from fastpath.routing.routes import ROUTES, check_switches
from fastpath.shared.errors import UsageError

# (variable, a value it refuses)
BAD = [
    ("FASTPATH_HUB_KERNELS", "sometimes"),
    ("FASTPATH_SSCAN_FWD", "fast"),
    ("FASTPATH_SSCAN_BWD", "parallel"),
    ("FASTPATH_FLA_DQKWG", "maybe"),
    ("FASTPATH_FLA_NORM", "maybe"),
    ("FASTPATH_GLUE", "maybe"),
    ("FASTPATH_ZC_NORM", "maybe"),
    ("FASTPATH_SWIGLU", "maybe"),
    ("FASTPATH_EMBEDDING", "maybe"),
    ("FASTPATH_LM_LOSS", "sometimes"),
    ("FASTPATH_AUTOTUNE_DECISIONS", "/no/such/decisions.json"),
]


@pytest.fixture(autouse=True)
def _clean(monkeypatch):
    for name, _ in BAD:
        monkeypatch.delenv(name, raising=False)
    fastpath.disable()
    yield
    fastpath.disable()


def test_unset_switches_pass() -> None:
    check_switches()


@pytest.mark.parametrize(("name", "value"), BAD)
def test_a_bad_value_is_one_usage_error_naming_the_variable(monkeypatch, name: str, value: str) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(UsageError) as err:
        check_switches()
    assert name in str(err.value) or "autotune decisions" in str(err.value)
    assert "\n" not in str(err.value)


def test_every_switch_reader_is_in_the_table() -> None:
    """Each routing module's route_mode() and the selective scan's kernel choices are somebody's
    switches: a route added with a mode of its own cannot escape the up-front check."""
    readers = {read for r in ROUTES for read in r.switches}
    for info in pkgutil.iter_modules(fastpath.routing.__path__):
        module = importlib.import_module(f"fastpath.routing.{info.name}")
        mode = getattr(module, "route_mode", None)
        if callable(mode) and getattr(mode, "__module__", None) == module.__name__:
            assert mode in readers, info.name
    assert {sscan.fwd_kernel, sscan.bwd_kernel} <= readers


def test_enable_refuses_a_bad_switch_before_changing_anything(monkeypatch) -> None:
    first = fastpath.enable(warn=False)
    state = engine._STATE
    assert state is not None and first is not None
    monkeypatch.setenv("FASTPATH_SSCAN_BWD", "parallel")
    with pytest.raises(UsageError, match="FASTPATH_SSCAN_BWD='parallel'"):
        fastpath.enable(warn=False)
    assert engine._STATE is state  # the earlier routing stands, untouched


@pytest.mark.parametrize("command", ["verify", "bench", "capture"])
def test_commands_refuse_a_bad_switch_in_one_line_before_any_work(monkeypatch, tmp_path: Path, capsys,
                                                                   command: str) -> None:
    import json

    from fastpath.cli import main

    model = tmp_path / "qwen35.json"
    model.write_text(json.dumps(QWEN35_2L))
    out = tmp_path / "out"
    argv = {
        "verify": ["verify", str(model), "--seq-len", "8", "--batch", "1", "--backward"],
        "bench": ["bench", str(model), "--out", str(out)],
        "capture": ["capture", str(model), str(tmp_path / "data.jsonl"), "--out", str(out)],
    }[command]
    monkeypatch.setenv("FASTPATH_SSCAN_BWD", "parallel")
    code = main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and err[0] == (f"fastpath {command}: error: FASTPATH_SSCAN_BWD='parallel': "
                                        "expected one of chunked, seq"), err
    assert not out.exists()
