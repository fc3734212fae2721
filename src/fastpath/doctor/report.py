"""Human report for a Diagnosis (rendering only; rich). Verdict line and top remedy first.

Fits the console width (COLUMNS when piped, 80 by default): prose wraps between words, a
`command` in backticks is never broken across lines, and a table that would not fit without
splitting a cell becomes a `key: value` list. Everything is printed as rich Text: no markup,
emoji code or highlighting is read from the strings, so facts from the target (made plain by
fastpath.shared.plain_text: control characters visible, long strings cut) show as they are.
"""

from __future__ import annotations

import io
import re
from typing import Any

from fastpath.doctor.facts import FactsView
from fastpath.doctor.plan import range_start

VERDICT_STYLE = {"fast": "bold green", "slow": "bold red", "blocked": "bold red",
                 "unknown": "bold yellow"}
SEVERITY_STYLE = {"error": "red", "warning": "yellow", "info": "cyan"}
_GAP = 2  # spaces between table columns
_CODE_OR_WORD = re.compile(r"`[^`]*`[^\s`]*|\S+")


def wrap_keeping_commands(text: str, width: int, indent: str = "", first: str = "") -> list[str]:
    """Greedy word wrap where a `backticked command` (with any punctuation glued to it) is one
    unbreakable token; a token longer than the width gets a line of its own."""
    lines: list[str] = []
    line = first
    room = width
    for token in _CODE_OR_WORD.findall(text):
        token = " ".join(token.split())  # a command keeps its words, on one line
        start = len(line) == len(first if not lines else indent)
        candidate = line + ("" if start else " ") + token
        if len(candidate) <= room or (start and len(line) + len(token) <= room):
            line = candidate
        else:
            if not start:
                lines.append(line)
            # a token too long for the indent moves left as far as it needs to fit
            line = " " * min(len(indent), max(0, room - len(token))) + token
    lines.append(line)
    return lines


def _line(console: Any, text: str, style: str = "") -> None:
    """One line as rich Text (a str would go through rich's markup and emoji passes)."""
    from rich.text import Text

    console.print(Text(text, style=style), soft_wrap=True)


def say(console: Any, text: str, *, indent: str = "", first: str = "", style: str = "") -> None:
    """`text` wrapped to the console's width between words (see wrap_keeping_commands)."""
    for line in wrap_keeping_commands(text, console.width, indent, first):
        _line(console, line, style)



def _section(console: Any, title: str) -> None:
    console.print()
    say(console, title, style="bold")
    _line(console, "-" * min(len(title), console.width), style="dim")


def grid(console: Any, columns: list[str], rows: list[list[str]],
         styles: list[dict[int, str]] | None = None) -> None:
    """A table when every cell fits on one line at this width, else one `key: value` block per
    row (the first column as the block's title), each line wrapped between words. styles: per
    row, column index -> rich style of that cell (the fleet's verdicts and odd-one-out marks)."""
    styles = styles or [{} for _ in rows]
    widths = [max([len(c)] + [len(r[i]) for r in rows]) for i, c in enumerate(columns)]
    if sum(widths) + _GAP * (len(columns) - 1) <= console.width:
        from rich.table import Table
        from rich.text import Text

        t = Table(box=None, pad_edge=False, padding=(0, _GAP // 2), show_edge=False)
        for c in columns:
            t.add_column(Text(c), no_wrap=True, overflow="ignore")
        for r, style in zip(rows, styles, strict=True):  # Text cells: a str would be markup
            t.add_row(*(Text(v, style=style.get(i, "")) for i, v in enumerate(r)))
        console.print(t)
        return
    for r, style in zip(rows, styles, strict=True):
        say(console, r[0], indent="  ", first=f"{columns[0]}: ", style="bold")
        for i, (c, v) in enumerate(zip(columns[1:], r[1:], strict=True), 1):
            if v:
                say(console, v, indent="    ", first=f"  {c}: ", style=style.get(i, ""))



def _gpu_section(console: Any, diagnosis: Any) -> None:
    facts = diagnosis.facts
    _section(console, "GPU / driver")
    if diagnosis.assumed_gpu is not None:
        say(console, diagnosis.assumed_gpu.describe() + ": the verdict, findings and plan are "
             "judged for it.")
    gpus = [g for g in facts.get("gpus") or [] if isinstance(g, dict)]
    if gpus:
        same: dict[tuple[str, ...], list[str]] = {}
        for g in gpus:  # identical GPUs share a row
            key = tuple(str(g.get(k)) for k in ("name", "compute_capability", "memory_mib", "driver"))
            same.setdefault(key, []).append(str(g.get("index")))
        grid(console, ["#", "name", "cc", "MiB", "driver"],
              [[idx[0] if len(idx) == 1 else f"{idx[0]}-{idx[-1]} ({len(idx)})", *key]
               for key, idx in same.items()])
        sources = sorted({str(g.get("source")) for g in gpus})
        say(console, f"(source: {', '.join(sources)})", style="dim")
    else:
        say(console, "no GPU detected here")
    drv = facts.get("driver")
    if drv:
        say(console, f"driver {drv.get('version')}, supports CUDA {drv.get('cuda_version')} "
                      f"({drv.get('source')})")


def _torch_section(console: Any, facts: dict[str, Any]) -> None:
    _section(console, "torch / Triton / NVRTC")
    t = facts.get("torch")
    if t:
        say(console, f"torch {t.get('version')}  CUDA {t.get('cuda')}  cuda_available="
                      f"{t.get('cuda_available')}  cxx11_abi={t.get('cxx11_abi')}  device arch "
                      f"covered={t.get('device_arch_covered')}")
        say(console, f"arch list: {' '.join(t.get('arch_list') or []) or '(none)'} "
                      f"({t.get('source')})", indent="  ", first="  ")
    else:
        say(console, "torch: not importable / not installed")
    tr = facts.get("triton")
    if tr:
        say(console, f"triton {tr.get('version')}  gpu backend={tr.get('gpu_backend')}  "
                      f"backends={','.join(tr.get('backends') or [])} ({tr.get('source')})")
    else:
        say(console, "triton: not installed")
    nvrtc = facts.get("nvrtc") or []
    for n in nvrtc:
        say(console, f"NVRTC (JIT without nvcc): {n.get('path')} {n.get('version') or ''}")
    if not nvrtc:
        say(console, "NVRTC: no libnvrtc found")


def _nvcc_section(console: Any, facts: dict[str, Any]) -> None:
    _section(console, "nvcc candidates")
    cands = facts.get("nvcc_candidates") or []
    if not cands:
        _line(console, "no nvcc found anywhere", style="red")
    else:
        rows = []
        for c in cands:
            path = c.get("path", "")
            if c.get("realpath") and c["realpath"] != path:
                path += f" -> {c['realpath']}"
            version = c.get("version") or c.get("error") or "?"
            if c.get("kind") == "ptxas-only-wheel":
                version = f"{version} (ptxas only, no nvcc)"
            rows.append([str(path), str(version), ", ".join(c.get("found_by") or []),
                         str(c.get("major_matches_torch"))])
        grid(console, ["path", "version", "found by", "major = torch's"], rows)
    home = facts.get("cuda_home") or {}
    _section(console, "CUDA_HOME (as torch.utils.cpp_extension resolves it)")
    if home:
        headers = ", ".join(f"{h} {'yes' if ok else 'NO'}" for h, ok in
                            (home.get("headers") or {}).items())
        say(console, f"torch would use {home.get('torch_would_use')} ({home.get('how')})")
        say(console, f"bin/nvcc: {'yes' if home.get('has_nvcc') else 'NO'} "
                      f"{home.get('nvcc_version') or ''}  headers: {headers}", indent="  ", first="  ")
        say(console, f"CUDA_HOME={home.get('cuda_home_env')}  CUDA_PATH={home.get('cuda_path_env')}"
                      f"  diverge={home.get('diverge')}", indent="  ", first="  ")
    gcc = facts.get("gcc")
    if gcc:
        say(console, f"host gcc {gcc.get('version')} ({gcc.get('path')})")
    db = facts.get("package_db") or {}
    pk = [f"{p['name']} {p.get('version')}" for p in (db.get("dpkg") or []) + (db.get("rpm") or [])]
    say(console, f"package DB: {', '.join(pk) if pk else 'no CUDA compiler packages recorded'}")


def _packages_section(console: Any, fv: FactsView) -> None:
    from fastpath.doctor.probe import arch_runs_on

    _section(console, "Kernel packages")
    cc = fv.device_cc
    rows = []
    for dist, p in (fv.raw.get("packages") or {}).items():
        imp = p.get("import") or {}
        if imp.get("ok") is True:
            state = "ok"
        elif imp.get("ok") is None:
            state = "not tried"
        else:
            state = str(imp.get("error_kind") or "failed")
        sass = sorted({a for so in p.get("so_files") or [] for a in so.get("sass") or []})
        ptx = sorted({a for so in p.get("so_files") or [] for a in so.get("ptx") or []})
        archs = " ".join(sass + ptx) or ("-" if not p.get("so_files") else "no device code")
        runs = "-"
        if cc and (sass or ptx):
            ok, how = arch_runs_on(sass, ptx, cc)
            runs = f"{'yes' if ok else 'NO'} ({how})"
        rows.append([dist, str(p.get("version") or "-"), state, archs, runs])
    grid(console, ["package", "version", "import", "archs in .so",
                    "runs on assumed GPU" if fv.device_assumed else "runs here"], rows)


def _findings_section(console: Any, findings: list[Any]) -> None:
    _section(console, f"Findings ({len(findings)})")
    if not findings:
        _line(console, "none")
    for f in findings:
        say(console, f"[{f.severity.upper()}] {f.title} ({f.id})",
             style=SEVERITY_STYLE.get(f.severity, ""))
        say(console, f.detail, indent="  ", first="  ")
        for i, r in enumerate(f.remedies, 1):
            say(console, r, indent="         ", first=f"  fix {i}: ")
        say(console, f"source: {f.source}", indent="  ", first="  ", style="dim")


def _after_enable(r: dict[str, Any]) -> str:
    """The plan's after-enable cell in explain()'s words: an op on fastpath's route that cannot
    run its Triton kernel here reads `fastpath (torch reference: needs ...)`, as explain() shows
    it, not as transformers' own torch fallback."""
    impl = str(r.get("with_fastpath", ""))
    needs = r.get("with_fastpath_needs")
    if r.get("with_fastpath_by") == "fastpath" and needs:
        return f"fastpath (torch reference: {needs})"
    if r.get("with_fastpath_by") == "hub":  # the Hub state's own words (hub_kernels_env)
        return str(needs) if needs else hub_label(r)
    return f"{impl}: {needs}" if needs else impl


def hub_label(r: dict[str, Any]) -> str:
    """A row's Hub kernel state as every report words it (`label` of hub_kernels.HubStatus)."""
    return str((r.get("hub") or {}).get("label") or r.get("reason") or "hub kernel")


def _plan_section(console: Any, plan: dict[str, Any]) -> None:
    _section(console, f"Model plan: {plan.get('model')} ({plan.get('model_type')})")
    tv = plan.get("transformers")
    say(console, f"transformers {tv or 'not installed'}; family {plan.get('family')}"
                  f"{'; fast path is all-or-nothing' if plan.get('all_or_nothing') else ''}")
    if plan.get("family_note"):
        say(console, f"note: {plan['family_note']}")
    for line in plan.get("summary") or []:
        say(console, line, indent="    ", first="  ")
    if plan.get("by_version"):
        _section(console, "by transformers release")
        rows: list[list[str]] = []
        for v in plan["by_version"]:
            slow = v.get("layers_slow")
            row = [v["range"], "-" if slow is None else f"{slow} of {v['layers_total']}",
                   "; ".join(v.get("summary") or []) or "all fast"]
            if rows and rows[-1][1:] == row[1:]:
                rows[-1][0] = merged_range(rows[-1][0], row[0])
            else:
                rows.append(row)
        grid(console, ["transformers", "layers on torch fallback", "what happens"], rows)
    else:
        for lt in plan.get("layer_types") or []:
            say(console, f"{lt['count']} x {lt['layer_type']}:"
                          + ("" if lt["ops"] else " no kernel ops"), style="bold")
            for r in lt["ops"]:
                say(console, f"{r['impl']} ({r['reason']}); after fastpath.enable(): "
                              f"{_after_enable(r)}", indent="      ", first=f"  {r['op']}: ")
    if plan.get("layers_slow_with_fastpath") is not None and plan.get("layers_slow"):
        needs = sorted({r["with_fastpath_needs"] for t in plan.get("layer_types") or []
                        for r in t["ops"] if r.get("with_fastpath_needs")})
        why = f" ({'; '.join(needs)})" if needs and plan["layers_slow_with_fastpath"] else ""
        say(console, f"after fastpath.enable(): {plan['layers_slow_with_fastpath']} of "
                      f"{plan['layers_total']} layers still on the torch fallback{why}")


def merged_range(first: str, last: str) -> str:
    """One label for two adjacent release ranges that would do the same thing ('5.0-5.14' and
    '>=5.25' give '>=5.0'), so a plan without transformers shows each outcome once."""
    start = range_start(first)
    if last.startswith(">="):
        return f">={start}"
    end = last.split("-")[-1]
    return f"{start}-{end}"


def _plain_view(diagnosis: Any) -> Any:
    """The diagnosis with every string that came from a target, a file or the environment (facts,
    model plan, findings' text, headline) made plain: control characters visible, long strings
    cut (see fastpath.shared.plain_text). Not markup-escaped: the layout prints only Text."""
    import dataclasses

    from fastpath.shared.plain_text import plain, plain_tree

    findings = [dataclasses.replace(f, title=plain(f.title),
                                    detail=plain(f.detail, multiline=True),
                                    remedies=tuple(plain(r, multiline=True) for r in f.remedies),
                                    source=plain(f.source)) for f in diagnosis.findings]
    return dataclasses.replace(
        diagnosis, facts=plain_tree(diagnosis.facts), findings=findings,
        model_plan=plain_tree(diagnosis.model_plan), headline=plain(diagnosis.headline),
        top_remedy=None if diagnosis.top_remedy is None else plain(diagnosis.top_remedy))


def render(diagnosis: Any, console: Any) -> None:
    diagnosis = _plain_view(diagnosis)
    facts = diagnosis.facts
    fv = FactsView(facts, diagnosis.assumed_gpu)
    say(console, diagnosis.headline, style=VERDICT_STYLE.get(diagnosis.verdict, "bold"))
    if diagnosis.top_remedy:
        say(console, diagnosis.top_remedy, indent="  ", first="Top remedy: ")
    host = facts.get("host") or {}
    probe = facts.get("probe") or {}
    say(console, f"host {host.get('hostname')}: {host.get('os')}, {host.get('glibc')}, "
                  f"Python {host.get('python')}, {host.get('arch')}; probe {probe.get('seconds')}s"
                  + ("; static: nothing imported, import verdicts from files and an ELF link "
                     "check (--probe full imports)" if fv.static_probe else ""), style="dim")
    _gpu_section(console, diagnosis)
    _torch_section(console, facts)
    _nvcc_section(console, facts)
    _packages_section(console, fv)
    _findings_section(console, diagnosis.findings)
    if diagnosis.model_plan is not None:
        _plan_section(console, diagnosis.model_plan)
    errors = fv.probe_errors
    if errors:
        _section(console, "Could not collect")
        for key, why in errors.items():
            say(console, f"{key}: {why}", indent="    ", first="  ")
    console.print()
    say(console, exit_meaning(diagnosis.exit_code, diagnosis.verdict), indent="  ",
        style=VERDICT_STYLE.get(diagnosis.verdict, "bold"))


# What each verdict's exit status means (the verdict decides the code: diagnosis.VERDICT_EXIT).
EXIT_MEANING = {
    "fast": "fast path, nothing to fix",
    "slow": "slow path found (the fixes are above); the doctor itself ran fine",
    "blocked": ("blocked on any GPU (the fixes are above); the doctor itself ran fine; "
                "judge for your GPU with --gpu"),
    "unknown": ("no GPU here to judge and nothing blocks on any GPU: could not diagnose a kernel "
                "path (--gpu judges for one)"),
}


def exit_meaning(code: int, verdict: str) -> str:
    """The report's last line: what its exit status means, so that a 1 after a healthy-looking
    run reads as "slow path found", not as "the doctor broke" (fastpath doctor --help has all)."""
    return f"exit status {code}: {EXIT_MEANING.get(verdict, 'see fastpath doctor --help')}"


def render_text(diagnosis: Any, width: int = 80) -> str:
    """The human report as plain text (verdict line first)."""
    from rich.console import Console

    console = Console(file=io.StringIO(), width=width, color_system=None, record=True)
    render(diagnosis, console)
    return console.export_text()


def print_report(diagnosis: Any) -> None:
    """To the terminal at its width; piped, at COLUMNS (rich reads it) or 80."""
    from rich.console import Console

    render(diagnosis, Console())
