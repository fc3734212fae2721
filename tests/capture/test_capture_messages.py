"""Capture's messages: the closing summary fits 80 columns and says so when no
row was re-checked; the ETA after --resume counts only this run's rows; Ctrl-C prints the exact
command that continues the capture.

CPU; the Ctrl-C test runs the real CLI on a tiny LFM2 (its convs on fastpath's kernels in the
Triton interpreter, or --allow-slow without it).
"""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("safetensors")
pytest.importorskip("datasets")

from tiny_configs import LFM2_4L as TINY_LFM2

from fastpath.capture import distributed
from fastpath.capture.capture_cli import resume_command, summary_text
from fastpath.capture.loop import Progress
from fastpath.capture.options import CaptureResult
from fastpath.cli import build_parser
from fastpath.kernels.dispatch import triton_interpreter_on


def _result(written: int, checks: list[dict], path: str = "fast") -> CaptureResult:
    return CaptureResult(out=Path("/data/captures/qwen3.5-27b-sharegpt-eagle3"), rows=48, written=written,
                         skipped_done=48 - written, tokens=196_608, seconds=3.1, checked=checks, path=path,
                         summary={"reference_checks": {"rows": checks}})


def test_the_summary_fits_80_columns_and_keeps_every_fact():
    checks = [{"row": 0, "ok": True}, {"row": 32, "ok": True}]
    slow = ("slow (--allow-slow): 3 op(s) take a slow path (first: model.layers.0.linear_attn "
            "chunk_gated_delta_rule: torch fallback (fla not importable when transformers imported the layer))")
    text = summary_text(_result(40, checks, slow), "speculators", 1, width=80)
    assert all(len(line) <= 80 for line in text.splitlines()), text
    words = text.split()
    for fact in ("48", "40", "8", "speculators", "/data/captures/qwen3.5-27b-sharegpt-eagle3", "tolerance",
                 "chunk_gated_delta_rule:"):
        assert fact in words or any(fact in w for w in words), fact
    assert "2 rows re-run on the reference path, all within tolerance" in " ".join(words)


def test_a_run_that_checked_nothing_does_not_claim_all_within_tolerance():
    text = " ".join(summary_text(_result(0, []), "speculators", 1, width=80).split())
    assert "all within tolerance" not in text and "0 rows" not in text.replace("0 rows written", "")
    assert "reference check: none (this run captured no new row)" in text


def test_the_eta_after_resume_counts_only_this_runs_rows(capsys):
    # 90 of 100 rows were on disk; this run did 5 more in 10 s: 5 left at 0.5 rows/s is 10 s.
    # Counting the old rows it said 95 rows in 10 s, ETA 0 s.
    progress = Progress(distributed.World(0, 1, 0), True, 100, already=90)
    progress.start -= 10.0
    progress.update(95, tokens=5 * 64)
    line = capsys.readouterr().err.strip()
    assert line.startswith("fastpath capture: 95/100 rows") and line.endswith("ETA 0m10s"), line


def test_resume_command_carries_the_environment_the_run_needed():
    args = build_parser().parse_args(["capture", "lfm2.json", "rows.jsonl", "--out", "caps/q", "--device", "cpu"])
    line = resume_command(args, {"TRITON_INTERPRET": "1", "PYTHONPATH": "/opt/fla site"})
    assert line == ("TRITON_INTERPRET=1 PYTHONPATH='/opt/fla site' fastpath capture lfm2.json rows.jsonl "
                    "--out caps/q --device cpu --resume")


def test_resume_command_is_what_was_typed_plus_resume():
    args = build_parser().parse_args(["capture", "qwen3.5-27b", "my data.jsonl", "--out", "caps/q", "--max-len",
                                      "2048", "--allow-slow", "--layers", "2,30,61"])
    assert resume_command(args) == ("fastpath capture qwen3.5-27b 'my data.jsonl' --out caps/q --max-len 2048 "
                                    "--layers 2,30,61 --allow-slow --resume")


def test_ctrl_c_names_the_resume_command(tmp_path, capsys):
    from fastpath.cli import main

    model = tmp_path / "lfm2.json"
    model.write_text(json.dumps(TINY_LFM2))
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps({"input_ids": [(7 * i + j) % 500 for j in range(16)],
                                        "loss_mask": [0] * 8 + [1] * 8}) + "\n" for i in range(40)))
    out = tmp_path / "out"
    argv = ["capture", str(model), str(data), "--out", str(out), "--dtype", "fp32", "--device", "cpu",
            "--layers", "1,2,3", "--batch-tokens", "16", "--check-every", "0", "--quiet"]
    if not triton_interpreter_on():
        argv.append("--allow-slow")

    def interrupt_once_rows_land() -> None:  # Ctrl-C once the capture is under way
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not list(out.glob("hidden_states/*.safetensors")):
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGINT)

    watcher = threading.Thread(target=interrupt_once_rows_land, daemon=True)
    watcher.start()
    try:
        code = main(argv)
        watcher.join()
    except KeyboardInterrupt:  # main returned before the rows landed (it failed): say why
        pytest.fail(f"capture ended before Ctrl-C: {capsys.readouterr().err[-2000:]}")
    err = capsys.readouterr().err
    assert code == 130, err
    said = " ".join(err[err.index("fastpath capture: interrupted"):].split())
    assert re.search(r"interrupted while capturing; [1-9][0-9]* of 40 rows in --out \S+, every row file complete "
                     r"\(written by atomic rename\)\. Continue with:", said), said
    resume = err.strip().splitlines()[-1].strip()
    env, command = resume.split("fastpath capture ", 1)
    assert ("TRITON_INTERPRET=1" in env.split()) == triton_interpreter_on(), resume  # what the run needed
    assert command.endswith(" --resume")
    assert f"--out {out}" in command and "--batch-tokens 16" in command and "--dtype fp32" in command
    # ... and that command continues the capture
    assert main(["capture", *command.split()]) == 0
    summary = json.loads((out / "capture_summary.json").read_text())
    assert summary["rows"] == 40
