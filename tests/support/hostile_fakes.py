"""Fake hostile targets for the tests/doctor/test_hostile_*.py suite (real processes, no network).

A fake target is a small Python program used as the target prefix: `python3 fake_target.py
SPEC.json`. The doctor appends `python3 - --framed [--static]` (or `sh -s` for the sh fallback)
and feeds the probe on stdin, exactly as with `ssh host`; the fake ignores the probe and answers
with what SPEC says (stdout bytes, stderr bytes, exit status), so every test controls precisely
what a hostile or broken target sends back.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from repo_paths import ROOT

# The fastpath sources the `fastpath` subprocesses run (this checkout; point it at another tree
# to run the suite against an older version, as done to see each test fail before the fix).
SRC = Path(os.environ.get("FASTPATH_HOSTILE_SRC") or ROOT / "src")

FRAME_BEGIN = "--- fastpath facts begin ---"
FRAME_END = "--- fastpath facts end ---"

# A plausible facts report (the shape probe.py writes), one H100, torch with CUDA.
BASE_FACTS: dict[str, Any] = {
    "schema": "fastpath.facts/1",
    "probe": {"kind": "python", "python": "3.11.9", "errors": {}, "seconds": 0.2,
              "options": {"root": "/", "skip": ["imports"]}},
    "host": {"hostname": "gpu1", "os": "Ubuntu 24.04 LTS", "kernel": "6.8.0", "arch": "x86_64",
             "glibc": "glibc 2.39", "python": "3.11.9", "executable": "/usr/bin/python3",
             "source": "platform"},
    "env": {"PATH": "/usr/bin:/bin"},
    "gpus": [{"index": 0, "name": "NVIDIA H100 80GB HBM3", "driver": "550.54.15",
              "compute_capability": "9.0", "memory_mib": 81559, "source": "nvidia-smi"}],
    "driver": {"version": "550.54.15", "cuda_version": "12.4", "source": "nvidia-smi"},
    "torch": {"version": "2.6.0+cu124", "cuda": "12.4", "file": "/x/torch/__init__.py",
              "cxx11_abi": False, "source": "static", "cuda_available": True,
              "device_arch_covered": True, "arch_list": ["sm_80", "sm_90"], "devices": []},
    "triton": {"version": "3.2.0", "source": "static", "backends": ["nvidia"]},
    "nvrtc": [],
    "nvcc_candidates": [],
    "cuda_home": {"torch_would_use": None, "how": "not found", "has_nvcc": False,
                  "headers": {}, "cuda_home_env": None, "cuda_path_env": None, "diverge": False},
    "package_db": {"dpkg": [], "rpm": [], "source": "dpkg"},
    "gcc": {"version": "13.2.0", "path": "/usr/bin/gcc", "source": "gcc -dumpfullversion"},
    "packages": {},
}

FAKE_TARGET = r'''
import json, os, sys, time
spec = json.load(open(sys.argv[1]))
rest = sys.argv[2:]
part = spec.get("sh", spec) if rest[-2:] == ["sh", "-s"] else spec
if part.get("sleep"):
    time.sleep(part["sleep"])
out = sys.stdout.buffer
if part.get("stdout_file"):
    with open(part["stdout_file"], "rb") as fh:
        while True:
            chunk = fh.read(1 << 20)
            if not chunk:
                break
            out.write(chunk)
if part.get("repeat"):
    block = part["repeat"]["text"].encode()
    for _ in range(part["repeat"]["times"]):
        out.write(block)
out.write(part.get("stdout", "").encode("utf-8", "surrogateescape"))
out.flush()
sys.stderr.write(part.get("stderr", ""))
sys.exit(part.get("exit", 0))
'''


def facts(**changes: Any) -> dict[str, Any]:
    """BASE_FACTS with top-level sections replaced (deep copy)."""
    out = copy.deepcopy(BASE_FACTS)
    out.update(copy.deepcopy(changes))
    return out


def framed(obj: Any, raw: str | None = None) -> str:
    """What probe.py --framed prints for facts `obj` (or a raw JSON text)."""
    body = raw if raw is not None else json.dumps(obj)
    return f"\n{FRAME_BEGIN}\n{body}\n{FRAME_END}\n"


def fake_target(tmp: Path, name: str, **spec: Any) -> list[str]:
    """A target prefix (argv) for a fake target answering per `spec` (stdout, stderr, exit,
    sleep, repeat, stdout_file; `sh` = the answer to the sh fallback)."""
    script = tmp / "fake_target.py"
    if not script.exists():
        script.write_text(FAKE_TARGET)
    spec_path = tmp / f"{name}.json"
    spec_path.write_text(json.dumps(spec))
    return [sys.executable, str(script), str(spec_path)]


def env(**extra: str) -> dict[str, str]:
    """The environment for a `fastpath` subprocess: this checkout's src first."""
    out = dict(os.environ)
    out["PYTHONPATH"] = os.pathsep.join([str(SRC), out.get("PYTHONPATH", "")])
    out.pop("FORCE_COLOR", None)
    out.update(extra)
    return out


def fastpath(*args: str, timeout: float = 120, extra_env: dict[str, str] | None = None,
             cwd: Path | None = None) -> subprocess.CompletedProcess[bytes]:
    """Run `python -m fastpath ARGS` (stdout/stderr as bytes, so escapes are seen as sent)."""
    return subprocess.run([sys.executable, "-m", "fastpath", *args], capture_output=True,
                          env=env(**(extra_env or {})), timeout=timeout, cwd=cwd)


def one_line_error(proc: subprocess.CompletedProcess[bytes]) -> str:
    """stderr of a failed run, asserted to be exactly one line without a traceback."""
    err = proc.stderr.decode("utf-8", "replace").strip()
    assert "Traceback" not in err, err[-3000:]
    assert err.count("\n") == 0, err[-3000:]
    return err
