"""Capture and FSDP2 training on N processes (torchrun), fallback vs fast path: tokens/s per GPU,
peak memory, losses, and whether every rank was on the fast path.

Usage (one node, N GPUs; run once per N for a scaling table):
    torchrun --nproc-per-node N benchmarks/multi_gpu.py --out benchmarks/results/multi_gpu
        [--model qwen3.5-27b --layers 8 --seq-len 4096 --phases capture,train --paths fallback,fast]
CPU smoke test (what CI runs, tests/capture/test_capture_multi.py):
    torchrun --nproc-per-node 2 benchmarks/multi_gpu.py --device cpu --dtype fp32 --model tiny.json ...

capture: `fastpath capture` of --capture-rows synthetic rows, target replicated on every rank
    (--capture-shard fsdp: sharded with FSDP2 as `fastpath capture --shard fsdp` does; rows split
    by packing.batches_for_rank), verification on; each rank's time split is reported.
train: the target wrapped with FSDP2 (`fully_shard` per decoder layer, then the root), activation
    checkpointing, mixed precision (params in --dtype, gradients reduced in fp32), AdamW; each step
    draws one global batch of --global-batch random sequences from a seeded generator and each rank
    takes its slice, so the loss sequence is the same function for any N (and for both paths,
    within bf16 noise when --dtype bf16).
Before timing, every rank runs `assert_fast` on the fast path (unless --allow-slow-fast-path, for
CPU smoke tests where an op has no fast path) and reports its explain() count. Rank 0 writes
multi_gpu_n{N}.json to --out.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

# Loss agreement between the two paths: fp32 must match closely; bf16 runs differ by rounding that
# the optimizer carries forward (verify's bf16 tolerance on one forward is 4e-2).
LOSS_TOL = {"fp32": 1e-4, "bf16": 5e-2, "fp16": 2e-2}


def _setup(device_name: str) -> tuple[Any, int, int]:
    """Process group (always: FSDP2 needs one, also for N=1) and this rank's device."""
    import torch
    import torch.distributed as dist

    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    local = int(os.environ.get("LOCAL_RANK", 0))
    cuda = device_name == "cuda"
    device = torch.device("cuda", local) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        if world == 1 and "MASTER_ADDR" not in os.environ:
            # an in-memory store: a file store's file outlives the process (its refcount is written
            # back at exit), one left in the temp folder per run
            dist.init_process_group("nccl" if cuda else "gloo", store=dist.HashStore(), rank=0, world_size=1)
        else:
            dist.init_process_group("nccl" if cuda else "gloo")
    return device, rank, world


def _route(model: Any, path: str, allow_slow: bool) -> dict[str, Any]:
    """enable() (+ assert_fast) for the fast path, disable() for the fallback; the explain count."""
    import fastpath

    if path == "fast":
        fastpath.enable(warn=False)
        if not allow_slow:
            fastpath.assert_fast(model)
    else:
        fastpath.disable()
    table = fastpath.explain(model)
    return {"ops": len(table.rows), "fast_ops": len(table.rows) - table.slow_count}


def _build(args: argparse.Namespace, dtype: str, device: Any) -> Any:
    from fastpath.capture.options import CaptureOptions
    from fastpath.capture.target import load_target

    return load_target(CaptureOptions(model=args.model, data="", out="", dtype=dtype, model_layers=args.layers,
                                      seed=args.seed), device)


def _peak(device: Any) -> float | None:
    import torch

    return round(torch.cuda.max_memory_allocated(device) / 2**30, 2) if device.type == "cuda" else None


def _reset_peak(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def capture_phase(args: argparse.Namespace, path: str, device: Any, rank: int, scratch: Path) -> dict[str, Any]:
    import torch.distributed as dist

    from fastpath.capture.options import CaptureOptions
    from fastpath.capture.run import run_capture

    built = _build(args, args.dtype, device)
    routes = _route(built.model, path, args.allow_slow_fast_path)
    data = scratch / "rows.jsonl"
    if rank == 0 and not data.exists():
        import random

        rng = random.Random(0)
        with data.open("w") as fh:
            for _ in range(args.capture_rows):
                ids = [rng.randrange(built.vocab_size) for _ in range(args.seq_len)]
                fh.write(json.dumps({"input_ids": ids, "loss_mask": [1] * args.seq_len}) + "\n")
    dist.barrier()
    out = scratch / f"capture-{path}"
    opts = CaptureOptions(model=args.model, data=str(data), out=str(out), format="speculators", max_len=args.seq_len,
                          batch_tokens=args.batch_tokens, dtype=args.dtype, device=str(device),
                          model_layers=args.layers, seed=args.seed, allow_slow=path == "fallback" or args.allow_slow_fast_path,
                          reference_path=path == "fallback", check_every=args.check_every, progress=False,
                          layers=args.capture_layers, prebuilt=built, shard=args.capture_shard)
    _reset_peak(device)
    result = run_capture(opts)
    dist.barrier()
    if rank == 0:
        shutil.rmtree(out, ignore_errors=True)
    return {"routes": routes, "rows_written": result.written, "tokens": result.tokens,
            "seconds": round(result.seconds, 4), "tokens_per_s": round(result.tokens_per_s, 1),
            "rows_rechecked": len(result.checked), "peak_gpu_memory_gib": _peak(device), "capture_path": result.path,
            "shard": result.shard, "timings_s": result.timings}


def train_phase(args: argparse.Namespace, path: str, device: Any, rank: int, world: int) -> dict[str, Any]:
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    from fastpath.models.dtypes import torch_dtype

    if args.global_batch % world:
        raise SystemExit(f"--global-batch {args.global_batch} must be a multiple of the {world} processes")
    built = _build(args, "fp32", device)  # fp32 master weights; FSDP2 casts to --dtype for compute
    model = built.model
    routes = _route(model, path, args.allow_slow_fast_path)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    policy = MixedPrecisionPolicy(param_dtype=torch_dtype(args.dtype), reduce_dtype=torch.float32)
    for layer in model.model.layers:
        fully_shard(layer, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    local = args.global_batch // world
    losses, times = [], []
    for step in range(args.warmup + args.steps):
        gen = torch.Generator().manual_seed(1000 + step)
        batch = torch.randint(0, built.vocab_size, (args.global_batch, args.seq_len), generator=gen)
        ids = batch[rank * local:(rank + 1) * local].to(device)
        if step == args.warmup:
            _reset_peak(device)
        t0 = time.perf_counter()
        loss = torch.zeros(1, device=device)
        for j in range(local):  # one sequence at a time: a 248k-vocab logits tensor is large
            model.set_requires_gradient_sync(j == local - 1)
            out = model(input_ids=ids[j:j + 1], labels=ids[j:j + 1], use_cache=False)
            (out.loss / local).backward()
            loss += out.loss.detach().float() / local
        opt.step()
        opt.zero_grad(set_to_none=True)
        dist.all_reduce(loss, op=dist.ReduceOp.SUM)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - t0)
        losses.append(float(loss) / world)
    timed = times[args.warmup:]
    tokens = local * args.seq_len * len(timed)
    import fastpath

    fastpath.disable()
    return {"routes": routes, "losses": losses, "tokens": tokens, "seconds": round(sum(timed), 4),
            "tokens_per_s": round(tokens / sum(timed), 1) if timed else None, "peak_gpu_memory_gib": _peak(device)}


def _scratch_root(args: argparse.Namespace) -> str:
    """/dev/shm when it can hold one path's capture (4 states per token, +25%), else the temp dir:
    a container's /dev/shm is often 64 MB."""
    from fastpath.models.resolve import resolve_source, transformers_config

    hidden = int(transformers_config(resolve_source(args.model).config, args.layers).hidden_size)
    need = int(args.capture_rows * args.seq_len * 4 * hidden * (4 if args.dtype == "fp32" else 2) * 1.25)
    if os.path.isdir("/dev/shm") and shutil.disk_usage("/dev/shm").free > need:
        return "/dev/shm"
    return tempfile.gettempdir()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--model", default="qwen3.5-27b")
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=4096)
    parser.add_argument("--phases", default="capture,train")
    parser.add_argument("--paths", default="fallback,fast")
    parser.add_argument("--dtype", default="bf16")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--capture-rows", type=int, default=64, help="rows in all (split over ranks)")
    parser.add_argument("--batch-tokens", type=int, default=16384)
    parser.add_argument("--check-every", type=int, default=64)
    parser.add_argument("--capture-layers", default=None, help="capture --layers (default EAGLE-3's)")
    parser.add_argument("--capture-shard", default="replicate", choices=["auto", "replicate", "fsdp"],
                        help="capture --shard (replicate)")
    parser.add_argument("--global-batch", type=int, default=8, help="sequences per training step, all ranks")
    parser.add_argument("--steps", type=int, default=4, help="timed training steps")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--allow-slow-fast-path", action="store_true",
                        help="CPU smoke tests: run the 'fast' path even where an op has no fast path")
    args = parser.parse_args()

    import torch.distributed as dist

    device, rank, world = _setup(args.device)
    scratch = Path(_scratch_root(args)) / f"fastpath-multi-{os.environ.get('TORCHELASTIC_RUN_ID', os.getpid())}"
    if rank == 0:
        scratch.mkdir(parents=True, exist_ok=True)
    dist.barrier()
    results: dict[str, dict[str, Any]] = {}
    try:
        for phase in [p for p in args.phases.split(",") if p]:
            for path in [p for p in args.paths.split(",") if p]:
                fn = capture_phase if phase == "capture" else train_phase
                extra = (scratch,) if phase == "capture" else (world,)
                mine = fn(args, path, device, rank, *extra)
                gathered: list[Any] = [None] * world
                dist.all_gather_object(gathered, mine)
                results[f"{phase}/{path}"] = {"per_rank": gathered}
                if rank == 0:
                    print(f"multi_gpu: {phase}/{path}: {json.dumps(mine)}", file=sys.stderr, flush=True)
    finally:
        dist.barrier()
        if rank == 0:
            shutil.rmtree(scratch, ignore_errors=True)
    if rank == 0:
        report = _report(args, world, results)
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / f"multi_gpu_n{world}.json").write_text(json.dumps(report, indent=2) + "\n")
        print(json.dumps(report["summary"]))
    dist.destroy_process_group()
    return 0


def _report(args: argparse.Namespace, world: int, results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    summary: dict[str, Any] = {"world_size": world}
    for key, res in results.items():
        ranks = res["per_rank"]
        tokens = sum(r["tokens"] for r in ranks)
        slowest = max(r["seconds"] for r in ranks) or 1e-9
        res["total_tokens_per_s"] = round(tokens / slowest, 1)
        res["per_gpu_tokens_per_s"] = round(tokens / slowest / world, 1)
        res["all_ranks_fast"] = all(r["routes"]["fast_ops"] == r["routes"]["ops"] for r in ranks)
        summary[key] = res["per_gpu_tokens_per_s"]
    for phase in ("capture", "train"):
        fast, slow = results.get(f"{phase}/fast"), results.get(f"{phase}/fallback")
        if fast and slow:
            summary[f"{phase} fast/fallback"] = round(fast["total_tokens_per_s"] / slow["total_tokens_per_s"], 3)
    if "train/fast" in results and "train/fallback" in results:
        a = results["train/fast"]["per_rank"][0]["losses"]
        b = results["train/fallback"]["per_rank"][0]["losses"]
        worst = max(abs(x - y) / max(abs(y), 1e-12) for x, y in zip(a, b, strict=True))
        summary["train loss rel diff fast vs fallback"] = worst
        summary["train losses agree"] = worst <= LOSS_TOL.get(args.dtype, 5e-2)
    return {
        "benchmark": "multi_gpu",
        "when": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "config": vars(args),
        "summary": summary,
        "results": results,
    }


if __name__ == "__main__":
    code = main()
    # Every result is written and the process group destroyed; leave without the interpreter's
    # and C++'s teardown, where a torch.distributed rank can abort after its work is done (seen
    # once in ~10 CPU test runs under load: "terminate called without an active exception",
    # SIGABRT; pytorch/pytorch#179291 describes Gloo's worker threads crashing finalization).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
