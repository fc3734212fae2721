"""`fastpath doctor --hosts FILE`: probe many targets in parallel, one table of their key facts.

Targets run as asyncio subprocesses under a semaphore (`--jobs`), each with its own deadline
(`--timeout`) after which its whole process group is killed, so one stuck host never holds the
run. The table puts the facts that decide fast vs slow side by side and marks the cells that
differ from the majority: in a fleet that should be uniform, the odd one out is the finding.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import shlex
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fastpath.doctor.facts_check import check_json
from fastpath.doctor.inventory import Target, load_targets
from fastpath.doctor.remote import (
    DEFAULT_TIMEOUT,
    OutputBudget,
    interruptible,
    probe_sources,
    probe_target,
)
from fastpath.shared.errors import FastpathError, TargetError, UsageError
from fastpath.shared.plain_text import plain
from fastpath.shared.redact import redact_facts, redact_text

DEFAULT_JOBS = 32
FLEET_SCHEMA = "fastpath.fleet/1"
COLUMNS = ("GPU", "driver", "torch", "nvcc", "causal_conv1d", "fla", "verdict")


@dataclass
class TargetResult:
    """The outcome for one target: status ok|unreachable|timeout|failed, facts and diagnosis."""

    target: Target
    status: str
    error: str | None
    seconds: float
    facts: dict[str, Any] | None = None
    diagnosis: Any = None

    @property
    def verdict(self) -> str:
        if self.status != "ok":
            return self.status
        return str(getattr(self.diagnosis, "verdict", "unknown"))


def _status_of(reason: str) -> str:
    if reason.startswith("unreachable"):
        return "unreachable"
    if reason.startswith("timed out"):
        return "timeout"
    return "failed"


async def probe_fleet(
    targets: list[Target],
    *,
    python: str | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    jobs: int = DEFAULT_JOBS,
    on_done: Callable[[TargetResult], None] | None = None,
    static: bool = True,
) -> list[TargetResult]:
    """Probe every target, at most `jobs` at a time; results in the targets' order. static (the
    fleet default): the probe imports nothing on the targets, so a fleet costs each host ~0.2
    CPU-s instead of ~3 (see BENCHMARKS.md, fleet doctor)."""
    sources = probe_sources()
    gate = asyncio.Semaphore(jobs)
    budget = OutputBudget()

    async def one(target: Target) -> TargetResult:
        if target.error is not None:  # refused by the inventory checks: reported, not probed
            result = TargetResult(target, "failed", target.error, 0.0)
            if on_done is not None:
                on_done(result)
            return result
        async with gate:
            started = time.monotonic()
            try:
                facts = await probe_target(
                    target.prefix, python=target.python or python, timeout=timeout,
                    sources=sources, static=static, budget=budget,
                )
                result = TargetResult(target, "ok", None, time.monotonic() - started, facts)
            except TargetError as exc:
                reason = str(exc)
                result = TargetResult(target, _status_of(reason), reason, time.monotonic() - started)
            except Exception as exc:  # one broken target must not take the fleet down
                reason = plain(redact_text(f"{type(exc).__name__}: {exc}"[:2000].splitlines()[0]))
                result = TargetResult(target, "failed", reason, time.monotonic() - started)
        if on_done is not None:
            on_done(result)
        return result

    return list(await asyncio.gather(*(one(t) for t in targets)))


# --- key facts per target -----------------------------------------------------------------------
def _get(d: Any, *keys: str) -> Any:
    for key in keys:
        if not isinstance(d, dict):
            return None
        d = d.get(key)
    return d


def _gpu_cell(facts: dict[str, Any]) -> str:
    gpus = facts.get("gpus")
    if gpus is None:
        return "?"
    if not gpus:
        return "none"
    kinds = Counter(f"{g.get('name') or '?'} ({g.get('compute_capability') or '?'})" for g in gpus)
    return ", ".join(f"{n}x {k}" if n > 1 else k for k, n in kinds.items())


def _torch_cell(facts: dict[str, Any]) -> str:
    torch = facts.get("torch")
    if not isinstance(torch, dict):
        return "? (no python)" if _get(facts, "probe", "kind") == "sh" else "not installed"
    version = str(torch.get("version") or "?")
    cuda = torch.get("cuda")
    if cuda and "+cu" not in version:
        version += f" cu{cuda}"
    elif not cuda and "+" not in version:
        version += " cpu"
    return version


def _nvcc_cell(facts: dict[str, Any]) -> str:
    cands = facts.get("nvcc_candidates")
    if cands is None:
        return "?"
    versions = sorted({str(c.get("version")) for c in cands if c.get("kind") == "nvcc" and c.get("version")})
    if versions:
        return ", ".join(versions)
    if any(c.get("kind") == "ptxas-only-wheel" for c in cands):
        return "none (ptxas-only wheel)"
    return "none"


def _package_cell(facts: dict[str, Any], *dists: str) -> str:
    packages = facts.get("packages")
    if not isinstance(packages, dict):
        return "?"
    for dist in dists:
        info = packages.get(dist)
        if not isinstance(info, dict) or not info.get("version"):
            continue
        imp = info.get("import") or {}
        if imp.get("ok") is False:
            return f"{info['version']} ({imp.get('error_kind') or 'import fails'})"
        return str(info["version"])
    return "missing"


def key_facts(result: TargetResult) -> dict[str, str]:
    """The table row for one target (every value a short string)."""
    if result.status != "ok" or result.facts is None:
        return {col: "-" for col in COLUMNS[:-1]} | {"verdict": result.verdict}
    facts = result.facts
    driver = _get(facts, "driver", "version")
    return {
        "GPU": _gpu_cell(facts),
        "driver": str(driver) if driver else ("?" if "driver" in (_get(facts, "probe", "errors") or {}) else "none"),
        "torch": _torch_cell(facts),
        "nvcc": _nvcc_cell(facts),
        "causal_conv1d": _package_cell(facts, "causal-conv1d"),
        "fla": _package_cell(facts, "flash-linear-attention", "fla-core"),
        "verdict": result.verdict,
    }


def majority_outliers(rows: list[dict[str, str]], ok: list[bool]) -> list[set[str]]:
    """For each row, the columns whose value differs from the majority value among ok targets."""
    out: list[set[str]] = [set() for _ in rows]
    for col in COLUMNS:
        counts = Counter(row[col] for row, good in zip(rows, ok, strict=True) if good)
        if len(counts) < 2:
            continue
        (top, top_n), (_, second_n) = counts.most_common(2)
        if top_n == second_n:
            continue  # no majority: nothing is the odd one out
        for i, (row, good) in enumerate(zip(rows, ok, strict=True)):
            if good and row[col] != top:
                out[i].add(col)
    return out


# --- output -------------------------------------------------------------------------------------
def fleet_json(results: list[TargetResult], exit_code: int) -> dict[str, Any]:
    """Every target's full report (the doctor's JSON) plus status; redacted."""
    rows = [key_facts(r) for r in results]
    outliers = majority_outliers(rows, [r.status == "ok" for r in results])
    targets = []
    for r, row, odd in zip(results, rows, outliers, strict=True):
        report = None
        if r.diagnosis is not None:
            report = r.diagnosis.to_json()
        elif r.facts is not None:
            report = {"facts": r.facts}
        targets.append(
            {
                "name": r.target.name,
                "prefix": plain(redact_text(shlex.join(r.target.prefix)[:16384])),
                "groups": r.target.groups,
                "status": r.status,
                "verdict": r.verdict,
                "error": r.error,
                "seconds": round(r.seconds, 3),
                "table_row": row,  # (not "key_facts": redaction blanks keys containing "key")
                "differs_from_majority": [col for col in COLUMNS if col in odd],
                "report": report,
            }
        )
    summary = Counter(r.verdict for r in results)
    return redact_facts(
        {
            "schema": FLEET_SCHEMA,
            "exit_code": exit_code,
            "summary": {"targets": len(results), **dict(summary)},
            "targets": targets,
        }
    )


FLEET_EXIT_MEANING = {
    0: "every target fast, or nothing to fix",
    1: "a target is slow or blocked (its fixes: fastpath doctor --on PREFIX); the doctor ran fine",
    3: ("a target could not be diagnosed (unreachable, failed, or no GPU to judge: its line above "
        "says why); none is slow or blocked"),
}


def render_table(results: list[TargetResult], console: Any, exit_code: int | None = None) -> None:
    """targets x key facts; cells that differ from the fleet majority are marked '*' and bold.
    A table when it fits the console's width, else one `key: value` block per target (as the
    single-target report does), so nothing is cut or folded mid-word on a narrow terminal."""
    from fastpath.doctor.report import grid, say

    rows = [key_facts(r) for r in results]
    outliers = majority_outliers(rows, [r.status == "ok" for r in results])
    verdict_style = {"fast": "green", "slow": "bold red", "blocked": "bold red",
                     "unknown": "yellow"}
    cells: list[list[str]] = []
    styles: list[dict[int, str]] = []
    for r, row, odd in zip(results, rows, outliers, strict=True):
        line = [plain(redact_text(r.target.name), 256)]
        style: dict[int, str] = {}
        for i, col in enumerate(COLUMNS, 1):
            value = plain(redact_text(row[col]), 256)
            if r.status != "ok" and col != "verdict":
                value = ""  # no facts: the verdict and the error line below say it all
            if col in odd:
                line.append(value + " *")
                style[i] = "bold yellow"
            else:
                line.append(value)
                if col == "verdict":
                    style[i] = verdict_style.get(value, "bold red")
        cells.append(line)
        styles.append(style)
    say(console, f"fastpath doctor: {len(results)} targets", style="bold")
    grid(console, ["target", *("conv1d" if c == "causal_conv1d" else c for c in COLUMNS)],
         cells, styles)
    if any(outliers):
        say(console, "* differs from the majority of the fleet")
    for r in (r for r in results if r.status != "ok"):
        say(console, plain(redact_text(f"{r.target.name}: {r.error}"), 1024), indent="  ")
    counts = Counter(r.verdict for r in results)
    say(console, ", ".join(f"{n} {v}" for v, n in sorted(counts.items())))
    from fastpath.doctor.facts import FactsView

    python_probes = [FactsView(r.facts) for r in results
                     if r.status == "ok" and ((r.facts or {}).get("probe") or {}).get("kind") == "python"]
    if python_probes and all(fv.static_probe for fv in python_probes):
        say(console, "probe: static (nothing imported on the targets; import verdicts from files "
                     "and an ELF link check). --probe full imports them.")
    if exit_code is not None:
        say(console, f"exit status {exit_code}: {FLEET_EXIT_MEANING.get(exit_code, '')}", indent="  ")


class _Progress:
    """rich progress bar on stderr when it is a terminal, else one line per finished target."""

    def __init__(self, total: int) -> None:
        from rich.console import Console

        self.total = total
        self.done = 0
        self.console = Console(stderr=True)
        self.live = None
        if self.console.is_terminal:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
            )

            self.live = Progress(
                TextColumn("probing"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TextColumn("{task.description}", markup=False),  # a host name is not markup
                console=self.console,
                transient=True,
            )
            self.task = self.live.add_task("", total=total)

    def __enter__(self) -> _Progress:
        if self.live is not None:
            self.live.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.live is not None:
            self.live.stop()

    def __call__(self, result: TargetResult) -> None:
        self.done += 1
        name = plain(redact_text(result.target.name[:4096]), 256)
        if self.live is not None:
            from rich.text import Text

            short = name if len(name) <= 32 else name[:31] + "…"
            self.live.update(self.task, advance=1, description=Text(f"{short}: {result.status}"))
        else:
            from fastpath.doctor.report import say

            say(self.console, f"[{self.done}/{self.total}] {name}: {result.status} "
                              f"({result.seconds:.1f}s)", indent="  ")


def _diagnose_all(results: list[TargetResult], model: str | None, assumed: Any = None) -> None:
    try:
        from fastpath.doctor.diagnosis import diagnose
    except ImportError as exc:
        raise FastpathError(f"fastpath.doctor.diagnosis.diagnose is not available: {exc}") from None
    for r in results:
        if r.status != "ok" or r.facts is None:
            continue
        try:
            r.diagnosis = diagnose(r.facts, model, assumed)
        except TargetError as exc:  # this target's facts are empty: it alone is undiagnosed
            r.status, r.error = "failed", redact_text(str(exc))
        except FastpathError:
            raise  # bad --model etc. is the user's input, not the target's
        except Exception as exc:  # a target's odd facts must not hide the other targets
            r.status, r.error = "failed", plain(redact_text(
                f"diagnosis failed: {type(exc).__name__}: {exc}"[:2000]))


def fleet_exit_code(results: list[TargetResult]) -> int:
    """1 if any target is slow or blocked (a blocking finding, also without a GPU), else 3 if
    any could not be diagnosed (unreachable, failed, or "unknown": no GPU to judge), else 0 (the
    single-target codes, combined)."""
    if any(r.status == "ok" and r.diagnosis is not None and r.diagnosis.exit_code == 1
           for r in results):
        return 1
    if any(r.status != "ok" or r.diagnosis is None or r.diagnosis.exit_code == 3
           for r in results):
        return 3
    return 0


def run_fleet(args: Any) -> int:
    """Entry point for `fastpath doctor --hosts FILE` (args: hosts, limit, jobs, timeout, python,
    model, json, probe)."""
    jobs = getattr(args, "jobs", None)
    jobs = DEFAULT_JOBS if jobs is None else jobs
    if jobs < 1:
        raise UsageError(f"--jobs must be at least 1, got {jobs}")
    timeout = getattr(args, "timeout", None)
    timeout = DEFAULT_TIMEOUT if timeout is None else timeout
    if not math.isfinite(timeout) or timeout <= 0:
        raise UsageError(f"--timeout must be a finite number of seconds > 0, got {timeout:g}")
    targets = load_targets(args.hosts, getattr(args, "limit", None))
    model = getattr(args, "model", None)
    if model:
        from fastpath.shared.model_source import load_config

        load_config(model)  # bad --model fails now, before any target is contacted

    with _Progress(len(targets)) as progress:
        results = asyncio.run(interruptible(
            probe_fleet(
                targets, python=getattr(args, "python", None), timeout=timeout, jobs=jobs,
                on_done=progress, static=(getattr(args, "probe", None) or "static") == "static",
            )
        ))
    _diagnose_all(results, model, getattr(args, "assumed_gpu", None))
    code = fleet_exit_code(results)
    if getattr(args, "json", False):
        doc = check_json(fleet_json(results, code))
        sys.stdout.write(json.dumps(doc, indent=2, default=str, allow_nan=False) + "\n")
    else:
        from rich.console import Console

        console = Console()
        if not console.is_terminal and not os.environ.get("COLUMNS"):
            console = Console(width=max(console.width, 160))  # piped: do not fold at 80 columns
        render_table(results, console, code)
    return code
