"""The peer-suite harness (conftest.py says how it works): mamba_ssm's own op test files run
against fastpath's functions. The upstream cases are collected as children of this file when
MAMBA_PEER_TESTS is set; the tests below check the harness itself on CPU in milliseconds."""

from __future__ import annotations

import ast
import sys
import textwrap

import peer_harness as harness
import pytest

SAMPLE = textwrap.dedent('''
    import pytest

    # @pytest.mark.parametrize('itype', [torch.float32, torch.float16, torch.bfloat16])
    @pytest.mark.parametrize('itype', [torch.float32])
    # @pytest.mark.parametrize('seqlen', [8, 16, 128, 2048 + 16])
    @pytest.mark.parametrize('seqlen', [128, 256])
    # @pytest.mark.parametrize('seqlen', [128])
    #@pytest.mark.parametrize("is_variable_B", [False, True])
    @pytest.mark.parametrize("is_variable_B", [True])
    @pytest.mark.parametrize("dim", [2048, 2048 + 16])
    # @pytest.mark.parametrize("not_an_argument", [1, 2])
    def test_one(itype, seqlen, is_variable_B, dim):
        device = 'cuda'
        # @pytest.mark.parametrize('dim', [1, 2, 3])  (a comment inside a body is not a decorator)
        return device

    @pytest.mark.parametrize('dim', [4])
    def test_two(dim):
        pass
''')


def _lists(tree: ast.Module) -> dict[tuple[str, str], list[str]]:
    out = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            for deco in node.decorator_list:
                argnames, values = harness._parametrize_call(deco)
                out[node.name, argnames] = [ast.unparse(e) for e in values.elts]
    return out


def test_upstream_suites_present():
    upstream, why = harness.find_upstream()
    if upstream is None:
        pytest.skip(why)
    assert all((upstream.tests / s.path).is_file() for s in harness.SUITES)


def test_widen_takes_the_union_with_the_commented_lists():
    tree = ast.parse(SAMPLE)
    changes = harness.widen(tree, SAMPLE)
    lists = _lists(tree)
    assert lists["test_one", "itype"] == ["torch.float32", "torch.float16", "torch.bfloat16"]
    assert lists["test_one", "seqlen"] == ["8", "16", "128", "2048 + 16", "256"]
    assert lists["test_one", "is_variable_B"] == ["False", "True"]
    assert lists["test_one", "dim"] == ["2048", "2048 + 16"]  # nothing commented: unchanged
    assert lists["test_two", "dim"] == ["4"]  # the body comment of test_one is not its decorator
    sizes = {(c.function, c.argnames): (c.default, c.wide) for c in changes if not c.unused}
    assert sizes["test_one", "seqlen"] == (2, 5)
    assert [c.argnames for c in changes if c.unused] == ["not_an_argument"]


def test_on_device_rewrites_only_the_device_assignment():
    tree = harness._OnDevice("cpu").visit(ast.parse(SAMPLE))
    text = ast.unparse(tree)
    assert "device = 'cpu'" in text and "'cuda'" not in text


def test_mamba_ssm_importable_from_source_then_gone(tmp_path):
    """A fake mamba_ssm tree whose root would fail and whose op imports the CUDA extension and
    causal_conv1d, as upstream's selective_scan_interface does."""
    pytest.importorskip("torch")
    ops = tmp_path / "mamba_ssm" / "ops"
    ops.mkdir(parents=True)
    (tmp_path / "mamba_ssm" / "__init__.py").write_text("raise ImportError('root must not run')\n")
    (ops / "__init__.py").write_text("")
    (ops / "probe.py").write_text(
        "import selective_scan_cuda\n"
        "from causal_conv1d import causal_conv1d_fn\n"
        "from causal_conv1d.cpp_functions import causal_conv1d_fwd_function\n")
    before = set(sys.modules)
    with harness.mamba_ssm_importable(tmp_path):
        import importlib

        probe = importlib.import_module("mamba_ssm.ops.probe")
    assert probe.causal_conv1d_fn.__module__.startswith("fastpath.causal_conv1d")
    with pytest.raises(AttributeError, match="CUDA extension is not built"):
        probe.selective_scan_cuda.fwd  # noqa: B018
    left = {n for n in set(sys.modules) - before
            if n.split(".")[0] in ("mamba_ssm", "selective_scan_cuda", "causal_conv1d")}
    assert left == set()


def test_bad_settings_are_one_line_errors(monkeypatch):
    monkeypatch.setenv(harness.GRID_ENV, "widest")
    with pytest.raises(ValueError, match="PEER_GRID"):
        harness.grid()
    monkeypatch.setenv(harness.SHARD_ENV, "3/2")
    with pytest.raises(ValueError, match="PEER_SHARD"):
        harness.shard()


FAKE_LIBRARY = {
    "mamba_ssm/__init__.py": "raise ImportError('the package root must not run')\n",
    "mamba_ssm/ops/__init__.py": "",
    "mamba_ssm/ops/triton/__init__.py": "",
    "mamba_ssm/ops/selective_scan_interface.py": (
        "import selective_scan_cuda\n"
        "from causal_conv1d import causal_conv1d_fn\n"
        "def selective_scan_fn(*a, **k):\n    return selective_scan_cuda.fwd(*a)\n"
        "def selective_scan_ref(*a, **k):\n    return 'upstream reference'\n"
        "def mamba_inner_fn(*a, **k):\n    return selective_scan_cuda.fwd(*a)\n"
        "def mamba_inner_ref(*a, **k):\n    return selective_scan_fn(*a)\n"),
    "mamba_ssm/ops/triton/selective_state_update.py": (
        "def selective_state_update(*a, **k):\n    raise AssertionError\n"
        "def selective_state_update_ref(*a, **k):\n    raise AssertionError\n"),
    "mamba_ssm/ops/triton/ssd_chunk_state.py": "def chunk_state_varlen(*a):\n    raise AssertionError\n",
}
FAKE_TESTS = {
    "tests/ops/test_selective_scan.py": textwrap.dedent('''
        import sys
        import pytest
        from mamba_ssm.ops.selective_scan_interface import selective_scan_fn, mamba_inner_fn, mamba_inner_ref

        # @pytest.mark.parametrize('n', [1, 2, 3])
        @pytest.mark.parametrize('n', [1])
        def test_swapped(n):
            device = 'cuda'
            assert device == 'cpu'
            assert selective_scan_fn.__module__ == 'fastpath.kernels.selective_scan.interface'
            assert mamba_inner_fn.__module__ == 'fastpath.kernels.selective_scan.interface'
            assert mamba_inner_ref() == 'upstream reference'
            assert 'mamba_ssm' not in sys.modules
    '''),
    "tests/ops/triton/test_selective_state_update.py": textwrap.dedent('''
        import pytest
        from mamba_ssm.ops.triton.selective_state_update import selective_state_update

        @pytest.mark.parametrize('n', [1, 2])
        def test_lost_context(n):
            assert selective_state_update.__module__ == 'peer_harness'
            raise RuntimeError('CUDA error: an illegal memory access was encountered')
    '''),
    "tests/ops/triton/test_ssd.py": textwrap.dedent('''
        from mamba_ssm.ops.triton.ssd_chunk_state import chunk_state_varlen

        def test_varlen():
            assert chunk_state_varlen.__module__ == 'peer_harness'
    '''),
}


def test_harness_end_to_end_on_a_fake_upstream(tmp_path):
    """The harness over a fake checkout, in a pytest subprocess on CPU: names swapped, the
    reference kept, the wide grid, a lost CUDA context ending the process, PEER_DONE written."""
    import os
    import subprocess
    from pathlib import Path

    for rel, text in {**FAKE_LIBRARY, **FAKE_TESTS}.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    done = tmp_path / "done.txt"
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, harness.TESTS_ENV: str(tmp_path), harness.GRID_ENV: "wide",
           harness.DEVICE_ENV: "cpu", "TRITON_INTERPRET": "1", harness.DONE_ENV: str(done)}
    env.pop(harness.SRC_ENV, None)
    env.pop(harness.SHARD_ENV, None)
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "gpu", "-rfE",
         "tests/peer/test_mamba_ssm_suites.py"],
        cwd=root, env=env, capture_output=True, text=True, timeout=300)
    text = run.stdout + run.stderr
    assert "1 failed, 3 passed, 6 deselected" in text, text
    assert "test_lost_context[1] lost the CUDA context" in text, text
    assert "test_swapped n: 1 -> 3 values" in text, text
    finished = done.read_text().split()
    assert len(finished) == 4 and not any("test_varlen" in n for n in finished), finished
