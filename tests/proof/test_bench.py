"""fastpath bench end to end on CPU at tiny size: each configuration in its own worker process,
then JSON, markdown table and PNG chart checked for content (never for timings)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("matplotlib")

from tiny_configs import QWEN35_2L as TINY_QWEN35

from fastpath.proof.bench_outputs import compare_docs, load_previous, markdown, speedups
from fastpath.proof.bench_spec import SCHEMA
from fastpath.shared.errors import UsageError

PHASES = ("prefill", "train", "decode")


@pytest.fixture(scope="module")
def bench_run(tmp_path_factory) -> tuple[int, dict, Path, str]:
    """One real bench run (both CPU configurations), shared by the content checks below."""
    from fastpath.cli import main

    tmp = tmp_path_factory.mktemp("bench")
    source = tmp / "tiny.json"
    source.write_text(json.dumps(TINY_QWEN35))
    # A previous run to compare against: the same schema, with made-up older numbers.
    previous = tmp / "previous.json"
    previous.write_text(json.dumps({
        "schema": SCHEMA, "settings": {"phases": list(PHASES)},
        "configs": [{"config": "fastpath", "phases": {"prefill": {"tokens_per_s": 1e-3}}}],
    }))
    out = tmp / "out"
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = main(["bench", str(source), "--device", "cpu", "--seq-len", "16", "--batch", "1",
                     "--decode-tokens", "2", "--repeats", "2", "--warmup", "1",
                     "--out", str(out), "--compare", str(previous), "--json"])
    return code, json.loads(buf.getvalue()), out, str(source)


def test_bench_json_has_every_config_and_phase(bench_run):
    code, doc, out, _source = bench_run
    assert code == 0
    assert doc["schema"] == SCHEMA
    assert json.loads((out / "bench.json").read_text()) == json.loads(json.dumps(doc))  # same document on disk
    assert doc["settings"]["seq_len"] == 16 and doc["settings"]["device"] == "cpu"
    by_name = {r["config"]: r for r in doc["configs"]}
    assert list(by_name) == ["reference", "fastpath", "fla", "fla+dao"]
    assert "CUDA" in by_name["fla"]["skipped"] and "CUDA" in by_name["fla+dao"]["skipped"]  # GPU-only peers
    for name in ("reference", "fastpath"):
        result = by_name[name]
        assert result["model"]["class"] == "Qwen3_5ForCausalLM" and result["model"]["layers"] == 2
        assert result["environment"]["torch"]
        for phase in PHASES:
            entry = result["phases"][phase]
            assert "error" not in entry, entry
            assert len(entry["samples_s"]) == 2 and entry["tokens_per_s"] > 0
            assert entry["peak_mem_mib"] is None  # CPU: no CUDA memory counter
        assert result["phases"]["decode"]["tokens_per_call"] == 2
        assert result["phases"]["prefill"]["tokens_per_call"] == 16
    # The fastpath worker really ran fastpath's kernels; the reference worker did not.
    calls = by_name["fastpath"]["kernel_calls"]
    assert calls.get("fwd:triton", 0) > 0 and calls.get("bwd:triton", 0) > 0 and calls.get("update:triton", 0) > 0
    assert not by_name["reference"]["kernel_calls"]
    # Under the Triton interpreter the kernels are emulated: timings, but no speed-up claimed.
    assert by_name["fastpath"]["implementation"] == "fastpath Triton (interpreter)"
    assert by_name["reference"]["implementation"] == "torch"
    assert all("not timing data" in by_name["fastpath"]["phases"][p]["not_timing_data"] for p in PHASES)
    assert "fastpath" not in doc["speedup"]
    assert doc["sizing"]["parameters"] == by_name["fastpath"]["model"]["parameters"]
    # --compare: the change against the made-up previous prefill number
    changes = doc["compare"]["changes"]
    assert [(c["config"], c["phase"]) for c in changes] == [("fastpath", "prefill")]
    assert changes[0]["change"] > 0


def test_bench_markdown_table_lists_configs_phases_and_change(bench_run):
    _code, _doc, out, source = bench_run
    text = (out / "bench.md").read_text()
    assert f"fastpath bench: {source}" in text
    header = next(line for line in text.splitlines() if line.startswith("| config |"))
    assert "prefill tok/s" in header and "forward+backward tok/s" in header and "decode tok/s" in header
    rows = [line for line in text.splitlines() if line.startswith("| ") and not line.startswith("| config")]
    assert any(r.startswith("| reference (") for r in rows)
    fast_row = next(r for r in rows if r.startswith("| fastpath ("))
    assert fast_row.count("(interpreter: not timing data)") == 3 and "x)" not in fast_row
    assert "fla+dao: skipped" in text
    assert "### change vs previous run" in text and "| fastpath | prefill |" in text
    assert "fastpath kernel calls:" in text
    assert "- fastpath routes: causal_conv1d_fn -> fastpath-triton" in text
    assert "- reference routes: causal_conv1d_fn -> torch fallback" in text


def test_bench_chart_is_a_png_with_one_panel_per_phase(bench_run):
    import matplotlib.image

    _code, _doc, out, _source = bench_run
    png = out / "bench.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    image = matplotlib.image.imread(png)
    height, width = image.shape[:2]
    assert width > 2 * height  # three panels side by side
    assert image.std() > 0.01  # not a blank canvas


def test_speedups_and_compare_arithmetic():
    doc = {"settings": {"phases": ["prefill"]}, "configs": [
        {"config": "reference", "phases": {"prefill": {"tokens_per_s": 100.0}}},
        {"config": "fastpath", "phases": {"prefill": {"tokens_per_s": 250.0}}},
        {"config": "fla+dao", "skipped": "not installed"},
    ], "created": "now"}
    assert speedups(doc) == {"reference": {"prefill": 1.0}, "fastpath": {"prefill": 2.5}}
    old = {"settings": {"phases": ["prefill"]}, "configs": [
        {"config": "fastpath", "phases": {"prefill": {"tokens_per_s": 200.0}}}]}
    assert compare_docs(doc, old) == [{"config": "fastpath", "phase": "prefill", "old": 200.0, "new": 250.0,
                                       "change": pytest.approx(0.25)}]
    doc.update(settings={**doc["settings"], "source": "m", "layers": None, "dtype": "bf16", "batch": 1,
                         "seq_len": 8, "decode_tokens": 1, "repeats": 1, "warmup": 0, "device": "cuda"})
    doc["speedup"] = speedups(doc)
    text = markdown(doc, compare_docs(doc, old))
    assert "250 (2.50x)" in text and "+25.0%" in text and "CUDA events" in text


def test_load_previous_rejects_other_json(tmp_path):
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"schema": "something/else"}))
    with pytest.raises(UsageError, match="not a fastpath bench JSON"):
        load_previous(str(other))
    with pytest.raises(UsageError, match="cannot read"):
        load_previous(str(tmp_path / "absent.json"))


@pytest.mark.parametrize(
    "extra, message",
    [
        (["no-such-preset"], "unknown preset"),
        (["qwen3.5-27b", "--layers", "0"], "--layers"),
        (["lfm2", "--configs", "reference,turbo"], "unknown config"),
        (["lfm2", "--seq-len", "1"], "--seq-len"),
        (["lfm2", "--phases", "decode,decode-graphs"], "unknown phase 'decode-graphs'"),
        (["lfm2", "--phases", "decode-graph", "--decode-tokens", "0"], "--decode-tokens"),
    ],
)
def test_cli_bench_bad_input_is_one_line_and_exit_2(extra, message, tmp_path, capsys):
    from fastpath.cli import main

    code = main(["bench", *extra, "--device", "cpu", "--out", str(tmp_path / "o")])
    err = [ln for ln in capsys.readouterr().err.strip().splitlines() if "error" in ln]
    assert code == 2
    assert len(err) == 1 and err[0].startswith("fastpath bench: error:") and message in err[0]
    assert not (tmp_path / "o").exists()


def test_bench_without_matplotlib_or_the_interpreter_loses_nothing_and_claims_no_speedup(tmp_path):
    """Two first-hour traps in one real run (CPU, no TRITON_INTERPRET, matplotlib made
    unimportable): fastpath's kernels run their torch reference here, so bench says "same
    implementation as reference" instead of a speed-up of torch over torch; and without matplotlib
    it still writes bench.json and bench.md, prints the table and says in one line why no PNG."""
    import os
    import subprocess
    import sys

    source = tmp_path / "tiny.json"
    source.write_text(json.dumps(TINY_QWEN35))
    out = tmp_path / "out"
    argv = ["bench", str(source), "--device", "cpu", "--seq-len", "8", "--phases", "prefill", "--repeats", "1",
            "--warmup", "0", "--configs", "reference,fastpath", "--out", str(out)]
    code = ("import sys\nsys.modules['matplotlib'] = None\n"
            f"from fastpath.cli import main\nsys.exit(main({argv!r}))\n")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["COLUMNS"] = "400"  # wide enough for the table (narrower terminals get key: value rows)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "| config |" in proc.stdout and "| fastpath (" in proc.stdout  # the table, printed
    assert sorted(p.name for p in out.iterdir()) == ["bench.json", "bench.md"]
    from fastpath.shared.extras import install_line

    assert (f"fastpath bench: no bench.png: matplotlib is not installed; run: {install_line('bench')}"
            in proc.stderr.splitlines())
    assert "Traceback" not in proc.stderr
    doc = json.loads((out / "bench.json").read_text())
    by_name = {r["config"]: r for r in doc["configs"]}
    assert by_name["fastpath"]["implementation"] == "torch"
    calls = by_name["fastpath"]["kernel_calls"]
    assert calls and all(k.endswith(":reference") for k in calls)
    assert "fastpath" not in doc["speedup"]
    text = (out / "bench.md").read_text()
    assert "(same implementation as reference)" in text
    assert "ran the same torch code as reference" in text
    assert "bench: reference: prefill" in proc.stderr and "estimate:" in proc.stderr


def test_decode_graph_phase_on_cpu_says_needs_cuda_in_table_and_json(tmp_path):
    """A real run selecting the CUDA-graph decode on a CPU: the phase is accepted, its entry and
    its table cell carry the reason instead of a number, the eager decode beside it still runs,
    nothing claims a speed-up for it, and the exit code is that of a run with skipped parts (0)."""
    import contextlib
    import io

    from fastpath.cli import main
    from fastpath.proof.bench_spec import PHASE_REGISTRY, default_phases

    assert "decode-graph" in PHASE_REGISTRY and PHASE_REGISTRY["decode-graph"].needs_cuda
    assert "decode-graph" not in default_phases("cpu") and "decode-graph" in default_phases("cuda:0")
    source = tmp_path / "tiny.json"
    source.write_text(json.dumps(TINY_QWEN35))
    out = tmp_path / "out"
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = main(["bench", str(source), "--device", "cpu", "--seq-len", "8", "--decode-tokens", "2",
                     "--repeats", "1", "--warmup", "0", "--phases", "decode,decode-graph",
                     "--configs", "reference,fla", "--out", str(out), "--json"])
    assert code == 0
    doc = json.loads(buf.getvalue())
    assert doc["settings"]["phases"] == ["decode", "decode-graph"]
    reference = next(r for r in doc["configs"] if r["config"] == "reference")
    assert reference["phases"]["decode-graph"] == {"skipped": "needs a CUDA device"}
    assert reference["phases"]["decode"]["tokens_per_s"] > 0
    assert doc["speedup_versus"] == {}
    text = (out / "bench.md").read_text()
    header = next(line for line in text.splitlines() if line.startswith("| config |"))
    assert "decode (CUDA graph) tok/s" in header
    row = next(line for line in text.splitlines() if line.startswith("| reference ("))
    assert row.split(" | ")[2] == "skipped: needs a CUDA device"
    assert (out / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_phase_has_one_way_to_be_timed():
    from fastpath.proof.bench_spec import Phase

    with pytest.raises(ValueError, match="exactly one of runner and measure"):
        Phase("both", "both", runner=lambda m, i, s: (lambda: None, None, 1), measure=lambda m, i, s: {})
    with pytest.raises(ValueError, match="exactly one of runner and measure"):
        Phase("neither", "neither")


def test_speedup_versus_compares_graph_decode_with_the_reference_eager_decode():
    from fastpath.proof.bench_outputs import speedups_versus

    doc = {"settings": {"phases": ["decode", "decode-graph"]}, "configs": [
        {"config": "reference", "implementation": "torch",
         "phases": {"decode": {"tokens_per_s": 90.0}, "decode-graph": {"tokens_per_s": 270.0}}},
        {"config": "fastpath", "implementation": "fastpath Triton",
         "phases": {"decode": {"tokens_per_s": 91.0}, "decode-graph": {"tokens_per_s": 300.0}}},
        {"config": "fla", "implementation": "fla",
         "phases": {"decode": {"tokens_per_s": 70.0}, "decode-graph": {"skipped": "needs a CUDA device"}}},
    ]}
    got = speedups_versus(doc)
    assert got == {"reference": {"decode-graph/decode": pytest.approx(3.0)},
                   "fastpath": {"decode-graph/decode": pytest.approx(300.0 / 90.0)}}
    doc.update(settings={**doc["settings"], "source": "m", "layers": None, "dtype": "bf16", "batch": 1,
                         "seq_len": 8, "decode_tokens": 1, "repeats": 1, "warmup": 0, "device": "cuda"},
               created="now", speedup_versus=got)
    text = markdown(doc)
    assert "- fastpath decode (CUDA graph): 3.33x the reference's decode" in text
    assert "| fla (" in text and "skipped: needs a CUDA device" in text


def test_compile_config_is_opt_in_compiles_the_model_and_skips_decode_with_a_reason(tmp_path):
    """`--configs fastpath+compile` (not in the default list): the model's forward really goes
    through torch.compile (dynamo's graph count, read in the worker), prefill and forward+backward
    are timed on the same numbers path, decode is skipped with its reason."""
    import contextlib
    import io

    from fastpath.cli import main
    from fastpath.proof.bench_spec import CONFIGS, DEFAULT_CONFIGS

    assert "fastpath+compile" in CONFIGS and "fastpath+compile" not in DEFAULT_CONFIGS
    source = tmp_path / "tiny.json"
    source.write_text(json.dumps(TINY_QWEN35))
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = main(["bench", str(source), "--device", "cpu", "--seq-len", "8", "--decode-tokens", "2",
                     "--repeats", "1", "--warmup", "1", "--phases", "prefill,train,decode",
                     "--configs", "fastpath+compile", "--out", str(tmp_path / "out"), "--json"])
    assert code == 0
    (row,) = json.loads(buf.getvalue())["configs"]
    assert row["compiled_graphs"] >= 1, row
    assert row["phases"]["prefill"]["tokens_per_s"] > 0 and row["phases"]["train"]["tokens_per_s"] > 0
    assert "torch.compile configuration times prefill and train only" in row["phases"]["decode"]["skipped"]
    assert "torch.compile" in row["implementation"]


# --- nothing lost, nothing misleading ------------------------------------------------


def _tiny_source(tmp_path: Path) -> Path:
    source = tmp_path / "tiny.json"
    source.write_text(json.dumps(TINY_QWEN35))
    return source


@pytest.mark.parametrize("layout", ["out is a file", "bench.json is a directory"])
def test_an_unwritable_out_is_one_line_and_exit_2_before_any_work(layout, tmp_path, capsys):
    # It used to run the whole bench and then lose every result to a FileExistsError traceback.
    from fastpath.cli import main

    out = tmp_path / "out"
    if layout == "out is a file":
        out.write_text("not a directory")
    else:
        (out / "bench.json").mkdir(parents=True)
    code = main(["bench", str(_tiny_source(tmp_path)), "--device", "cpu", "--out", str(out)])
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and err[0].startswith("fastpath bench: error: --out"), err
    assert "estimate" not in captured.err  # refused before sizing, let alone a worker


def test_a_killed_bench_keeps_every_finished_configuration_on_disk(tmp_path):
    """SIGTERM (what `timeout` and job schedulers send) after the first configuration: its result
    is on disk, marked partial, the running worker is killed with bench, exit 128 + 15."""
    import os
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "out"
    argv = [sys.executable, "-m", "fastpath", "bench", str(_tiny_source(tmp_path)), "--device", "cpu",
            "--seq-len", "8", "--phases", "prefill", "--repeats", "1", "--warmup", "0",
            "--configs", "reference,fastpath", "--out", str(out)]
    env = dict(os.environ, FASTPATH_TEST_TAG=str(tmp_path))
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.monotonic() + 240
    while not (out / "bench.json").exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert proc.poll() is None, proc.communicate()
    doc = json.loads((out / "bench.json").read_text())
    assert [r["config"] for r in doc["configs"]] == ["reference"]  # written as soon as measured
    assert doc["partial"]["done"] == 1 and doc["partial"]["total"] == 2
    assert "PARTIAL: 1 of 2 configurations" in (out / "bench.md").read_text()
    proc.send_signal(signal.SIGTERM)
    _stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, stderr
    assert "interrupted (SIGTERM); 1 of 2 configurations measured" in stderr and "Traceback" not in stderr
    doc = json.loads((out / "bench.json").read_text())
    assert doc["partial"]["why"] == "interrupted by SIGTERM"
    assert doc["configs"][0]["phases"]["prefill"]["tokens_per_s"] > 0
    assert "interrupted by SIGTERM" in (out / "bench.md").read_text()
    time.sleep(0.5)  # the worker was killed, not orphaned
    workers = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            environ = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        if b"fastpath.proof.bench_worker" in cmd and str(tmp_path).encode() in environ:
            workers.append(pid)
    assert not workers


def _previous(tmp_path: Path, **changes: object) -> Path:
    settings = {"source": str(tmp_path / "tiny.json"), "layers": None, "batch": 1, "seq_len": 8, "dtype": "fp32",
                "decode_tokens": 64, "device": "cpu", "phases": ["prefill"]}
    env = {"triton_interpret": "1"}
    for key, value in changes.items():
        (env if key == "triton_interpret" else settings)[key] = value
    path = tmp_path / "previous.json"
    path.write_text(json.dumps({"schema": SCHEMA, "settings": settings, "environment": env,
                                "configs": [{"config": "fastpath", "phases": {"prefill": {"tokens_per_s": 1.0}}}]}))
    return path


@pytest.mark.parametrize("change, message", [
    ({"seq_len": 4096}, "--seq-len 4096 vs now 8"),
    ({"device": "cuda:0", "triton_interpret": None}, "device cuda:0 vs now cpu; Triton interpreter off vs now on"),
    ({"dtype": "bf16"}, "--dtype bf16 vs now fp32"),
    ({"source": "qwen3.5-27b", "layers": 8}, "model qwen3.5-27b vs now"),
])
def test_compare_with_a_run_that_is_not_comparable_is_refused_before_any_work(change, message, tmp_path, capsys,
                                                                             monkeypatch):
    # An interpreter run compared with a GPU run printed "+15587%".
    from fastpath.cli import main

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    source = _tiny_source(tmp_path)
    code = main(["bench", str(source), "--device", "cpu", "--seq-len", "8", "--phases", "prefill",
                 "--out", str(tmp_path / "o"), "--compare", str(_previous(tmp_path, **change))])
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and "is not comparable with this run" in err[0] and message in err[0], err
    assert "estimate" not in captured.err and not (tmp_path / "o").exists()


def test_the_terminal_gets_key_value_rows_when_the_table_is_wider_than_it(bench_run):
    from fastpath.proof.bench_outputs import narrow, terminal_text

    _code, doc, _out, _source = bench_run
    table = markdown(doc, doc["compare"]["changes"])
    assert max(len(line) for line in table.splitlines()) > 120  # bench.md keeps the table ...
    rows = [line for line in table.splitlines() if line.startswith("|") and "---" not in line]
    header = next(r for r in rows if r.startswith("| config |"))
    assert all(r.count(" | ") == header.count(" | ") for r in rows if r.startswith(("| reference", "| fastpath (")))
    text = terminal_text(doc, doc["compare"]["changes"], 80)
    assert text == narrow(doc, doc["compare"]["changes"], 80)  # ... the terminal gets rows that fit
    assert all(len(line) <= 80 for line in text.splitlines()), max(text.splitlines(), key=len)
    assert "  prefill tok/s: " in text and "fla (FLA, torch conv)" in text and "change vs previous run:" in text
    # nothing cut: every word of the markdown's notes is in the narrow text
    for note in [line[2:] for line in table.splitlines() if line.startswith("- ")]:
        assert note.split() == [w for w in note.split() if w in text.split()], note
    words = " ".join(text.split())
    assert " k parameters" in words and "B parameters" not in words  # not "0.000169 B parameters"
    wide = terminal_text(doc, None, 400)  # a wide terminal gets the table, long notes wrapped
    assert [ln for ln in wide.splitlines() if ln.startswith("|")] == [
        ln for ln in markdown(doc, None).splitlines() if ln.startswith("|")]
    assert all(len(line) <= 400 for line in wide.splitlines())
