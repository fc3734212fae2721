"""benchmarks/multi_gpu.py on CPU: capture and FSDP2 training, fallback and fast path, with gloo
and 2 processes under torchrun, agree with the single-process run (issue: multi-GPU scaling; the
GPU numbers come from the same script on the device).

Tiny LFM2 (4 layers, hidden 32), 16-token rows, 2 training steps: ~1 minute of CPU for both runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("safetensors")
pytest.importorskip("datasets")

from repo_paths import ROOT

from fastpath.kernels.dispatch import triton_interpreter_on

SCRIPT = ROOT / "benchmarks" / "multi_gpu.py"
TINY_LFM2 = {
    "model_type": "lfm2", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 4,
    "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 128, "conv_bias": True,
    "layer_types": ["conv", "full_attention", "conv", "conv"],
}


def _run(tmp_path: Path, nproc: int) -> dict:
    tmp_path.mkdir(parents=True, exist_ok=True)
    cfg = tmp_path / "lfm2.json"
    cfg.write_text(json.dumps(TINY_LFM2))
    launcher = ([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc)]
                if nproc > 1 else [sys.executable])
    args = ["--out", str(tmp_path / "out"), "--device", "cpu", "--dtype", "fp32", "--model", str(cfg),
            "--layers", "4", "--capture-layers", "1,2,3", "--seq-len", "16", "--capture-rows", "4",
            "--batch-tokens", "32", "--check-every", "2", "--global-batch", "2", "--steps", "2", "--warmup", "0",
            *([] if triton_interpreter_on() else ["--allow-slow-fast-path"])]
    temp = tmp_path / "tmp"  # the script's temporary files (the one-process group's file store)
    temp.mkdir()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": str(temp)}
    proc = subprocess.run([*launcher, str(SCRIPT), *args], capture_output=True, text=True, timeout=400, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not list(temp.glob("fastpath-pg-*")), "the file store was left behind"
    return json.loads((tmp_path / "out" / f"multi_gpu_n{nproc}.json").read_text())


def test_two_gloo_processes_agree_with_one(tmp_path):
    one = _run(tmp_path / "n1", 1)
    two = _run(tmp_path / "n2", 2)
    for report, world in ((one, 1), (two, 2)):
        res = report["results"]
        assert report["summary"]["world_size"] == world
        assert set(res) == {"capture/fallback", "capture/fast", "train/fallback", "train/fast"}
        for key, entry in res.items():
            assert len(entry["per_rank"]) == world
            if key.startswith("capture"):
                assert sum(r["rows_written"] for r in entry["per_rank"]) == 4
                assert all(r["rows_rechecked"] >= 1 for r in entry["per_rank"])
        if triton_interpreter_on():
            assert res["capture/fast"]["all_ranks_fast"] and res["train/fast"]["all_ranks_fast"]
            assert all(r["capture_path"] == "fast" for r in res["capture/fast"]["per_rank"])
        assert not res["train/fallback"]["all_ranks_fast"]
        assert report["summary"]["train losses agree"], report["summary"]
    for path in ("fast", "fallback"):
        ranks = two["results"][f"train/{path}"]["per_rank"]
        assert ranks[0]["losses"] == ranks[1]["losses"]  # all-reduced: one loss per step
        single = one["results"][f"train/{path}"]["per_rank"][0]["losses"]
        assert ranks[0]["losses"] == pytest.approx(single, rel=1e-5)
        assert len(single) == 2
