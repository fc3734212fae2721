"""bench's +liger configurations on CPU at tiny size: the worker applies Liger's patch for the
model's family to the built model, the train phase takes its loss through Liger's fused linear
cross-entropy, explain() lists Liger's ops, and a model type Liger has no patch for is skipped with
the reason. Each configuration runs in its own process (as bench runs them), under the Triton
interpreter with tests/support/liger_interpreter.py's adaptations so Liger's kernels execute (in `fastpath
bench` itself the +liger configurations need CUDA). Timings are not looked at."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("liger_kernel")

from liger_run import run_with_liger
from tiny_configs import LFM2_2L as TINY_LFM2
from tiny_configs import QWEN35_2L as TINY_QWEN35

from fastpath.proof.bench_spec import CONFIGS, DEFAULT_CONFIGS

SCRIPT = """
from fastpath.proof.bench_spec import CONFIGS, BenchSettings
from fastpath.proof.bench_worker import run_config
settings = BenchSettings(source={source!r}, device="cpu", seq_len=8, batch=1, repeats=1, warmup=0,
                         phases=("prefill", "train"))
print(json.dumps(run_config(CONFIGS[{config!r}], settings), default=str))
"""


def _run_config(config: str, model: dict, tmp_path: Path) -> dict:
    source = tmp_path / f"{model['model_type']}.json"
    source.write_text(json.dumps(model))
    return run_with_liger(SCRIPT.format(source=str(source), config=config))


def test_liger_configurations_are_opt_in_and_cuda_only():
    liger = {name: spec for name, spec in CONFIGS.items() if spec.liger}
    assert set(liger) == {"reference+liger", "fastpath+liger", "fla+dao+liger"}
    assert not set(liger) & set(DEFAULT_CONFIGS)
    for name, spec in liger.items():
        base = CONFIGS[name.removesuffix("+liger")]
        assert spec.needs_cuda and "liger_kernel" in spec.requires
        assert (spec.enable, spec.hide) == (base.enable, base.hide)  # the same run, plus Liger


@pytest.mark.parametrize("config", ["fastpath+liger", "reference+liger"])
def test_liger_configuration_runs_both_phases_with_the_fused_loss(config: str, tmp_path: Path):
    result = _run_config(config, TINY_QWEN35, tmp_path)
    assert result["liger"] == "apply_liger_kernel_to_qwen3_5(model=...)"
    for phase in ("prefill", "train"):
        entry = result["phases"][phase]
        assert "error" not in entry, entry.get("error")
        assert len(entry["samples_s"]) == 1 and "peak_mem_mib" in entry
    ops = {r["op"]: r["impl"] for r in result["explain"] if str(r["impl"]).startswith("liger ")}
    assert {"rmsnorm", "swiglu", "lm_loss"} <= set(ops), ops
    assert ops["lm_loss"].startswith("liger fused linear cross-entropy")
    if config == "fastpath+liger":
        assert result["implementation"] == "fastpath Triton + Liger (interpreter)"
        assert result["kernel_calls"].get("bwd:triton", 0) > 0  # the train phase ran fastpath's backward
    else:
        assert result["implementation"] == "torch + Liger"
        assert not any(k.endswith(":triton") for k in result["kernel_calls"])
    assert result["environment"]["liger-kernel"]


def test_a_model_type_liger_does_not_patch_is_skipped_with_the_reason(tmp_path: Path):
    result = _run_config("fastpath+liger", TINY_LFM2, tmp_path)
    assert "phases" not in result
    assert "has no patch for model_type 'lfm2'" in result["skipped"], result["skipped"]

