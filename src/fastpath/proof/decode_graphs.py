"""Greedy decoding with every single-token step replayed from one CUDA graph.

Why: at batch 1 a hybrid model's decode step is host-bound for everyone (~90 tok/s for the
8-layer Qwen3.5-27B-shaped preset on an H200, whatever the kernels): each step launches hundreds
of small kernels from Python. Captured once into a CUDA graph, a step is one launch. That needs a
cache whose tensors never move: transformers' `StaticCache`, whose linear-attention layers copy
their conv/recurrent states in place and mark them static (transformers >= 5.17 for the hybrid
Qwen3.5 / Qwen3-Next layer types; older versions cannot build a StaticCache for them, and
`static_cache_problem` says so).

`graph_greedy` prefills eagerly, runs a few eager warm-up steps (every kernel compiled, every
autotuner settled, our launch caches filled), captures one step that reads the token and the
position from device buffers and writes the chosen token back, then replays it. The same loop
without the graph, on a fresh StaticCache, is the reference: the tokens must match exactly
(both run the same kernels on the same inputs), so a capture that baked in a stale host value
shows up as a mismatch instead of as a speed-up.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any


@dataclass
class GraphDecodeResult:
    """What a graph decode run established; `ok` only when the graph ran and matched eager."""

    ok: bool
    reason: str
    new_tokens: int = 0
    batch: int = 0
    match: bool | None = None                 # graph tokens == eager StaticCache tokens
    graph_tokens_per_s: float | None = None   # replayed steps only
    eager_tokens_per_s: float | None = None   # the same steps, eager, same cache type
    first_mismatch: int | None = None
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def static_cache_problem(model: Any, max_cache_len: int) -> str | None:
    """Why transformers cannot give this model a CUDA-graph-safe static cache, None if it can."""
    try:
        import transformers
        from transformers import StaticCache
    except ImportError:
        return "this transformers has no StaticCache"
    try:
        cache = StaticCache(config=model.config, max_cache_len=max_cache_len)
    except Exception as exc:  # e.g. a layer type the static mapping does not know
        return (f"transformers {transformers.__version__} cannot build a StaticCache for "
                f"{type(model).__name__}: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}")
    compileable = getattr(cache, "is_compileable", None)
    if compileable is False:
        return (f"transformers {transformers.__version__}: StaticCache for {type(model).__name__} "
                "has layers that are not compileable (their tensors may move between steps)")
    return None


def decode_step(model: Any, cache: Any, token: Any, position: Any) -> Any:
    """One decode step on device buffers: reads `token` [B, 1] and `position` [1], writes the
    argmax back into `token` and advances `position`, all without a host sync."""
    import torch

    def step() -> None:
        out = model(input_ids=token, past_key_values=cache, cache_position=position,
                    use_cache=True)
        token.copy_(torch.argmax(out.logits[:, -1], dim=-1, keepdim=True))
        position.add_(1)

    return step


def static_prefill(model: Any, input_ids: Any, cache: Any) -> tuple[Any, Any]:
    """Run the prompt into `cache`: the first chosen token [B, 1] and the next position [1]."""
    import torch

    length = input_ids.shape[1]
    out = model(input_ids=input_ids, past_key_values=cache, use_cache=True,
                cache_position=torch.arange(length, device=input_ids.device), logits_to_keep=1)
    token = torch.argmax(out.logits[:, -1], dim=-1, keepdim=True)
    return token, torch.tensor([length], device=input_ids.device, dtype=torch.long)


def _sync(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def eager_static_run(model: Any, input_ids: Any, steps: int, timed_from: int,
                     max_cache_len: int) -> tuple[Any, float]:
    """Tokens of `steps` eager steps on a fresh StaticCache (the prefill's token first, [B, 1 +
    steps]); seconds of the steps from `timed_from` on. Any device: the reference loop."""
    from transformers import StaticCache

    cache = StaticCache(config=model.config, max_cache_len=max_cache_len)
    token, position = static_prefill(model, input_ids, cache)
    step = decode_step(model, cache, token, position)
    tokens = [token.clone()]
    start = None
    for i in range(steps):
        if i == timed_from:
            _sync(input_ids.device)
            start = time.perf_counter()
        step()
        tokens.append(token.clone())
    _sync(input_ids.device)
    seconds = time.perf_counter() - start if start is not None else 0.0
    return _cat(tokens), seconds


def _cat(tokens: list[Any]) -> Any:
    import torch

    return torch.cat(tokens, 1)


def graph_greedy(model: Any, input_ids: Any, new_tokens: int = 64,
                 warmup: int = 3) -> GraphDecodeResult:
    """Greedy-decode `new_tokens` tokens after `input_ids` with the steps replayed from a CUDA
    graph, and check them against the same loop run eagerly (see the module docstring)."""
    import torch

    batch, length = int(input_ids.shape[0]), int(input_ids.shape[1])
    result = GraphDecodeResult(False, "", new_tokens=new_tokens, batch=batch)
    if not input_ids.is_cuda:
        result.reason = "CUDA graphs need a CUDA device"
        return result
    if new_tokens < 1 or warmup < 1:
        result.reason = "new_tokens and warmup must be at least 1"
        return result
    steps = warmup + new_tokens
    max_cache_len = length + steps + 1
    problem = static_cache_problem(model, max_cache_len)
    if problem is not None:
        result.reason = problem
        return result
    from transformers import StaticCache

    with torch.inference_mode():
        eager_tokens, eager_s = eager_static_run(model, input_ids, steps, warmup, max_cache_len)
        cache = StaticCache(config=model.config, max_cache_len=max_cache_len)
        token, position = static_prefill(model, input_ids, cache)
        step = decode_step(model, cache, token, position)
        tokens = [token.clone()]
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up off the capture stream, as torch recommends
            for _ in range(warmup):
                step()
                tokens.append(token.clone())
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph):
                step()
        except Exception as exc:
            result.reason = (f"capture failed: {type(exc).__name__}: "
                             f"{str(exc).splitlines()[0][:200] if str(exc) else ''}")
            return result
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(new_tokens):
            graph.replay()
            tokens.append(token.clone())
        torch.cuda.synchronize()
        graph_s = time.perf_counter() - start
    got = torch.cat(tokens, 1)
    same = got.shape == eager_tokens.shape and bool(torch.equal(got, eager_tokens))
    result.match = same
    if not same:
        diff = (got != eager_tokens).any(0).nonzero()
        result.first_mismatch = int(diff[0]) if len(diff) else None
    result.graph_tokens_per_s = batch * new_tokens / graph_s if graph_s > 0 else None
    result.eager_tokens_per_s = batch * new_tokens / eager_s if eager_s > 0 else None
    result.ok = same
    result.reason = ("graph tokens match the eager StaticCache loop" if same else
                     f"graph tokens differ from eager from step {result.first_mismatch} on")
    return result


def bench_phase(model: Any, input_ids: Any, decode_tokens: int) -> dict[str, Any]:
    """A `fastpath bench` phase entry: decode with CUDA graphs after the prompt, tokens/s of the
    replayed steps, or the reason it could not run (then no number is claimed)."""
    res = graph_greedy(model, input_ids, new_tokens=decode_tokens)
    entry: dict[str, Any] = {"ok": res.ok, "reason": res.reason, "match_eager": res.match,
                             "eager_static_tokens_per_s": res.eager_tokens_per_s}
    if res.ok:
        entry["tokens_per_s"] = res.graph_tokens_per_s
    return entry
