"""`fastpath capture MODEL DATA --out DIR` (see fastpath.capture for what it does)."""

from __future__ import annotations

import argparse
import sys

from fastpath.errors import UsageError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="preset name, config.json (random weights) or a local model directory "
                                      "(safetensors weights + tokenizer)")
    parser.add_argument("data", help="JSONL: chat 'messages' / ShareGPT 'conversations', or input_ids + loss_mask")
    parser.add_argument("--out", required=True, help="output directory (empty, or a capture to --resume)")
    parser.add_argument("--format", default="speculators", choices=["speculators", "specforge"],
                        help="offline layout to write (default: speculators)")
    parser.add_argument("--max-len", type=int, default=4096, help="truncate rows to this many tokens (4096)")
    parser.add_argument("--batch-tokens", type=int, default=16384,
                        help="padded tokens per forward; rows are batched by length (16384)")
    parser.add_argument("--layers", default=None,
                        help="auxiliary layer ids, comma-separated (default EAGLE-3: 2,L//2,L-3, capture-before); "
                             "the last layer's output is always stored as well")
    parser.add_argument("--layer-convention", default="before", choices=["before", "after"],
                        help="'before': id i = input of layer i (vLLM, speculators); "
                             "'after': id i = output of layer i (SGLang, SpecForge)")
    parser.add_argument("--dtype", default="bf16", help="bf16 | fp16 | fp32 (bf16)")
    parser.add_argument("--device", default="auto", help="auto | cpu | cuda[:N] (torchrun: one GPU per rank)")
    parser.add_argument("--seed", type=int, default=0, help="weights seed for presets/configs (0)")
    parser.add_argument("--model-layers", type=int, default=None,
                        help="cut a preset/config to its first N layers (layer pattern kept)")
    parser.add_argument("--tokenizer", default=None, help="local tokenizer directory (default: MODEL when a directory)")
    parser.add_argument("--resume", action="store_true", help="continue a capture in --out, skipping finished rows")
    parser.add_argument("--allow-slow", action="store_true",
                        help="capture even if some op takes a torch fallback (recorded in every shard)")
    parser.add_argument("--reference-path", action="store_true",
                        help="run the whole capture on transformers' reference path (benchmarks; needs --allow-slow)")
    parser.add_argument("--check-every", type=int, default=256,
                        help="re-run every Nth row on the reference path and compare (256; each rank's first "
                             "row always; 0: only that one)")
    parser.add_argument("--shard", default="auto", choices=["auto", "replicate", "fsdp"],
                        help="under torchrun: 'replicate' the target on every rank, or 'fsdp': shard it with "
                             "FSDP2 (fully_shard per decoder layer + the decoder stack; loaded on the host first). "
                             "'auto' (default): fsdp on GPUs when the weights exceed 75%% of one GPU's memory")
    parser.add_argument("--write-threads", type=int, default=4,
                        help="background threads writing row files while the next batch runs (4)")
    parser.add_argument("--quiet", action="store_true", help="no progress on stderr")


def main(args: argparse.Namespace) -> int:
    from fastpath.extras import require

    require("capture")  # before any work: one line naming the pip install, exit 2
    from fastpath.capture.run import CaptureOptions, run_capture

    opts = CaptureOptions(
        model=args.model, data=args.data, out=args.out, format=args.format, max_len=args.max_len,
        batch_tokens=args.batch_tokens, layers=args.layers, layer_convention=args.layer_convention,
        dtype=args.dtype, device=args.device, seed=args.seed, model_layers=args.model_layers,
        tokenizer=args.tokenizer, resume=args.resume, allow_slow=args.allow_slow,
        reference_path=args.reference_path, check_every=args.check_every, shard=args.shard,
        write_threads=args.write_threads, progress=not args.quiet,
    )
    if opts.check_every < 0:
        raise UsageError("--check-every must be >= 0")
    result = run_capture(opts)
    from fastpath.capture.distributed import world_from_env

    if world_from_env().is_main:
        checks = result.summary.get("reference_checks", {}).get("rows", [])
        print(f"fastpath capture: {result.rows} rows in {result.out} ({args.format}); this run wrote "
              f"{result.written} on rank 0 ({result.tokens_per_s:,.0f} tok/s), {result.skipped_done} already there; "
              f"{len(checks)} row{'' if len(checks) == 1 else 's'} re-checked on the reference path, all within tolerance; path: {result.path}"
              + (f"; target sharded with FSDP2 over {world_from_env().size} processes" if result.shard == "fsdp" else ""),
              file=sys.stdout)
    return 0
