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

import pytest
import torch

from fastpath.proof import greedy
from fastpath.proof.decode_graphs import (
    decode_step,
    eager_static_run,
    graph_greedy,
    static_cache_problem,
    static_prefill,
)
from fastpath.proof.models import build_model
from test_models import TINY_QWEN35  # the tiny Qwen3.5 hybrid the model tests build


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
    assert res.ok is False and "CUDA" in res.reason


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
    res = graph_greedy(tiny.model, _prompt(tiny.device), new_tokens=8, warmup=2)
    assert res.ok and res.match, res.to_json()
