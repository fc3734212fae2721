"""bench on a CUDA GPU (run on the device machine: `pytest -m gpu`): CUDA-event timings, peak
memory from torch.cuda.max_memory_allocated, every output written into --out. Skipped without CUDA."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("matplotlib")

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def test_bench_on_cuda_writes_everything_into_out(tmp_path, capsys):
    from fastpath.cli import main

    source = tmp_path / "qwen.json"
    source.write_text(json.dumps({
        "model_type": "qwen3_5_text", "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 4,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64, "linear_num_key_heads": 2,
        "linear_num_value_heads": 4, "linear_key_head_dim": 64, "linear_value_head_dim": 64,
        "linear_conv_kernel_dim": 4, "vocab_size": 1024}))
    out = tmp_path / "out"
    code = main(["bench", str(source), "--device", "cuda", "--seq-len", "256", "--repeats", "3", "--warmup", "1",
                 "--decode-tokens", "8", "--out", str(out), "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 0
    assert sorted(p.name for p in out.iterdir()) == ["bench.json", "bench.md", "bench.png"]
    by_name = {r["config"]: r for r in doc["configs"]}
    for name in ("reference", "fastpath"):
        for phase in ("prefill", "train", "decode"):
            entry = by_name[name]["phases"][phase]
            assert "error" not in entry, entry
            assert entry["peak_mem_mib"] > 0 and entry["tokens_per_s"] > 0
    assert by_name["fastpath"]["implementation"] == "fastpath Triton"  # real kernels: a real speed-up
    assert set(doc["speedup"]["fastpath"]) == {"prefill", "train", "decode"}
    assert not any("not_timing_data" in e for e in by_name["fastpath"]["phases"].values())
    assert doc["environment"]["gpu"]
    assert "CUDA events" in (out / "bench.md").read_text()
