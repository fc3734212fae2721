"""`fastpath capture MODEL DATA --out DIR` (see fastpath.capture for what it does)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from fastpath.capture.formats import DEFAULT_FORMAT, FORMAT_NAMES
from fastpath.shared.errors import UsageError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="preset name, config.json (random weights) or a local model directory "
                                      "(safetensors weights + tokenizer)")
    parser.add_argument("data", nargs="?", default=None,
                        help="JSONL: chat 'messages' / ShareGPT 'conversations', or input_ids + loss_mask "
                             "(leave it out with --check-client to check the finished capture in --out)")
    parser.add_argument("--out", required=True, help="output directory (empty, or a capture to --resume)")
    parser.add_argument("--format", default=DEFAULT_FORMAT, choices=FORMAT_NAMES,
                        help=f"offline layout to write (default: {DEFAULT_FORMAT})")
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
    parser.add_argument("--recheck-tokens", type=int, default=1024,
                        help="re-run only the first N tokens of a re-checked row (1024; 0: the whole row). Exact: "
                             "a causal model's first N positions do not depend on the rest")
    parser.add_argument("--shard", default="auto", choices=["auto", "replicate", "fsdp"],
                        help="under torchrun: 'replicate' the target on every rank, or 'fsdp': shard it with "
                             "FSDP2 (fully_shard per decoder layer + the decoder stack; loaded on the host first). "
                             "'auto' (default): fsdp on GPUs when the weights exceed 75%% of one GPU's memory")
    parser.add_argument("--write-threads", type=int, default=4,
                        help="background threads writing row files while the next batch runs (4)")
    parser.add_argument("--no-overlap", dest="overlap", action="store_false",
                        help="settle each batch (checks read, rows handed to the writers) before the next "
                             "forward starts; default: the next forward is queued first, which holds one "
                             "more batch of states in GPU memory")
    parser.add_argument("--check-client", default=None, choices=FORMAT_NAMES,
                        help="after the capture (or, without DATA, on the capture in --out): rebuild with the "
                             "installed client's own code what it will train against for a few rows (speculators: "
                             "its verifier norm + lm_head on the stored last state; SpecForge: its TargetHead on "
                             "the stored post-norm state), compare with MODEL's own logits, warn on a mismatch "
                             "with the remedy; recorded in capture_summary.json. MODEL must be a local directory. "
                             "Without DATA the exit status is 1 when the client would train against other logits")
    parser.add_argument("--client-target", default=None, metavar="DIR",
                        help="with --check-client: write DIR = MODEL as the client should read it (MODEL's files "
                             "linked; an index for SpecForge; for speculators with a zero-centred final norm, "
                             "model.norm.weight stored as 1 + w), check the client against it, and point the "
                             "client there (speculators --verifier-name-or-path, SpecForge --target-model-path). "
                             "Never load the model itself from DIR")
    parser.add_argument("--quiet", action="store_true", help="no progress on stderr")


# The environment a capture's run depends on, carried into the line that continues it: without
# TRITON_INTERPRET=1 a CPU capture refuses its own --resume (the fast path needs the interpreter),
# without CUDA_VISIBLE_DEVICES it lands on other GPUs, without PYTHONPATH it may not find fla.
RESUME_ENV = ("CUDA_VISIBLE_DEVICES", "TRITON_INTERPRET", "PYTHONPATH", "HF_HUB_OFFLINE", "USE_HUB_KERNELS",
              "FASTPATH_HUB_KERNELS")


def main(args: argparse.Namespace) -> int:
    import os

    from fastpath.capture.distributed import world_from_env
    from fastpath.shared.extras import require

    env = {name: os.environ[name] for name in RESUME_ENV if name in os.environ}  # before fastpath sets any
    require("capture")  # before any work: one line naming the pip install, exit 2
    from fastpath.routing.routes import check_switches

    check_switches()  # a bad FASTPATH_* value: one line, exit 2, before the model is built
    from fastpath.capture.options import CaptureOptions, check_options
    from fastpath.capture.run import run_capture

    opts = CaptureOptions(
        model=args.model, data=args.data, out=args.out, format=args.format, max_len=args.max_len,
        batch_tokens=args.batch_tokens, layers=args.layers, layer_convention=args.layer_convention,
        dtype=args.dtype, device=args.device, seed=args.seed, model_layers=args.model_layers,
        tokenizer=args.tokenizer, resume=args.resume, allow_slow=args.allow_slow,
        reference_path=args.reference_path, check_every=args.check_every, shard=args.shard,
        recheck_tokens=args.recheck_tokens,
        write_threads=args.write_threads, overlap=args.overlap, progress=not args.quiet,
        check_client=getattr(args, "check_client", None), client_target=getattr(args, "client_target", None),
    )
    opts.setup_interrupt_text = lambda: interrupted_text(args, opts.status, env)
    if opts.check_every < 0:
        raise UsageError("--check-every must be >= 0")
    if args.data is not None:
        check_options(opts)  # the options themselves: one line, before anything is said or imported
    if not args.quiet and world_from_env().is_main:  # the imports alone take seconds
        print("fastpath capture: starting: importing torch and transformers, then reading MODEL's config"
              + (" and DATA" if args.data is not None else ""), file=sys.stderr, flush=True)
    if args.data is None:  # --check-client on the finished capture in --out
        from fastpath.capture.finish import check_existing_capture

        record = check_existing_capture(opts)
        return 0 if record.get("ok") or record.get("ok_with_client_target") else 1
    try:
        result = run_capture(opts)
    except KeyboardInterrupt:
        if world_from_env().is_main:
            print(interrupted_text(args, opts.status, env), file=sys.stderr)
        return 130
    if world_from_env().is_main:
        print(summary_text(result, args.format, world_from_env().size), file=sys.stdout)
    return 0


def resume_command(args: argparse.Namespace, env: dict[str, str] | None = None) -> str:
    """The command that continues this capture: the environment it ran with (`env`, RESUME_ENV's
    variables that were set), what was typed (options at their defaults left out), plus --resume."""
    import shlex

    parser = argparse.ArgumentParser(add_help=False)
    add_arguments(parser)
    words = ["fastpath", "capture", args.model, args.data]
    for action in parser._actions:
        if not action.option_strings or action.dest == "resume":
            continue
        value = getattr(args, action.dest, action.default)
        if value == action.default:
            continue
        flag = action.option_strings[-1]
        words += [flag] if isinstance(action, argparse._StoreTrueAction) else [flag, str(value)]
    prefix = [f"{name}={shlex.quote(value)}" for name, value in (env or {}).items()]
    return " ".join([*prefix, shlex.join([*words, "--resume"])])


def interrupted_text(args: argparse.Namespace, status: Any = None, env: dict[str, str] | None = None) -> str:
    """Ctrl-C: when, what is on disk ("0 of 40 rows ..."), and the exact command (with the
    environment the run needed) that continues from it."""
    if status is None:
        when, kept = "", "every row file in --out is complete (written by atomic rename)"
    else:
        when, kept = f" {status.stage}", status.kept()
    return f"fastpath capture: interrupted{when}; {kept}. Continue with:\n  {resume_command(args, env)}"


def summary_text(result: object, layout: str, processes: int, width: int | None = None) -> str:
    """The closing summary as short lines wrapped to the terminal (it was one 318-column line)."""
    import shutil
    import textwrap

    r: Any = result
    width = width or shutil.get_terminal_size().columns
    checks = r.summary.get("reference_checks", {}).get("rows", [])
    if checks:
        bad = [c for c in checks if not c.get("ok")]
        verdict = "all within tolerance" if not bad else f"{len(bad)} beyond tolerance"
        checked = f"{len(checks)} row{'' if len(checks) == 1 else 's'} re-run on the reference path, {verdict}"
    elif r.written == 0:
        checked = "none (this run captured no new row)"
    else:
        checked = "no row was re-run on the reference path"
    parts = [
        f"fastpath capture: {r.rows} rows in {r.out} ({layout})",
        f"this run: {r.written} rows written on rank 0 ({r.tokens_per_s:,.0f} tok/s), {r.skipped_done} already there",
        f"reference check: {checked}",
        f"path: {r.path}",
    ]
    if r.shard == "fsdp":
        parts.append(f"target sharded with FSDP2 over {processes} processes")
    lines: list[str] = []
    for i, part in enumerate(parts):
        indent = "" if i == 0 else "  "
        lines += textwrap.wrap(part, width, initial_indent=indent, subsequent_indent=indent + "  ",
                               break_long_words=False, break_on_hyphens=False)
    return "\n".join(lines)
