"""proof.decode_graphs: the static-cache decode step it captures, on a tiny Qwen3.5 hybrid.

On CPU: the step (token and position in device buffers, argmax written back) decodes the same
tokens as the ordinary DynamicCache greedy loop, and - with fastpath enabled and the Triton
interpreter on - the whole step traces into one torch.compile graph (fullgraph=True) that
contains fastpath's causal_conv1d_update custom op. On a CUDA machine: the CUDA-graph replay
decodes exactly the eager tokens.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from repo_paths import ROOT, venv_missing, venv_python
from tiny_configs import QWEN35_4L as TINY_QWEN35  # the tiny Qwen3.5 hybrid the model tests build

from fastpath.models import greedy
from fastpath.models.build import build_model
from fastpath.proof.decode_graphs import (
    bench_phase,
    decode_step,
    eager_static_run,
    graph_greedy,
    static_cache_problem,
    static_prefill,
)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny") / "config.json"
    path.write_text(json.dumps(TINY_QWEN35))
    device = "cuda" if torch.cuda.is_available() else "cpu"
    return build_model(str(path), device=device, seed=0)


def _prompt(device) -> torch.Tensor:
    return torch.randint(0, 64, (2, 7), generator=torch.Generator().manual_seed(0)).to(device)


def test_static_cache_step_decodes_like_the_dynamic_cache_loop(tiny):
    ids = _prompt(tiny.device)
    assert static_cache_problem(tiny.model, 32) is None
    with torch.no_grad():
        got, _ = eager_static_run(tiny.model, ids, steps=6, timed_from=0, max_cache_len=32)
        state = greedy.prefill(tiny.model, ids)
        want = [state.next_token]
        for _ in range(6):
            state = greedy.step(tiny.model, state)
            want.append(state.next_token)
    assert torch.equal(got, torch.cat(want, 1))


def test_graph_greedy_says_why_without_cuda(tiny):
    if tiny.device.type == "cuda":
        pytest.skip("this machine has CUDA: test_graph_greedy_matches_eager_on_cuda runs instead")
    res = graph_greedy(tiny.model, _prompt(tiny.device), new_tokens=2)
    assert res.ok is False and res.unsupported and "CUDA" in res.reason
    assert bench_phase(tiny.model, _prompt(tiny.device), 2) == {
        "tokens_per_call": 4, "skipped": "needs a CUDA device (CUDA graphs)"}


TINY_QWEN3_NEXT = {**TINY_QWEN35, "model_type": "qwen3_next"}
# What the matrix venv runs: the bench phase's verdict, and what really happens on an eager step.
OLD_TRANSFORMERS_PROBE = """
import json, sys, torch, transformers
from fastpath.proof.decode_graphs import bench_phase, eager_static_run
from fastpath.models.build import build_model
model = build_model(sys.argv[1], device="cpu", seed=0).model
ids = torch.randint(0, 64, (1, 6), generator=torch.Generator().manual_seed(0))
entry = bench_phase(model, ids, 2)
try:
    with torch.no_grad():
        eager_static_run(model, ids, 2, 0, 16)
    failure = None
except Exception as exc:
    failure = f"{type(exc).__name__}: {exc}"
print("RESULT " + json.dumps({"version": transformers.__version__, "entry": entry, "eager": failure}))
"""


def test_old_transformers_static_cache_is_refused_with_the_reason(tmp_path):
    """transformers 4.57.6 builds a StaticCache for Qwen3-Next, but with key/value layers where the
    GatedDeltaNet layers need conv/recurrent state: the phase is skipped with that reason (before
    the missing GPU), and an eager step on that cache really fails there."""
    python = venv_python("4.57.6")
    if not python.exists():
        pytest.skip(venv_missing("4.57.6"))
    config = tmp_path / "qwen3_next.json"
    config.write_text(json.dumps(TINY_QWEN3_NEXT))
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    proc = subprocess.run([str(python), "-c", OLD_TRANSFORMERS_PROBE, str(config)], capture_output=True,
                          text=True, env=env, timeout=600)
    found = [ln[7:] for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and found, proc.stderr[-2000:]
    got = json.loads(found[-1])
    assert got["version"] == "4.57.6"
    assert set(got["entry"]) == {"tokens_per_call", "skipped"}
    reason = got["entry"]["skipped"]
    assert reason.startswith("transformers 4.57.6: StaticCache keeps no linear_attention state for "
                             "Qwen3NextForCausalLM (layer 0 gets StaticLayer)"), reason
    assert "\n" not in reason and "issues/40827" in reason
    assert got["eager"] and "has_previous_state" in got["eager"]
    # this process's transformers (>= 5.12) serves the same model: no transformers reason here
    here = build_model(str(config), device="cpu", seed=0).model
    assert static_cache_problem(here, 16) is None


MAMBA2 = {"model_type": "mamba2", "hidden_size": 64, "num_hidden_layers": 2, "vocab_size": 64, "num_heads": 4,
          "head_dim": 32, "state_size": 16, "n_groups": 1, "expand": 2, "chunk_size": 8}


def test_model_taking_cache_params_is_refused_not_timed_without_history(tmp_path):
    """Mamba2ForCausalLM takes `cache_params` and swallows `past_key_values` in **kwargs: a
    StaticCache never reaches its layers, so graph and eager would agree on a decode without
    history. The phase refuses it (the DynamicCache decode shows the tokens really differ)."""
    config = tmp_path / "mamba2.json"
    config.write_text(json.dumps(MAMBA2))
    model = build_model(str(config), device="cpu", seed=0).model
    ids = torch.randint(0, 64, (2, 5), generator=torch.Generator().manual_seed(0))
    reason = static_cache_problem(model, 32)
    assert reason is not None and reason.startswith(
        "Mamba2ForCausalLM takes its cache as cache_params, not past_key_values"), reason
    assert bench_phase(model, ids, 2)["skipped"] == reason
    with torch.no_grad():
        static, _ = eager_static_run(model, ids, steps=8, timed_from=0, max_cache_len=32)
        dynamic = greedy.greedy_decode(model, ids, 9).tokens
    assert not torch.equal(static, dynamic)


def test_decode_graphs_script_is_bench_and_reports_the_cpu_reason(tmp_path):
    """benchmarks/decode_graphs_gpu.py runs `fastpath bench --phases decode,decode-graph` (the one
    implementation); on a CPU its row carries the eager decode and the reason for no graph number."""
    config = tmp_path / "tiny.json"
    config.write_text(json.dumps(TINY_QWEN35))
    out = tmp_path / "out"
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "decode_graphs_gpu.py"), "--out", str(out),
                           "--model", str(config), "--layers", "2", "--prompt", "6", "--tokens", "2",
                           "--repeats", "1", "--warmup", "0", "--configs", "reference", "--device", "cpu",
                           "--dtype", "fp32"], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = json.loads((out / "decode_graphs.json").read_text())["rows"]
    assert [r["config"] for r in rows] == ["reference"]
    assert rows[0]["ok"] is False and rows[0]["reason"] == "needs a CUDA device"
    assert rows[0]["eager_tokens_per_s"] > 0 and rows[0]["graph_tokens_per_s"] is None
    bench = json.loads((out / "bench" / "bench.json").read_text())
    assert bench["settings"]["phases"] == ["decode", "decode-graph"]


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available(),
                    reason="fastpath's conv kernels run on CPU only under TRITON_INTERPRET=1")
def test_decode_step_compiles_into_one_graph_with_fastpath_ops(tiny):
    import fastpath

    ops: list[str] = []

    def recording_backend(gm, _inputs):
        ops.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return gm.forward

    from transformers import StaticCache

    ids = _prompt(tiny.device)
    fastpath.enable(warn=False)
    try:
        with torch.no_grad():
            want, _ = eager_static_run(tiny.model, ids, steps=3, timed_from=0, max_cache_len=24)
            cache = StaticCache(config=tiny.model.config, max_cache_len=24)
            token, position = static_prefill(tiny.model, ids, cache)
            step = decode_step(tiny.model, cache, token, position)
            got = [token.clone()]
            step()  # eager first step: the cache's lazy initialisation happens outside the graph
            got.append(token.clone())
            compiled = torch.compile(step, backend=recording_backend, fullgraph=True)
            for _ in range(2):
                compiled()
                got.append(token.clone())
    finally:
        fastpath.disable()
        torch._dynamo.reset()
    assert any("fastpath.causal_conv1d_update" in op for op in ops), sorted(set(ops))[:20]
    assert torch.equal(torch.cat(got, 1), want)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_graph_greedy_matches_eager_on_cuda(tiny):
    res = graph_greedy(tiny.model, _prompt(tiny.device), new_tokens=8, warmup=2, repeats=2)
    assert res.ok and res.match, res.to_json()
    assert len(res.samples_s) == 2 and res.capture_s is not None and res.capture_s > 0
    assert res.match_dynamic is not None  # recorded (fp32 tiny model: expected True, not required)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_bench_decode_graph_phase_on_cuda(tmp_path):
    """A real `fastpath bench` run of the phase on the GPU: a number, capture apart, tokens matched."""
    from fastpath.cli import main

    config = tmp_path / "tiny.json"
    config.write_text(json.dumps(TINY_QWEN35))
    out = tmp_path / "out"
    code = main(["bench", str(config), "--device", "cuda", "--seq-len", "16", "--decode-tokens", "4",
                 "--repeats", "2", "--warmup", "1", "--phases", "decode,decode-graph",
                 "--configs", "reference,fastpath", "--out", str(out)])
    assert code == 0
    doc = json.loads((out / "bench.json").read_text())
    for r in doc["configs"]:
        entry = r["phases"]["decode-graph"]
        assert "error" not in entry and "skipped" not in entry, entry
        assert entry["tokens_match_eager"] is True and entry["capture_s"] > 0
        assert len(entry["samples_s"]) == 2 and entry["tokens_per_s"] > 0
        assert entry["tokens_per_call"] == 4
    assert "reference" in doc["speedup_versus"]
