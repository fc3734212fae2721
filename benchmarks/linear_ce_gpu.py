"""The LM head + cross-entropy of a training step on the GPU: transformers' materialised loss vs
fastpath's fused op (kernels/linear_ce) vs Liger Kernel's fused linear cross-entropy.

Op level (default): Qwen3.5-27B's head (hidden 5120, vocab 248,320, read from fastpath's
qwen3.5-27b preset), N = B*L rows, bf16, every input requiring grad, forward + backward:
* materialised: F.linear, .float(), cross_entropy (what ForCausalLMLoss runs);
* fastpath:     linear_cross_entropy with its default chunking, and with --chunk-rows values;
* liger:        LigerFusedLinearCrossEntropyFunction (when liger_kernel imports).
Each row: median / min ms (CUDA events), the extra peak memory over the inputs, the loss and its
distance to the materialised loss, and the relative L2 distance of dhidden / dweight to it.

Row kernel (--rows-sweep SPEC, alone: no op or model rows): the cross-entropy row kernel by itself
(kernels/linear_ce/fwd_bwd.ce_rows_, the step after the GEMM) on (N, V) bf16 logits at each
access order of SPEC, a comma list of PROGRAMS[r] (PROGRAMS: 0 for one program per row, or
Kx for K programs a streaming multiprocessor; r: pass 2 walked from the row's end), default
"0,0r,1x,1xr,2x,2xr,4xr". Each row: median / min ms, the bandwidth over the kernel's mandatory
bytes (read N*V, write N*V), its fraction of a device copy timed in the same process, and whether
its losses and gradients equal the default order's bit for bit (they must: only the order moves).

Model level (--model): bench's train step (`model(input_ids, labels=ids).loss.backward()`) on the
8-layer qwen3.5-27b cut after fastpath.enable(), with and without routing/lm_head_route applied
(tokens/s and peak memory); the route is applied here by hand, so this works before enable()
wires it in.

usage: python benchmarks/linear_ce_gpu.py [--batch 1] [--seq-len 4096] [--iters 10] [--warmup 3]
                                          [--chunk-rows 1024,512] [--model] [--layers 8]
                                          [--rows-sweep SPEC] [--out FILE]
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


DEFAULT_ROWS_SWEEP = "0,0r,1x,1xr,2x,2xr,4xr"


def parse_rows_sweep(spec: str) -> list[tuple[str, int, bool]]:
    """"0,0r,2xr" -> [(label, programs per SM (0: one program per row), reverse)]; a bad item
    is an argparse error naming it."""
    items = []
    for item in (v.strip() for v in spec.split(",") if v.strip()):
        body, reverse = (item[:-1], True) if item.endswith("r") else (item, False)
        per_sm = body[:-1] if body.endswith("x") else body
        if not per_sm.isdigit() or (body.endswith("x") == (per_sm == "0")):
            raise argparse.ArgumentTypeError(f"--rows-sweep item {item!r}: expected 0, 0r, Kx or Kxr "
                                             "(K >= 1 programs a streaming multiprocessor)")
        items.append((item, int(per_sm), reverse))
    if not items:
        raise argparse.ArgumentTypeError("--rows-sweep: no items")
    return items


def rows_level(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The row kernel alone at each access order of args.rows_sweep (module doc)."""
    from fastpath.kernels.linear_ce.fwd_bwd import ce_rows_

    _, vocab = head_dims()
    n = args.batch * args.seq_len
    gen = torch.Generator(device="cuda").manual_seed(0)
    logits = (4 * torch.randn(n, vocab, device="cuda", generator=gen)).to(torch.bfloat16)
    y = torch.randint(0, vocab, (n,), device="cuda", generator=gen)
    y[args.seq_len - 1::args.seq_len] = -100
    scale = torch.tensor([1.0 / max(1, int((y != -100).sum()))], device="cuda")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    mandatory = 2 * logits.numel() * logits.element_size()
    scratch = torch.empty_like(logits)
    copy_ms = statistics.median(cuda_times(lambda: scratch.copy_(logits), args.iters))
    copy_gbs = mandatory / copy_ms / 1e6  # a copy moves the same bytes: read N*V, write N*V
    out, want = [], None
    for label, per_sm, reverse in args.rows_sweep:
        programs = per_sm * sms

        def call(buf: torch.Tensor, programs: int = programs, reverse: bool = reverse) -> torch.Tensor:
            return ce_rows_(buf, y, scale, -100, programs=programs, reverse=reverse)

        scratch.copy_(logits)
        loss = call(scratch)
        got = (loss.clone(), scratch.clone())
        if want is None:
            want = got
        same = torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
        del got
        for _ in range(args.warmup):
            call(scratch)
        times = cuda_times(lambda: call(scratch), args.iters)
        med = statistics.median(times)
        out.append({"order": label, "programs": programs or n, "reverse": reverse, "n": n, "vocab": vocab,
                    "median_ms": med, "min_ms": min(times), "gb_per_s": mandatory / med / 1e6,
                    "copy_gb_per_s": copy_gbs, "copy_frac": copy_ms / med, "bitwise_equal_default": same})
        print(json.dumps(out[-1]), file=sys.stderr)
    return out


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
    parser.add_argument("--rows-sweep", type=parse_rows_sweep, default=None, metavar="SPEC",
                        help=f"time only the row kernel at these access orders (e.g. {DEFAULT_ROWS_SWEEP})")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("linear_ce_gpu: needs a CUDA GPU", file=sys.stderr)
        return 3
    doc: dict[str, Any] = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
    if args.rows_sweep:
        doc["rows"] = rows_level(args)
    else:
        doc["op"] = op_level(args)
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
