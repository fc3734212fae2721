"""capture.formats: one class per offline layout, and the one place that knows the layouts' names.
The CLI's choices, the writers, the capture run and the client checks go through FORMATS."""

from __future__ import annotations

import ast

import pytest
from repo_paths import ROOT

from fastpath.capture.formats import (
    DEFAULT_FORMAT,
    FORMAT_NAMES,
    FORMATS,
    capture_format,
    format_of,
)
from fastpath.shared.errors import UsageError

CAPTURE = ROOT / "src" / "fastpath" / "capture"


def _capture_options(flag: str):
    from fastpath.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction").choices["capture"]
    return next(a for a in sub._actions if flag in a.option_strings)


def test_the_cli_offers_exactly_the_registered_formats():
    assert FORMAT_NAMES == ("speculators", "specforge") and DEFAULT_FORMAT in FORMATS
    assert tuple(_capture_options("--format").choices) == FORMAT_NAMES
    assert _capture_options("--format").default == DEFAULT_FORMAT
    assert tuple(_capture_options("--check-client").choices) == FORMAT_NAMES


@pytest.mark.parametrize("name", FORMAT_NAMES)
def test_each_format_makes_its_own_writer_and_is_found_from_it(name, tmp_path):
    pytest.importorskip("safetensors")
    pytest.importorskip("datasets")
    fmt = capture_format(name)
    writer = fmt.make_writer(tmp_path)
    assert type(writer) is fmt.writer_class and format_of(writer) is fmt and writer.ids_key


def test_an_unknown_format_is_one_line_naming_the_choices():
    with pytest.raises(UsageError) as err:
        capture_format("eagle")
    assert "\n" not in str(err.value) and all(name in str(err.value) for name in FORMAT_NAMES)


def test_the_dtype_rule_is_the_formats_own():
    pytest.importorskip("torch")
    for dtype in ("bf16", "fp16", "fp32"):
        FORMATS["speculators"].check_dtype(dtype)
    FORMATS["specforge"].check_dtype("bfloat16")
    with pytest.raises(UsageError, match=r"^--format specforge needs --dtype bf16"):
        FORMATS["specforge"].check_dtype("fp32")


def test_no_capture_module_but_formats_compares_format_names():
    """A layout's rules live in its class: elsewhere, no `== "specforge"`, no `in ("speculators", ...)`
    and no dict keyed by a format name."""
    names = set(FORMAT_NAMES)
    found = []
    for path in sorted(CAPTURE.glob("*.py")):
        if path.name == "formats.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Compare):
                operands = [node.left, *node.comparators]
                operands += [e for o in operands if isinstance(o, (ast.Tuple, ast.List, ast.Set)) for e in o.elts]
            elif isinstance(node, ast.Dict):
                operands = [k for k in node.keys if k is not None]
            else:
                continue
            found += [f"{path.name}:{node.lineno}" for o in operands
                      if isinstance(o, ast.Constant) and o.value in names]
    assert not found, found
