"""The human report at 80 columns (and narrower): no line longer than the width unless it is one
unbreakable token, no word split, every `command` of a remedy on one line; tables that do not
fit become key: value lists; piped output honours COLUMNS."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from fakeenv import seed_facts

from fastpath.doctor.diagnosis import diagnose
from fastpath.doctor.gpu_models import parse_gpu_spec
from fastpath.doctor.report import merged_range, render_text, wrap_keeping_commands


def _one_token(line: str) -> bool:
    """A line holding one unbreakable token: a word, or one `command` (with its punctuation)."""
    return re.fullmatch(r"`[^`]*`[^\s`]*|\S+", line.strip()) is not None


def _diagnoses():
    no_gpu = seed_facts()
    no_gpu["gpus"] = []
    no_gpu["torch"]["cuda_available"] = False
    return [diagnose(seed_facts(), "qwen3.5-27b"), diagnose(no_gpu, "qwen3.5-27b"),
            diagnose(no_gpu, "mamba2", parse_gpu_spec("H100")), diagnose(seed_facts(), None)]


@pytest.mark.parametrize("width", [80, 60, 120])
def test_report_fits_the_width_and_keeps_words_and_commands_whole(width):
    for d in _diagnoses():
        text = render_text(d, width)
        lines = text.splitlines()
        for line in lines:
            assert len(line.rstrip()) <= width or _one_token(line), line
        flat = " ".join(text.split())
        texts = [d.headline, *(r for f in d.findings for r in f.remedies),
                 *(f.detail for f in d.findings)]
        for t in texts:
            assert " ".join(t.split()) in flat, t  # no word was split by a line break
            for cmd in re.findall(r"`[^`]*`", t):
                assert any(cmd in line for line in lines), cmd


def test_wrap_moves_a_long_command_left_instead_of_breaking_it():
    cmd = "`" + "x" * 70 + "`"
    lines = wrap_keeping_commands(f"run {cmd} now", 80, indent=" " * 20, first="fix: ")
    assert lines[0] == "fix: run" and lines[1].strip() == cmd and len(lines[1]) <= 80
    assert lines[2] == " " * 20 + "now"


def test_narrow_tables_become_key_value_lists():
    text = render_text(_diagnoses()[0], 50)
    assert "package: causal-conv1d" in text and "  import: not-installed" in text


def test_piped_report_honours_columns():
    env = dict(os.environ, COLUMNS="70", FASTPATH_PROBE_SKIP="imports,rpm")
    r = subprocess.run([sys.executable, "-m", "fastpath", "doctor", "--model", "qwen3.5-27b"],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.stdout.startswith(("FAST", "SLOW", "BLOCKED", "UNKNOWN"))
    assert all(len(line.rstrip()) <= 70 or _one_token(line) for line in r.stdout.splitlines())
    assert max(len(line.rstrip()) for line in r.stdout.splitlines()) > 60  # it used the width


def test_release_ranges_with_the_same_outcome_are_shown_once():
    """Without transformers the plan covers every release range; ranges that would do the same
    thing share one row (here every 5.x range: the same 48 layers on the fallback), while JSON
    keeps one entry per range."""
    facts = seed_facts()
    facts["packages"] = {k: v for k, v in facts["packages"].items() if k != "transformers"}
    d = diagnose(facts, "qwen3.5-27b")
    ranges = [v["range"] for v in d.model_plan["by_version"]]
    assert ranges == ["4.57.x", "5.2-5.14", "5.15-5.16", "5.17-5.24", ">=5.25"]
    text = render_text(d, 200)
    table = text.split("by transformers release", 1)[1]
    assert "4.57.x" in table and ">=5.2" in table
    assert not any(r in table for r in ranges[1:]), table
    assert table.count("take the torch fallback for causal_conv1d_fn") == 1


def test_merged_range_labels():
    assert merged_range("5.0-5.14", ">=5.25") == ">=5.0"
    assert merged_range("4.57.x", "5.0-5.14") == "4.57-5.14"
    assert merged_range("5.0-5.14", "5.17-5.24") == "5.0-5.24"
