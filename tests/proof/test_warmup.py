"""`fastpath warmup`: its refusals and bad input are one line with their exit status before any
work; its flow (build, enable(), the phases) runs for real on a tiny model under the Triton
interpreter; the cache counter reads a Triton cache laid out as Triton writes it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import repo_paths
from tiny_configs import QWEN35_2L as TINY_QWEN35

from fastpath.proof.warmup import (
    NO_CUDA,
    CacheCount,
    NothingToCompile,
    WarmupSettings,
    cache_dir,
    check_cache_dir,
    count_cache,
    refuse_here,
)
from fastpath.shared.errors import UsageError

SRC = str(repo_paths.SRC)


def _cli(argv: list[str], env: dict[str, str] | None = None, columns: int = 200) -> subprocess.CompletedProcess:
    full = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (SRC, os.environ.get("PYTHONPATH")) if p),
            "COLUMNS": str(columns), **(env or {})}
    return subprocess.run([sys.executable, "-m", "fastpath", "warmup", *argv], capture_output=True, text=True,
                          env=full, timeout=300)


def _one_error_line(proc: subprocess.CompletedProcess) -> str:
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    return lines[0]


def test_help_fits_80_columns_and_documents_every_option_and_exit_status():
    proc = _cli(["--help"], columns=80)
    assert proc.returncode == 0
    lines = proc.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80, [ln for ln in lines if len(ln) > 80]
    for word in ("--layers", "--batch", "--seq", "--dtype", "--train", "--decode", "--save-decisions",
                 "TRITON_CACHE_DIR",
                 "TRITON_CACHE_AUTOTUNING", "exit status", "130", "no CUDA device"):
        assert word in proc.stdout, word


def test_no_cuda_device_is_exit_3_with_the_one_line():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this host has a CUDA device")
    proc = _cli(["qwen3.5-27b"], env={"TRITON_INTERPRET": "0"})
    assert proc.returncode == 3
    assert _one_error_line(proc) == f"fastpath warmup: error: {NO_CUDA}"


def test_the_interpreter_is_refused_nothing_compiles():
    proc = _cli(["qwen3.5-27b"], env={"TRITON_INTERPRET": "1"})
    assert proc.returncode == 3
    line = _one_error_line(proc)
    assert "TRITON_INTERPRET=1" in line and "compiles nothing" in line


def test_cpu_device_is_refused():
    with pytest.raises(NothingToCompile, match="no CUDA device"):
        refuse_here("cpu", environ={})


def test_unknown_preset_is_exit_2_naming_the_known_ones():
    proc = _cli(["qwen9-000b"])
    assert proc.returncode == 2
    line = _one_error_line(proc)
    assert "unknown preset 'qwen9-000b'" in line and "qwen3.5-27b" in line


@pytest.mark.parametrize("flag", [["--batch", "0"], ["--seq", "1"], ["--layers", "0"]])
def test_bad_numbers_are_exit_2(flag):
    proc = _cli(["qwen3.5-27b", *flag])
    assert proc.returncode == 2
    assert flag[0] in _one_error_line(proc)


def test_an_unwritable_cache_dir_is_exit_2_before_any_import(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    proc = _cli(["qwen3.5-27b"], env={"TRITON_CACHE_DIR": str(blocker / "cache")})
    assert proc.returncode == 2
    line = _one_error_line(proc)
    assert "Triton cache dir" in line and str(blocker / "cache") in line and "TRITON_CACHE_DIR" in line
    with pytest.raises(UsageError, match="not writable"):
        check_cache_dir(blocker / "cache")


def test_cache_dir_follows_tritons_rule(tmp_path):
    assert cache_dir({"TRITON_CACHE_DIR": str(tmp_path / "c")}) == (tmp_path / "c", "TRITON_CACHE_DIR")
    assert cache_dir({"TRITON_HOME": str(tmp_path)})[0] == tmp_path / ".triton" / "cache"
    path, why = cache_dir({})
    assert path == Path("~/.triton/cache").expanduser() and "not set" in why
    check_cache_dir(tmp_path / "new" / "cache")  # made when missing
    assert (tmp_path / "new" / "cache").is_dir() and not list((tmp_path / "new" / "cache").iterdir())


def test_count_cache_tells_kernels_from_autotune_decisions(tmp_path):
    # Triton's FileCacheManager: one folder per key; a kernel folder holds NAME.json (+ binaries and
    # __grp__NAME.json), an autotune decision folder NAME.autotune.json.
    for i in range(3):
        folder = tmp_path / f"k{i}"
        folder.mkdir()
        (folder / "kern.json").write_text("{}")
        (folder / "kern.cubin").write_bytes(b"\0")
        (folder / "__grp__kern.json").write_text("{}")
    decision = tmp_path / "a0"
    decision.mkdir()
    (decision / "kern.autotune.json").write_text(json.dumps({"key": [1], "configs_timings": []}))
    (tmp_path / "stray.txt").write_text("")
    assert count_cache(tmp_path) == CacheCount(3, 1)
    assert count_cache(tmp_path / "missing") == CacheCount(0, 0)
    assert CacheCount(5, 2).minus(CacheCount(3, 1)) == CacheCount(2, 1)


@pytest.mark.parametrize("train, decode", [(False, False), (True, True)])
def test_warm_model_runs_each_phase_on_a_tiny_model(tmp_path, monkeypatch, train, decode):
    """The flow the command runs on a GPU, here on the CPU under the interpreter: every phase
    runs, is timed, and enable() is undone afterwards."""
    pytest.importorskip("transformers")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    from fastpath.kernels.counters import CALLS
    from fastpath.proof.warmup import warm_model
    from fastpath.routing import engine as routes

    source = tmp_path / "tiny.json"
    source.write_text(json.dumps(TINY_QWEN35))
    said: list[str] = []
    before = dict(CALLS)
    decisions = tmp_path / "decisions.json"
    result = warm_model(WarmupSettings(str(source), batch=1, seq_len=8, dtype="fp32", device="cpu", train=train,
                                       decode=decode, save_decisions=str(decisions)), said.append)
    assert list(result.phases) == (["import", "enable", "build", "prefill"] + (["train"] if train else [])
                                   + (["decode"] if decode else []))
    assert all(v >= 0 for v in result.phases.values())
    assert result.layers == 2  # the fewest that keep both layer types
    assert any("forward+backward" in s for s in said) == train
    assert sum(CALLS.values()) > sum(before.values())  # fastpath's kernels ran (the interpreter)
    assert not routes.is_enabled()
    doc = json.loads(decisions.read_text())  # the interpreter tunes nothing: an empty, valid file
    assert doc["schema"] == "fastpath.autotune-decisions/1" and doc["device"]["capability"] == []
    assert result.decisions == sum(len(rows) for rows in doc["kernels"].values())


def test_a_bad_save_decisions_path_is_exit_2_before_any_work(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    proc = _cli(["qwen3.5-27b", "--save-decisions", str(blocker / "d.json")])
    assert proc.returncode == 2
    assert "--save-decisions" in _one_error_line(proc)


def test_fastpaths_autotuned_kernels_keep_their_decisions_in_tritons_cache():
    """A compiled device (no interpreter): every autotuner of fastpath's kernels asks Triton to
    keep its timings on disk where this Triton can, so a warmed cache skips the timing too."""
    pytest.importorskip("triton")
    code = (
        "import importlib, inspect, json, pkgutil, triton\n"
        "from triton.runtime.autotuner import Autotuner\n"
        "import fastpath.kernels as k\n"
        "found = []\n"
        "for info in pkgutil.walk_packages(k.__path__, 'fastpath.kernels.'):\n"
        "    mod = importlib.import_module(info.name)\n"
        "    found += [(info.name + '.' + n, v.cache_results) for n, v in vars(mod).items() if isinstance(v, Autotuner)]\n"
        "print(json.dumps({'supported': 'cache_results' in inspect.signature(triton.autotune).parameters,\n"
        "                  'found': found}))\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "TRITON_CACHE_AUTOTUNING")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (SRC, os.environ.get("PYTHONPATH")) if p)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads(proc.stdout.strip().splitlines()[-1])
    assert doc["found"], "no autotuned kernel found: the walk is broken"
    assert all(keep == doc["supported"] for _name, keep in doc["found"]), doc["found"]


GPU_QWEN35 = {
    "model_type": "qwen3_5_text", "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 4,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64, "linear_num_key_heads": 2,
    "linear_num_value_heads": 4, "linear_key_head_dim": 64, "linear_value_head_dim": 64,
    "linear_conv_kernel_dim": 4, "vocab_size": 1024,
}


@pytest.mark.gpu
def test_warmup_on_cuda_fills_an_empty_cache_and_a_second_run_compiles_nothing(tmp_path):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    source = tmp_path / "qwen.json"
    source.write_text(json.dumps(GPU_QWEN35))
    cache = tmp_path / "cache"
    decisions = tmp_path / "decisions.json"
    env = {"TRITON_CACHE_DIR": str(cache), "TRITON_INTERPRET": "0", "FASTPATH_AUTOTUNE_DECISIONS": "off"}
    argv = [str(source), "--train", "--batch", "1", "--seq", "512", "--save-decisions", str(decisions)]
    first = _cli(argv, env=env)
    assert first.returncode == 0, first.stderr[-3000:]
    after_first = count_cache(cache)
    assert after_first.kernels > 0  # fastpath's kernels (and FLA's, where installed) compiled into it
    assert f"Triton cache: {cache} (TRITON_CACHE_DIR)" in first.stdout
    assert "TRITON_CACHE_DIR" in first.stdout and "forward+backward" in first.stderr
    second = _cli(argv, env=env)
    assert second.returncode == 0, second.stderr[-3000:]
    assert count_cache(cache) == after_first  # everything came from the cache: nothing compiled, nothing timed
    doc = json.loads(decisions.read_text())
    assert doc["device"]["capability"] == list(torch.cuda.get_device_capability())
    if any(name.startswith("fla.") for name in doc["kernels"]):
        # a fresh process on an EMPTY cache, FLA's autotuners handed the decisions: it times nothing
        seeded = tmp_path / "seeded-cache"
        code = ("import json, torch\n"
                "from fastpath.proof.warmup import WarmupSettings, warm_model\n"
                f"s = WarmupSettings({str(source)!r}, batch=1, seq_len=512, dtype='bf16', device='cuda', train=True)\n"
                "import fastpath.routing.engine as routes\n"
                "report = routes.enable(warn=False)  # seeds FASTPATH_AUTOTUNE_DECISIONS\n"
                "print([n for n in report.notes if n.startswith('autotune decisions')])\n"
                "warm_model(s, lambda _m: None)\n")
        full = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (SRC, os.environ.get("PYTHONPATH")) if p),
                "TRITON_CACHE_DIR": str(seeded), "FASTPATH_AUTOTUNE_DECISIONS": str(decisions),
                "TRITON_INTERPRET": "0"}
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full, timeout=900)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "autotune decisions:" in proc.stdout and " 0 applied" not in proc.stdout
        now = count_cache(seeded)
        assert now.autotune < after_first.autotune and now.kernels < after_first.kernels
