"""Human report for a Diagnosis (rendering only; rich). Verdict line and top remedy first."""

from __future__ import annotations

import io
from typing import Any

VERDICT_STYLE = {"fast": "bold green", "slow": "bold red", "unknown": "bold yellow"}
SEVERITY_STYLE = {"error": "red", "warning": "yellow", "info": "cyan"}


def _section(console: Any, title: str) -> None:
    console.print()
    console.rule(f"[bold]{title}", align="left")


def _gpu_section(console: Any, facts: dict[str, Any]) -> None:
    from rich.table import Table

    _section(console, "GPU / driver")
    gpus = facts.get("gpus") or []
    if gpus:
        t = Table(box=None, pad_edge=False)
        for col in ("#", "name", "capability", "memory MiB", "driver", "source"):
            t.add_column(col)
        for g in gpus:
            t.add_row(str(g.get("index")), str(g.get("name")), str(g.get("compute_capability")),
                      str(g.get("memory_mib")), str(g.get("driver")), str(g.get("source")))
        console.print(t)
    else:
        console.print("no GPU listed")
    drv = facts.get("driver")
    if drv:
        console.print(f"driver {drv.get('version')}, supports CUDA {drv.get('cuda_version')} "
                      f"[dim]({drv.get('source')})")


def _torch_section(console: Any, facts: dict[str, Any]) -> None:
    _section(console, "torch / Triton / NVRTC")
    t = facts.get("torch")
    if t:
        console.print(
            f"torch {t.get('version')}  CUDA {t.get('cuda')}  cuda_available={t.get('cuda_available')}"
            f"  cxx11_abi={t.get('cxx11_abi')}  device arch covered={t.get('device_arch_covered')}")
        console.print(f"  arch list: {' '.join(t.get('arch_list') or []) or '(none)'} "
                      f"[dim]({t.get('source')})")
    else:
        console.print("torch: not importable / not installed")
    tr = facts.get("triton")
    if tr:
        console.print(f"triton {tr.get('version')}  gpu backend={tr.get('gpu_backend')}  "
                      f"backends={','.join(tr.get('backends') or [])} [dim]({tr.get('source')})")
    else:
        console.print("triton: not installed")
    nvrtc = facts.get("nvrtc") or []
    if nvrtc:
        for n in nvrtc:
            console.print(f"NVRTC (JIT without nvcc): {n.get('path')} {n.get('version') or ''}")
    else:
        console.print("NVRTC: no libnvrtc found")


def _nvcc_section(console: Any, facts: dict[str, Any]) -> None:
    from rich.table import Table

    _section(console, "nvcc candidates")
    cands = facts.get("nvcc_candidates") or []
    if not cands:
        console.print("[red]no nvcc found anywhere[/]")
    else:
        t = Table(box=None, pad_edge=False)
        for col in ("path", "version", "found by", "major = torch's"):
            t.add_column(col, overflow="fold")
        for c in cands:
            path = c.get("path", "")
            if c.get("realpath") and c["realpath"] != path:
                path += f" -> {c['realpath']}"
            version = c.get("version") or c.get("error") or "?"
            if c.get("kind") == "ptxas-only-wheel":
                version = f"{version} (ptxas only, no nvcc)"
            t.add_row(path, str(version), ", ".join(c.get("found_by") or []),
                      str(c.get("major_matches_torch")))
        console.print(t)
    home = facts.get("cuda_home") or {}
    _section(console, "CUDA_HOME (as torch.utils.cpp_extension resolves it)")
    if home:
        headers = ", ".join(f"{h} {'yes' if ok else 'NO'}" for h, ok in
                            (home.get("headers") or {}).items())
        console.print(f"torch would use {home.get('torch_would_use')} ({home.get('how')})")
        console.print(f"  bin/nvcc: {'yes' if home.get('has_nvcc') else 'NO'} "
                      f"{home.get('nvcc_version') or ''}  headers: {headers}")
        console.print(f"  CUDA_HOME={home.get('cuda_home_env')}  CUDA_PATH={home.get('cuda_path_env')}"
                      f"  diverge={home.get('diverge')}")
    gcc = facts.get("gcc")
    if gcc:
        console.print(f"host gcc {gcc.get('version')} ({gcc.get('path')})")
    db = facts.get("package_db") or {}
    pk = [f"{p['name']} {p.get('version')}" for p in (db.get("dpkg") or []) + (db.get("rpm") or [])]
    console.print(f"package DB: {', '.join(pk) if pk else 'no CUDA compiler packages recorded'}")


def _packages_section(console: Any, facts: dict[str, Any]) -> None:
    from rich.table import Table

    from fastpath.doctor.probe import arch_runs_on

    _section(console, "Kernel packages")
    cc = next((g.get("compute_capability") for g in facts.get("gpus") or []
               if g.get("compute_capability")), None)
    t = Table(box=None, pad_edge=False)
    for col in ("package", "version", "import", "SASS / PTX in .so", "runs on device"):
        t.add_column(col, overflow="fold")
    for dist, p in (facts.get("packages") or {}).items():
        imp = p.get("import") or {}
        if imp.get("ok") is True:
            state = "[green]ok"
        elif imp.get("ok") is None:
            state = "not tried"
        else:
            state = f"[red]{imp.get('error_kind') or 'failed'}"
        sass = sorted({a for so in p.get("so_files") or [] for a in so.get("sass") or []})
        ptx = sorted({a for so in p.get("so_files") or [] for a in so.get("ptx") or []})
        archs = " ".join(sass + ptx) or ("-" if not p.get("so_files") else "no device code")
        runs = "-"
        if cc and (sass or ptx):
            ok, how = arch_runs_on(sass, ptx, cc)
            runs = f"{'yes' if ok else 'NO'} ({how})"
        t.add_row(dist, str(p.get("version") or "-"), state, archs, runs)
    console.print(t)


def _findings_section(console: Any, findings: list[Any]) -> None:
    _section(console, f"Findings ({len(findings)})")
    if not findings:
        console.print("none")
    for f in findings:
        style = SEVERITY_STYLE.get(f.severity, "")
        console.print(f"[{style}][{f.severity.upper()}][/] [bold]{f.title}[/] [dim]({f.id})")
        console.print(f"  {f.detail}", highlight=False)
        for i, r in enumerate(f.remedies, 1):
            console.print(f"  fix {i}: {r}", highlight=False)
        console.print(f"  [dim]source: {f.source}")


def _plan_table(console: Any, plan: dict[str, Any]) -> None:
    from rich.table import Table

    t = Table(box=None, pad_edge=False)
    for col in ("layer type", "layers", "op", "implementation", "why", "after fastpath.enable()"):
        t.add_column(col, overflow="fold")
    for lt in plan.get("layer_types") or []:
        if not lt["ops"]:
            t.add_row(lt["layer_type"], str(lt["count"]), "-", "no kernel ops", "", "")
        for r in lt["ops"]:
            style = "green" if r["fast"] else "red"
            t.add_row(lt["layer_type"], str(lt["count"]), r["op"], f"[{style}]{r['impl']}",
                      r["reason"], r.get("with_fastpath", ""))
    console.print(t)


def _plan_section(console: Any, plan: dict[str, Any]) -> None:
    _section(console, f"Model plan: {plan.get('model')} ({plan.get('model_type')})")
    tv = plan.get("transformers")
    console.print(f"transformers {tv or 'not installed'}; family {plan.get('family')}"
                  f"{'; fast path is all-or-nothing' if plan.get('all_or_nothing') else ''}")
    if plan.get("family_note"):
        console.print(f"note: {plan['family_note']}")
    for line in plan.get("summary") or []:
        console.print(f"  {line}", highlight=False)
    if plan.get("by_version"):
        from rich.table import Table

        t = Table(box=None, pad_edge=False, title="by transformers release")
        for col in ("transformers", "layers on torch fallback", "what happens"):
            t.add_column(col, overflow="fold")
        for v in plan["by_version"]:
            slow = v.get("layers_slow")
            t.add_row(v["range"], "-" if slow is None else f"{slow} of {v['layers_total']}",
                      "; ".join(v.get("summary") or []) or "all fast")
        console.print(t)
    else:
        _plan_table(console, plan)
    if plan.get("layers_slow_with_fastpath") is not None and plan.get("layers_slow"):
        console.print(f"after fastpath.enable(): {plan['layers_slow_with_fastpath']} of "
                      f"{plan['layers_total']} layers still slow")


def ran_static(facts: dict[str, Any]) -> bool:
    """The Python probe ran without imports (`--probe static`): its import verdicts are inferred
    from files."""
    probe = facts.get("probe") or {}
    return probe.get("kind") == "python" and "imports" in (
        (probe.get("options") or {}).get("skip") or [])


def _inert_view(diagnosis: Any) -> Any:
    """The diagnosis with every string that came from a target, a file or the environment (facts,
    model plan, findings' text, headline) made inert: control characters visible, rich markup
    escaped, long strings cut (see fastpath.doctor.plain_text). The layout below adds its own
    markup around these."""
    import dataclasses

    from fastpath.doctor.plain_text import inert, inert_tree

    findings = [dataclasses.replace(f, title=inert(f.title),
                                    detail=inert(f.detail, multiline=True),
                                    remedies=tuple(inert(r, multiline=True) for r in f.remedies),
                                    source=inert(f.source)) for f in diagnosis.findings]
    return dataclasses.replace(
        diagnosis, facts=inert_tree(diagnosis.facts), findings=findings,
        model_plan=inert_tree(diagnosis.model_plan), headline=inert(diagnosis.headline),
        top_remedy=None if diagnosis.top_remedy is None else inert(diagnosis.top_remedy))


def render(diagnosis: Any, console: Any) -> None:
    diagnosis = _inert_view(diagnosis)
    facts = diagnosis.facts
    style = VERDICT_STYLE.get(diagnosis.verdict, "bold")
    console.print(f"[{style}]{diagnosis.headline}", highlight=False)
    if diagnosis.top_remedy:
        console.print(f"[bold]Top remedy:[/] {diagnosis.top_remedy}", highlight=False)
    host = facts.get("host") or {}
    probe = facts.get("probe") or {}
    static = ran_static(facts)
    console.print(f"[dim]host {host.get('hostname')}: {host.get('os')}, {host.get('glibc')}, "
                  f"Python {host.get('python')}, {host.get('arch')}; probe {probe.get('seconds')} s"
                  + ("; static: nothing imported, import verdicts from files and an ELF link "
                     "check (--probe full imports)" if static else ""))
    _gpu_section(console, facts)
    _torch_section(console, facts)
    _nvcc_section(console, facts)
    _packages_section(console, facts)
    _findings_section(console, diagnosis.findings)
    if diagnosis.model_plan is not None:
        _plan_section(console, diagnosis.model_plan)
    errors = (facts.get("probe") or {}).get("errors") or {}
    if errors:
        _section(console, "Could not collect")
        for key, why in errors.items():
            console.print(f"  {key}: {why}", highlight=False)


def render_text(diagnosis: Any, width: int = 120) -> str:
    """The human report as plain text (verdict line first)."""
    from rich.console import Console

    console = Console(file=io.StringIO(), width=width, color_system=None, record=True)
    render(diagnosis, console)
    return console.export_text()


def print_report(diagnosis: Any) -> None:
    from rich.console import Console

    console = Console()
    if not console.is_terminal:
        console = Console(width=max(console.width, 120))
    render(diagnosis, console)
