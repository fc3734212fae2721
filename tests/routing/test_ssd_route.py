"""In-process checks of the Mamba-2 routing on the system transformers (5.17): the enable() option,
mamba_ssm detection on fake installed packages, exact undo, the CPU branch without the
interpreter, and the module 5.0-5.14's lazy loader is seeded with."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest
import torch

import fastpath
from fastpath.kernels.counters import CALLS, reset
from fastpath.routing import ssd_route
from fastpath.shared.errors import UsageError

transformers = pytest.importorskip("transformers")
NEMOTRON = "transformers.models.nemotron_h.modeling_nemotron_h"


def _tiny_nemotron() -> torch.nn.Module:
    from transformers import NemotronHConfig, NemotronHForCausalLM

    config = NemotronHConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, hybrid_override_pattern="M*",
                             mamba_num_heads=4, mamba_head_dim=16,
                             ssm_state_size=8, n_groups=2, chunk_size=8, num_attention_heads=2,
                             num_key_value_heads=1, head_dim=16, intermediate_size=64, pad_token_id=0)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    return NemotronHForCausalLM(config).float().eval()


@pytest.fixture(autouse=True)
def _disabled():
    fastpath.disable()
    _tiny_nemotron()  # modeling module imported before any fake mamba_ssm exists
    yield
    fastpath.disable()
    for name in [n for n in sys.modules if n == "mamba_ssm" or n.startswith("mamba_ssm.")]:
        del sys.modules[name]  # a fake package must not outlive its test


def test_bad_mode_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="mamba_ssm must be one of"):
        fastpath.enable(warn=False, mamba_ssm="yes")


def _fake_mamba_ssm(tmp_path: Path, working: bool) -> None:
    pkg = tmp_path / "mamba_ssm"
    (pkg / "ops" / "triton").mkdir(parents=True)
    if working:
        (pkg / "__init__.py").write_text("__version__ = '2.3.0'\n")
        (pkg / "ops" / "__init__.py").write_text("")
        (pkg / "ops" / "triton" / "__init__.py").write_text("")
        (pkg / "ops" / "triton" / "ssd_combined.py").write_text(textwrap.dedent("""
            def mamba_chunk_scan_combined(*a, **k): raise RuntimeError("fake")
            def mamba_split_conv1d_scan_combined(*a, **k): raise RuntimeError("fake")
        """))
        (pkg / "ops" / "triton" / "selective_state_update.py").write_text(
            "def selective_state_update(*a, **k): raise RuntimeError('fake')\n")
    else:  # the released 2.3.2.post1 package root without its compiled extension
        (pkg / "__init__.py").write_text("import selective_scan_cuda\n")


@pytest.mark.parametrize("working", [False, True])
def test_mamba_ssm_detection(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, working: bool) -> None:
    _fake_mamba_ssm(tmp_path, working)
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [n for n in sys.modules if n == "mamba_ssm" or n.startswith("mamba_ssm.")]:
        monkeypatch.delitem(sys.modules, name)
    status = ssd_route.detect_mamba("auto")
    if working:
        assert (status.route, status.impl) == (False, "mamba_ssm") and "kept" in status.reason
    else:
        assert (status.route, status.impl) == (True, "fastpath")
        assert "does not import" in status.reason and "selective_scan_cuda" in status.reason
    assert ssd_route.detect_mamba("fastpath").route
    assert not ssd_route.detect_mamba("off").route


def test_kept_mamba_ssm_leaves_the_wrappers_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _tiny_nemotron()
    module = sys.modules[NEMOTRON]
    before = dict(vars(module))
    _fake_mamba_ssm(tmp_path, True)
    monkeypatch.syspath_prepend(str(tmp_path))
    report = fastpath.enable(warn=False)
    assert report.mamba_ssd == "mamba_ssm"
    for gname in ssd_route.op_globals(module).values():
        assert vars(module)[gname] is before[gname]
    fastpath.disable()
    report = fastpath.enable(warn=False, mamba_ssm="fastpath")
    assert report.mamba_ssd == "fastpath"
    assert all(getattr(vars(module)[g], ssd_route.ROUTE_ATTR, None) == op
               for op, g in ssd_route.op_globals(module).items())


def test_disable_restores_every_global_exactly() -> None:
    _tiny_nemotron()
    module = sys.modules[NEMOTRON]
    before = dict(vars(module))
    fastpath.enable(warn=False, mamba_ssm="fastpath")
    changed = [k for k, v in vars(module).items() if before.get(k) is not v]
    assert {"mamba2_chunk_scan", "mamba2_selective_state_update", "mamba2_split_conv1d_scan_combined"} <= set(changed)
    fastpath.disable()
    after = dict(vars(module))
    assert after.keys() == before.keys() and all(after[k] is before[k] for k in before)


def test_cpu_without_interpreter_keeps_transformers_torch_functions(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    model = _tiny_nemotron()
    ids = torch.randint(3, 64, (1, 11), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = model(ids).logits
    fastpath.enable(warn=False, mamba_ssm="fastpath")
    rows = {r["op"]: r for r in fastpath.explain(model).rows}
    for op in ssd_route.MAMBA_OPS:
        assert rows[op]["impl"] == "torch (cpu tensors; fastpath routed for CUDA)" and not rows[op]["fast"]
    reset()
    with torch.no_grad():
        got = model(ids).logits
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)  # the conv reference rounds differently
    assert not any(k.startswith(("ssd_fwd", "ssd_update", "ssd_split")) for k in CALLS), dict(CALLS)
    module = sys.modules[NEMOTRON]
    split = getattr(module, ssd_route.op_globals(module)["mamba_split_conv1d_scan_combined"])
    assert split(torch.zeros(1, 2, 3), None, None, None, None, None, 8) is None


def test_route_module_is_what_resolve_internal_import_finds() -> None:
    from transformers.utils.import_utils import resolve_internal_import

    mod = ssd_route.route_module()
    for op, path in (("selective_state_update", "ops.triton.selective_state_update.selective_state_update"),
                     ("mamba_chunk_scan_combined", "ops.triton.ssd_combined.mamba_chunk_scan_combined"),
                     ("mamba_split_conv1d_scan_combined",
                      "ops.triton.ssd_combined.mamba_split_conv1d_scan_combined")):
        found = resolve_internal_import(mod, chained_path=path)
        assert getattr(found, ssd_route.ROUTE_ATTR) == op
