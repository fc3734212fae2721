"""bench's outputs: speed-ups, the comparison with an earlier run, bench.json, bench.md and the
chart (bench.png, only when matplotlib is installed: the numbers never depend on it).

Honest labels: a configuration that ran the same implementation as the reference (fastpath on a
CPU without the Triton interpreter runs the kernels' torch reference) gets no speed-up, only
"same implementation as reference"; timings of kernels run by the Triton interpreter are marked
"not timing data" in the table and in the JSON (`not_timing_data` on each phase).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fastpath.errors import UsageError
from fastpath.proof.bench_spec import PHASE_REGISTRY, SCHEMA, phase_label

SAME_AS_REFERENCE = "same implementation as reference"


def same_as_reference(doc: dict[str, Any], config: str) -> bool:
    """True when `config` ran the code the reference configuration ran (see module doc)."""
    impls = {r.get("config"): r.get("implementation") for r in doc.get("configs", [])}
    return config != "reference" and impls.get(config) is not None and impls.get(config) == impls.get("reference")


def not_timing_data(doc: dict[str, Any], config: str) -> str | None:
    for r in doc.get("configs", []):
        if r.get("config") == config:
            for entry in r.get("phases", {}).values():
                if entry.get("not_timing_data"):
                    return str(entry["not_timing_data"])
    return None


def tokens_per_s(doc: dict[str, Any], config: str, phase: str) -> float | None:
    for r in doc.get("configs", []):
        if r.get("config") == config:
            value = r.get("phases", {}).get(phase, {}).get("tokens_per_s")
            return float(value) if isinstance(value, (int, float)) else None
    return None


def speedups(doc: dict[str, Any]) -> dict[str, dict[str, float]]:
    """config -> phase -> tokens/s relative to the reference configuration."""
    out: dict[str, dict[str, float]] = {}
    for r in doc.get("configs", []):
        for phase in doc["settings"]["phases"]:
            base = tokens_per_s(doc, "reference", phase)
            value = tokens_per_s(doc, r["config"], phase)
            if same_as_reference(doc, r["config"]) or not_timing_data(doc, r["config"]):
                continue
            if base and value:
                out.setdefault(r["config"], {})[phase] = value / base
    return out


def speedups_versus(doc: dict[str, Any]) -> dict[str, dict[str, float]]:
    """config -> "phase/baseline" -> tokens/s relative to the reference's `baseline` phase, for
    phases declaring `versus` (a CUDA-graph decode against the eager fallback decode)."""
    out: dict[str, dict[str, float]] = {}
    for phase in doc["settings"]["phases"]:
        spec = PHASE_REGISTRY.get(phase)
        if spec is None or spec.versus is None:
            continue
        base = tokens_per_s(doc, "reference", spec.versus)
        for r in doc.get("configs", []):
            value = tokens_per_s(doc, r["config"], phase)
            if not_timing_data(doc, r["config"]) or (r["config"] != "reference" and same_as_reference(doc, r["config"])):
                continue
            if base and value:
                out.setdefault(r["config"], {})[f"{phase}/{spec.versus}"] = value / base
    return out


def compare_docs(new: dict[str, Any], old: dict[str, Any]) -> list[dict[str, Any]]:
    """Per config and phase present in both runs: old and new tokens/s and the relative change."""
    rows = []
    for r in new.get("configs", []):
        for phase in new["settings"]["phases"]:
            a = tokens_per_s(old, r["config"], phase)
            b = tokens_per_s(new, r["config"], phase)
            if a and b:
                rows.append({"config": r["config"], "phase": phase, "old": a, "new": b, "change": b / a - 1.0})
    return rows


def load_previous(path: str) -> dict[str, Any]:
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise UsageError(f"cannot read --compare file {path}: {exc}") from None
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise UsageError(f"--compare file {path} is not a fastpath bench JSON ({SCHEMA})")
    return doc


# ---------------------------------------------------------------------------------------------
# Rendering


def _fmt_rate(value: float | None) -> str:
    if value is None:
        return "-"
    if value >= 1e4:
        return f"{value / 1e3:,.1f}k"
    return f"{value:,.1f}" if value < 100 else f"{value:,.0f}"


def _cell(r: dict[str, Any], phase: str, speed: dict[str, dict[str, float]], doc: dict[str, Any]) -> str:
    if "skipped" in r:
        return "skipped"
    entry = r.get("phases", {}).get(phase)
    if entry is None:
        return "error" if "error" in r else "-"
    if "skipped" in entry:  # this setup cannot run the phase: the reason, never a number
        return f"skipped: {entry['skipped']}"
    if "error" in entry:
        return "error"
    text = _fmt_rate(entry.get("tokens_per_s"))
    if entry.get("not_timing_data"):
        return text + " (interpreter: not timing data)"
    if same_as_reference(doc, r["config"]):
        return text + f" ({SAME_AS_REFERENCE})"
    ratio = speed.get(r["config"], {}).get(phase)
    if ratio is not None and r["config"] != "reference":
        text += f" ({ratio:.2f}x)"
    return text


def route_digest(rows: list[dict[str, Any]]) -> str:
    """'causal_conv1d_fn -> fastpath-triton; chunk_gated_delta_rule -> torch fallback (...)'."""
    by_op: dict[str, list[str]] = {}
    for r in rows:
        if "op" in r:
            impls = by_op.setdefault(str(r["op"]), [])
            if str(r.get("impl")) not in impls:
                impls.append(str(r.get("impl")))
    return "; ".join(f"{op} -> {' | '.join(impls)}" for op, impls in by_op.items()) or "no routed ops found"


def markdown(doc: dict[str, Any], comparison: list[dict[str, Any]] | None = None) -> str:
    """The results as a markdown table (tokens/s, speed-up vs reference, peak memory)."""
    s = doc["settings"]
    env = doc.get("environment") or {}
    model = doc.get("model") or {}
    phases = s["phases"]
    lines = [
        f"## fastpath bench: {s['source']}" + (f" (--layers {s['layers']})" if s.get("layers") else ""),
        "",
        f"- model: {model.get('class', '?')}, {model.get('layers', '?')} layers "
        f"({', '.join(sorted(set(model.get('layer_types', []))))}), {model.get('parameters', 0) / 1e9:.3g} B parameters, "
        f"{s['dtype']}, batch {s['batch']} x seq-len {s['seq_len']}, decode {s['decode_tokens']} tokens",
        f"- machine: {env.get('gpu') or env.get('cpu', '?')} ({env.get('host', '?')}); torch {env.get('torch')}, "
        f"triton {env.get('triton')}, transformers {env.get('transformers')}, CUDA {env.get('cuda')}",
        f"- timing: median of {s['repeats']} after {s['warmup']} warm-up runs "
        f"({'CUDA events' if str(s['device']).startswith('cuda') else 'perf_counter'}); {doc['created']}",
        "",
        "| config | " + " | ".join(f"{phase_label(p)} tok/s" for p in phases) + " | peak memory MiB ("
        + "/".join(phases) + ") |",
        "|---|" + "---|" * len(phases) + "---|",
    ]
    speed = doc.get("speedup", {})
    for r in doc["configs"]:
        mem = []
        for p in phases:
            value = r.get("phases", {}).get(p, {}).get("peak_mem_mib")
            mem.append(f"{value:,.0f}" if isinstance(value, (int, float)) else "-")
        cells = [_cell(r, p, speed, doc) for p in phases]
        lines.append(f"| {r['config']} ({r.get('label', '')}) | " + " | ".join(cells) + f" | {'/'.join(mem)} |")
    notes = []
    for r in doc["configs"]:
        if "skipped" in r:
            notes.append(f"- {r['config']}: skipped: {r['skipped']}")
        if "error" in r:
            notes.append(f"- {r['config']}: error: {r['error']}")
        for p, entry in r.get("phases", {}).items():
            if "error" in entry:
                notes.append(f"- {r['config']} {phase_label(p)}: {entry['error']}")
            elif entry.get("note"):
                notes.append(f"- {r['config']} {phase_label(p)}: {entry['note']}")
        for key, ratio in doc.get("speedup_versus", {}).get(r.get("config"), {}).items():
            phase, base = key.split("/", 1)
            notes.append(f"- {r['config']} {phase_label(phase)}: {ratio:.2f}x the reference's {phase_label(base)}")
        if r.get("explain"):
            notes.append(f"- {r['config']} routes: {route_digest(r['explain'])}")
        if same_as_reference(doc, r.get("config", "")):
            notes.append(f"- {r['config']}: ran the same torch code as reference ({r.get('implementation')}); "
                         "its timings are not a speed-up")
        if not_timing_data(doc, r.get("config", "")):
            notes.append(f"- {r['config']}: {not_timing_data(doc, r['config'])}")
        calls = r.get("kernel_calls")
        if r.get("config") == "fastpath" and calls is not None:
            notes.append(f"- fastpath kernel calls: {', '.join(f'{k} x{v}' for k, v in sorted(calls.items())) or 'none'}")
    if notes:
        lines += ["", *notes]
    if comparison:
        lines += ["", "### change vs previous run", "", "| config | phase | previous tok/s | now tok/s | change |",
                  "|---|---|---|---|---|"]
        for row in comparison:
            lines.append(f"| {row['config']} | {phase_label(row['phase'])} | {_fmt_rate(row['old'])} | "
                         f"{_fmt_rate(row['new'])} | {row['change'] * 100:+.1f}% |")
    return "\n".join(lines) + "\n"


def chart(doc: dict[str, Any], path: Path) -> None:
    """Bars of tokens/s: one panel per phase (scales differ by orders), one bar per config."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    phases = doc["settings"]["phases"]
    configs = [r for r in doc["configs"] if "phases" in r]
    colors = {"reference": "#9e9e9e", "fastpath": "#1f77b4", "fla": "#2ca02c", "fla+dao": "#ff7f0e"}
    fig, axes = plt.subplots(1, len(phases), figsize=(4.2 * len(phases), 4.2), squeeze=False)
    for ax, phase in zip(axes[0], phases, strict=True):
        names, values, skipped = [], [], []
        for r in configs:
            value = r["phases"].get(phase, {}).get("tokens_per_s")
            names.append(r["config"])
            values.append(value or 0.0)
            skipped.append("skipped" in r["phases"].get(phase, {}))
        bars = ax.bar(names, values, color=[colors.get(n, "#2ca02c") for n in names])
        base = tokens_per_s(doc, "reference", phase)
        for bar, name, value, skip in zip(bars, names, values, skipped, strict=True):
            label = _fmt_rate(value) if value else ("skipped" if skip else "error")
            if not_timing_data(doc, name):
                label += "\ninterpreter:\nnot timing data"
            elif same_as_reference(doc, name):
                label += "\nsame impl.\nas reference"
            elif base and value and name != "reference":
                label += f"\n{value / base:.2f}x"
            ax.annotate(label, (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                        ha="center", va="bottom", fontsize=8)
        ax.set_title(phase_label(phase))
        ax.set_ylabel("tokens/s")
        ax.margins(y=0.2)
    s = doc["settings"]
    env = doc.get("environment") or {}
    where = env.get("gpu") or f"CPU{' (Triton interpreter)' if env.get('triton_interpret') == '1' else ''}"
    fig.suptitle(f"{s['source']}" + (f" ({s['layers']} layers)" if s.get("layers") else "")
                 + f", {s['dtype']}, B={s['batch']}, L={s['seq_len']}, {where}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_outputs(doc: dict[str, Any], out_dir: Path, comparison: list[dict[str, Any]] | None,
                  draw_chart: bool = True) -> tuple[dict[str, Path], str | None]:
    """bench.json and bench.md always, first; bench.png when `draw_chart` (matplotlib importable).
    Returns the paths written and, when there is no chart, why (one line)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"json": out_dir / "bench.json", "markdown": out_dir / "bench.md"}
    paths["json"].write_text(json.dumps(doc, indent=1, default=str) + "\n")
    paths["markdown"].write_text(markdown(doc, comparison))
    if not draw_chart:
        return paths, 'matplotlib is not installed; run: pip install "fastpath-kit[bench]"'
    try:
        chart(doc, out_dir / "bench.png")
    except Exception as exc:  # the numbers are on disk already; a chart never costs them
        return paths, f"matplotlib failed: {exc.__class__.__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
    paths["chart"] = out_dir / "bench.png"
    return paths, None
