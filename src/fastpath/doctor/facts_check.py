"""Facts from a target checked against the facts schema on arrival: keep what is valid, name the
rest in probe.errors as "could not collect: malformed ...".

Why: the rules and renderers read facts as the probe writes them (`gpus` a list of objects,
`torch.cuda` a version string). A target can send anything: wrong types, 10 000-deep nesting,
NaN, megabyte strings. Checking once here means the rules never see a shape they would crash on,
and the JSON we print is strict (no NaN/Infinity, which `json.loads` accepts but strict parsers
reject).
"""

from __future__ import annotations

import math
import re
from typing import Any

# Nesting deeper than this is not a facts report (the real one is 6 levels deep).
MAX_DEPTH = 32
# Any one string (a path, a version, an error line).
MAX_STRING = 8192
# Entries of any one list or mapping (a fleet of 8 GPUs, ~200 env/packages entries).
MAX_ITEMS = 4096

_VERSION = re.compile(r"^\d{1,6}(?:\.\d{1,6}){0,5}$")
_CC = re.compile(r"^\d{1,3}\.\d{1,3}$")


class _Spec:
    """One field's expected shape: `check(value)` returns a cleaned value or raises _Bad."""


class _Bad(ValueError):
    pass


def _what(value: Any) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def _generic(value: Any, depth: int) -> Any:
    """Any JSON value, with strings cut, lists/maps capped, depth capped and NaN dropped."""
    if depth > MAX_DEPTH:
        raise _Bad(f"nested deeper than {MAX_DEPTH} levels")
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise _Bad("not a finite number")
        return value
    if isinstance(value, str):
        return value if len(value) <= MAX_STRING else value[:MAX_STRING] + "..."
    if isinstance(value, list):
        return [_generic(v, depth + 1) for v in value[:MAX_ITEMS]]
    if isinstance(value, dict):
        return {str(k)[:MAX_STRING]: _generic(v, depth + 1)
                for k, v in list(value.items())[:MAX_ITEMS]}
    raise _Bad(f"unexpected {type(value).__name__}")


# --- field kinds ---------------------------------------------------------------------------------
# A spec is one of: type (str/bool/int/float), "version", "cc", "any", ("list", spec),
# ("map", spec) (string keys -> spec), or a dict {field: spec} (an object with known fields;
# unknown fields are kept through _generic). Every field may be null.


def _check(value: Any, spec: Any, depth: int, path: str, bad: list[str]) -> Any:
    if value is None:
        return None
    if depth > MAX_DEPTH:
        raise _Bad(f"{path}: nested deeper than {MAX_DEPTH} levels")
    if spec == "any":
        try:
            return _generic(value, depth)
        except _Bad as exc:
            raise _Bad(f"{path}: {exc}") from None
    if spec is str:
        if not isinstance(value, str):
            raise _Bad(f"{path}: expected a string, got {_what(value)}")
        return _generic(value, depth)
    if spec is bool:
        if not isinstance(value, bool):
            raise _Bad(f"{path}: expected true/false, got {_what(value)}")
        return value
    if spec in (int, float):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (
                spec is int and not isinstance(value, int)):
            raise _Bad(f"{path}: expected a number, got {_what(value)}")
        if isinstance(value, float) and not math.isfinite(value):
            raise _Bad(f"{path}: not a finite number")
        return value
    if spec in ("version", "cc"):
        text = str(value) if isinstance(value, (int, float)) and not isinstance(value, bool) \
            else value
        pattern = _VERSION if spec == "version" else _CC
        if not isinstance(text, str) or not pattern.match(text):
            shown = repr(text)[:40] if isinstance(text, str) else _what(value)
            raise _Bad(f"{path}: expected a version like 12.8, got {shown}")
        return text
    if isinstance(spec, tuple):
        kind, inner = spec
        if kind == "list":
            if not isinstance(value, list):
                raise _Bad(f"{path}: expected a list, got {_what(value)}")
            out = []
            for i, item in enumerate(value[:MAX_ITEMS]):
                if item is None and inner != "any":
                    bad.append(f"{path}[{i}]: null")
                    continue
                try:
                    out.append(_check(item, inner, depth + 1, f"{path}[{i}]", bad))
                except _Bad as exc:
                    bad.append(str(exc))
            return out
        if not isinstance(value, dict):
            raise _Bad(f"{path}: expected an object, got {_what(value)}")
        out_map: dict[str, Any] = {}
        for key, item in list(value.items())[:MAX_ITEMS]:
            if item is None and isinstance(inner, dict):
                bad.append(f"{path}.{str(key)[:40]}: null")
                continue
            try:
                out_map[str(key)[:MAX_STRING]] = _check(item, inner, depth + 1,
                                                        f"{path}.{str(key)[:40]}", bad)
            except _Bad as exc:
                bad.append(str(exc))
        return out_map
    if isinstance(spec, dict):
        if not isinstance(value, dict):
            raise _Bad(f"{path}: expected an object, got {_what(value)}")
        for key in spec.get(_REQUIRED, ()):
            if not isinstance(value.get(key), str):
                raise _Bad(f"{path}: no {key}")
        out_obj: dict[str, Any] = {}
        for key, item in list(value.items())[:MAX_ITEMS]:
            key = str(key)[:MAX_STRING]
            if key == _REQUIRED:
                continue
            try:
                out_obj[key] = _check(item, spec.get(key, "any"), depth + 1,
                                      f"{path}.{key[:40]}", bad)
            except _Bad as exc:
                bad.append(str(exc))
                out_obj[key] = None
        return out_obj
    raise TypeError(f"bad spec at {path}")  # a bug in SCHEMA below, not in the facts


_REQUIRED = "__required__"  # in an object spec: fields that must be present, as strings
_IMPORT = {"ok": bool, "error_kind": str, "error": str, "how": str, "link_check": "any"}
_SO = {"path": str, "sass": ("list", str), "ptx": ("list", str), "sections": ("list", str),
       "error": str}
_NVCC = {"path": str, "realpath": str, "paths": ("list", str), "found_by": ("list", str),
         "kind": str, "version": str, "major": int, "minor": int, "major_matches_torch": bool,
         "source": str, "error": str}
_NAME_VERSION = {"name": str, "version": str, "status": str, _REQUIRED: ("name",)}

SCHEMA: dict[str, Any] = {
    "schema": str,
    "probe": {"kind": str, "python": str, "errors": ("map", str), "seconds": float,
              "options": {"root": str, "dpkg_status": str, "site_packages": ("list", str),
                          "nvcc_site_dirs": ("list", str), "skip": ("list", str)},
              "target": str, "wall_seconds": float},
    "host": ("map", str),
    "env": ("map", str),
    "gpus": ("list", {"index": int, "name": str, "driver": str, "compute_capability": "cc",
                      "memory_mib": float, "source": str}),
    "driver": {"version": str, "cuda_version": "version", "source": str},
    "torch": {"version": str, "cuda": "version", "file": str, "cxx11_abi": bool, "source": str,
              "cuda_available": bool, "device_arch_covered": bool, "arch_list": ("list", str),
              "devices": ("list", "any"), "cuda_error": str},
    "triton": {"version": str, "source": str, "backends": ("list", str)},
    "nvrtc": ("list", {"path": str, "version": str}),
    "nvcc_candidates": ("list", _NVCC),
    "cuda_home": {"torch_would_use": str, "how": str, "has_nvcc": bool,
                  "headers": ("map", bool), "include_dir": str, "cuda_home_env": str,
                  "cuda_path_env": str, "diverge": bool, "nvcc_version": "version"},
    "package_db": {"dpkg": ("list", _NAME_VERSION), "rpm": ("list", _NAME_VERSION),
                   "source": str},
    "gcc": {"version": str, "path": str, "source": str},
    "packages": ("map", {"version": str, "module": str, "source": str, "import": _IMPORT,
                         "so_files": ("list", _SO), "extension_modules": ("map", str)}),
    "hub_kernels": {"cache_dir": str, "how": str, "source": str,
                    "repos": ("map", {"path": str, "refs": ("map", str),
                                      "snapshots": ("map", ("map", {"metadata": bool,
                                                                    "backend": "any"}))})},
}


def check_facts(facts: Any) -> dict[str, Any]:
    """A facts dict safe for the rules and renderers: every known field of the right type and
    shape, strings cut, NaN/Infinity and over-deep nesting removed. What was dropped is named in
    probe.errors as "could not collect: malformed ..." under its top-level section."""
    if not isinstance(facts, dict):
        return {"probe": {"errors": {"facts": f"could not collect: malformed facts: expected an "
                                               f"object, got {_what(facts)}"}}}
    bad_by_section: dict[str, list[str]] = {}
    out: dict[str, Any] = {}
    for key, value in list(facts.items())[:MAX_ITEMS]:
        key = str(key)[:MAX_STRING]
        bad: list[str] = []
        try:
            out[key] = _check(value, SCHEMA.get(key, "any"), 1, key, bad)
        except _Bad as exc:
            bad.append(str(exc))
            out[key] = None
        if bad:
            bad_by_section[key] = bad
    probe = out.get("probe")
    if not isinstance(probe, dict):
        probe = {}
        out["probe"] = probe
    errors = probe.get("errors")
    if not isinstance(errors, dict):
        errors = {}
        probe["errors"] = errors
    for section, bad in bad_by_section.items():
        more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
        note = f"could not collect: malformed {bad[0][:300]}{more}"
        errors[section] = f"{errors[section]}; {note}" if isinstance(errors.get(section), str) \
            else note
    return out


def check_json(obj: Any, depth: int = 0) -> Any:
    """A copy of any JSON-bound tree that `json.dumps(allow_nan=False)` accepts: NaN/Infinity
    become null, non-JSON keys strings, and subtrees past 2 * MAX_DEPTH "<too deep>"."""
    if depth > 2 * MAX_DEPTH:
        return "<too deep>"
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k if isinstance(k, (str, int, bool)) or k is None else str(k):
                check_json(v, depth + 1) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [check_json(v, depth + 1) for v in obj]
    return obj
