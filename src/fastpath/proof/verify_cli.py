"""`fastpath verify MODEL` arguments and entry point: the input checked before any work, the two
paths run (proof/run_paths.verify_model), verify.render's table or the JSON printed, and the
verdict's exit status (what is proved, and why so: proof/verify.py)."""

from __future__ import annotations

import argparse
import json
import sys

from fastpath.proof.run_paths import REFERENCES
from fastpath.proof.verdict import NOT_VERIFIED_HINT, NOT_VERIFIED_LINE, CannotVerify
from fastpath.proof.verify import render

SAVE_NAME = "fastpath-verify.json"  # the file `--save DIR` writes inside DIR


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", metavar="MODEL", help="preset name, config.json path, or local model directory with safetensors")
    parser.add_argument("--dtype", default="auto", choices=["auto", "bf16", "fp16", "fp32"],
                        help="auto: bf16 on a GPU, fp32 on CPU")
    parser.add_argument("--seq-len", type=int, default=256, help="tokens per row (default 256)")
    parser.add_argument("--batch", type=int, default=2, help="rows (default 2)")
    parser.add_argument("--packed", action="store_true",
                        help="pack the batch into one row of unequal sequences (seq_idx / cu_seqlens)")
    parser.add_argument("--backward", action="store_true", help="also compare parameter gradients of a next-token loss")
    parser.add_argument("--layers", type=int, default=None,
                        help="keep N layers, every layer type of the model represented")
    parser.add_argument("--decode-tokens", type=int, default=8, help="greedy cached decode steps to compare (0: skip)")
    parser.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    parser.add_argument("--seed", type=int, default=0, help="seed for random weights and inputs")
    parser.add_argument("--reference", choices=REFERENCES, default="torch",
                        help="torch: transformers' torch fallbacks (Dao causal-conv1d / FLA hidden while the model "
                             "is built); transformers: whatever transformers binds here")
    parser.add_argument("--liger", action="store_true",
                        help="apply Liger Kernel's patch for the model's family before both runs (the fast path "
                             "vs the reference, both with Liger; needs liger-kernel and a CUDA device)")
    parser.add_argument("--json", action="store_true", help="print the result as JSON on stdout")
    parser.add_argument("--save", metavar="PATH", default=None,
                        help=f"also write the result JSON to PATH (default: not saved); a directory: "
                             f"PATH/{SAVE_NAME}, or the next free {SAVE_NAME.replace('.json', '-N.json')} "
                             "there; an existing file only with --force")
    parser.add_argument("--force", action="store_true", help="let --save replace an existing file")
    parser.epilog = ("exit status: 0 PASS (same function, every op on a fast kernel), 1 FAIL, 2 bad input or "
                     "a job that does not fit in memory, 3 NOT VERIFIED (the fast path ran torch code), "
                     "4 SLOW (same function, but some op ran slow code; the lines above name them)")


def main(args: argparse.Namespace) -> int:
    from fastpath.shared.extras import require

    require("verify")  # the command's one check: verify_model, below, assumes it
    from fastpath.routing.routes import check_switches

    check_switches()  # a bad FASTPATH_* value stops here, not after the reference side has run
    from dataclasses import replace

    from rich.console import Console

    from fastpath.models.resolve import resolve_model
    from fastpath.proof.progress import Stages
    from fastpath.proof.run_paths import VerifySettings, verify_resolved

    save = None
    if args.save:  # checked before any work: a bad path used to cost the whole run
        from fastpath.shared.output_files import resolve_save_file

        save = resolve_save_file(args.save, "--save", SAVE_NAME, force=args.force)
    run = VerifySettings(seq_len=args.seq_len, batch=args.batch, packed=args.packed, backward=args.backward,
                         decode_tokens=args.decode_tokens, seed=args.seed, reference=args.reference,
                         liger=args.liger, liger_interpreter=False)  # checked before the source is read
    model = resolve_model(args.model, layers=args.layers, dtype=args.dtype, device=args.device)  # read once
    try:
        with Stages("verify") as stages:
            if save is not None and str(save) != args.save:
                stages.note(f"the result JSON goes to {save}")
            result = verify_resolved(model, replace(run, say=stages, tell=stages.note))
    except CannotVerify as exc:  # said before any work: the verdict, not an error
        print(f"fastpath verify: NOT VERIFIED: {exc}", file=sys.stderr)
        return exc.exit_code
    if save is not None:
        save.parent.mkdir(parents=True, exist_ok=True)
        save.write_text(json.dumps(result.to_json(), indent=1, default=str) + "\n")
        print(f"fastpath verify: wrote {save}", file=sys.stderr)
    if args.json:
        json.dump(result.to_json(), sys.stdout, indent=1, default=str)
        sys.stdout.write("\n")
    else:
        console = Console()
        console.print(render(result, console.width))
    if result.verdict == "NOT VERIFIED" and args.json:
        print(f"fastpath verify: {NOT_VERIFIED_LINE}; {NOT_VERIFIED_HINT}", file=sys.stderr)
    return result.exit_code
