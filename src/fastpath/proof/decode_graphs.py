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
position from device buffers and writes the chosen token back, then replays it (capture is timed
apart from the replays). The same loop without the graph, on a fresh StaticCache, is the
reference: the tokens must match exactly (both run the same kernels on the same inputs), so a
capture that baked in a stale host value shows up as a mismatch instead of as a speed-up. The
ordinary DynamicCache greedy loop (models/greedy.py, what bench's `decode` phase runs) is compared
too and recorded, not required: its attention runs over a different cache length, so low-precision
rounding may pick a different token on a near-tie.

`fastpath bench --phases decode-graph` (proof/bench_spec.py) and benchmarks/decode_graphs_gpu.py
both measure through `bench_phase`, the one implementation.
"""

from __future__ import annotations

import inspect
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

# Layer types whose cache holds a recurrent / conv state rather than keys and values (the names of
# transformers' STATIC_LAYER_TYPE_MAPPING, cache_utils.py, 5.12+).
STATE_LAYER_TYPES = ("linear_attention", "conv", "mamba", "hybrid", "hybrid_sliding")
LINEAR_CACHE_ISSUE = "https://github.com/huggingface/transformers/issues/40827"


@dataclass
class GraphDecodeResult:
    """What a graph decode run established; `ok` only when the graph ran and matched eager.
    `unsupported`: this setup cannot run it at all (no CUDA, transformers' cache) - a skip, not a
    failure of the code under test."""

    ok: bool
    reason: str
    unsupported: bool = False
    new_tokens: int = 0
    batch: int = 0
    repeats: int = 0
    warmup: int = 0
    match: bool | None = None                 # graph tokens == eager StaticCache tokens
    match_dynamic: bool | None = None         # graph tokens == DynamicCache greedy tokens (recorded)
    graph_tokens_per_s: float | None = None   # replayed steps only, median block
    eager_tokens_per_s: float | None = None   # the same steps, eager, same cache type
    capture_s: float | None = None            # one torch.cuda.graph capture of a step
    samples_s: list[float] = field(default_factory=list)  # seconds per block of new_tokens replays
    first_mismatch: int | None = None
    first_mismatch_dynamic: int | None = None
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _text_config(model: Any) -> Any:
    config = model.config
    get = getattr(config, "get_text_config", None)
    return get() if callable(get) else config


def static_cache_problem(model: Any, max_cache_len: int) -> str | None:
    """Why transformers cannot give this model a CUDA-graph-safe static cache, None if it can.

    The model must take `past_key_values` (Mamba takes `cache_params` and swallows the rest in
    **kwargs: the steps would run without history and still agree graph vs eager). Building is
    not enough either: transformers 4.57 builds a StaticCache for Qwen3-Next whose
    linear-attention layers are key/value layers, and the model then fails on its first step
    (no `has_previous_state`). So every state-carrying layer type must get a cache layer that
    holds conv/recurrent state (transformers' LinearAttentionCacheLayerMixin)."""
    try:
        import transformers
        from transformers import StaticCache
    except ImportError:
        return "this transformers has no StaticCache"
    version = transformers.__version__
    name = type(model).__name__
    params = inspect.signature(model.forward).parameters
    if "past_key_values" not in params:  # e.g. Mamba: a StaticCache would be swallowed by **kwargs
        how = ("takes its cache as cache_params, not past_key_values" if "cache_params" in params
               else "has no past_key_values argument")
        return (f"{name} {how}: transformers {version}'s StaticCache would not reach its layers "
                "(each step would run without history)")
    config = _text_config(model)
    try:
        cache = StaticCache(config=config, max_cache_len=max_cache_len)
    except Exception as exc:  # e.g. a layer type the static mapping does not know
        return (f"transformers {version} cannot build a StaticCache for "
                f"{name}: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}")
    types = [str(t) for t in (getattr(config, "layer_types", None) or [])]
    stateful = [i for i, t in enumerate(types) if t in STATE_LAYER_TYPES]
    if stateful:
        from transformers import cache_utils

        mixin = getattr(cache_utils, "LinearAttentionCacheLayerMixin", None)
        layers = list(getattr(cache, "layers", None) or [])
        for i in stateful:
            layer = layers[i] if i < len(layers) else None
            if mixin is None or layer is None or not isinstance(layer, mixin):
                got = type(layer).__name__ if layer is not None else "no cache layer"
                return (f"transformers {version}: StaticCache keeps no {types[i]} state for {name} "
                        f"(layer {i} gets {got}); needs a transformers with linear-attention "
                        f"cache layers ({LINEAR_CACHE_ISSUE})")
    compileable = getattr(cache, "is_compileable", None)
    if compileable is False:
        return (f"transformers {version}: StaticCache for {name} "
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

    cache = StaticCache(config=_text_config(model), max_cache_len=max_cache_len)
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


def _first_mismatch(got: Any, want: Any) -> int | None:
    """Index of the first step where two [B, N] token streams differ (None when they agree)."""
    import torch

    if got.shape != want.shape:
        return min(got.shape[1], want.shape[1])
    if torch.equal(got, want):
        return None
    return int((got != want).any(0).nonzero()[0])


def graph_greedy(model: Any, input_ids: Any, new_tokens: int = 64, warmup: int = 3,
                 repeats: int = 1, compare_dynamic: bool = True) -> GraphDecodeResult:
    """Greedy-decode `warmup + repeats * new_tokens` tokens after `input_ids`: `warmup` eager
    steps, one captured step, then `repeats` timed blocks of `new_tokens` graph replays; check the
    tokens against the same loop run eagerly (see the module docstring)."""
    import torch

    batch, length = int(input_ids.shape[0]), int(input_ids.shape[1])
    result = GraphDecodeResult(False, "", new_tokens=new_tokens, batch=batch, repeats=repeats,
                               warmup=warmup)
    if new_tokens < 1 or warmup < 1 or repeats < 1:
        result.reason = "new_tokens, warmup and repeats must be at least 1"
        return result
    steps = warmup + repeats * new_tokens
    max_cache_len = length + steps + 1
    # transformers first: the lasting reason (a GPU would not help) wins over the missing device
    problem = static_cache_problem(model, max_cache_len)
    if problem is None and not input_ids.is_cuda:
        problem = "needs a CUDA device (CUDA graphs)"
    if problem is not None:
        result.reason, result.unsupported = problem, True
        return result
    from transformers import StaticCache

    with torch.inference_mode():
        try:
            eager_tokens, eager_s = eager_static_run(model, input_ids, steps, warmup, max_cache_len)
        except Exception as exc:
            result.reason = f"eager StaticCache decode failed: {_one_line(exc)}"
            return result
        if compare_dynamic:
            from fastpath.models.greedy import greedy_decode

            dynamic = greedy_decode(model, input_ids, steps + 1).tokens
            result.first_mismatch_dynamic = _first_mismatch(eager_tokens, dynamic)
        cache = StaticCache(config=_text_config(model), max_cache_len=max_cache_len)
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
        torch.cuda.synchronize()
        begin = time.perf_counter()
        try:
            with torch.cuda.graph(graph):
                step()
        except Exception as exc:
            result.reason = f"capture failed: {_one_line(exc)}"
            return result
        torch.cuda.synchronize()
        result.capture_s = time.perf_counter() - begin
        for _ in range(repeats):
            torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(new_tokens):
                graph.replay()
                tokens.append(token.clone())
            torch.cuda.synchronize()
            result.samples_s.append(time.perf_counter() - start)
    got = torch.cat(tokens, 1)
    result.first_mismatch = _first_mismatch(got, eager_tokens)
    result.match = result.first_mismatch is None
    if compare_dynamic:
        # graph == eager static, so graph vs dynamic is eager static vs dynamic
        result.match_dynamic = result.first_mismatch_dynamic is None if result.match else None
    median = statistics.median(result.samples_s)
    result.graph_tokens_per_s = batch * new_tokens / median if median > 0 else None
    result.eager_tokens_per_s = batch * repeats * new_tokens / eager_s if eager_s > 0 else None
    result.ok = result.match
    result.reason = ("graph tokens match the eager StaticCache loop" if result.match else
                     f"graph tokens differ from the eager StaticCache loop from step "
                     f"{result.first_mismatch} on")
    return result


def _one_line(exc: BaseException) -> str:
    from fastpath.shared.errors import first_line

    return first_line(exc, with_type=True)[:240]


def bench_phase(model: Any, input_ids: Any, decode_tokens: int, warmup: int = 1,
                repeats: int = 1) -> dict[str, Any]:
    """A `fastpath bench` entry for greedy decode replayed from a CUDA graph: `samples_s` (one
    per block of `decode_tokens` replays, capture excluded) and `capture_s`, or `skipped` (this
    setup cannot: no CUDA, transformers' cache) / `error` (it ran and failed, tokens differed)
    with the one-line reason - then no tokens/s is claimed."""
    res = graph_greedy(model, input_ids, new_tokens=decode_tokens, warmup=max(1, warmup),
                       repeats=repeats)
    entry: dict[str, Any] = {"tokens_per_call": res.batch * decode_tokens}
    if res.unsupported:
        entry["skipped"] = res.reason
        return entry
    entry.update(tokens_match_eager=res.match, tokens_match_dynamic_cache=res.match_dynamic,
                 eager_static_tokens_per_s=res.eager_tokens_per_s, capture_s=res.capture_s,
                 warmup_steps=res.warmup)
    if not res.ok:
        entry["error"] = res.reason
        return entry
    dynamic = {True: "and the DynamicCache decode", None: "(DynamicCache decode not compared)",
               False: f"but not the DynamicCache decode from step {res.first_mismatch_dynamic} on "
                      "(attention over a different cache length)"}[res.match_dynamic]
    eager = f", eager StaticCache {res.eager_tokens_per_s:,.1f} tok/s" if res.eager_tokens_per_s else ""
    entry["samples_s"] = res.samples_s
    entry["note"] = (f"capture {res.capture_s:.3f} s (not timed){eager}; tokens match the eager "
                     f"StaticCache loop {dynamic}")
    return entry
