"""mamba_ssm's own op tests, run against fastpath's functions ("peer suites").

fastpath claims mamba_ssm's public API; the judge of that claim is mamba_ssm's own test files,
read from a state-spaces/mamba checkout (https://github.com/state-spaces/mamba), never copied
into this repository:

- tests/ops/test_selective_scan.py: `selective_scan_fn` and `mamba_inner_fn` become
  fastpath.kernels.selective_scan.interface's; the judges stay upstream's `selective_scan_ref`
  and `mamba_inner_ref`. mamba_inner_ref ends in the module's `selective_scan_fn` (the CUDA
  extension upstream); here that name inside mamba_ssm is upstream's own `selective_scan_ref`.
- tests/ops/triton/test_selective_state_update.py: `selective_state_update` becomes fastpath's
  (a 3-D state: the Mamba-1 step of fastpath.kernels.selective_scan.update; a 4-D state: the
  Mamba-2 step of fastpath.kernels.ssd.update); the judge stays
  `selective_state_update_ref`.
- tests/ops/triton/test_ssd.py: its one test checks the per-sequence final states of packed
  sequences through mamba_ssm's internal `chunk_state_varlen`; that name answers through
  fastpath's public `mamba_chunk_scan_combined(..., cu_seqlens=..., return_varlen_states=True)`
  (peer_harness.chunk_state_varlen); upstream's own Triton chunk kernels stay the judge. The file
  has no test of `mamba_chunk_scan_combined` / `mamba_split_conv1d_scan_combined` outputs.

mamba_ssm is imported from source without its package root (which imports the compiled
`selective_scan_cuda`): `selective_scan_cuda` is a stub no judge calls, and `causal_conv1d`
(which `mamba_inner_ref` and mamba_ssm's SSD module import) is fastpath.causal_conv1d, the face
that passes Dao-AILab causal-conv1d's own tests/test_causal_conv1d.py
(https://github.com/Dao-AILab/causal-conv1d). sys.modules is restored after the import, so the rest
of a test run sees no mamba_ssm.

How to run them (on a machine with a CUDA GPU; `einops` importable):

    git clone https://github.com/state-spaces/mamba /tmp/mamba          # or:
    bash benchmarks/device/pack_peer_tests.sh    # packs the three files into .carry/mamba_peer
    MAMBA_PEER_TESTS=/tmp/mamba python3 -m pytest tests/peer -m gpu -q
    MAMBA_PEER_TESTS=/tmp/mamba PEER_GRID=wide python3 -m pytest tests/peer -m gpu -q

MAMBA_PEER_TESTS is the folder holding tests/ops/; MAMBA_SRC the folder holding mamba_ssm/
(default: MAMBA_PEER_TESTS; the unpacked PyPI sdist mamba_ssm-2.3.2.post1 works too — the sdist
itself ships no tests). PEER_GRID=wide widens every parametrize list to the union with the
lists the file leaves commented out (its seqlens 8...4096, every itype, time-invariant B and C,
each option on and off), by rewriting the file's syntax tree in memory at collection.
PEER_SHARD=i/n keeps every n-th upstream case from i (n processes share the GPU); PEER_DONE=FILE
skips the node ids listed in FILE and appends each case it finishes with its outcome, one
"node id<TAB>outcome" line (resuming across calls; benchmarks/device/peer_state.py reads it);
PEER_DEVICE=cpu with TRITON_INTERPRET=1 runs them on the CPU (a smoke check: small cases only).
A failed tolerance assertion (`assert torch.allclose(...)` in the upstream file) is re-judged
against float64 (float64_judge.py): the recorded call of the function under test is rerun through
fastpath, mamba_ssm's same-dtype reference and that reference on float64 inputs; the case passes
only if fastpath's max_abs and rel_l2 from float64 are each at most 2x the reference's (a tensor
beyond that on the case's own draw is judged by its median over 8 more draws: the test body rerun
with its seed moved, `_redraw` below). A case it passes is reported apart (terminal summary
"float64 judge", JUnit property `float64_judge`, one JSON line in PEER_JUDGE_LOG when set); any
other failure stays a plain failure.
Without MAMBA_PEER_TESTS the group is one skipped test naming the variable; without a GPU every
upstream case is collected and skipped. bash benchmarks/device/peer.sh OUT runs it all on the
device and writes JUnit XML and counts to OUT.
"""

from __future__ import annotations

import json
import os
import re
import sys

import float64_judge as judge
import peer_harness as harness
import pytest

_SUITES = pytest.StashKey[dict]()
_JUDGED = pytest.StashKey[list]()  # (nodeid, Verdict) of every re-judged case
# the outcome of a case the judge skipped as beyond its dtype's range (float64_judge.py module doc)
BEYOND_RANGE = "skipped_beyond_range"
CACHED_GPU_BYTES = 4 << 30  # what one shard's allocator may keep cached between cases
# One out-of-bounds access loses the process's CUDA context: every later case would fail too.
_CONTEXT_LOST = re.compile(r"illegal memory access|CUDA error|device-side assert")


class UpstreamSuite(pytest.Module):
    """One upstream test file, compiled in memory with fastpath's functions under test."""

    def __init__(self, *, suite: harness.Suite, upstream: harness.Upstream, **kw):
        super().__init__(**kw)
        self.suite = suite
        self.upstream = upstream
        self.grid_changes: list[harness.GridChange] = []

    def _getobj(self):
        module, self.grid_changes = harness.load_suite(
            self.suite, self.upstream, harness.grid() == "wide", harness.device())
        return module


class PeerSuites(pytest.Module):
    """test_mamba_ssm_suites.py (the harness's own CPU tests) plus one child per upstream file."""

    def collect(self):
        yield from super().collect()
        upstream, _ = harness.find_upstream()
        if upstream is None:
            return  # test_upstream_suites_present skips with the reason
        for suite in harness.SUITES:
            name = suite.path.rsplit("/", 1)[-1]
            yield UpstreamSuite.from_parent(
                self, path=upstream.tests / suite.path, name=name,
                nodeid=f"{self.nodeid}::{name}", suite=suite, upstream=upstream)


def pytest_pycollect_makemodule(module_path, parent):
    if module_path.name == "test_mamba_ssm_suites.py":
        return PeerSuites.from_parent(parent, path=module_path)
    return None


def _skip_reason() -> str | None:
    if harness.device() == "cpu":
        if os.environ.get("TRITON_INTERPRET") != "1":
            return f"{harness.DEVICE_ENV}=cpu needs TRITON_INTERPRET=1"
        return None
    import torch

    return None if torch.cuda.is_available() else "mamba_ssm's own tests need a CUDA GPU"


def pytest_collection_modifyitems(config, items):
    upstream_items = [i for i in items if i.getparent(UpstreamSuite) is not None]
    if not upstream_items:
        return
    config.stash[_SUITES] = {id(p): p for p in (i.getparent(UpstreamSuite) for i in upstream_items)}
    done = _done()
    if done:  # finished in an earlier call (PEER_DONE): the rest is shared out below
        finished = [i for i in upstream_items if i.nodeid in done]
        upstream_items = [i for i in upstream_items if i.nodeid not in done]
        config.hook.pytest_deselected(items=finished)
        gone = {id(i) for i in finished}
        items[:] = [i for i in items if id(i) not in gone]
    index, count = harness.shard()
    reason = _skip_reason()
    keep_ids = {id(item) for n, item in enumerate(upstream_items) if n % count == index}
    deselected = [i for i in upstream_items if id(i) not in keep_ids]
    for item in upstream_items:
        item.add_marker(pytest.mark.gpu)
        if reason:
            item.add_marker(pytest.mark.skip(reason=reason))
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        gone = {id(i) for i in deselected}
        items[:] = [i for i in items if id(i) not in gone]


def _done() -> set[str]:
    path = os.environ.get(harness.DONE_ENV)
    if not path or not os.path.isfile(path):
        return set()
    with open(path) as f:  # "node id<TAB>outcome" (or a bare node id, as written before outcomes)
        return {line.split("\t")[0].strip() for line in f if line.strip()}


def _outcome(report: pytest.TestReport) -> str | None:
    """The outcome a phase's report settles (None when the phase settles nothing): the done list
    keeps it, so a case stays counted when its process is killed before pytest writes the XML."""
    if report.when == "call":
        judged = any(name == judge.PROPERTY for name, _ in report.user_properties)
        if report.passed and judged:
            return "passed_float64_judge"
        if report.skipped and judged:
            return BEYOND_RANGE
        return report.outcome
    if report.skipped:
        return "skipped"
    return "error" if report.failed else None


def _release_cached_memory(keep: int = CACHED_GPU_BYTES) -> None:
    """Hand the allocator's cached blocks back to the GPU once they pass `keep`: the grid's shards
    share one GPU, and a process keeping the high-water mark of its largest case starves the others
    (out-of-memory errors in small cases beside 15 other shards)."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized() and torch.cuda.memory_reserved() > keep:
        torch.cuda.empty_cache()


class RuntestHooks:
    """Registered as a plugin, not left as conftest hooks: pytest calls a conftest's run-time
    hooks only for items under the conftest's folder, and the upstream cases live elsewhere."""

    def __init__(self) -> None:
        self.outcomes: dict[str, str] = {}

    def pytest_runtest_logreport(self, report):
        outcome = _outcome(report)
        if outcome is not None and self.outcomes.get(report.nodeid) not in ("failed", "error"):
            self.outcomes[report.nodeid] = outcome  # a teardown error outranks the call's pass

    def pytest_runtest_logfinish(self, nodeid, location):
        path = os.environ.get(harness.DONE_ENV)
        outcome = self.outcomes.pop(nodeid, "unknown")
        if path and nodeid.count("::") >= 2 and "test_mamba_ssm_suites.py::test_" in nodeid:
            with open(path, "a") as f:  # one short line per write: parallel shards may share it
                f.write(f"{nodeid}\t{outcome}\n")
        _release_cached_memory()

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item):
        """Records the calls of the functions under test; a failed tolerance assertion of the
        upstream file goes to the float64 judge (float64_judge.py), whose pass turns the case
        into a pass that is reported as re-judged."""
        parent = item.getparent(UpstreamSuite)
        judges = judge.module_judges(parent.obj) if parent is not None else None
        if judges is None:
            return (yield)
        judge.RECORDER.start()
        try:
            return (yield)
        except AssertionError as exc:
            verdict = judge.rejudge(exc, judges, item.name, redraw=_redraw(item))
            if verdict is None:
                raise
            item.user_properties.append((judge.PROPERTY, judge.property_value(verdict)))
            item.config.stash.setdefault(_JUDGED, []).append((item.nodeid, verdict))
            judge.log_verdict(item.nodeid, verdict)
            if verdict.unjudgeable:  # the exact answer does not fit the dtype: no verdict either way
                pytest.skip(verdict.range_reason())
            if not verdict.passed:
                raise
            return None
        finally:
            judge.RECORDER.stop()

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item, call):
        report = yield
        if call.when == "call":
            for name, value in item.user_properties:
                if name == judge.PROPERTY:
                    verdict = json.loads(value)
                    head = ("PASSED by the float64 judge (upstream's assertion failed)" if verdict["passed"]
                            else "not judged: the exact result is beyond its dtype's range" if report.skipped
                            else "the float64 judge upheld the failure")
                    report.sections.append(("float64 judge", head + "\n" + value))
        if (report.failed and item.getparent(UpstreamSuite) is not None
                and _CONTEXT_LOST.search(report.longreprtext or "")):
            item.session.shouldstop = (f"{item.nodeid} lost the CUDA context "
                                       f"({_CONTEXT_LOST.search(report.longreprtext).group(0)}): "
                                       "the rest of this process's cases cannot run")
        return report


def _redraw(item: pytest.Item):
    """`run(k)`: the upstream test body again with every `torch.manual_seed(s)` it calls moved to
    s + k * SEED_STEP (fresh inputs of the same case), returning the calls it recorded. Its own
    tolerance assertions may fail on that draw: the judge weighs the calls, not upstream's check."""

    def run(k: int) -> list[judge.Call]:
        import torch
        import torch.random

        originals = torch.manual_seed, torch.random.manual_seed

        def moved(seed: int):
            return originals[1](int(seed) + k * judge.SEED_STEP)

        torch.manual_seed = torch.random.manual_seed = moved
        judge.RECORDER.start()
        try:
            try:
                item.runtest()
            except AssertionError:
                pass
            return list(judge.RECORDER.calls)
        finally:
            judge.RECORDER.stop()
            torch.manual_seed, torch.random.manual_seed = originals

    return run


def pytest_configure(config):
    if not config.pluginmanager.has_plugin("mamba-peer-runtest"):
        config.pluginmanager.register(RuntestHooks(), "mamba-peer-runtest")


def pytest_terminal_summary(terminalreporter, config):
    parents = config.stash.get(_SUITES, {})
    if not parents:
        return
    first = next(iter(parents.values()))
    tr = terminalreporter
    tr.section("mamba_ssm peer suites")
    tr.line(f"upstream tests: {first.upstream.origin}; mamba_ssm from {first.upstream.src}")
    tr.line(f"grid: {harness.grid()}; device: {harness.device()}; shard: "
            f"{os.environ.get(harness.SHARD_ENV, '0/1')}")
    judged = config.stash.get(_JUDGED, [])
    if judged:
        passed = sum(1 for _, v in judged if v.passed)
        beyond = sum(1 for _, v in judged if v.unjudgeable)
        tr.line(f"float64 judge: {len(judged)} upstream tolerance failures re-judged, {passed} "
                f"passed (counted apart from upstream passes), {beyond} beyond their dtype's range "
                f"(skipped, not judged), {len(judged) - passed - beyond} upheld; "
                f"criterion: fastpath's max_abs and rel_l2 from a float64 run <= "
                f"{judge.RATIO:g}x the same-dtype reference's (beyond it: the median over "
                f"{judge.RESAMPLES + 1} draws)")
        for nodeid, verdict in judged:
            word = "REJUDGED PASS" if verdict.passed else "BEYOND RANGE" if verdict.unjudgeable else "STILL FAILED"
            tr.line(f"  {word} {nodeid}")
            tr.line(f"    {verdict.assertion}")
            for line in verdict.lines():
                tr.line(f"    {line}")
    for parent in parents.values():
        for change in parent.grid_changes:
            if change.unused:
                tr.line(f"  {parent.name}::{change.function}: commented list for "
                        f"{change.argnames!r}, which the function does not vary: not used")
            elif change.wide != change.default:
                tr.line(f"  {parent.name}::{change.function} {change.argnames}: "
                        f"{change.default} -> {change.wide} values")
