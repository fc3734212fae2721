"""The API's first hour: explain()'s table fits the width it is given (100 columns by default
where there is no terminal) with long implementation names wrapped inside their cell, and
enable() says which transformers releases it supports when the installed one is absent, too old
or too new."""

from __future__ import annotations

import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import fastpath  # noqa: E402
from fastpath.routing.engine import SUPPORTED_TRANSFORMERS, check_transformers_version  # noqa: E402
from fastpath.shared.errors import UsageError  # noqa: E402


def tiny_qwen3_5():
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    cfg = Qwen3_5TextConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                            num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                            linear_num_value_heads=2, linear_num_key_heads=2, linear_key_head_dim=8,
                            linear_value_head_dim=8, layer_types=["linear_attention", "full_attention"])
    return Qwen3_5ForCausalLM(cfg).eval()


@pytest.mark.parametrize("width", [100, 80])
def test_explain_table_fits_the_width_and_wraps_long_impl_names(width):
    table = fastpath.explain(tiny_qwen3_5(), width=width)
    text = str(table)
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= width, text
    # every implementation is still there, word for word, only wrapped
    impls = {r["impl"] for r in table.rows}
    assert any(len(i) > 40 for i in impls)
    flat = " ".join(" ".join(line.split()) for line in lines)
    for impl in impls:
        assert all(word in flat for word in impl.split())
    assert lines[-1] == f"0/{len(table.rows)} ops fast"
    assert repr(table) == text  # what a notebook shows


def test_explain_defaults_to_100_columns_without_a_terminal():
    code = ("import os, sys; sys.path[:0] = " + repr(sys.path) + "\n"
            "import fastpath\n"
            "from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig\n"
            "cfg = Qwen3_5TextConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,"
            " num_attention_heads=2, num_key_value_heads=1, head_dim=16, linear_num_value_heads=2,"
            " linear_num_key_heads=2, linear_key_head_dim=8, linear_value_head_dim=8,"
            " layer_types=['linear_attention', 'full_attention'])\n"
            "print(fastpath.explain(Qwen3_5ForCausalLM(cfg)))\n")
    env = {k: v for k, v in __import__("os").environ.items() if k != "COLUMNS"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines and max(len(line) for line in lines) <= 100 and "ops fast" in lines[-1]


def test_supported_transformers_pass_silently():
    oldest, newest = SUPPORTED_TRANSFORMERS
    for version in ("4.57.6", "5.0.0", "5.17.0", "5.25.0", "5.25.1"):
        assert check_transformers_version(version) is None
    assert (oldest, newest) == ("4.57", "5.25")


def test_too_old_transformers_is_refused_naming_the_supported_range():
    with pytest.raises(UsageError, match=r"supports transformers 4\.57 to 5\.25; transformers 4\.56\.2 is too old: "
                                         r'pip install "transformers>=4\.57,<5\.26"'):
        check_transformers_version("4.56.2")


def test_too_new_transformers_warns_and_says_what_is_supported():
    with pytest.warns(RuntimeWarning, match=r"supports transformers 4\.57 to 5\.25; transformers 5\.30\.0 is newer"):
        note = check_transformers_version("5.30.0")
    assert note and "fastpath.explain(model)" in note


def test_enable_without_transformers_is_one_line_and_exit_2():
    code = ("import sys; sys.path[:0] = " + repr(sys.path) + "\n"
            "sys.modules['transformers'] = None\n"
            "import fastpath\nfastpath.enable()\nprint('not reached')\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "supports transformers 4.57 to 5.25, and transformers is not installed" in lines[0]
    assert 'pip install "transformers>=4.57,<5.26"' in lines[0]
