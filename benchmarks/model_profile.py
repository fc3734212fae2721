"""Where a whole model's step goes: GPU time per kernel family, the split of "elementwise/other"
into its kernels and the ops that launched them, and the matmul-bound ceiling.

The targets: model forward+backward >= 3.5x the torch fallback and prefill >= 1.05x FLA+Dao.
Whether such a ratio is reachable depends on how much of a step is dense matmul work that every
configuration shares (cuBLAS runs the projections and MLPs the same way whatever runs the
GatedDeltaNet core). This script runs `fastpath bench`'s own prefill and forward+backward phases
(bench_spec: same inputs, same loss) under torch.profiler, one configuration per process (the
same package hiding as bench), and reports for each phase:

* GPU time by kernel family (gemm, attention, gated delta rule (FLA), causal conv, SSD, norm,
  elementwise/other) with the top kernels, so the classification can be checked by eye;
* the split of "elementwise/other": its top kernels by GPU time, each with the source
  ops that launched it, and the top source ops. A source is "<module class>: <op>", the module
  being the innermost nn.Module whose forward was running (a record_function scope this script
  opens around every module forward while profiling) and the op the innermost aten / custom op
  that launched the kernel; a backward kernel's source is "<module class>: <autograd node>
  (backward)", its module found through the node's sequence number, which the forward op that
  created the node shares;
* the analytic matmul FLOPs of the step (2 x tokens x linear weights forward, 6x for
  forward+backward; prefill's lm_head runs on the last token only) and the GEMM rate reached;
* the ceiling: the step's tokens/s if everything but the GEMMs took no time at that rate;
* the device's time end to end (`kernel_ms`: every kernel once, those no launching op claimed
  among the split's sources as "(no launching op recorded)") and the rest of the un-profiled
  step (`device_idle_ms`), with the host syncs of one more step by Python line (`sync_points`):
  a sync in mid-step idles the GPU while the host launches what follows.

Configurations are bench's (fastpath, fla+dao, reference, fastpath+compile) plus "<config>+liger":
the same, then Liger Kernel's `apply_liger_kernel_to_<family>(model=...)` on the built model
(after enable()); skipped with a reason when liger_kernel does not import. Liger's fused linear
cross-entropy only runs when the model gets `labels`, so a +liger configuration's train phase
calls `model(input_ids, labels=input_ids)` (the same next-token loss transformers shifts itself)
instead of bench's loss on materialised logits.

usage: python benchmarks/model_profile.py --out DIR [--configs fastpath,fastpath+liger]
                                          [--layers 8] [--seq-len 4096] [--steps 3] [--top 15]
       python benchmarks/model_profile.py --out DIR --smoke   (CPU, tiny Qwen3.5: the plumbing)
Writes DIR/model_profile.json, rewritten after each configuration. Needs CUDA unless --smoke
(where the "kernels" are leaf CPU ops and their times CPU self times). ~1 minute per
configuration after compiles.
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from gdn_layer_profile import _device_self_us, cuda_times  # same folder: sys.path[0]

# Ordered: the first family whose pattern matches a kernel's name takes it.
FAMILIES: tuple[tuple[str, str], ...] = (
    ("attention", r"flash|fmha|attention|sdpa|softmax_warp"),
    ("gated delta rule (FLA)", r"chunk_|gated_delta|delta_rule|fused_recurrent|solve_tril|kkt|"
                               r"recompute_w_u|prepare_wy|wy_fast|l2norm|merge_16x16|dqkwg|dhu|dv_local"),
    ("causal conv", r"causal_conv1d"),
    ("ssd", r"_states_kernel|_dstates_kernel|_out_kernel|_cb_kernel|_dcb_kernel|_dbc_kernel|"
            r"_dx_kernel|_state_update_kernel"),
    ("norm", r"rms|layer_norm|layernorm|group_norm|_norm_"),
    # the last alternative: CPU op names, for --smoke
    ("gemm", r"gemm|gemv|xmma|cutlass|nvjet|cublas|sm90_|splitk|matmul|^aten::(add|b)?mm$"),
)
MATCHERS = [(name, re.compile(pat, re.I)) for name, pat in FAMILIES]
OTHER = "elementwise/other"
MODULE_SCOPE = "fp.module: "  # record_function label of a module forward (this script's hooks)
_AUTOGRAD_NODE = "autograd::engine::evaluate_function: "
UNCLAIMED = "(no launching op recorded)"
# Smoke mode: CPU ops that only make views or allocate (no kernel would run on a GPU).
NO_KERNEL_OPS = frozenset(f"aten::{n}" for n in (
    "as_strided", "view", "_unsafe_view", "_reshape_alias", "reshape", "expand", "transpose", "t",
    "slice", "select", "split", "split_with_sizes", "chunk", "unsqueeze", "squeeze", "permute",
    "detach", "alias", "empty", "empty_like", "empty_strided", "resolve_conj", "resolve_neg",
    "lift_fresh", "unbind", "narrow", "view_as", "expand_as", "set_", "result_type"))
# Smoke mode: the preset's shape cut to a few seconds of CPU (same layer pattern and head ratios).
SMOKE_TEXT_CONFIG = {
    "model_type": "qwen3_5_text", "vocab_size": 96, "hidden_size": 64, "intermediate_size": 96,
    "num_hidden_layers": 4, "layer_types": ["linear_attention"] * 3 + ["full_attention"],
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "linear_num_key_heads": 2,
    "linear_num_value_heads": 6, "linear_key_head_dim": 8, "linear_value_head_dim": 8,
    "linear_conv_kernel_dim": 4, "partial_rotary_factor": 0.25, "attn_output_gate": True,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25,
                        "mrope_section": [2, 1, 1], "mrope_interleaved": True},
    "tie_word_embeddings": False,
}


def family(kernel: str) -> str:
    for name, pat in MATCHERS:
        if pat.search(kernel):
            return name
    return OTHER


def linear_params(model: Any) -> tuple[int, int]:
    """(weights of every nn.Linear except lm_head, lm_head's weights)."""
    import torch

    head = model.get_output_embeddings()
    body = sum(m.weight.numel() for m in model.modules()
               if isinstance(m, torch.nn.Linear) and m is not head)
    return body, (head.weight.numel() if head is not None else 0)


def split_config(config: str) -> tuple[str, bool]:
    """("fastpath", True) for "fastpath+liger": bench's configuration and whether Liger goes on top."""
    if config.endswith("+liger"):
        return config.removesuffix("+liger"), True
    return config, False


def apply_liger(model: Any, model_type: str) -> str:
    """Liger Kernel's patch for this model family, applied to the built model; what was called."""
    import liger_kernel.transformers as liger

    family_name = model_type.removesuffix("_text")
    fn = getattr(liger, f"apply_liger_kernel_to_{family_name}", None)
    if fn is None:
        raise LookupError(f"liger_kernel has no apply_liger_kernel_to_{family_name}")
    fn(model=model)
    return f"apply_liger_kernel_to_{family_name}(model=...)"


def train_with_labels(model: Any, ids: Any, settings: Any) -> tuple[Callable[[], Any], None, int]:
    """Forward + backward of the next-token loss computed inside the model (labels=ids; the model
    shifts them), so a fused linear cross-entropy patched into the model's forward runs."""

    from fastpath.routing.liger_route import next_token_loss

    def run() -> None:
        model.zero_grad(set_to_none=True)
        # skip_logits: Liger's fused linear cross-entropy runs only when asked in eval mode too
        loss = next_token_loss(model, ids)
        if loss is None:  # Liger's loss forward is not in place
            loss = model(input_ids=ids, labels=ids, use_cache=False).loss
        loss.backward()
    return run, None, ids.numel()


@contextmanager
def module_scopes(model: Any) -> Iterator[None]:
    """A record_function scope "fp.module: <class>" around every submodule's forward (removed on
    exit), so a profile can name the module each op ran in. Not on the LM head: a hook there makes
    fastpath's fused-loss route keep transformers' own loss (a hooked lm_head may be an offload or
    a wrapper), so the profile would time a step the benchmark does not run; its GEMMs count under
    the model's scope. Not on plain nn.Linear modules either, for the same reason: a hooked
    projection keeps fastpath's linear group off it (kernels/linear_group); their GEMMs count
    under the enclosing module's scope. Not on a post-attention norm whose decoder layer the
    residual add + norm route rewrote (FASTPATH_ADD_NORM=auto): a hooked norm keeps the separate
    add and norm; its kernel counts under the decoder layer's scope."""
    import torch

    from fastpath.routing import add_norm_route

    handles = []
    head = getattr(model, "lm_head", None)
    fused_norms = {id(getattr(layer, "post_attention_layernorm", None)) for layer in model.modules()
                   if add_norm_route.ACTIVE is not None and add_norm_route.ACTIVE.route
                   and hasattr(type(layer).forward, add_norm_route.ROUTE_ATTR)}

    def pre(mod: Any, _args: Any) -> None:
        rf = torch.autograd.profiler.record_function(MODULE_SCOPE + type(mod).__name__)
        rf.__enter__()
        mod.__dict__.setdefault("_fp_scopes", []).append(rf)

    def post(mod: Any, _args: Any, _out: Any) -> None:
        stack = mod.__dict__.get("_fp_scopes")
        if stack:
            stack.pop().__exit__(None, None, None)

    for mod in model.modules():
        if mod is head or type(mod) is torch.nn.Linear or id(mod) in fused_norms:
            continue
        handles.append(mod.register_forward_pre_hook(pre))
        handles.append(mod.register_forward_hook(post))
    try:
        yield
    finally:
        for h in handles:
            h.remove()
        for mod in model.modules():
            mod.__dict__.pop("_fp_scopes", None)


def _parents(event: Any) -> Iterator[Any]:
    node = event.cpu_parent
    while node is not None:
        yield node
        node = node.cpu_parent


def _scope_of(event: Any) -> str | None:
    """The innermost module scope around `event` (itself included), or None."""
    if event.name.startswith(MODULE_SCOPE):
        return event.name[len(MODULE_SCOPE):]
    for p in _parents(event):
        if p.name.startswith(MODULE_SCOPE):
            return p.name[len(MODULE_SCOPE):]
    return None


def _backward_node(event: Any) -> str | None:
    for p in (event, *_parents(event)):
        if p.name.startswith(_AUTOGRAD_NODE):
            return p.name[len(_AUTOGRAD_NODE):]
    return None


def _launcher(event: Any) -> str:
    """The op that launched a kernel: `event` itself unless it is a profiler scope of ours."""
    for p in (event, *_parents(event)):
        if not p.name.startswith((MODULE_SCOPE, _AUTOGRAD_NODE)):
            return p.name
    return event.name


def attributed_kernels(events: list[Any], cpu: bool) -> list[tuple[str, str, float]]:
    """(kernel name, source, us) for every device kernel in a profile's events (`prof.events()`);
    with cpu=True the "kernels" are the leaf CPU ops, timed by their CPU self time."""
    seq_scope: dict[int, str] = {}
    for e in events:  # forward ops in start order: the outermost op of a sequence number first
        seq = getattr(e, "sequence_nr", -1)
        if seq is None or seq < 0 or seq in seq_scope or _backward_node(e) is not None:
            continue
        scope = _scope_of(e)
        if scope is not None:
            seq_scope[seq] = scope
    rows = []
    for e in events:
        if cpu:
            if e.name.startswith((MODULE_SCOPE, _AUTOGRAD_NODE)) or e.cpu_children or e.name in NO_KERNEL_OPS:
                continue
            kernels = [(e.name, float(e.self_cpu_time_total))]
        else:
            kernels = [(k.name, float(k.duration)) for k in getattr(e, "kernels", ()) or ()]
        if not kernels:
            continue
        node = _backward_node(e)
        op = _launcher(e)
        if node is not None:
            seq = next((getattr(p, "sequence_nr", -1) for p in (e, *_parents(e))
                        if p.name.startswith(_AUTOGRAD_NODE) or p.name == node), -1)
            scope = seq_scope.get(seq) or "?"
            source = f"{scope}: {node} (backward)"
        else:
            source = f"{_scope_of(e) or 'top level'}: {op}"
        rows.extend((name, source, us) for name, us in kernels)
    return rows


def other_split(rows: list[tuple[str, str, float]], steps: int, top: int) -> dict[str, Any]:
    """The elementwise/other kernels: top `top` by time (each with its top sources) and the top
    `top` sources (each with its top kernels), ms per step."""
    by_kernel: dict[str, dict[str, list[float]]] = {}
    by_source: dict[str, dict[str, list[float]]] = {}
    for name, source, us in rows:
        if family(name) != OTHER:
            continue
        for outer, inner, table in ((name, source, by_kernel), (source, name, by_source)):
            cell = table.setdefault(outer, {}).setdefault(inner, [0.0, 0])
            cell[0] += us / 1e3 / steps
            cell[1] += 1

    def ranked(table: dict[str, dict[str, list[float]]], inner_key: str) -> list[dict[str, Any]]:
        out = []
        for outer, inner in table.items():
            ms = sum(v[0] for v in inner.values())
            calls = sum(v[1] for v in inner.values()) // steps
            parts = sorted(inner.items(), key=lambda kv: kv[1][0], reverse=True)[:3]
            out.append({"name": outer[:160], "ms": ms, "calls": calls,
                        inner_key: [{"name": k[:160], "ms": v[0]} for k, v in parts]})
        return sorted(out, key=lambda r: r["ms"], reverse=True)[:top]

    total = sum(us for name, _s, us in rows if family(name) == OTHER) / 1e3 / steps
    return {"ms": total, "kernels": ranked(by_kernel, "sources"), "sources": ranked(by_source, "kernels")}


def device_kernels(events: list[Any]) -> dict[str, float]:
    """Microseconds by name of every kernel, copy and memset the device ran (`prof.events()`'s
    device-side events): each once, unlike per-op device totals, where an op and its kernel both
    count, and whatever launched it (an op, an autograd node, a Triton launch outside any op)."""
    out: dict[str, float] = {}
    for e in events:
        if "CUDA" not in str(getattr(e, "device_type", "")) or getattr(e, "is_user_annotation", False):
            continue
        if e.name.startswith((MODULE_SCOPE, _AUTOGRAD_NODE)):  # scopes mirrored on the device's timeline
            continue
        out[e.name] = out.get(e.name, 0.0) + e.time_range.elapsed_us()
    return out


def unclaimed(rows: list[tuple[str, str, float]], device: dict[str, float]) -> list[tuple[str, str, float]]:
    """The device time no launching op claimed (the profiler links each kernel to the host event
    that launched it, and a launch it did not record leaves its kernel out of `rows`), as rows of
    source UNCLAIMED, so the split adds up to what the device ran."""
    claimed: dict[str, float] = {}
    for name, _source, us in rows:
        claimed[name] = claimed.get(name, 0.0) + us
    rest = ((name, us - claimed.get(name, 0.0)) for name, us in device.items())
    return [(name, UNCLAIMED, us) for name, us in rest if us > 0.5]


def idle_split(busy_us: float, steps: int, step_ms: float) -> dict[str, float]:
    """The step's device work end to end (`kernel_ms`) and the rest of its wall time
    (`device_idle_ms`): the GPU waiting on the host, e.g. after a sync in mid-step. The step is
    timed without the profiler, so its hooks' host cost does not count as idle."""
    kernel_ms = busy_us / 1e3 / steps
    return {"kernel_ms": kernel_ms, "device_idle_ms": max(0.0, step_ms - kernel_ms)}


def sync_points(run: Callable[[], Any], top: int = 30) -> list[dict[str, Any]]:
    """[{where: "file:line", what: first line of the warning, count}] of one `run()` (CUDA only):
    every host <- device sync it makes, by the Python line that asked (torch's sync debug mode,
    https://pytorch.org/docs/stable/generated/torch.cuda.set_sync_debug_mode.html, warns at each;
    the warning's location is that line). A sync in mid-step idles the GPU while the host
    launches what follows."""
    import torch

    seen: collections.Counter[tuple[str, str]] = collections.Counter()

    def note(message: Any, category: Any, filename: str, lineno: int, file: Any = None, line: Any = None) -> None:
        seen[(f"{filename}:{lineno}", str(message).splitlines()[0][:120])] += 1

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        previous, warnings.showwarning = warnings.showwarning, note
        torch.cuda.set_sync_debug_mode(1)
        try:
            run()
        finally:
            torch.cuda.set_sync_debug_mode(0)
            warnings.showwarning = previous
    return [{"where": where, "what": what, "count": n} for (where, what), n in seen.most_common(top)]


def _wall_times(fn: Callable[[], Any], n: int) -> list[float]:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return times


def child(config: str, args: argparse.Namespace) -> dict[str, Any]:
    """One configuration in this process (bench's package hiding), both phases profiled."""
    from torch.profiler import ProfilerActivity, profile

    from fastpath.proof.bench_spec import CONFIGS, PHASE_REGISTRY, BenchSettings
    from fastpath.proof.bench_worker import _hide_modules, _importable

    base, liger = split_config(config)
    spec = CONFIGS[base]
    _hide_modules(spec.hide)
    missing = [m for m in (*spec.requires, *(("liger_kernel",) if liger else ())) if not _importable(m)]
    if missing:
        return {"config": config, "skipped": f"not importable: {', '.join(missing)}"}
    import torch

    from fastpath.models.build import build_model
    from fastpath.routing.engine import enable

    device = "cpu" if args.smoke else "cuda"
    dtype = "fp32" if args.smoke else "bf16"
    if spec.enable:
        enable(warn=False)
    settings = BenchSettings(source=args.model, layers=args.layers, dtype=dtype, device=device,
                             seq_len=args.seq_len, batch=1)
    built = build_model(settings.source, layers=settings.layers, dtype=dtype, device=device, seed=0)
    model = built.model
    body, head = linear_params(model)
    out: dict[str, Any] = {"config": config, "label": spec.label + (" + Liger Kernel" if liger else ""),
                           "linear_params": body, "lm_head_params": head, "phases": {}}
    if liger:
        out["liger"] = apply_liger(model, built.model_type)
    if spec.compile:  # fastpath+compile: the eager model-wide work compiled too
        model.forward = torch.compile(model.forward)
    ids = torch.randint(0, built.vocab_size, (1, args.seq_len), generator=torch.Generator().manual_seed(1))
    ids = ids.to(device)
    tokens = ids.numel()
    activities = [ProfilerActivity.CPU] + ([] if args.smoke else [ProfilerActivity.CUDA])
    timer = _wall_times if args.smoke else cuda_times
    for name, flops in (("prefill", 2 * tokens * body + 2 * head),
                        ("train", 6 * tokens * (body + head))):
        runner = train_with_labels if (liger and name == "train") else PHASE_REGISTRY[name].runner
        fn, _setup, _ = runner(model, ids, settings)
        try:
            for _ in range(2):
                fn()
            if not args.smoke:
                torch.cuda.synchronize()
            times = timer(fn, args.steps)
            with module_scopes(model), profile(activities=activities) as prof:
                for _ in range(args.steps):
                    fn()
                if not args.smoke:
                    torch.cuda.synchronize()
        except Exception as exc:  # an FLA refusal in one phase must not hide the other
            out["phases"][name] = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"}
            continue
        finally:
            model.zero_grad(set_to_none=True)
        phase = summarise(prof, args.steps, sorted(times)[len(times) // 2], flops, tokens, cpu=args.smoke)
        events = list(prof.events())
        rows = attributed_kernels(events, cpu=args.smoke)
        if not args.smoke:
            rows += unclaimed(rows, device_kernels(events))
        phase["other_split"] = other_split(rows, args.steps, args.top)
        phase.update(idle_split(sum(us for _n, _s, us in rows), args.steps, phase["step_ms"]))
        if not args.smoke:  # one more step under torch's sync debug mode
            try:
                phase["sync_points"] = sync_points(fn)
            except Exception as exc:  # the profile above stands without it
                phase["sync_points_error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
            finally:
                model.zero_grad(set_to_none=True)
        if liger and name == "train":
            phase["loss"] = "model(input_ids, labels=input_ids, skip_logits=True).loss (Liger's fused loss)"
        out["phases"][name] = phase
    return out


def summarise(prof: Any, steps: int, step_ms: float, flops: int, tokens: int, cpu: bool = False) -> dict[str, Any]:
    kernels: dict[str, list[float]] = {}
    for e in prof.key_averages():
        if cpu:  # leaf CPU ops stand in for kernels (smoke mode)
            scope = e.key.startswith((MODULE_SCOPE, _AUTOGRAD_NODE)) or e.key in NO_KERNEL_OPS
            us = 0.0 if scope else float(e.self_cpu_time_total)
        else:
            us = _device_self_us(e)
        if us > 0:
            row = kernels.setdefault(e.key, [0.0, 0])
            row[0] += us / steps / 1e3
            row[1] += e.count // steps
    by_family: dict[str, float] = {}
    for name, (ms, _calls) in kernels.items():
        by_family[family(name)] = by_family.get(family(name), 0.0) + ms
    gemm_ms = by_family.get("gemm", 0.0)
    gpu_ms = sum(by_family.values())
    top = sorted(kernels.items(), key=lambda kv: kv[1][0], reverse=True)[:30]
    return {
        "step_ms": step_ms,
        "tokens_per_s": tokens / step_ms * 1e3,
        "gpu_busy_ms": gpu_ms,
        "ms_by_family": dict(sorted(by_family.items(), key=lambda kv: kv[1], reverse=True)),
        "matmul_tflop": flops / 1e12,
        "gemm_tflops_reached": flops / gemm_ms / 1e9 if gemm_ms else None,
        "ceiling_tokens_per_s": tokens / gemm_ms * 1e3 if gemm_ms else None,
        "top_kernels": [{"name": k[:140], "family": family(k), "ms": v[0], "calls": v[1]} for k, v in top],
    }


def print_row(row: dict[str, Any], top: int) -> None:
    config = row["config"]
    for phase, p in row.get("phases", {}).items():
        if "error" in p:
            print(f"{config:14s} {phase:8s} error: {p['error']}")
            continue
        fams = ", ".join(f"{k} {v:.1f}" for k, v in p["ms_by_family"].items())
        print(f"{config:14s} {phase:8s} {p['step_ms']:7.1f} ms ({p['tokens_per_s'] / 1e3:.1f}k tok/s), "
              f"GEMM {p['gemm_tflops_reached'] or 0:.0f} TFLOP/s, ceiling "
              f"{(p['ceiling_tokens_per_s'] or 0) / 1e3:.1f}k tok/s | {fams}", flush=True)
        if "kernel_ms" in p:
            syncs = p.get("sync_points")
            where = "; ".join(f"{s['count']}x {s['where'].rsplit('/', 1)[-1]}" for s in (syncs or [])[:4])
            print(f"  kernels {p['kernel_ms']:.2f} ms, device idle {p['device_idle_ms']:.2f} ms of the step"
                  + ("" if syncs is None else f"; host syncs: {sum(s['count'] for s in syncs)}"
                     + (f" ({where})" if where else "")), flush=True)
        split = p.get("other_split")
        if split:
            print(f"  {OTHER} {split['ms']:.2f} ms; top sources:")
            for s in split["sources"][:top]:
                kern = "; ".join(k["name"][:60] for k in s["kernels"][:2])
                print(f"    {s['ms']:7.3f} ms {s['calls']:5d}x  {s['name'][:70]}  [{kern}]", flush=True)
    if "error" in row or "skipped" in row:
        print(f"{config:14s} {row.get('error') or row.get('skipped')}", flush=True)


def smoke_source(out: Path) -> str:
    """A config.json of a tiny Qwen3.5 (SMOKE_TEXT_CONFIG) in `out`, for --smoke."""
    path = out / "smoke_config.json"
    path.write_text(json.dumps(SMOKE_TEXT_CONFIG, indent=1))
    return str(path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="output directory")
    ap.add_argument("--model", default="qwen3.5-27b")
    ap.add_argument("--layers", type=int, default=None, help="default: 8 (--smoke: the tiny model's 4)")
    ap.add_argument("--seq-len", type=int, default=None, help="default: 4096 (--smoke: 64)")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--top", type=int, default=15, help="rows of the elementwise/other split")
    ap.add_argument("--configs", default="fastpath,fastpath+liger")
    ap.add_argument("--smoke", action="store_true", help="CPU, tiny Qwen3.5 model (tests the plumbing)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.layers is None:
        args.layers = 4 if args.smoke else 8
    if args.seq_len is None:
        args.seq_len = 64 if args.smoke else 4096
    if args.child:
        print(json.dumps(child(args.child, args)))
        return 0
    import torch

    from fastpath.proof.bench_spec import CONFIGS

    configs = [c for c in args.configs.split(",") if c]
    unknown = [c for c in configs if split_config(c)[0] not in CONFIGS]
    if unknown:
        print(f"model_profile: error: unknown configuration {unknown[0]!r}; known: "
              f"{', '.join(CONFIGS)} (each also as <name>+liger)", file=sys.stderr)
        return 2
    if not args.smoke and not torch.cuda.is_available():
        print("model_profile: error: needs a CUDA device (or --smoke)", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.smoke and args.model == "qwen3.5-27b":
        args.model = smoke_source(out)
    doc: dict[str, Any] = {
        "device": "cpu (smoke)" if args.smoke else torch.cuda.get_device_name(), "torch": torch.__version__,
        "model": args.model, "layers": args.layers, "seq_len": args.seq_len, "batch": 1,
        "dtype": "fp32" if args.smoke else "bf16", "configs": []}
    for config in configs:
        cmd = [sys.executable, __file__, "--out", str(out), "--model", args.model, "--layers", str(args.layers),
               "--seq-len", str(args.seq_len), "--steps", str(args.steps), "--top", str(args.top),
               "--child", config, *(["--smoke"] if args.smoke else [])]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        lines = proc.stdout.strip().splitlines()
        try:
            row = json.loads(lines[-1])
        except (IndexError, json.JSONDecodeError):
            row = {"config": config, "error": f"exit {proc.returncode}: {proc.stderr.strip()[-400:]}"}
        doc["configs"].append(row)
        (out / "model_profile.json").write_text(json.dumps(doc, indent=1))  # on disk as soon as measured
        print_row(row, args.top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
