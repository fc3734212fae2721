"""Autotune decisions as data: record which config each Triton autotuner chose for each key on
one GPU, and hand those choices to the autotuners of a later process on the same kind of GPU, so
it compiles the chosen config only instead of compiling and timing every config.

Why: on an empty Triton cache an autotuner compiles every config it is offered before it can time
them. fla-core 0.6.0 offers many per kernel (its chunk_h kernels 48, l2norm 25, solve_tril 16, the
KDA backward 36 on a CPU-side count), so the first forward and backward of a GatedDeltaNet or KDA
model spend most of their cold minute compiling configs that lose. Triton's own
`cache_results` keeps timings beside the binaries, which helps a host (or a fleet sharing
TRITON_CACHE_DIR) from its second process on; decisions as data help the first process too.

Safety: a decision is a config from the autotuner's own current list (matched field by field;
anything else is skipped), applied only on the compute capability it was recorded on (a config
that fits one GPU's shared memory may not fit another's). Any config of the list computes the same
function: the choice is speed, never correctness. Keys already decided in this process are left.

The file: {"schema", "device": {"name", "capability"}, "versions", "kernels": {"module:name":
[{"key": [...], "config": {...}}]}}. Recorded by `fastpath warmup --save-decisions FILE`;
applied by `seed()`. `seed_for_process()` picks the file: FASTPATH_AUTOTUNE_DECISIONS=FILE, else
the one shipped for this compute capability (autotune_data/sm_XY.json), if any; =off: none.
"""

from __future__ import annotations

import importlib
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastpath.shared.errors import UsageError

SCHEMA = "fastpath.autotune-decisions/1"
ENV = "FASTPATH_AUTOTUNE_DECISIONS"
# The modules whose autotuners are recorded and seeded: FLA's ops and modules, fastpath's kernels.
PREFIXES = ("fla.", "fastpath.kernels.")
CONFIG_FIELDS = ("kwargs", "num_warps", "num_stages", "num_ctas", "maxnreg")
_KEY_TYPES = (int, float, bool, str, type(None))


def _autotuner_class() -> type:
    from triton.runtime.autotuner import Autotuner

    return Autotuner


def unwrap_autotuner(obj: Any, depth: int = 4) -> Any:
    """The Autotuner under `obj` (itself, or below heuristics wrappers), or None."""
    autotuner = _autotuner_class()
    for _ in range(depth):
        if isinstance(obj, autotuner):
            return obj
        try:
            obj = getattr(obj, "fn", None)
        except Exception:  # a module attribute whose lookup raises (lazy proxies): not a kernel
            return None
        if obj is None:
            return None
    return None


def _defining_name(autotuner: Any) -> str | None:
    """'module:function' of the Python function under the autotuner: where the decorated kernel
    is bound, whatever modules re-export it."""
    fn = autotuner.fn
    for _ in range(4):
        inner = getattr(fn, "fn", None)
        if inner is None or not callable(inner):
            break
        fn = inner
    module, name = getattr(fn, "__module__", None), getattr(fn, "__name__", None)
    return f"{module}:{name}" if module and name else None


def loaded_autotuners(prefixes: tuple[str, ...] = PREFIXES) -> dict[str, Any]:
    """Every autotuner bound at module level in the loaded modules under `prefixes`, by its
    defining 'module:function' name."""
    found: dict[str, Any] = {}
    seen: set[int] = set()
    for mod_name, module in list(sys.modules.items()):
        if module is None or not mod_name.startswith(prefixes):
            continue
        for value in list(vars(module).values()):
            tuner = unwrap_autotuner(value)
            if tuner is None or id(tuner) in seen:
                continue
            seen.add(id(tuner))
            name = _defining_name(tuner)
            if name is not None:
                found.setdefault(name, tuner)
    return found


def config_fields(config: Any) -> dict[str, Any]:
    """The fields of a triton.Config that decide the binary (not its hooks)."""
    return {f: getattr(config, f, None) for f in CONFIG_FIELDS}


def merge(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """`new` with the decisions of `old` (same compute capability) it does not hold, so warming
    several models into one file keeps them all; a key decided in both takes `new`'s config."""
    if old.get("device", {}).get("capability") != new.get("device", {}).get("capability"):
        raise UsageError("cannot merge autotune decisions of different GPUs (compute capability "
                         f"{old.get('device', {}).get('capability')} vs {new.get('device', {}).get('capability')})")
    kernels = {name: list(rows) for name, rows in old.get("kernels", {}).items()}
    for name, rows in new["kernels"].items():
        fresh = {json.dumps(r["key"]) for r in rows}
        kernels[name] = [r for r in kernels.get(name, []) if json.dumps(r["key"]) not in fresh] + list(rows)
    return {**new, "kernels": dict(sorted(kernels.items()))}


def record(device_name: str, capability: tuple[int, int], versions: dict[str, Any],
           prefixes: tuple[str, ...] = PREFIXES) -> dict[str, Any]:
    """The decisions this process's autotuners made so far, as a JSON-ready document."""
    kernels: dict[str, list[dict[str, Any]]] = {}
    for name, tuner in sorted(loaded_autotuners(prefixes).items()):
        rows = []
        for key, config in tuner.cache.items():
            if not all(isinstance(k, _KEY_TYPES) for k in key):
                continue  # a key that does not survive JSON could never match again
            fields = config_fields(config)
            if not all(isinstance(v, _KEY_TYPES) for k, v in fields.items() if k != "kwargs"):
                continue
            rows.append({"key": list(key), "config": fields})
        if rows:
            kernels[name] = rows
    return {"schema": SCHEMA, "device": {"name": device_name, "capability": list(capability)},
            "versions": dict(versions), "kernels": kernels}


def load(path: str | Path) -> dict[str, Any]:
    """A decisions file; UsageError (one line) when it is not one."""
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot read autotune decisions {path}: {exc}") from None
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA or not isinstance(doc.get("kernels"), dict):
        raise UsageError(f"{path} is not an autotune decisions file (schema {SCHEMA})")
    return doc


@dataclass
class SeedReport:
    """What seed() did: decisions handed to autotuners, and why others were not."""

    seeded: int = 0
    kernels: int = 0
    skipped: dict[str, int] = field(default_factory=dict)
    refused: str | None = None  # the whole file was not applied (another GPU)
    applied: list[tuple[Any, tuple[Any, ...]]] = field(default_factory=list, repr=False)  # (autotuner, key)

    def undo(self) -> None:
        """Take back the decisions this seed() handed out (disable() leaves nothing behind);
        a key the autotuner re-decided since is left alone only if its config changed."""
        for tuner, key in self.applied:
            tuner.cache.pop(key, None)
        self.applied.clear()

    def skip(self, why: str) -> None:
        self.skipped[why] = self.skipped.get(why, 0) + 1

    def summary(self) -> str:
        if self.refused:
            return f"autotune decisions not applied: {self.refused}"
        text = f"autotune decisions: {self.seeded} applied to {self.kernels} kernels"
        if self.skipped:
            text += " (skipped: " + ", ".join(f"{n} {why}" for why, n in sorted(self.skipped.items())) + ")"
        return text


def seed(doc: dict[str, Any], capability: tuple[int, int] | None) -> SeedReport:
    """Hand each recorded decision to its autotuner in this process (importing its module),
    where the capability matches and the config is one of the autotuner's own."""
    report = SeedReport()
    recorded = tuple(doc.get("device", {}).get("capability") or ())
    if capability is None or tuple(capability) != recorded:
        report.refused = (f"recorded on compute capability {'.'.join(map(str, recorded)) or '?'}, this device is "
                          f"{'.'.join(map(str, capability)) if capability else 'not a CUDA GPU'}")
        return report
    for name, rows in doc["kernels"].items():
        module_name, _, attr = name.partition(":")
        try:
            tuner = unwrap_autotuner(getattr(importlib.import_module(module_name), attr))
        except Exception:
            tuner = None
        if tuner is None:
            report.skip("kernels not found")
            continue
        own = [(config_fields(c), c) for c in tuner.configs]
        used = False
        for row in rows:
            key = tuple(row.get("key", ()))
            match = next((c for fields, c in own if fields == row.get("config")), None)
            if match is None:
                report.skip("configs no longer offered")
            elif key in tuner.cache:
                report.skip("keys already decided")
            else:
                tuner.cache[key] = match
                report.applied.append((tuner, key))
                report.seeded += 1
                used = True
        report.kernels += used
    return report


def this_device() -> tuple[str, tuple[int, int]] | None:
    """(name, compute capability) of the current CUDA device: what decisions are keyed on."""
    import torch

    if not torch.cuda.is_available():
        return None
    major, minor = torch.cuda.get_device_capability()
    return torch.cuda.get_device_name(), (int(major), int(minor))


def versions() -> dict[str, str | None]:
    """The versions a decisions file records (for the reader; matching is by config)."""
    from importlib.metadata import PackageNotFoundError, version

    out: dict[str, str | None] = {}
    for dist in ("torch", "triton", "fla-core", "fastpath-kit"):
        try:
            out[dist] = version(dist)
        except PackageNotFoundError:
            out[dist] = None
    return out


SHIPPED = Path(__file__).resolve().parent / "autotune_data"


def shipped_file(capability: tuple[int, int] | None) -> Path | None:
    """The decisions shipped with fastpath for this compute capability, if there are any."""
    if capability is None:
        return None
    path = SHIPPED / f"sm_{capability[0]}{capability[1]}.json"
    return path if path.is_file() else None


def check_setting() -> None:
    """FASTPATH_AUTOTUNE_DECISIONS checked without applying it: unset, "off" or a readable
    decisions file (UsageError, one line, otherwise)."""
    import os

    setting = os.environ.get(ENV, "").strip()
    if setting and setting.lower() != "off":
        load(setting)


def seed_for_process(capability: tuple[int, int] | None) -> SeedReport | None:
    """What a process applies at start (enable()): the file FASTPATH_AUTOTUNE_DECISIONS names,
    else the shipped one for this capability; nothing with FASTPATH_AUTOTUNE_DECISIONS=off.
    Kernels of packages that are not installed are skipped, never imported by force."""
    import importlib.util
    import os

    setting = os.environ.get(ENV, "").strip()
    if setting.lower() == "off":
        return None
    if setting:
        return seed(load(setting), capability)
    path = shipped_file(capability)
    if path is None:
        return None
    doc = load(path)

    def installed(name: str) -> bool:
        try:
            return importlib.util.find_spec(name.split(".")[0]) is not None
        except (ImportError, ValueError):
            return False

    doc["kernels"] = {k: v for k, v in doc["kernels"].items() if installed(k)}
    return seed(doc, capability)
