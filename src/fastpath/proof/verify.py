"""`fastpath verify MODEL`: prove that the fast path computes the same function as the reference.

One process, one set of weights, one set of inputs: the model runs once with `fastpath.disable()`
(transformers' own path) and once with `fastpath.enable()`; every layer's output hidden states,
the logits, optionally every parameter gradient, and a greedy cached decode are compared with
tolerances chosen per dtype. Why every layer: drafters have been trained on hidden states that
were silently all zero, and a fallback once drifted by 0.125 in the logits. Only a comparison at
every layer says *where* a kernel goes wrong, and a flag on zero / constant / non-finite states
catches outputs that are wrong on both paths.

`--liger` checks a model composed with Liger Kernel (`pip install "fastpath-kit[train]"`): Liger's
`apply_liger_kernel_to_<family>(model=...)` goes on the built model before both runs, so the
reference is transformers' torch fallbacks + Liger and the fast path enable() + Liger, and the
backward goes through Liger's fused linear cross-entropy (the loss a Liger user trains with).
That proves what composing adds: fastpath's kernels compute the same function under Liger's, and
enable() routes with Liger in place (the kernel calls, explain()'s rows of both). The other
comparison (plain reference vs fast + Liger) would mix Liger's own rounding (its norms compute in
fp32) with fastpath's, and a failure could not say whose it is; Liger's tests cover Liger itself.

This module is the command line and the rendering; the maths is in models/compare.py, running the
two paths in proof/run_paths.py, the verdict in proof/verdict.py, the job's size in models/sizing.py.
Exit status: 0 PASS, 1 FAIL, 2 bad input (or a job that will not fit), 3 NOT VERIFIED.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from fastpath.models.compare import NOISE_SLACK, ORACLE_SLACK
from fastpath.proof.run_paths import REFERENCES
from fastpath.proof.verdict import (
    NOT_VERIFIED_HINT,
    NOT_VERIFIED_LINE,
    CannotVerify,
    VerifyResult,
    route_summary,
)

SAVE_NAME = "fastpath-verify.json"  # the file `--save DIR` writes inside DIR

# Rendering and CLI


def render(result: VerifyResult) -> Any:
    """A rich renderable: per-layer table, then the verdict."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    tol = result.tolerance
    table = Table(title=f"fast vs reference, {result.dtype}, limits: rel {tol.rel:g}, token {tol.token_rel:g}")
    for col in ("output", "type", "rel error", "max token rel", "mean token rel", "flags", ""):
        table.add_column(col, justify="right" if "rel" in col else "left")
    for diff in [*result.layers, result.logits]:
        mark = "[green]ok[/]" if diff.ok else "[red]MISMATCH[/]"
        if diff.ok and diff.fast_vs_fp32 is not None:
            mark = "[green]ok (fp32)[/]"  # beyond the limit, no further from fp32 than the reference
        table.add_row(diff.name, diff.kind, f"{diff.rel:.2e}", f"{diff.token_rel_max:.2e}",
                      f"{diff.token_rel_mean:.2e}", ", ".join(diff.flags), mark)
    lines: list[Any] = [Text(f"model: {result.model['source']} ({result.model['class']}, "
                             f"{result.model['layers']} layers, {result.dtype}, {result.model['device']})")]
    if result.sizing:
        sizing = result.sizing
        from fastpath.models.sizing import human_bytes, human_count

        lines.append(Text(f"size: {human_count(sizing['parameters'])} parameters, weights "
                          f"{human_bytes(sizing['weight_bytes'])}, estimated peak {human_bytes(sizing['peak_bytes'])}",
                          style="dim"))
    for note in result.model.get("notes", []):
        lines.append(Text(f"note: {note}", style="dim"))
    shape = f"batch {result.batch} x seq-len {result.seq_len}"
    if result.packed:
        shape += f", packed into one row as sequences of {result.segments} (reference: each on its own)"
    lines += [
        Text(f"inputs: {shape}"),
        Text(f"reference path: {route_summary(result.reference_explain)}", style="dim"),
        Text(f"fast path: {route_summary(result.explain)}", style="dim"),
        table,
    ]
    rescued = [d for d in [*result.layers, result.logits] if d.ok and d.fast_vs_fp32 is not None]
    if rescued:
        worst = max(rescued, key=lambda d: d.rel)
        lines.append(Text(
            f"ok (fp32): {len(rescued)} outputs beyond the limit, but the fast path is no further from an "
            f"fp32 run of the reference path than {ORACLE_SLACK:g}x the bf16 reference is (worst {worst.name}: "
            f"fast {worst.fast_vs_fp32:.2e}, reference {worst.ref_vs_fp32:.2e} from fp32)", style="dim"))
    if result.grads is not None:
        bad = [g for g in result.grads if not g.ok]
        rule = f"within {tol.grad_rel:g} of the reference"
        if any(g.fast_vs_fp32 is not None for g in result.grads):
            rule += f", or no further from an fp32 run than {ORACLE_SLACK:g}x the reference is"
        noisy = [g for g in result.grads if g.noise is not None]
        if noisy:
            rule += (f"; {len(noisy)} ill-conditioned, judged against {NOISE_SLACK:g}x the reference's own "
                     "rounding noise (" + ", ".join(f"{g.name.split('.')[-1]} {g.rel:.2e} vs noise {g.noise:.2e}"
                                                    for g in noisy[:3]) + ")")
        text = f"gradients: {len(result.grads) - len(bad)}/{len(result.grads)} parameters pass ({rule})"
        worst = max(result.grads, key=lambda g: g.rel, default=None)
        if worst is not None:
            text += f"; largest difference {worst.name} {worst.rel:.2e}"
            if worst.fast_vs_fp32 is not None:
                text += f" (vs fp32: fast {worst.fast_vs_fp32:.2e}, reference {worst.ref_vs_fp32:.2e})"
        lines.append(Text(text, style="green" if not bad else "red"))
    if result.decode is not None:
        lines.append(Text(f"decode: {result.decode.detail}", style="green" if result.decode.ok else "red"))
    calls = ", ".join(f"{k} x{n}" for k, n in result.fast_calls.items()) or "none"
    lines.append(Text(f"fast path executed {result.conv_kernel_calls} conv kernel calls ({calls})"))
    if result.verdict == "PASS":
        lines.append(Text("PASS: the fast path computes the same function", style="bold green"))
    elif result.verdict == "NOT VERIFIED":
        lines.append(Text(NOT_VERIFIED_LINE, style="bold yellow"))
        lines.append(Text(f"  - {result.not_verified}", style="yellow"))
        lines.append(Text(f"  - {NOT_VERIFIED_HINT}", style="yellow"))
    else:
        lines.append(Text("FAIL:", style="bold red"))
        lines += [Text(f"  - {p}", style="red") for p in result.problems]
    return Group(*lines)




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
                        help=f"also write the result JSON to PATH (a directory: PATH/{SAVE_NAME})")
    parser.epilog = "exit status: 0 PASS, 1 FAIL, 2 bad input or a job that does not fit in memory, 3 NOT VERIFIED"


def main(args: argparse.Namespace) -> int:
    from fastpath.extras import require

    require("verify")
    from rich.console import Console

    from fastpath.models.dtypes import resolve_dtype
    from fastpath.proof.progress import Stages
    from fastpath.proof.run_paths import verify_model

    save = None
    if args.save:  # checked before any work: a bad path used to cost the whole run
        from fastpath.proof.out_paths import resolve_save_file

        save = resolve_save_file(args.save, "--save", SAVE_NAME)
    dtype = resolve_dtype(args.dtype, args.device)
    try:
        with Stages("verify") as stages:
            if save is not None and str(save) != args.save:
                stages.note(f"the result JSON goes to {save}")
            result = verify_model(
                args.model, dtype=dtype, seq_len=args.seq_len, batch=args.batch, packed=args.packed,
                backward=args.backward, layers=args.layers, decode_tokens=args.decode_tokens,
                device=args.device, seed=args.seed, reference=args.reference, liger=args.liger,
                progress=stages, note=stages.note,
            )
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
        Console().print(render(result))
    if result.verdict == "NOT VERIFIED" and args.json:
        print(f"fastpath verify: {NOT_VERIFIED_LINE}; {NOT_VERIFIED_HINT}", file=sys.stderr)
    return result.exit_code
