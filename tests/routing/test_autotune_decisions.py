"""routing/autotune_decisions: a real Triton autotuner (timed by a stand-in benchmarker, since
the interpreter has none) decides in one process; its decision, recorded to JSON, is handed to the
same kernel's autotuner in a fresh process, which then runs the recorded config without timing
any; decisions for another GPU, configs no longer offered and malformed files are refused."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("triton")

import repo_paths

from fastpath.routing import autotune_decisions as ad
from fastpath.shared.errors import UsageError

SRC = str(repo_paths.SRC)
KERNELS = textwrap.dedent('''
    import triton
    import triton.language as tl

    TIMED = []

    def stand_in_bench(kernel_call, quantiles=None):
        """The interpreter has no benchmarker: run the config, and time later configs faster so
        the last one wins (not the first, which a fallback would pick)."""
        kernel_call()
        TIMED.append(1)
        return [10.0 - len(TIMED)] * 3

    @triton.autotune(configs=[triton.Config({"BLOCK": b}, num_warps=w) for b in (16, 32) for w in (1, 2)],
                     key=["n"], do_bench=stand_in_bench)
    @triton.jit
    def double_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = offs < n
        tl.store(y_ptr + offs, 2 * tl.load(x_ptr + offs, mask=m), mask=m)
''')
RUN = textwrap.dedent('''
    import json, sys, torch, triton
    import adt_kernels as k
    from fastpath.routing import autotune_decisions as ad
    mode, path = sys.argv[1], sys.argv[2]
    seeded = None
    if mode == "seed":
        seeded = ad.seed(ad.load(path), (9, 0)).summary()
    x = torch.randn(100, dtype=torch.float64)
    y = torch.empty_like(x)
    k.double_kernel[lambda m: (triton.cdiv(100, m["BLOCK"]),)](x, y, 100)
    assert torch.equal(y, 2 * x)
    if mode == "record":
        doc = ad.record("test GPU", (9, 0), {"triton": triton.__version__}, prefixes=("adt_",))
        open(path, "w").write(json.dumps(doc))
    best = k.double_kernel.best_config
    print(json.dumps({"timed": len(k.TIMED), "best": ad.config_fields(best), "seeded": seeded}))
''')


def _run(tmp_path: Path, mode: str, path: Path) -> dict:
    (tmp_path / "adt_kernels.py").write_text(KERNELS)
    (tmp_path / "run_adt.py").write_text(RUN)
    env = {**os.environ, "TRITON_INTERPRET": "1",
           "PYTHONPATH": os.pathsep.join(p for p in (str(tmp_path), SRC, os.environ.get("PYTHONPATH")) if p)}
    proc = subprocess.run([sys.executable, str(tmp_path / "run_adt.py"), mode, str(path)], capture_output=True,
                          text=True, env=env, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_a_recorded_decision_is_used_by_a_fresh_process_without_timing(tmp_path):
    decisions = tmp_path / "decisions.json"
    first = _run(tmp_path, "record", decisions)
    assert first["timed"] == 4  # every config timed once
    assert first["best"]["kwargs"] == {"BLOCK": 32} and first["best"]["num_warps"] == 2  # the last, fastest
    doc = json.loads(decisions.read_text())
    assert doc["schema"] == ad.SCHEMA and doc["device"]["capability"] == [9, 0]
    [(name, rows)] = doc["kernels"].items()
    assert name == "adt_kernels:double_kernel"
    assert rows == [{"key": [100, "torch.float64", "torch.float64"], "config": first["best"]}]
    second = _run(tmp_path, "seed", decisions)
    assert second["seeded"] == "autotune decisions: 1 applied to 1 kernels"
    assert second["timed"] == 0  # no config compiled or timed: the decision was there
    assert second["best"] == first["best"]


def test_other_gpu_stale_config_and_bad_files_are_refused(tmp_path):
    doc = {"schema": ad.SCHEMA, "device": {"name": "x", "capability": [9, 0]}, "versions": {},
           "kernels": {"fastpath.kernels.ssd.fwd:nowhere": [{"key": [1], "config": {}}]}}
    report = ad.seed(doc, (12, 0))
    assert report.seeded == 0 and "recorded on compute capability 9.0, this device is 12.0" in report.summary()
    assert "not a CUDA GPU" in ad.seed(doc, None).summary()
    report = ad.seed(doc, (9, 0))
    assert report.seeded == 0 and report.skipped == {"kernels not found": 1}
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(UsageError, match="cannot read autotune decisions"):
        ad.load(bad)
    bad.write_text(json.dumps({"schema": "other"}))
    with pytest.raises(UsageError, match="not an autotune decisions file"):
        ad.load(bad)


def test_a_config_the_autotuner_no_longer_offers_is_skipped(tmp_path):
    (tmp_path / "adt_kernels.py").write_text(KERNELS)
    sys.path.insert(0, str(tmp_path))
    try:
        import adt_kernels

        doc = {"schema": ad.SCHEMA, "device": {"name": "x", "capability": [9, 0]}, "versions": {},
               "kernels": {"adt_kernels:double_kernel": [
                   {"key": [100, "torch.float64", "torch.float64"],
                    "config": {"kwargs": {"BLOCK": 128}, "num_warps": 4, "num_stages": 3, "num_ctas": 1,
                               "maxnreg": None}}]}}
        report = ad.seed(doc, (9, 0))
        assert report.seeded == 0 and report.skipped == {"configs no longer offered": 1}
        assert adt_kernels.double_kernel.cache == {}
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("adt_kernels", None)


def test_the_process_picks_the_env_file_then_the_shipped_one_and_off_means_none(tmp_path, monkeypatch):
    doc = {"schema": ad.SCHEMA, "device": {"name": "x", "capability": [9, 0]}, "versions": {},
           "kernels": {"notinstalled_pkg.ops:kern": [{"key": [1], "config": {}}]}}
    shipped = tmp_path / "shipped"
    shipped.mkdir()
    (shipped / "sm_90.json").write_text(json.dumps(doc))
    monkeypatch.setattr(ad, "SHIPPED", shipped)
    monkeypatch.delenv(ad.ENV, raising=False)
    assert ad.shipped_file((9, 0)) == shipped / "sm_90.json"
    assert ad.shipped_file((10, 0)) is None and ad.shipped_file(None) is None
    report = ad.seed_for_process((9, 0))  # shipped: kernels of packages not installed are dropped
    assert report is not None and report.seeded == 0 and report.skipped == {} and report.refused is None
    assert ad.seed_for_process((10, 0)) is None  # nothing shipped for this GPU
    mine = tmp_path / "mine.json"
    mine.write_text(json.dumps(doc))
    monkeypatch.setenv(ad.ENV, str(mine))  # a file named by the user is applied as it is
    assert ad.seed_for_process((9, 0)).skipped == {"kernels not found": 1}
    monkeypatch.setenv(ad.ENV, "off")
    assert ad.seed_for_process((9, 0)) is None


def test_merge_keeps_both_models_and_takes_the_newer_config_for_a_shared_key():
    row = lambda key, warps: {"key": key, "config": {"kwargs": {}, "num_warps": warps, "num_stages": 2,  # noqa: E731
                                                      "num_ctas": 1, "maxnreg": None}}
    old = {"schema": ad.SCHEMA, "device": {"name": "x", "capability": [9, 0]}, "versions": {"fla-core": "0.5"},
           "kernels": {"m:a": [row([1], 4), row([2], 4)], "m:b": [row([7], 8)]}}
    new = {"schema": ad.SCHEMA, "device": {"name": "x", "capability": [9, 0]}, "versions": {"fla-core": "0.6"},
           "kernels": {"m:a": [row([2], 8), row([3], 2)]}}
    merged = ad.merge(old, new)
    assert merged["versions"] == {"fla-core": "0.6"}
    assert merged["kernels"]["m:b"] == [row([7], 8)]
    assert {json.dumps(r["key"]): r["config"]["num_warps"] for r in merged["kernels"]["m:a"]} == \
        {"[1]": 4, "[2]": 8, "[3]": 2}
    with pytest.raises(UsageError, match="different GPUs"):
        ad.merge({**old, "device": {"capability": [12, 0]}}, new)


def test_undo_takes_back_exactly_the_seeded_keys(tmp_path):
    (tmp_path / "adt_kernels.py").write_text(KERNELS)
    sys.path.insert(0, str(tmp_path))
    try:
        import adt_kernels

        tuner = adt_kernels.double_kernel
        own_key = (5, "torch.float32", "torch.float32")
        tuner.cache[own_key] = tuner.configs[0]  # decided by the autotuner itself, before
        doc = {"schema": ad.SCHEMA, "device": {"name": "x", "capability": [9, 0]}, "versions": {},
               "kernels": {"adt_kernels:double_kernel": [
                   {"key": [100, "torch.float64", "torch.float64"], "config": ad.config_fields(tuner.configs[3])},
                   {"key": list(own_key), "config": ad.config_fields(tuner.configs[1])}]}}
        report = ad.seed(doc, (9, 0))
        assert report.seeded == 1 and report.skipped == {"keys already decided": 1}
        assert tuner.cache[(100, "torch.float64", "torch.float64")] is tuner.configs[3]
        report.undo()
        assert tuner.cache == {own_key: tuner.configs[0]}
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("adt_kernels", None)


def test_every_shipped_file_is_a_decisions_file_for_the_gpu_its_name_says():
    """The files shipped under routing/autotune_data (recorded by `fastpath warmup --save-decisions`
    on the lent GPU): each loads, was recorded on the compute capability its name gives (seed()
    applies it on that one alone), names only kernels of the recorded prefixes, and holds
    configs with the fields seed() matches."""
    files = sorted(ad.SHIPPED.glob("*.json"))
    assert files, "nothing shipped"
    for path in files:
        doc = ad.load(path)
        major, minor = doc["device"]["capability"]
        assert path.name == f"sm_{major}{minor}.json", path
        assert doc["kernels"], path
        for name, decisions in doc["kernels"].items():
            assert name.startswith(ad.PREFIXES) and ":" in name, name
            for d in decisions:
                assert isinstance(d["key"], list) and d["key"], (name, d)
                assert set(d["config"]) <= set(ad.CONFIG_FIELDS) and "kwargs" in d["config"], (name, d)
