"""benchmarks/judge_noise.py at tiny size on the CPU (fastpath's kernels in Triton's interpreter):
every configuration and candidate is counted, the ratios are consistent with the judge's own
bar and its resampling rule, and bad arguments are one line, exit 2. Values are checked for
consistency, not for rates."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from repo_paths import BENCHMARKS, ROOT

pytest.importorskip("torch")
SCRIPT = BENCHMARKS / "judge_noise.py"


def _run(tmp_path: Path, *extra: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT / "src"), os.environ.get("PYTHONPATH")) if p)}
    return subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path / "out"), *extra],
                          capture_output=True, text=True, env=env, timeout=600)


def test_every_candidate_is_judged_on_every_draw(tmp_path):
    proc = _run(tmp_path, "--draws", "3", "--lengths", "24")
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((tmp_path / "out" / "judge_noise.json").read_text())
    assert [(r["length"], r["itype"]) for r in report["rows"]] == [(24, "float16"), (24, "bfloat16")]
    for row in report["rows"]:
        assert row["draws"] == 3 and row["ratio_bar"] == 2.0
        assert set(row["flagged"]) == set(row["flagged_resampled"]) == {
            "fastpath", "reordered", "reordered_fma", "biased_exp"}
        assert row["resamples"] == 2  # the judge's 8, capped by the draws there are
        for kind, count in row["flagged"].items():
            assert 0 <= count <= 3 and row["flagged_rate"][kind] == round(count / 3, 3)
            assert 0 <= row["flagged_resampled"][kind] <= count  # the rule only weighs flagged draws
            for metric in ("max_abs", "rel_l2"):
                stats = row["ratios"][kind][metric]
                assert 0 < stats["p50"] <= stats["max"] and stats["mean"] > 0
            # a draw flagged by the judge has a ratio above its bar in at least one metric
            if count:
                assert max(row["ratios"][kind]["max_abs"]["max"], row["ratios"][kind]["rel_l2"]["max"]) > 2.0
    assert "flagged by one draw's bar / by the judge's rule" in proc.stdout


@pytest.mark.parametrize("args", [("--lengths", "x"), ("--draws", "0")])
def test_bad_arguments_are_one_line_exit_2(tmp_path, args):
    proc = _run(tmp_path, *args)
    assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0, proc.stderr


def test_the_resampled_rule_weighs_a_flagged_draw_against_the_next_ones():
    """resampled_flags is the judge's rule over a row of draws: a lone tail is let go, a run of
    bad draws (the median beyond the bar) is flagged, a non-finite ratio in the window too."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("judge_noise", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    good, bad = (0.9, 0.8), (3.0, 2.5)
    assert module.resampled_flags([bad] + [good] * 9, 8) == 0
    assert module.resampled_flags([bad] * 5 + [good] * 5, 8) >= 1
    assert module.resampled_flags([bad] * 10, 8) == 10
    assert module.resampled_flags([good] * 10, 8) == 0
    assert module.resampled_flags([(float("nan"), 1.0)] + [good] * 9, 8) == 1
