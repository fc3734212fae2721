"""The LM head + cross-entropy of a training step on the GPU: transformers' materialised loss vs
fastpath's fused op (kernels/linear_ce) vs Liger Kernel's fused linear cross-entropy.

Op level (default): Qwen3.5-27B's head (hidden 5120, vocab 248,320, read from fastpath's
qwen3.5-27b preset), N = B*L rows, bf16, every input requiring grad, forward + backward:
* materialised: F.linear, .float(), cross_entropy (what ForCausalLMLoss runs);
* fastpath:     linear_cross_entropy with its default chunking, and with --chunk-rows values;
* liger:        LigerFusedLinearCrossEntropyFunction (when liger_kernel imports).
Each row: median / min ms (CUDA events), the extra peak memory over the inputs, the loss and its
distance to the materialised loss, and the relative L2 distance of dhidden / dweight to it.

Model level (--model): bench's train step (`model(input_ids, labels=ids).loss.backward()`) on the
8-layer qwen3.5-27b cut after fastpath.enable(), with and without routing/lm_head_route applied
(tokens/s and peak memory); the route is applied here by hand, so this works before enable()
wires it in.

usage: python benchmarks/linear_ce_gpu.py [--batch 1] [--seq-len 4096] [--iters 10] [--warmup 3]
                                          [--chunk-rows 1024,512] [--model] [--layers 8] [--out FILE]
Needs a CUDA GPU. Prints one JSON document (and writes it to --out).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch
from gdn_layer_profile import cuda_times  # same folder: sys.path[0]


def head_dims() -> tuple[int, int]:
    """(hidden, vocab) of the qwen3.5-27b preset."""
    from fastpath.shared.model_source import load_preset_with_source

    cfg = load_preset_with_source("qwen3.5-27b")
    text = cfg.get("text_config", cfg)
    return int(text["hidden_size"]), int(text["vocab_size"])


def measure(step: Any, iters: int, warmup: int) -> dict[str, Any]:
    """step() -> (loss, dhidden, dweight); its times and the extra peak memory of one call."""
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    loss, dx, dw = step()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    times = cuda_times(step, iters)
    return {"median_ms": statistics.median(times), "min_ms": min(times), "extra_peak_gb": peak / 1e9,
            "loss": float(loss), "grads": (dx, dw)}


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.linalg.vector_norm(a.float() - b.float()) / torch.linalg.vector_norm(b.float()))


def op_level(args: argparse.Namespace) -> list[dict[str, Any]]:
    from fastpath.kernels.linear_ce.interface import linear_cross_entropy

    hidden, vocab = head_dims()
    n = args.batch * args.seq_len
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(n, hidden, device="cuda", generator=gen).to(torch.bfloat16).requires_grad_()
    w = (0.02 * torch.randn(vocab, hidden, device="cuda", generator=gen)).to(torch.bfloat16).requires_grad_()
    y = torch.randint(0, vocab, (n,), device="cuda", generator=gen)
    y[args.seq_len - 1::args.seq_len] = -100  # each row's shifted-out last position

    def run(loss_fn: Any) -> Any:
        def step() -> tuple[Any, Any, Any]:
            x.grad = w.grad = None
            loss = loss_fn()
            loss.backward()
            return loss.detach(), x.grad, w.grad
        return step

    impls: dict[str, Any] = {
        "materialised": lambda: torch.nn.functional.cross_entropy(
            torch.nn.functional.linear(x, w).float(), y, ignore_index=-100),
        "fastpath": lambda: linear_cross_entropy(x, w, y),
    }
    for rows in args.chunk_rows:
        impls[f"fastpath chunk_rows={rows}"] = lambda rows=rows: linear_cross_entropy(x, w, y, chunk_rows=rows)
    try:
        from liger_kernel.ops.fused_linear_cross_entropy import LigerFusedLinearCrossEntropyFunction

        impls["liger"] = lambda: LigerFusedLinearCrossEntropyFunction.apply(x, w, y)[0]
    except Exception as exc:  # reported, not fatal
        print(f"liger skipped: {type(exc).__name__}: {exc}", file=sys.stderr)
    rows_out, reference = [], None
    for name, fn in impls.items():
        res = measure(run(fn), args.iters, args.warmup)
        dx, dw = res.pop("grads")
        if reference is None:
            reference = (res["loss"], dx.clone(), dw.clone())
        else:
            res["loss_diff"] = abs(res["loss"] - reference[0])
            res["dhidden_rel"] = rel(dx, reference[1])
            res["dweight_rel"] = rel(dw, reference[2])
        rows_out.append({"impl": name, "n": n, "hidden": hidden, "vocab": vocab, **res})
        print(json.dumps(rows_out[-1]), file=sys.stderr)
    return rows_out


def model_level(args: argparse.Namespace) -> list[dict[str, Any]]:
    import fastpath
    from fastpath.models.build import build_model
    from fastpath.routing import lm_head_route
    from fastpath.routing.patch_registry import PatchRegistry

    fastpath.enable(warn=False)
    built = build_model("qwen3.5-27b", layers=args.layers, dtype="bf16", device="cuda")
    model = built.model.train()
    ids = torch.randint(0, model.config.vocab_size, (args.batch, args.seq_len), device="cuda")
    out = []
    for routed in (False, True):
        reg = PatchRegistry()
        if routed:
            lm_head_route.apply(reg)
            assert lm_head_route.fused_loss_in_place(model)

        def step() -> tuple[Any, Any, Any]:
            model.zero_grad(set_to_none=True)
            loss = model(input_ids=ids, labels=ids, use_cache=False).loss
            loss.backward()
            return loss.detach(), None, None

        res = measure(step, args.iters, args.warmup)
        res.pop("grads")
        res["tokens_per_s"] = ids.numel() / (res["median_ms"] / 1e3)
        out.append({"impl": "enable() + lm_head_route" if routed else "enable()", "layers": args.layers, **res})
        print(json.dumps(out[-1]), file=sys.stderr)
        reg.undo()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--seq-len", type=int, default=4096)
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--chunk-rows", type=lambda s: [int(v) for v in s.split(",") if v], default=[1024])
    parser.add_argument("--model", action="store_true", help="also bench's train step on the qwen3.5-27b cut")
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("linear_ce_gpu: needs a CUDA GPU", file=sys.stderr)
        return 3
    doc: dict[str, Any] = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                           "op": op_level(args)}
    if args.model:
        doc["model"] = model_level(args)
    import triton

    doc["triton"] = triton.__version__
    text = json.dumps(doc, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
