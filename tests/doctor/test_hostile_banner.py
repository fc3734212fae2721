"""A login banner before the probe's output (or noise after it) is ignored.
It used to make the doctor fall back to the sh probe silently, losing torch, Triton and the
packages."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import pytest
from hostile_fakes import BASE_FACTS, fake_target, fastpath, framed

from fastpath.doctor.remote import parse_facts

PY = shlex.quote(sys.executable)


@pytest.mark.parametrize("shell", [
    # .bashrc-style banner before, `logout`-style noise after; the real probe runs in between
    "sh -c 'echo Welcome to gpu1; echo \"{not json}\"; \"$@\"; echo logout; echo \"{}\"' b",
    # a banner that is itself one JSON line (a motd "status" feed)
    "sh -c 'echo \"{\\\"motd\\\": 1}\"; exec \"$@\"' b",
])
def test_banner_and_trailing_noise_are_ignored(shell: str) -> None:
    proc = fastpath("doctor", "--on", shell, "--python", sys.executable, "--probe", "static",
                    "--json", "--timeout", "120", timeout=180)
    assert proc.returncode in (0, 1), proc.stderr.decode()[-2000:]
    report = json.loads(proc.stdout)
    probe = report["facts"]["probe"]
    assert probe["kind"] == "python", probe  # not the sh fallback
    assert report["facts"]["packages"] is not None


def test_parse_facts_frames_and_old_unframed_output() -> None:
    obj = {"schema": "fastpath.facts/1", "probe": {"kind": "python"}}
    noisy = b"Welcome\n{not json}\n" + framed(obj).encode() + b"logout\n{\"x\": 1}\n"
    assert parse_facts(noisy) == obj
    # an older probe: one unframed JSON object, possibly after a banner line
    assert parse_facts(json.dumps(obj, indent=1).encode()) == obj
    assert parse_facts(b"Last login: today\n" + json.dumps(obj).encode() + b"\n") == obj
    assert parse_facts(b"Welcome\n") is None


def test_fake_target_with_banner_over_the_whole_path(tmp_path: Path) -> None:
    prefix = fake_target(tmp_path, "banner", stdout="Welcome! {\n" + framed(BASE_FACTS) + "bye\n")
    proc = fastpath("doctor", "--on", " ".join(prefix), "--json", "--timeout", "30")
    report = json.loads(proc.stdout)
    assert report["facts"]["gpus"][0]["name"] == "NVIDIA H100 80GB HBM3"
