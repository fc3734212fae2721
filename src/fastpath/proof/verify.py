"""`fastpath verify MODEL`: prove that the fast path computes the same function as the reference.

One process, one set of weights, one set of inputs: the model runs once with `fastpath.disable()`
(transformers' own path) and once with `fastpath.enable()`; every layer's output hidden states,
the logits, optionally every parameter gradient, and a greedy cached decode are compared with
tolerances chosen per dtype. Why every layer: drafters have been trained on hidden states that
were silently all zero, and a fallback once drifted by 0.125 in the logits. Only a comparison at
every layer says *where* a kernel goes wrong, and a flag on zero / constant / non-finite states
catches outputs that are wrong on both paths.

`--liger` checks a model composed with Liger Kernel (`pip install ".[train]"` from a checkout): Liger's
`apply_liger_kernel_to_<family>(model=...)` goes on the built model before both runs, so the
reference is transformers' torch fallbacks + Liger and the fast path enable() + Liger, and the
backward goes through Liger's fused linear cross-entropy (the loss a Liger user trains with).
That proves what composing adds: fastpath's kernels compute the same function under Liger's, and
enable() routes with Liger in place (the kernel calls, explain()'s rows of both). The other
comparison (plain reference vs fast + Liger) would mix Liger's own rounding (its norms compute in
fp32) with fastpath's, and a failure could not say whose it is; Liger's tests cover Liger itself.

This module is the rendering; the command line is proof/verify_cli.py, the maths is in
models/compare.py, running the two paths in proof/run_paths.py, the verdict in proof/verdict.py, the
job's size in models/sizing.py.
Exit status: 0 PASS, 1 FAIL, 2 bad input (or a job that will not fit), 3 NOT VERIFIED, 4 SLOW (same
function, but an op ran slow code: a torch fallback, a Hub kernel not cached, FLA on CPU tensors).
"""

from __future__ import annotations

from typing import Any

from fastpath.models.compare import NOISE_SLACK, ORACLE_SLACK
from fastpath.proof.verdict import (
    NOT_VERIFIED_HINT,
    NOT_VERIFIED_LINE,
    SLOW,
    SLOW_LINE,
    VerifyResult,
)


def route_lines(rows: list[dict[str, Any]]) -> list[str]:
    """'op: impl xN' per op and implementation, in the order explain() lists them."""
    counts: dict[tuple[str, str], int] = {}
    for r in rows:
        if "op" in r:
            impl = r.get("impl")
            key = (str(r["op"]), str(impl) if impl is not None else "not reported")
            counts[key] = counts.get(key, 0) + 1
        elif "error" in r:
            counts[(str(r["error"]), "")] = 1
    if not counts:
        return ["no causal_conv1d / gated-delta-rule layers found"]
    return [f"{op}: {impl} x{n}" if impl else op for (op, impl), n in counts.items()]


def _wrapped(head: str, items: list[str], width: int) -> list[str]:
    """`head` on its own line and one item per line under it, each wrapped at word boundaries to
    `width` with its continuation indented further (the route of 5 ops was one 600-column run)."""
    import textwrap

    lines = [head]
    for item in items:
        lines += textwrap.wrap(item, width, initial_indent="  ", subsequent_indent="      ",
                               break_long_words=False, break_on_hyphens=False) or ["  "]
    return lines


def _check_text(diff: Any) -> str:
    mark = "ok" if diff.ok else "MISMATCH"
    if diff.ok and diff.fast_vs_fp32 is not None:
        mark = "ok (fp32)"  # beyond the limit, no further from fp32 than the reference
    return mark + (": " + ", ".join(diff.flags) if diff.flags else "")


def _table(result: VerifyResult, width: int) -> Any:
    """The per-output table, within `width` columns. Layer types and numbers are never cut
    ("linear_at…" at 80 columns): every column's width is set here (rich crops a table whose
    columns cannot shrink enough); output names and flags wrap at spaces; where the types are
    too long for a column of their own, each goes under its output's name."""
    from rich.table import Table
    from rich.text import Text

    tol = result.tolerance
    rows = [*result.layers, result.logits]
    kinds = max((len(d.kind or "") for d in rows), default=0)
    names = max(len(d.name) for d in rows)
    checks = [_check_text(d) for d in rows]
    check_need = max(9, *(len(c) for c in checks))  # "MISMATCH:" / "ok (fp32)" whole
    numbers = (8, 9, 9)  # "2.51e-08"; the headers' "token rel"
    own_column = 10 + max(kinds, 4) + sum(numbers) + 9 + 6 * 2 + 7 <= width
    if own_column:
        fixed = max(kinds, 4) + sum(numbers) + 6 * 2 + 7
        output = min(names, max(10, width - fixed - check_need))
    else:
        fixed = sum(numbers) + 5 * 2 + 6
        output = max(kinds, 10, min(names, width - fixed - check_need))
    check = max(9, min(check_need, width - fixed - output))
    table = Table(title=f"fast vs reference, {result.dtype}, limits: rel {tol.rel:g}, token {tol.token_rel:g}")
    table.add_column("output" if own_column else "output\ntype", overflow="fold", width=output)
    if own_column:
        table.add_column("type", no_wrap=True, width=max(kinds, 4))
    for col, w in zip(("rel\nerror", "max\ntoken rel", "mean\ntoken rel"), numbers, strict=True):
        table.add_column(col, justify="right", no_wrap=True, width=w)
    table.add_column("check", overflow="fold", width=check)
    for diff, text in zip(rows, checks, strict=True):
        mark = Text(text, style="green" if diff.ok else "red")
        values = (f"{diff.rel:.2e}", f"{diff.token_rel_max:.2e}", f"{diff.token_rel_mean:.2e}")
        if own_column:
            table.add_row(diff.name, diff.kind or "", *values, mark)
        else:
            table.add_row(diff.name + (f"\n{diff.kind}" if diff.kind else ""), *values, mark)
    return table


def render(result: VerifyResult, width: int | None = None) -> Any:
    """A rich renderable: per-layer table, then the verdict. `width`: the terminal's columns
    (the route lines are wrapped to it; default: the terminal's)."""
    import shutil

    from rich.console import Group
    from rich.text import Text

    width = width or shutil.get_terminal_size().columns
    tol = result.tolerance
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
    lines.append(Text(f"inputs: {shape}"))
    for head, rows in (("reference path:", result.reference_explain), ("fast path:", result.explain)):
        lines += [Text(line, style="dim") for line in _wrapped(head, route_lines(rows), width)]
    lines.append(_table(result, width))
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
    lines.append(Text(f"fast path executed {result.conv_kernel_calls} conv kernel calls; every kernel counter: {calls}"))
    if result.verdict == "PASS":
        lines.append(Text("PASS: the fast path computes the same function", style="bold green"))
    elif result.verdict == SLOW:
        lines.append(Text(SLOW_LINE, style="bold yellow"))
        lines += [Text(f"  - {line}", style="yellow") for line in result.slow]
    elif result.verdict == "NOT VERIFIED":
        lines.append(Text(NOT_VERIFIED_LINE, style="bold yellow"))
        lines.append(Text(f"  - {result.not_verified}", style="yellow"))
        lines.append(Text(f"  - {NOT_VERIFIED_HINT}", style="yellow"))
    else:
        lines.append(Text("FAIL:", style="bold red"))
        lines += [Text(f"  - {p}", style="red") for p in result.problems]
    return Group(*lines)
