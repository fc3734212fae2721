"""Every kernel op folder follows the rule written in fastpath/kernels/__init__.py: interface.py
(the entry points) and naive.py (the float reference) in each; Triton modules named by the pass
they compute (fwd / bwd / fwd_bwd / update / varlen / common, optionally _<strategy>), never
triton_*; host-side helpers only under the names the rule lists."""

from __future__ import annotations

import re

from repo_paths import SRC

KERNELS = SRC / "fastpath" / "kernels"
OPS = sorted(p for p in KERNELS.iterdir() if p.is_dir() and (p / "__init__.py").exists())
PASS_NAME = re.compile(r"(fwd|bwd|fwd_bwd|update|varlen|common)(_[a-z0-9]+)*\.py")
HOST_SIDE = {"launchers.py", "shared_memory.py", "split_conv_scan.py", "inner.py", "dqkwg.py",
             "split_outputs.py"}


def test_every_op_has_its_entry_and_its_reference() -> None:
    assert len(OPS) == 13, [p.name for p in OPS]
    for op in OPS:
        assert (op / "interface.py").is_file(), op.name
        assert (op / "naive.py").is_file(), op.name


def test_module_names_follow_the_rule() -> None:
    for op in OPS:
        for module in op.glob("*.py"):
            name = module.name
            if name in ("__init__.py", "interface.py", "naive.py") or name in HOST_SIDE:
                continue
            assert PASS_NAME.fullmatch(name), f"{op.name}/{name}"


def test_the_rule_and_the_ops_are_written_down() -> None:
    doc = (KERNELS / "__init__.py").read_text()
    for op in OPS:
        assert op.name in doc, op.name
