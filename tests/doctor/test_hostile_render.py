"""What a target says is rendered as inert plain text, and malformed
facts never crash the report (kept where valid, named as "could not collect: malformed ...")."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hostile_fakes import facts, fake_target, fastpath, framed

ESC = b"\x1b"
OSC8 = "\x1b]8;;http://evil.example/\x1b\\click me\x1b]8;;\x1b\\"
CLEAR = "\x1b[2J\x1b[H"


def _hostile_facts() -> dict:
    gpus = [{"index": 0, "name": "H100" + OSC8 + CLEAR, "driver": "550.1" + CLEAR,
             "compute_capability": "9.0", "memory_mib": 81559, "source": "[link=http://evil]x[/link]"}]
    return facts(
        host={"hostname": "node[/bold]\x1b]0;pwned title\x07", "os": "[bold red]OS[/] :warning:",
              "arch": "x86_64", "python": "3.11.9", "glibc": "glibc\u202e2.39"},
        gpus=gpus,
        driver={"version": "550.1" + CLEAR, "cuda_version": "12.4", "source": "[/]"},
        env={"CUDA_HOME": "/opt/cuda[/]", "PATH": "/usr/bin" + OSC8},
    )


def test_single_target_report_is_inert(tmp_path: Path) -> None:
    prefix = fake_target(tmp_path, "evil", stdout=framed(_hostile_facts()))
    proc = fastpath("doctor", "--on", " ".join(prefix), "--timeout", "30")
    out = proc.stdout + proc.stderr
    assert b"Traceback" not in out and b"MarkupError" not in out, out[-3000:].decode()
    assert proc.returncode in (0, 1), out[-3000:].decode()
    assert ESC not in out  # no OSC-8 link, no clear-screen, no title change reaches the terminal
    text = proc.stdout.decode()
    assert "\\x1b[2J" in text and "\\x1b]8;;http://evil.example/" in text  # shown, visibly
    assert "node[/bold]" in text and "[link=http://evil]x[/link]" in text  # markup shown as text
    assert "\\[" not in text  # ... as sent, not markup-escaped
    assert "[bold red]OS[/] :warning:" in text  # not an emoji either
    assert "\\u202e" in text  # a bidi override is shown, not applied


def test_fleet_table_and_progress_are_inert(tmp_path: Path) -> None:
    hosts = tmp_path / "fleet.txt"
    prefix = " ".join(fake_target(tmp_path, "evil", stdout=framed(_hostile_facts())))
    failing = " ".join(fake_target(tmp_path, "bad", stderr="boom" + CLEAR + "\n", exit=3))
    hosts.write_text(f"{prefix}\n{failing}\n")
    proc = fastpath("doctor", "--hosts", str(hosts), "--timeout", "30")
    out = proc.stdout + proc.stderr
    assert b"Traceback" not in out, out[-3000:].decode()
    assert ESC not in out
    assert "550.1\\x1b[2J\\x1b[H" in proc.stdout.decode()  # the driver column, visibly


def test_fleet_progress_on_a_terminal_is_inert(tmp_path: Path) -> None:
    """On a terminal the progress bar shows each target's name: a rich TextColumn read it as
    markup, and a host `n[/b]` crashed the fleet with a MarkupError."""
    hosts = tmp_path / "fleet.txt"
    hosts.write_text("n[/b]\n")
    proc = fastpath("doctor", "--hosts", str(hosts), "--timeout", "10",
                    extra_env={"TTY_COMPATIBLE": "1"})  # rich: stdout/stderr are terminals
    assert b"Traceback" not in proc.stderr, proc.stderr[-3000:].decode()
    assert proc.returncode == 3  # the one target could not be diagnosed
    assert b"n[/b]" in proc.stderr  # the progress line shows the name as sent


def test_local_cuda_home_with_markup_does_not_crash(tmp_path: Path) -> None:
    proc = fastpath("doctor", "--probe", "static",
                    extra_env={"CUDA_HOME": "/opt/cuda[/]", "CUDA_PATH": "[link=http://x]y"})
    assert proc.returncode in (0, 1), proc.stderr[-3000:].decode()
    assert b"Traceback" not in proc.stderr
    assert b"/opt/cuda[/]" in proc.stdout


# --- point 5: malformed facts ------------------------------------------------------------------
def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


MALFORMED = {
    "gpus-string": json.dumps(facts(gpus="x")),
    "packages-list": json.dumps(facts(packages=["causal-conv1d", 1])),
    "torch-cuda-word": json.dumps(facts(torch={"version": "2.6.0", "cuda": "abc",
                                               "cuda_available": True})),
    "errors-list": json.dumps(facts(probe={"kind": "python", "errors": ["a", "b"]})),
    "gpu-items-wrong": json.dumps(facts(gpus=[1, "x", None, {"name": 5,
                                                              "compute_capability": [9]}])),
    "deep-600": json.dumps(facts()).replace('"nvrtc": []', '"nvrtc": ' + _nested(600)),
    "deep-100k": json.dumps(facts()).replace('"nvrtc": []', '"nvrtc": ' + _nested(100_000)),
    "nan-infinity": json.dumps(facts()).replace('"seconds": 0.2', '"seconds": NaN').replace(
        '"memory_mib": 81559', '"memory_mib": Infinity'),
    "huge-float": json.dumps(facts()).replace('"memory_mib": 81559', '"memory_mib": 1e999'),
}


def _strict(text: str) -> dict:
    def refuse(name: str) -> None:
        raise ValueError(f"non-standard JSON constant {name}")

    return json.loads(text, parse_constant=refuse)


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_facts_never_crash(tmp_path: Path, case: str) -> None:
    prefix = " ".join(fake_target(tmp_path, case, stdout=framed(None, raw=MALFORMED[case])))
    text = fastpath("doctor", "--on", prefix, "--timeout", "30")
    assert b"Traceback" not in text.stderr + text.stdout, text.stderr[-3000:].decode()
    as_json = fastpath("doctor", "--on", prefix, "--timeout", "30", "--json")
    assert b"Traceback" not in as_json.stderr, as_json.stderr[-3000:].decode()
    if case == "deep-100k":  # not parseable at all: the target fails, one line, exit 3
        assert text.returncode == 3 and as_json.returncode == 3
        assert as_json.stderr.count(b"\n") == 1
        failed = _strict(as_json.stdout.decode())  # still one JSON document, with the error
        assert failed["exit_code"] == 3 and failed["error"]
        return
    assert text.returncode in (0, 1) and as_json.returncode in (0, 1), text.stderr.decode()
    report = _strict(as_json.stdout.decode())  # strict JSON: no NaN / Infinity
    errors = report["facts"]["probe"]["errors"]
    assert any("malformed" in str(v) for v in errors.values()), errors
    if case in ("nan-infinity", "huge-float"):
        gpu = report["facts"]["gpus"][0]
        assert gpu["name"] == "NVIDIA H100 80GB HBM3"  # the valid rest is kept
        assert gpu["memory_mib"] is None or math.isfinite(gpu["memory_mib"])


def test_sh_probe_reply_probe_is_a_string(tmp_path: Path) -> None:
    """python3 missing on the target; the sh fallback answers `{"probe": "x"}`."""
    prefix = fake_target(tmp_path, "shx", stderr="python3: not found\n", exit=127,
                         sh={"stdout": framed({"probe": "x"})})
    proc = fastpath("doctor", "--on", " ".join(prefix), "--timeout", "30", "--json")
    assert b"Traceback" not in proc.stderr, proc.stderr.decode()
    report = _strict(proc.stdout.decode())
    assert "malformed probe" in json.dumps(report["facts"]["probe"]["errors"])
