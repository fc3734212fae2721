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

from fastpath.models.sizing import human_count
from fastpath.proof.bench_spec import PHASE_REGISTRY, SCHEMA, phase_label
from fastpath.shared.errors import UsageError

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


# What must match for two runs' tokens/s to be comparable (an interpreter run against a
# GPU run printed "+15587%"). Settings the user chose; then the machine the run measured.
_SAME_SETTINGS = (("source", "model"), ("layers", "--layers"), ("batch", "--batch"), ("seq_len", "--seq-len"),
                  ("dtype", "--dtype"), ("decode_tokens", "--decode-tokens"))


def _device_kind(device: Any) -> str:
    return str(device).split(":")[0] if device else "?"


def _interpreter(env: dict[str, Any]) -> bool:
    return str(env.get("triton_interpret") or "") == "1"


def settings_mismatches(settings: dict[str, Any], interpreter: bool, old: dict[str, Any]) -> list[str]:
    """What differs between this run's settings (known before it starts) and an earlier bench
    JSON: model, shape, dtype, device type, Triton interpreter. Empty: comparable. A setting the
    old file does not record is not held against it."""
    old_settings = old.get("settings") or {}
    out = []
    for key, label in _SAME_SETTINGS:
        if key in old_settings and old_settings[key] != settings.get(key):
            out.append(f"{label} {old_settings[key]} vs now {settings.get(key)}")
    if "device" in old_settings and _device_kind(old_settings["device"]) != _device_kind(settings.get("device")):
        out.append(f"device {old_settings['device']} vs now {settings.get('device')}")
    old_env = old.get("environment")
    if isinstance(old_env, dict) and "triton_interpret" in old_env and _interpreter(old_env) != interpreter:
        out.append("Triton interpreter " + ("on" if _interpreter(old_env) else "off")
                   + " vs now " + ("on" if interpreter else "off"))
    return out


def machine_mismatches(new: dict[str, Any], old: dict[str, Any]) -> list[str]:
    """Differences the new run's results reveal (model built, GPU, versions): flagged next to
    the comparison, not refused (a new transformers is a reason to compare)."""
    out = []
    new_model, old_model = new.get("model") or {}, old.get("model") or {}
    for key in ("class", "layers", "parameters"):
        if key in old_model and key in new_model and old_model[key] != new_model[key]:
            out.append(f"model {key} {old_model[key]} vs now {new_model[key]}")
    new_env, old_env = new.get("environment") or {}, old.get("environment") or {}
    for key in ("gpu", "cpu", "torch", "triton", "transformers"):
        if key in old_env and key in new_env and old_env[key] != new_env[key]:
            out.append(f"{key} {old_env[key]} vs now {new_env[key]}")
    return out


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


def _title(doc: dict[str, Any]) -> str:
    s = doc["settings"]
    return f"fastpath bench: {s['source']}" + (f" (--layers {s['layers']})" if s.get("layers") else "")


def _facts(doc: dict[str, Any]) -> list[str]:
    """The bullet lines above the table: model, machine, timing, and whether the run finished."""
    s = doc["settings"]
    env = doc.get("environment") or {}
    model = doc.get("model") or {}
    def shown(value: Any, missing: str = "?") -> str:  # never a raw None in a report
        return missing if value is None or value == "" else str(value)

    if model:
        types = ", ".join(sorted(set(model.get("layer_types") or [])))
        described = (f"model: {shown(model.get('class'))}, {shown(model.get('layers'))} layers"
                     + (f" ({types})" if types else "")
                     + (f", {human_count(model['parameters'])} parameters" if model.get("parameters") else ""))
    else:
        described = "model: not built (no configuration ran)"
    facts = [
        f"{described}, {s['dtype']}, batch {s['batch']} x seq-len {s['seq_len']}, decode {s['decode_tokens']} tokens",
        (f"machine: {shown(env.get('gpu') or env.get('cpu'))} ({shown(env.get('host'))}); torch "
         f"{shown(env.get('torch'))}, triton {shown(env.get('triton'), 'not installed')}, transformers "
         f"{shown(env.get('transformers'))}, CUDA {shown(env.get('cuda'), 'none')}") if env
        else "machine: not recorded (no configuration ran)",
        f"timing: {timing_caption(s)} ({'CUDA events' if str(s['device']).startswith('cuda') else 'perf_counter'}); "
        f"{doc['created']}",
    ]
    partial = doc.get("partial")
    if partial:
        facts.append(f"PARTIAL: {partial['done']} of {partial['total']} configurations measured; {partial['why']}")
    return facts


def timing_caption(settings: dict[str, Any]) -> str:
    """How each number was timed; one repeat says so (there is no spread to show)."""
    repeats, warmup = int(settings.get("repeats") or 0), int(settings.get("warmup") or 0)
    after = f"after {warmup} warm-up run{'' if warmup == 1 else 's'}"
    if repeats == 1:
        return f"one timed run per phase {after} (--repeats 1: a single sample, no spread measured)"
    return f"median of {repeats} timed runs {after}"


def _memory(r: dict[str, Any], phases: list[str]) -> str:
    mem = []
    for p in phases:
        value = r.get("phases", {}).get(p, {}).get("peak_mem_mib")
        mem.append(f"{value:,.0f}" if isinstance(value, (int, float)) else "-")
    return "/".join(mem)


def _notes(doc: dict[str, Any]) -> list[str]:
    """One line per skip, error, phase note, route digest and honesty label, under the table."""
    notes = []
    for r in doc["configs"]:
        if "skipped" in r:
            notes.append(f"{r['config']}: skipped: {r['skipped']}")
        if "error" in r:
            notes.append(f"{r['config']}: error: {r['error']}")
        for p, entry in r.get("phases", {}).items():
            if "error" in entry:
                notes.append(f"{r['config']} {phase_label(p)}: {entry['error']}")
            elif entry.get("note"):
                notes.append(f"{r['config']} {phase_label(p)}: {entry['note']}")
        for key, ratio in doc.get("speedup_versus", {}).get(r.get("config"), {}).items():
            phase, base = key.split("/", 1)
            notes.append(f"{r['config']} {phase_label(phase)}: {ratio:.2f}x the reference's {phase_label(base)}")
        if r.get("explain"):
            notes.append(f"{r['config']} routes: {route_digest(r['explain'])}")
        if same_as_reference(doc, r.get("config", "")):
            notes.append(f"{r['config']}: ran the same torch code as reference ({r.get('implementation')}); "
                         "its timings are not a speed-up")
        if not_timing_data(doc, r.get("config", "")):
            notes.append(f"{r['config']}: {not_timing_data(doc, r['config'])}")
        calls = r.get("kernel_calls")
        if r.get("config") == "fastpath" and calls is not None:
            notes.append(f"fastpath kernel calls: {', '.join(f'{k} x{v}' for k, v in sorted(calls.items())) or 'none'}")
    return notes


def _compare_flags(doc: dict[str, Any]) -> list[str]:
    flags = (doc.get("compare") or {}).get("differences") or []
    return [f"not like for like: {', '.join(flags)}"] if flags else []


def markdown(doc: dict[str, Any], comparison: list[dict[str, Any]] | None = None) -> str:
    """The results as a markdown table (tokens/s, speed-up vs reference, peak memory)."""
    phases = doc["settings"]["phases"]
    lines = [f"## {_title(doc)}", "", *(f"- {fact}" for fact in _facts(doc)), "",
             "| config | " + " | ".join(f"{phase_label(p)} tok/s" for p in phases) + " | peak memory MiB ("
             + "/".join(phases) + ") |",
             "|---|" + "---|" * len(phases) + "---|"]
    speed = doc.get("speedup", {})
    for r in doc["configs"]:
        cells = [_cell(r, p, speed, doc) for p in phases]
        lines.append(f"| {r['config']} ({r.get('label', '')}) | " + " | ".join(cells) + f" | {_memory(r, phases)} |")
    notes = _notes(doc)
    if notes:
        lines += ["", *(f"- {note}" for note in notes)]
    if comparison:
        lines += ["", "### change vs previous run", "", *(f"- {flag}" for flag in _compare_flags(doc)),
                  "| config | phase | previous tok/s | now tok/s | change |", "|---|---|---|---|---|"]
        for row in comparison:
            lines.append(f"| {row['config']} | {phase_label(row['phase'])} | {_fmt_rate(row['old'])} | "
                         f"{_fmt_rate(row['new'])} | {row['change'] * 100:+.1f}% |")
    return "\n".join(lines) + "\n"


def narrow(doc: dict[str, Any], comparison: list[dict[str, Any]] | None, width: int) -> str:
    """The same content as `markdown` as `key: value` rows wrapped to `width` columns, for a
    terminal narrower than the table (words are never cut; a path longer than a line stays whole)."""
    import textwrap

    def wrap(text: str, indent: str = "", first: str | None = None) -> list[str]:
        return textwrap.wrap(text, width, initial_indent=indent if first is None else first,
                             subsequent_indent=indent + "  ", break_long_words=False, break_on_hyphens=False) or [""]

    phases = doc["settings"]["phases"]
    lines = wrap(_title(doc))
    for fact in _facts(doc):
        lines += wrap(fact, "", "- ")
    speed = doc.get("speedup", {})
    for r in doc["configs"]:
        lines += ["", *wrap(f"{r['config']} ({r.get('label', '')})")]
        if "skipped" in r:
            lines += wrap(f"skipped: {r['skipped']}", "  ")
            continue
        for p in phases:
            lines += wrap(f"{phase_label(p)} tok/s: {_cell(r, p, speed, doc)}", "  ")
        lines += wrap(f"peak memory MiB ({'/'.join(phases)}): {_memory(r, phases)}", "  ")
    notes = _notes(doc)
    if notes:
        lines.append("")
        for note in notes:
            lines += wrap(note, "", "- ")
    if comparison:
        lines += ["", "change vs previous run:"]
        for flag in _compare_flags(doc):
            lines += wrap(flag, "", "- ")
        for row in comparison:
            lines += wrap(f"{row['config']} {phase_label(row['phase'])}: {_fmt_rate(row['old'])} -> "
                          f"{_fmt_rate(row['new'])} tok/s ({row['change'] * 100:+.1f}%)", "  ")
    return "\n".join(lines) + "\n"


def terminal_text(doc: dict[str, Any], comparison: list[dict[str, Any]] | None, width: int) -> str:
    """What bench prints: the markdown when its tables fit `width` columns (the other lines
    wrapped at word boundaries, list items indented), else `narrow`."""
    import textwrap

    text = markdown(doc, comparison)
    if any(len(line) > width for line in text.splitlines() if line.startswith("|")):
        return narrow(doc, comparison, width)
    lines = []
    for line in text.splitlines():
        if line.startswith("|") or len(line) <= width:
            lines.append(line)
        else:
            lines += textwrap.wrap(line, width, subsequent_indent="  " if line.startswith("- ") else "",
                                   break_long_words=False, break_on_hyphens=False)
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
        names, values, skipped, spreads = [], [], [], []
        for r in configs:
            value = r["phases"].get(phase, {}).get("tokens_per_s")
            names.append(r["config"])
            values.append(value or 0.0)
            skipped.append("skipped" in r["phases"].get(phase, {}))
            spreads.append(_spread(r["phases"].get(phase, {})) or (0.0, 0.0))
        errors = None
        if any(b or a for b, a in spreads):
            errors = [[max(b, 0.0) for b, _ in spreads], [max(a, 0.0) for _, a in spreads]]
        bars = ax.bar(names, values, color=[colors.get(n, "#2ca02c") for n in names], yerr=errors,
                      capsize=4 if errors else 0)
        base = tokens_per_s(doc, "reference", phase)
        for bar, name, value, skip, (_, above) in zip(bars, names, values, skipped, spreads, strict=True):
            label = _fmt_rate(value) if value else ("skipped" if skip else "error")
            if not_timing_data(doc, name):
                label += "\ninterpreter:\nnot timing data"
            elif same_as_reference(doc, name):
                label += "\nsame impl.\nas reference"
            elif base and value and name != "reference":
                label += f"\n{value / base:.2f}x"
            ax.annotate(label, (bar.get_x() + bar.get_width() / 2, bar.get_height() + max(above, 0.0)),
                        ha="center", va="bottom", fontsize=8)  # above the whisker
        ax.set_title(phase_label(phase))
        ax.set_ylabel("tokens/s")
        ax.margins(y=0.2)
    s = doc["settings"]
    env = doc.get("environment") or {}
    where = env.get("gpu") or f"CPU{' (Triton interpreter)' if env.get('triton_interpret') == '1' else ''}"
    title = (f"{s['source']}" + (f" ({s['layers']} layers)" if s.get("layers") else "")
             + f", {s['dtype']}, B={s['batch']}, L={s['seq_len']}, {where}")
    caption = chart_caption(s)
    fig.suptitle(f"{title}\n{caption}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110, metadata={"Title": title, "Description": caption})
    plt.close(fig)


def chart_caption(settings: dict[str, Any]) -> str:
    """The chart's second title line: what a bar is, and what its whisker is (min-max of the
    timed runs), or that there is none (one repeat: a bar is one sample)."""
    if int(settings.get("repeats") or 0) == 1:
        return "bars: " + timing_caption(settings) + "; no error bars"
    return "bars: " + timing_caption(settings) + "; whiskers: fastest and slowest run"


def _spread(entry: dict[str, Any]) -> tuple[float, float] | None:
    """(below, above) the bar's tokens/s for the slowest and fastest timed run, or None."""
    samples = [t for t in entry.get("samples_s") or [] if isinstance(t, (int, float)) and t > 0]
    value, tokens = entry.get("tokens_per_s"), entry.get("tokens_per_call")
    if len(samples) < 2 or not value or not tokens:
        return None
    return value - tokens / max(samples), tokens / min(samples) - value


def write_tables(doc: dict[str, Any], out_dir: Path, comparison: list[dict[str, Any]] | None) -> dict[str, Path]:
    """bench.json and bench.md, each replaced atomically (a reader never sees half a file): bench
    rewrites them after every configuration, so a run that is killed keeps what it measured."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"json": out_dir / "bench.json", "markdown": out_dir / "bench.md"}
    for path, text in ((paths["json"], json.dumps(doc, indent=1, default=str) + "\n"),
                       (paths["markdown"], markdown(doc, comparison))):
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(text)
        tmp.replace(path)
    return paths


def write_outputs(doc: dict[str, Any], out_dir: Path, comparison: list[dict[str, Any]] | None,
                  draw_chart: bool = True) -> tuple[dict[str, Path], str | None]:
    """bench.json and bench.md always, first; bench.png when `draw_chart` (matplotlib importable).
    Returns the paths written and, when there is no chart, why (one line)."""
    paths = write_tables(doc, out_dir, comparison)
    stale = out_dir / "bench.png"  # an earlier run's (--force): never left beside these numbers
    if not any(isinstance(e, dict) and e.get("tokens_per_s") for r in doc.get("configs", [])
               for e in (r.get("phases") or {}).values()):
        stale.unlink(missing_ok=True)
        return paths, "no configuration measured anything (see the notes in bench.md)"
    if not draw_chart:
        stale.unlink(missing_ok=True)
        from fastpath.shared.extras import install_line

        return paths, f"matplotlib is not installed; run: {install_line('bench')}"
    try:
        chart(doc, out_dir / "bench.png")
    except Exception as exc:  # the numbers are on disk already; a chart never costs them
        return paths, f"matplotlib failed: {exc.__class__.__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
    paths["chart"] = out_dir / "bench.png"
    return paths, None
