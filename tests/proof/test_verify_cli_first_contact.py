"""`fastpath verify` as a new user meets it: --save given a directory, --packed where
it cannot be checked, and what verify says while it builds the model. Every refusal is one line
before any work (no model built)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from tiny_configs import QWEN35_2L as TINY_QWEN35

import fastpath

TINY_LFM2 = {
    "model_type": "lfm2", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 128, "layer_types": ["conv", "full_attention"],
}


@pytest.fixture(autouse=True)
def _leave_fastpath_disabled():
    yield
    fastpath.disable()


def _write(tmp_path: Path, config: dict, name: str) -> str:
    path = tmp_path / name
    path.write_text(json.dumps(config))
    return str(path)


def test_save_to_a_directory_writes_a_file_inside_it_and_says_its_name(tmp_path, capsys):
    # It used to run the whole verification and then raise IsADirectoryError (exit 1, "FAIL").
    from fastpath.cli import main

    model = _write(tmp_path, TINY_LFM2, "lfm2.json")
    results = tmp_path / "results"
    results.mkdir()
    code = main(["verify", model, "--seq-len", "8", "--batch", "1", "--decode-tokens", "0", "--save", str(results)])
    err = capsys.readouterr().err
    saved = results / "fastpath-verify.json"
    assert code in (0, 3), err  # PASS, or NOT VERIFIED without the Triton interpreter
    words = " ".join(err.split())
    assert f"the result JSON goes to {saved}" in words and f"fastpath verify: wrote {saved}" in words
    assert json.loads(saved.read_text())["model"]["class"] == "Lfm2ForCausalLM"


@pytest.mark.parametrize("where", ["parent is a file", "target is a directory"])
def test_save_that_cannot_be_written_is_one_line_exit_2_before_any_work(where, tmp_path, capsys):
    from fastpath.cli import main

    model = _write(tmp_path, TINY_LFM2, "lfm2.json")
    blocker = tmp_path / "blocker"
    blocker.write_text("a file")
    if where == "parent is a file":
        save = str(blocker / "result.json")
    else:
        (tmp_path / "d" / "fastpath-verify.json").mkdir(parents=True)
        save = str(tmp_path / "d")
    code = main(["verify", model, "--seq-len", "8", "--batch", "1", "--save", save])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and err[0].startswith("fastpath verify: error: ") and "--save" in err[0], err


def test_packed_that_cannot_be_checked_here_says_not_verified_first(tmp_path, capsys):
    # Without FLA on CUDA, the fast path cannot keep packed sequences apart in the gated delta rule:
    # it used to run the reference path, then fail with a ValueError (exit 1, FAIL, no table).
    import importlib.util

    from fastpath.cli import main

    if importlib.util.find_spec("fla") is not None and __import__("torch").cuda.is_available():
        pytest.skip("FLA on a CUDA device can check packed sequences")
    model = _write(tmp_path, TINY_QWEN35, "qwen.json")
    code = main(["verify", model, "--packed", "--seq-len", "16", "--batch", "2"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 3  # NOT VERIFIED
    verdicts = [line for line in err if "NOT VERIFIED" in line]
    assert len(verdicts) == 1 and verdicts[0].startswith("fastpath verify: NOT VERIFIED: --packed on qwen3_5_text")
    assert "cu_seqlens" in verdicts[0]
    assert not any("reference path" in line or "building the model" in line for line in err)  # before any work


def test_packed_on_a_conv_only_model_is_still_checked(tmp_path):
    from fastpath.proof.run_paths import verify_model

    result = verify_model(_write(tmp_path, TINY_LFM2, "lfm2.json"), seq_len=8, batch=2, packed=True, decode_tokens=0)
    assert not result.problems, result.problems


def test_verify_says_what_it_builds(tmp_path, capsys, monkeypatch):
    from fastpath.cli import main

    monkeypatch.setenv("COLUMNS", "80")

    model = _write(tmp_path, TINY_LFM2, "lfm2.json")
    main(["verify", model, "--seq-len", "8", "--batch", "1", "--decode-tokens", "0", "--dtype", "bf16"])
    err = capsys.readouterr().err
    words = " ".join(err.split())
    assert "verify: sizing the job" in words
    assert "verify: building the model: lfm2, 2 layers, random weights (seed 0) initialised in fp32 on cpu, " \
           "then cast to bf16" in words
    assert "estimate: peak ~" in err
    assert all(len(line) <= 80 for line in err.splitlines()), max(err.splitlines(), key=len)
