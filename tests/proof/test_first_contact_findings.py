"""A new user's first contact with verify / bench / capture, on the real CLI (tiny models, real
files, fake environments): each refusal is one line before any work, a finished result is never
replaced silently, an interrupted capture says what it kept and how to continue, and no raw
`None` reaches the user.

What each test saw before its fix:
- `verify --packed` with fla-core installed on a CPU: "fla is not installed" (verify hides FLA
  from transformers while the model is built, and the check ran inside that window).
- `verify --liger` under TRITON_INTERPRET=1: built the model, then "reference path: forward raised
  InterpreterError" (exit 1).
- `bench --configs fla,fla+dao` on a CPU: exit 0, an empty bench.png, "torch None, triton None".
- `bench --out /proc/nope`, `verify --save /proc/x/y.json`: the whole run, then a FileNotFoundError
  traceback (exit 1); root passes the permission check the path guard made.
- a second `bench --out DIR` / `verify --save FILE`: the earlier results replaced without a word.
- capture interrupted before its first row: "every row file in --out is complete", no count, and a
  --resume line without the TRITON_INTERPRET=1 the run needed (so the resume refused to run).
- Ctrl-C while the target was built: ignored until the C call under way returned (17 s for three
  `normal_` calls over 600M floats), then a plain KeyboardInterrupt.
- a `--repeats 1` chart: bars with no word that each is a single sample.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from repo_paths import ROOT
from test_verify_cli_first_contact import TINY_QWEN35
from tiny_configs import LFM2_4L as TINY_LFM2

# the sources the subprocesses run (point it at an older tree to see a test fail before its fix)
SRC = Path(os.environ.get("FASTPATH_HOSTILE_SRC") or ROOT / "src")
RAW_NONE = re.compile(r"\bNone\b")


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SRC), extra.pop("PYTHONPATH", None)) if p)
    env.pop("FORCE_COLOR", None)
    env.update(extra)
    return env


def _fastpath(*args: str, timeout: float = 600, cwd: Path | None = None, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fastpath", *args], capture_output=True, text=True,
                          timeout=timeout, env=_env(**env), cwd=cwd)


def _one_line(proc: subprocess.CompletedProcess) -> str:
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert "Traceback" not in proc.stderr and len(lines) == 1, proc.stderr[-3000:]
    return lines[0]


def _write(tmp_path: Path, config: dict, name: str) -> str:
    path = tmp_path / name
    path.write_text(json.dumps(config))
    return str(path)


# --- 1. verify --packed names the device, not a missing package ---------------------------------


def _fake_fla(site: Path) -> Path:
    """An installed fla-core as far as finding it goes (its kernels are never reached on a CPU)."""
    ops = site / "fla" / "ops" / "gated_delta_rule"
    ops.mkdir(parents=True)
    (site / "fla" / "__init__.py").write_text("__version__ = '0.6.0'\n")
    (site / "fla" / "ops" / "__init__.py").write_text("")
    (ops / "__init__.py").write_text("def chunk_gated_delta_rule(*a, **k):\n    raise RuntimeError('CUDA only')\n"
                                     "fused_recurrent_gated_delta_rule = chunk_gated_delta_rule\n")
    return site


def test_verify_packed_on_a_cpu_with_fla_installed_names_the_device(tmp_path):
    site = _fake_fla(tmp_path / "site")
    model = _write(tmp_path, TINY_QWEN35, "qwen.json")
    proc = _fastpath("verify", model, "--packed", "--seq-len", "16", "--device", "cpu", PYTHONPATH=str(site))
    line = _one_line(proc)
    assert proc.returncode == 3, proc.stderr  # NOT VERIFIED
    assert line.startswith("fastpath verify: NOT VERIFIED: --packed on qwen3_5_text")
    assert "CUDA tensors only (device here: cpu; fla-core is installed)" in line, line
    assert "not installed" not in line


def test_verify_packed_without_fla_still_says_the_device_first(tmp_path):
    import importlib.util

    if importlib.util.find_spec("fla") is not None:
        pytest.skip("fla is installed in this Python")
    proc = _fastpath("verify", _write(tmp_path, TINY_QWEN35, "qwen.json"), "--packed", "--seq-len", "16",
                     "--device", "cpu")
    assert proc.returncode == 3
    assert "CUDA tensors only (device here: cpu; fla-core is not installed either)" in _one_line(proc)


# --- 2. verify --liger under the interpreter: refused before any work -----------------------------


def test_verify_liger_under_the_interpreter_is_one_line_before_any_work(tmp_path):
    pytest.importorskip("liger_kernel")
    proc = _fastpath("verify", _write(tmp_path, TINY_QWEN35, "qwen.json"), "--liger", "--seq-len", "8",
                     TRITON_INTERPRET="1")
    line = _one_line(proc)  # no "sizing the job", no "building the model"
    assert proc.returncode == 2
    assert line.startswith("fastpath verify: error: --liger needs a CUDA device (here: cpu)"), line
    assert "TRITON_INTERPRET=1" in line


# --- 3. bench with nothing to measure ------------------------------------------------------------


def test_bench_with_every_configuration_skipped_is_one_line_and_writes_nothing(tmp_path):
    out = tmp_path / "out"
    proc = _fastpath("bench", _write(tmp_path, TINY_LFM2, "lfm2.json"), "--device", "cpu", "--configs",
                     "fla,fla+dao", "--out", str(out))
    line = _one_line(proc)
    assert proc.returncode == 2
    assert "every configuration would be skipped" in line and "fla: needs a CUDA device" in line, line
    assert not out.exists()  # no empty chart, no table of skips


# --- 4. output paths: refused before work, never replaced silently --------------------------------


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux /proc (a folder nobody can create in)")
@pytest.mark.parametrize("command", ["bench", "verify", "capture"])
def test_an_output_path_that_cannot_be_created_is_one_line_exit_2_before_work(command, tmp_path):
    model = _write(tmp_path, TINY_LFM2, "lfm2.json")
    data = tmp_path / "rows.jsonl"
    data.write_text(json.dumps({"input_ids": list(range(16)), "loss_mask": [1] * 16}) + "\n")
    args = {"bench": ["bench", model, "--device", "cpu", "--configs", "reference", "--out", "/proc/nope"],
            "verify": ["verify", model, "--device", "cpu", "--save", "/proc/x/y.json"],
            "capture": ["capture", model, str(data), "--device", "cpu", "--out", "/proc/nope/capture",
                        "--allow-slow", "--quiet"]}[command]
    proc = _fastpath(*args)
    line = _one_line(proc)  # nothing sized, built or run
    assert proc.returncode == 2, proc.stderr
    assert line.startswith(f"fastpath {command}: error: cannot create --"), line
    assert "/proc/" in line


def test_bench_never_replaces_an_earlier_run_silently(tmp_path):
    model = _write(tmp_path, TINY_LFM2, "lfm2.json")
    earlier = tmp_path / "mine"
    earlier.mkdir()
    (earlier / "bench.json").write_text("{}")
    common = ["bench", model, "--device", "cpu", "--configs", "reference", "--seq-len", "8", "--decode-tokens", "2",
              "--phases", "prefill", "--repeats", "1", "--warmup", "0"]
    proc = _fastpath(*common, "--out", str(earlier))
    assert proc.returncode == 2 and "--force" in _one_line(proc) and "bench.json" in _one_line(proc)
    assert (earlier / "bench.json").read_text() == "{}"
    # the default folder moves on to the next free name, and says so
    (tmp_path / "fastpath-bench").mkdir()
    (tmp_path / "fastpath-bench" / "bench.md").write_text("earlier")
    proc = _fastpath(*common, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (tmp_path / "fastpath-bench" / "bench.md").read_text() == "earlier"
    assert json.loads((tmp_path / "fastpath-bench-2" / "bench.json").read_text())["configs"][0]["config"] == "reference"
    assert "this one goes to fastpath-bench-2/" in proc.stderr
    proc = _fastpath(*common, "--out", str(earlier), "--force")
    assert proc.returncode == 0 and json.loads((earlier / "bench.json").read_text())["schema"]


def test_verify_save_never_replaces_an_earlier_result_silently(tmp_path):
    model = _write(tmp_path, TINY_LFM2, "lfm2.json")
    common = ["verify", model, "--device", "cpu", "--seq-len", "8", "--batch", "1", "--decode-tokens", "0"]
    target = tmp_path / "result.json"
    target.write_text("earlier")
    proc = _fastpath(*common, "--save", str(target))
    assert proc.returncode == 2 and "--force" in _one_line(proc)
    assert target.read_text() == "earlier"
    folder = tmp_path / "results"
    folder.mkdir()
    (folder / "fastpath-verify.json").write_text("earlier")
    proc = _fastpath(*common, "--save", str(folder))
    assert proc.returncode in (0, 3, 4), proc.stderr[-2000:]
    assert (folder / "fastpath-verify.json").read_text() == "earlier"
    assert json.loads((folder / "fastpath-verify-2.json").read_text())["model"]["class"] == "Lfm2ForCausalLM"
    proc = _fastpath(*common, "--save", str(target), "--force")
    assert proc.returncode in (0, 3, 4) and json.loads(target.read_text())["model"]["layers"] == 4


@pytest.mark.parametrize("command,flag", [("bench", "--out"), ("verify", "--save"), ("bench", "--force"),
                                          ("verify", "--force")])
def test_help_shows_where_results_go_and_the_force_switch(command, flag):
    proc = _fastpath(command, "--help", COLUMNS="200")  # argparse breaks lines at hyphens
    text = " ".join(proc.stdout.split())
    assert proc.returncode == 0 and flag in text
    if flag == "--out":
        assert "default: fastpath-bench, or the next free fastpath-bench-N" in text
    elif flag == "--save":
        assert "default: not saved" in text and "fastpath-verify-N.json" in text


# --- 5. capture: interrupted before a row, the first line, the environment to resume -------------


def _rows(tmp_path: Path, n: int) -> Path:
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps({"input_ids": [(7 * i + j) % 500 for j in range(16)],
                                        "loss_mask": [0] * 8 + [1] * 8}) + "\n" for i in range(n)))
    return data


def test_capture_interrupted_before_any_row_says_0_of_n_and_resumes_with_its_environment(tmp_path):
    # wide enough that building it takes a while (a 2M-entry embedding), small enough for any CI box
    model = _write(tmp_path, {**TINY_LFM2, "hidden_size": 256, "vocab_size": 8192, "tie_word_embeddings": False},
                   "lfm2.json")
    data = _rows(tmp_path, 6)
    out = tmp_path / "out"
    argv = [sys.executable, "-m", "fastpath", "capture", model, str(data), "--out", str(out), "--dtype", "fp32",
            "--device", "cpu", "--layers", "1,2,3", "--batch-tokens", "16", "--check-every", "0"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=_env(TRITON_INTERPRET="1"))
    assert proc.stderr is not None
    seen = [proc.stderr.readline()]
    # the first line comes before the slow imports and says what is happening
    assert seen[0].startswith("fastpath capture: starting: importing torch"), seen
    while "loading" not in seen[-1] and proc.poll() is None:
        seen.append(proc.stderr.readline())
    assert "reading" in "".join(seen) and "6 rows; loading" in seen[-1], seen
    proc.send_signal(signal.SIGINT)  # while the model is built: nothing written yet
    _stdout, rest = proc.communicate(timeout=120)
    err = "".join(seen) + rest
    assert proc.returncode == 130, err
    said = err[err.index("fastpath capture: interrupted"):]
    assert "0 of 6 rows in --out" in said and "nothing captured yet" in said, said
    resume = said.strip().splitlines()[-1].strip()
    prefix, command = resume.split("fastpath capture ", 1)
    assert "TRITON_INTERPRET=1" in prefix.split(), resume
    assert command.endswith(" --resume") and f"--out {out}" in command
    assert RAW_NONE.search(err) is None, err
    # the line continues the capture as it stands, environment included
    done = subprocess.run(["bash", "-c", resume.replace("fastpath capture", f"{sys.executable} -m fastpath capture", 1)],
                          capture_output=True, text=True, timeout=600, env=_env())
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads((out / "capture_summary.json").read_text())["rows"] == 6


GUARD = """
import os, signal, sys, threading, time
import torch
from fastpath.capture.interrupts import ExitAtFirstInterrupt
t = torch.empty(50_000_000)
def ctrl_c():
    time.sleep(0.5)
    os.kill(os.getpid(), signal.SIGINT)
threading.Thread(target=ctrl_c, daemon=True).start()
with ExitAtFirstInterrupt(lambda: "kept: nothing written yet", active=sys.argv[1] == "1"):
    try:
        for _ in range(int(sys.argv[2])):
            t.normal_()  # one C call that Python's own SIGINT handling waits for
        print("all calls finished", flush=True)
    except KeyboardInterrupt:
        print("KeyboardInterrupt", flush=True)
"""


def test_the_first_ctrl_c_during_setup_stops_at_once_and_says_what_was_kept():
    proc = subprocess.run([sys.executable, "-c", GUARD, "1", "400"], capture_output=True, text=True, timeout=600,
                          env=_env())
    assert proc.returncode == 130, proc.stdout + proc.stderr
    assert proc.stderr.strip() == "kept: nothing written yet"
    assert "all calls finished" not in proc.stdout and "KeyboardInterrupt" not in proc.stdout
    # without the guard (the library API) Ctrl-C is a KeyboardInterrupt, as Python makes it
    # (400 calls: the loop is still running when the signal lands, however fast or loaded the host)
    proc = subprocess.run([sys.executable, "-c", GUARD, "0", "400"], capture_output=True, text=True, timeout=600,
                          env=_env())
    assert proc.stdout.strip() == "KeyboardInterrupt", proc.stdout + proc.stderr


# --- 6 and 8. no raw None; a one-repeat chart says so -------------------------------------------


def _png_text(path: Path) -> dict[str, str]:
    """tEXt / iTXt chunks of a PNG (what matplotlib's `metadata=` writes)."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, found = 8, {}
    while pos < len(data):
        length = int.from_bytes(data[pos:pos + 4], "big")
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + length]
        if kind == b"tEXt":
            key, value = body.split(b"\0", 1)
            found[key.decode("latin-1")] = value.decode("latin-1")
        elif kind == b"iTXt":
            key, rest = body.split(b"\0", 1)
            compressed, rest = rest[0], rest[2:]
            _lang, _translated, value = rest.split(b"\0", 2)
            found[key.decode()] = (zlib.decompress(value) if compressed else value).decode()
        pos += 12 + length
    return found


def test_a_one_repeat_bench_says_so_and_prints_no_raw_none(tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "out"
    proc = _fastpath("bench", _write(tmp_path, TINY_LFM2, "lfm2.json"), "--device", "cpu", "--configs",
                     "reference,fla", "--seq-len", "8", "--decode-tokens", "2", "--repeats", "1", "--warmup", "0",
                     "--out", str(out), COLUMNS="80")
    assert proc.returncode == 0, proc.stderr[-3000:]
    caption = _png_text(out / "bench.png")["Description"]
    assert "one timed run per phase" in caption and "no error bars" in caption, caption
    md = (out / "bench.md").read_text()
    assert "--repeats 1: a single sample, no spread measured" in md
    assert "CUDA none" in md  # a CPU run: said, not "CUDA None"
    for text in (proc.stdout, proc.stderr, md):
        assert RAW_NONE.search(text) is None, text


def test_a_repeated_bench_chart_names_its_whiskers(tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "out"
    proc = _fastpath("bench", _write(tmp_path, TINY_LFM2, "lfm2.json"), "--device", "cpu", "--configs",
                     "reference", "--seq-len", "8", "--phases", "prefill", "--repeats", "3", "--warmup", "0",
                     "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    caption = _png_text(out / "bench.png")["Description"]
    assert "median of 3 timed runs" in caption and "whiskers: fastest and slowest run" in caption


def test_verify_prints_no_raw_none(tmp_path):
    save = tmp_path / "r.json"
    proc = _fastpath("verify", _write(tmp_path, TINY_QWEN35, "qwen.json"), "--device", "cpu", "--seq-len", "8",
                     "--batch", "1", "--decode-tokens", "2", "--backward", "--save", str(save))
    assert proc.returncode in (0, 3, 4), proc.stderr[-3000:]
    for text in (proc.stdout, proc.stderr):
        assert RAW_NONE.search(text) is None, text


def test_capture_prints_no_raw_none(tmp_path):
    proc = _fastpath("capture", _write(tmp_path, TINY_LFM2, "lfm2.json"), str(_rows(tmp_path, 3)), "--out",
                     str(tmp_path / "out"), "--dtype", "fp32", "--device", "cpu", "--layers", "1,2,3",
                     "--batch-tokens", "16", "--allow-slow", "--reference-path")
    assert proc.returncode == 0, proc.stderr[-3000:]
    for text in (proc.stdout, proc.stderr):
        assert RAW_NONE.search(text) is None, text


def test_the_first_line_comes_before_the_imports_and_options_are_refused_before_it(tmp_path):
    """A DATA problem is found after the imports and the config: the line saying what is being
    done comes first. An option alone is refused before anything is said (one line)."""
    model = _write(tmp_path, TINY_LFM2, "lfm2.json")
    data = tmp_path / "rows.jsonl"
    data.write_text('{"input_ids": [1, 2, 3]}\nnot json\n')
    proc = _fastpath("capture", model, str(data), "--out", str(tmp_path / "out"), "--device", "cpu", "--allow-slow",
                     "--layers", "1,2,3")
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert lines[0].startswith("fastpath capture: starting: importing torch"), lines
    assert lines[-1].startswith("fastpath capture: error: ") and "rows.jsonl:2: not JSON" in lines[-1]
    proc = _fastpath("capture", model, str(data), "--out", str(tmp_path / "out"), "--device", "cpu",
                     "--reference-path")
    assert proc.returncode == 2 and "needs --allow-slow" in _one_line(proc)
