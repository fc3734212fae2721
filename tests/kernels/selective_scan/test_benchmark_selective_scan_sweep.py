"""The plumbing of benchmarks/selective_scan.py's forward-variant sweep (--fwd-variants), run
for real on CPU under TRITON_INTERPRET=1 at its --smoke size: rows per (variant, config,
layout, case) with the difference against the chunked kernel and the copy fraction, the best
row per case, the budget cut-off, and one-line errors for bad options. No timing claims."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch
from repo_paths import ROOT

from fastpath.kernels.dispatch import use_triton
from fastpath.kernels.selective_scan.fwd_tile import TILE_CONFIG

pytestmark = pytest.mark.skipif(
    not use_triton(torch.empty(0)), reason="needs CUDA or TRITON_INTERPRET=1"
)
SCRIPT = ROOT / "benchmarks" / "selective_scan.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_selective_scan", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop(spec.name, None)


def results(out: Path) -> dict:
    return json.loads((out / "selective_scan.json").read_text())


def test_sweep_rows_diffs_and_best(bench, tmp_path, capsys):
    rc = bench.main(["--out", str(tmp_path), "--smoke", "--fwd-variants", "tile,seq",
                     "--fwd-configs", "tile:16/0/1/0/1", "--fwd-layouts", "tf,contiguous"])
    assert rc == 0
    data = results(tmp_path)
    rows = data["results"]
    assert {r["phase"] for r in rows} == {"fwdvariants"}  # the other phases stay off
    # 3 (variant, config) items x 2 layouts x 2 smoke cases
    assert len(rows) == 12
    assert {(r["variant"], tuple(r["config"])) for r in rows} == {
        ("tile", TILE_CONFIG), ("seq", (32, 1)), ("tile", (16, 0, 1, 0, 1))}
    for r in rows:
        assert "error" not in r, r
        assert r["finite"] and r["ms"] > 0 and r["copy_ms"] > 0
        assert r["pct_copy"] == pytest.approx(100 * r["copy_ms"] / r["ms"])
        assert r["mandatory_bytes"] > 0
        assert r["max_abs_diff_out"] < 0.05 and r["max_abs_diff_last"] < 1e-4
    assert {(r["layout"], r["case"]) for r in rows} == {
        (lay, case) for lay in ("tf", "contiguous") for case in ("2x21", "1x21")}
    best = data["meta"]["fwd_best"]
    assert len(best) == 4
    assert all(b["ms"] == min(r["ms"] for r in rows if (r["layout"], r["case"]) ==
                              (b["layout"], b["case"])) for b in best)
    assert "max_abs_diff_out" in capsys.readouterr().out  # printed as the rows come


def test_seq_backward_beside_the_chunked_one(bench, tmp_path):
    """The seq backward (bwd_seq.py, the default) timed in the same run as the chunked one: the
    ours-bwd-chunked peer in fwdbwd (FASTPATH_SSCAN_BWD=chunked around the whole step, so
    autograd's call takes it) beside ours, and phase bwd (both backwards alone, the seq one at its default and smoke configs, with its
    distance to the chunked one's gradients)."""
    from fastpath.kernels.counters import CALLS

    CALLS.clear()
    rc = bench.main(["--out", str(tmp_path), "--smoke", "--phases", "fwdbwd,bwd",
                     "--peers", "ours-bwd-chunked"])
    assert rc == 0
    rows = results(tmp_path)["results"]
    peer = [r for r in rows if r["phase"] == "fwdbwd"]
    assert [r["peer"] for r in peer] == ["ours-bwd-chunked"] * 2 and all(r["ms"] > 0 for r in peer)
    assert CALLS["ss_bwd:triton"] > 0 and CALLS["ss_bwd:triton-seq"] == 0, dict(CALLS)
    bwd = [r for r in rows if r["phase"] == "bwd"]
    seq_configs = [list(c) for c in bench.SMOKE_BWD_SEQ_SWEEP]
    for case in ("1x12", "2x12"):
        got = [r for r in bwd if r["case"] == case]
        assert [r["kernel"] for r in got] == ["chunked"] + ["seq"] * (1 + len(seq_configs))
        assert [r["config"] for r in got[2:]] == seq_configs and got[1]["default"]
        for r in got:
            assert "error" not in r and r["ms"] > 0, r
        for r in got[1:]:
            assert r["max_rel_diff"] < 1e-5 and r["speedup"] > 0, r


def test_budget_cuts_rows_but_writes_them(bench, tmp_path):
    rc = bench.main(["--out", str(tmp_path), "--smoke", "--fwd-variants", "tile",
                     "--fwd-layouts", "tf", "--budget-s", "0"])
    assert rc == 0
    rows = results(tmp_path)["results"]
    assert rows and all(r["skipped"] == "past --budget-s" for r in rows)


def test_sweep_lists_put_the_candidates_first(bench):
    items = bench.parse_fwd_items(["chunked", "seq", "tile", "tile-poly"], "sweep", False)
    names = [v for v, _ in items]
    assert names[:4] == ["chunked", "seq", "tile", "tile-poly"]  # every default first
    extra = names[4:]
    assert extra.index("tile") < extra.index("tile-poly") < extra.index("seq")


@pytest.mark.parametrize(("argv", "message"), [
    (["--fwd-variants", "tile,fast"], "--fwd-variants: unknown fast"),
    (["--fwd-variants", "tile", "--fwd-configs", "tile:32/1"], "tile takes 5 to 8 numbers"),
    (["--fwd-variants", "tile", "--fwd-configs", "seq:32/1"], "is not VARIANT:A/B/C"),
    (["--fwd-variants", "tile", "--fwd-configs", "tile:a/b"], "not integers"),
    (["--fwd-variants", "tile", "--fwd-layouts", "nhwc"], "--fwd-layouts 'nhwc'"),
    (["--fwd-variants", "tile", "--fwd-cases", "8"], "--fwd-cases '8'"),
])
def test_bad_options_are_one_line_errors(bench, tmp_path, capsys, argv, message):
    assert bench.main(["--out", str(tmp_path), *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err
