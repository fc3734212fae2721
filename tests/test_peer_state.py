"""benchmarks/device/peer_state.py on a state folder built here: what a continued call keeps
(cases with a recorded outcome; with --rejudge not those the judge decided or that failed), and
the counts (one record per case, the latest call's; only cases on the done list; a case whose
XML was lost counted by its done line's outcome)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from repo_paths import BENCHMARKS

SCRIPT = BENCHMARKS / "device" / "peer_state.py"
PREFIX = "tests/peer/test_mamba_ssm_suites.py::test_x.py::"
VERDICT = json.dumps({"passed": True, "assertion": "test_x.py:9: assert torch.allclose(a, b)", "note": "",
                      "tensors": [{"tensor": "out", "dtype": "float16", "ok": True, "draws": [],
                                   "fastpath": {"max_abs": 1.0, "rel_l2": 0.1},
                                   "reference": {"max_abs": 1.0, "rel_l2": 0.1}}]})


def _case(name: str, kind: str) -> str:
    judged = f'<properties><property name="float64_judge" value="{VERDICT.replace(chr(34), "&quot;")}"/></properties>'
    inner = {"passed": "", "failed": '<failure message="boom"/>', "skipped": '<skipped message="s"/>',
             "judged": judged, "beyond": judged + '<skipped message="float64 judge: beyond its range"/>',
             "oom": '<failure message="torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 256 MiB"/>'}[kind]
    return f'<testcase classname="tests.peer.test_mamba_ssm_suites.test_x.py" name="{name}">{inner}</testcase>'


def _xml(path: Path, cases: dict[str, str]) -> None:
    own = '<testcase classname="tests.peer.test_mamba_ssm_suites" name="test_harness_itself"/>'
    body = "".join(_case(n, k) for n, k in cases.items())
    path.write_text(f'<?xml version="1.0"?><testsuites><testsuite name="pytest">{own}{body}</testsuite></testsuites>')


def _state(folder: Path) -> None:
    _xml(folder / "wide_100_0.xml", {"test_a[1]": "passed", "test_b[1]": "failed", "test_j[1]": "judged",
                                     "test_stale[1]": "judged"})
    _xml(folder / "wide_200_0.xml", {"test_b[1]": "passed", "test_s[1]": "skipped", "test_gone[1]": "passed"})
    (folder / "wide_100_1.xml").write_text("<testsuites><testsuite")  # killed mid-write: unreadable
    done = [f"{PREFIX}test_a[1]\tpassed", f"{PREFIX}test_b[1]\tpassed", f"{PREFIX}test_j[1]\tpassed_float64_judge",
            f"{PREFIX}test_s[1]\tskipped", f"{PREFIX}test_lost[1]\tpassed", f"{PREFIX}test_lostfail[1]\tfailed",
            f"{PREFIX}test_bare[1]", f"{PREFIX}test_unknown[1]\tunknown", f"{PREFIX}test_a[1]\tpassed",
            f"{PREFIX}test_stale[1]\tfailed"]  # run again since its XML record; that run's XML lost
    (folder / "wide_done.txt").write_text("\n".join(done) + "\n")
    (folder / "wide_judged.jsonl").write_text(json.dumps({"nodeid": f"{PREFIX}test_j[1]", "passed": True}) + "\n")
    (folder / "wide_collect.txt").write_text("20/21 tests collected (1 deselected) in 0.1s\n")


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=60)


def _done(folder: Path) -> list[str]:
    return [line.split("\t")[0].removeprefix(PREFIX) for line in (folder / "wide_done.txt").read_text().splitlines()]


def test_the_counts_take_each_cases_latest_record_and_only_cases_on_the_done_list(tmp_path):
    _state(tmp_path)
    proc = _run("summary", str(tmp_path), "wide")
    assert proc.returncode == 0, proc.stderr
    s = json.loads((tmp_path / "summary.json").read_text())["wide"]
    # a, b (its later pass), j (judged), s (skipped) from the XML; lost, lostfail and stale (its
    # done line outranks its older XML record) from the done list
    assert (s["passed"], s["passed_float64_judge"], s["failed"], s["skipped"]) == (3, 1, 2, 1), s
    assert s["ran"] == 7 and s["counted_from_done_list"] == 3 and s["expected"] == 20 and s["not_run"] == 13
    assert s["failures"] == [f"test_x.py::{t}[1] (outcome from the done list; no XML of that run)"
                             for t in ("test_stale", "test_lostfail")], s["failures"]
    assert [j["case"] for j in s["float64_judge"]] == ["test_x.py::test_j[1]"]
    assert "7 ran: 3 passed, 1 passed only by the float64 judge, 2 failed" in proc.stdout
    assert "3 of them counted from the done list" in proc.stdout


def test_not_run_counts_only_this_calls_collection(tmp_path):
    """A seeded state holds cases of a wider collection than a narrowed call's (-k): NOT RUN is
    the collection's cases with no outcome, never a negative difference of the two counts."""
    _state(tmp_path)
    listed = [f"{PREFIX}test_a[1]", f"{PREFIX}test_new[1]"]
    (tmp_path / "wide_collect.txt").write_text("\n".join(listed) + "\n\n2/21 tests collected (19 deselected) in 0.1s\n")
    proc = _run("summary", str(tmp_path), "wide")
    assert proc.returncode == 0, proc.stderr
    s = json.loads((tmp_path / "summary.json").read_text())["wide"]
    assert s["expected"] == 2 and s["ran"] == 7 and s["not_run"] == 1, s
    assert "1 NOT RUN" in proc.stdout and "-" not in proc.stdout.split("NOT RUN")[0].split(",")[-1]


def test_adopt_reruns_cases_with_no_recorded_outcome(tmp_path):
    _state(tmp_path)
    proc = _run("adopt", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert _done(tmp_path) == ["test_a[1]", "test_b[1]", "test_j[1]", "test_s[1]", "test_lost[1]", "test_lostfail[1]",
                               "test_stale[1]"]
    assert "7 finished cases stand, 2 with no recorded outcome run again" in proc.stdout
    assert (tmp_path / "wide_judged.jsonl").read_text()  # the judge's log stays when it did not change


def test_adopt_rejudge_also_reruns_what_the_judge_decided_or_what_failed(tmp_path):
    _state(tmp_path)
    proc = _run("adopt", str(tmp_path), "--rejudge")
    assert proc.returncode == 0, proc.stderr
    assert _done(tmp_path) == ["test_a[1]", "test_b[1]", "test_s[1]", "test_lost[1]"]
    assert (tmp_path / "wide_judged.jsonl").read_text() == ""
    assert "3 the judge decided (or that failed) run again under this judge" in proc.stdout
    lines = (tmp_path / "wide_done.txt").read_text().splitlines()
    assert lines[0] == f"{PREFIX}test_a[1]\tpassed"  # outcomes kept on the lines that stay



def test_a_case_beyond_its_dtypes_range_counts_apart_and_an_out_of_memory_failure_runs_again(tmp_path):
    """The judge's skip of a result beyond its dtype's range is its own count (not upstream's
    skips, not a pass); a case that ran out of GPU memory beside the other shards is listed as such
    and runs again in the next call, judge changed or not."""
    _xml(tmp_path / "wide_100_0.xml", {"test_r[1]": "beyond", "test_m[1]": "oom", "test_a[1]": "passed"})
    (tmp_path / "wide_done.txt").write_text("".join(f"{PREFIX}{n}[1]\t{o}\n" for n, o in (
        ("test_r", "skipped_beyond_range"), ("test_m", "failed"), ("test_a", "passed"))))
    proc = _run("summary", str(tmp_path), "wide")
    assert proc.returncode == 0, proc.stderr
    s = json.loads((tmp_path / "summary.json").read_text())["wide"]
    assert (s["passed"], s["skipped"], s["skipped_beyond_range"], s["failed"]) == (1, 0, 1, 1), s
    assert s["failures"] == ["test_x.py::test_m[1] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate "
                             "256 MiB (out of GPU memory beside the other shards: runs again)"]
    assert "1 skipped by the judge as beyond their dtype's range" in proc.stdout
    proc = _run("adopt", str(tmp_path))
    assert proc.returncode == 0 and "1 that ran out of GPU memory run again" in proc.stdout, proc.stdout
    assert _done(tmp_path) == ["test_r[1]", "test_a[1]"]
    proc = _run("adopt", str(tmp_path), "--rejudge")
    assert proc.returncode == 0, proc.stderr
    assert _done(tmp_path) == ["test_a[1]"]  # the judge's skip is the judge's decision: it reruns


def test_bad_arguments_are_one_line_exit_2(tmp_path):
    for args in ([], ["adopt"], ["summary", str(tmp_path)], ["adopt", str(tmp_path), "--force"],
                 ["adopt", str(tmp_path / "missing")], ["rejudge", str(tmp_path)]):
        proc = _run(*args)
        assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0, (args, proc.stderr)


def _peer_sh(tmp_path: Path, out: str, **env: str) -> subprocess.CompletedProcess:
    """benchmarks/device/peer.sh over the peer harness's fake upstream checkout, on the CPU
    (PEER_DEVICE=cpu, TRITON_INTERPRET=1), its state in tmp_path/state."""
    import os

    from repo_paths import ROOT

    sys.path.insert(0, str(ROOT / "tests" / "peer"))
    from test_mamba_ssm_suites import write_fake_upstream

    fake = tmp_path / "upstream"
    write_fake_upstream(fake)
    (fake / "UPSTREAM").write_text("fake checkout\n")
    shim = tmp_path / "bin"
    shim.mkdir(exist_ok=True)
    (shim / "python3").unlink(missing_ok=True)
    (shim / "python3").symlink_to(sys.executable)
    base = {k: v for k, v in os.environ.items() if not k.startswith(("PEER_", "MAMBA_"))}
    run_env = {**base, "PATH": f"{shim}{os.pathsep}{os.environ['PATH']}", "MAMBA_PEER_TESTS": str(fake),
               "PEER_DEVICE": "cpu", "TRITON_INTERPRET": "1", "PEER_STATE": str(tmp_path / "state"),
               "PEER_GRIDS": "wide", "PEER_WIDE_SHARDS": "1", "PEER_WIDE_TIMEOUT": "200",
               "TRITON_CACHE_DIR": str(tmp_path / "triton"), **env}
    return subprocess.run(["bash", str(BENCHMARKS / "device" / "peer.sh"), str(tmp_path / out)], cwd=ROOT,
                          env=run_env, capture_output=True, text=True, timeout=600)


def test_peer_sh_continues_a_state_by_its_key(tmp_path):
    """A first call, a resumed one (nothing left to run), a seed whose judge part differs (the
    judged and failed cases run again) and one whose cases part differs: the same sources under
    another scan switch (everything runs again)."""
    first = _peer_sh(tmp_path, "one")
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    key = (tmp_path / "one" / "peer" / "state_key.txt").read_text().split()
    assert [k.split("=")[0] for k in key] == ["cases", "judge"]
    summary = json.loads((tmp_path / "one" / "peer" / "summary.json").read_text())["wide"]
    assert (summary["passed"], summary["failed"]) == (3, 1), summary  # test_swapped x3, the lost context
    done = (tmp_path / "state" / "wide_done.txt").read_text().splitlines()
    assert len(done) == 4 and all("\t" in line for line in done), done

    again = _peer_sh(tmp_path, "two", PEER_RESUME="1")
    assert "4 finished cases stand, 0 with no recorded outcome run again" in again.stdout, again.stdout
    assert "4 done before" in again.stdout, again.stdout
    seed = tmp_path / "one" / "peer"
    # a repeated seeding command on the warm machine continues its state (5 cases done after call
    # two), not the seed's (the 4 of call one)
    both = _peer_sh(tmp_path, "two-b", PEER_RESUME="1", PEER_SEED=str(seed))
    assert f"peer: seed {seed} not taken: PEER_RESUME=1 continues this machine's own state" in both.stdout, \
        both.stdout
    assert "5 done before" in both.stdout, both.stdout

    (seed / "state_key.txt").write_text(f"{key[0]} judge=another\n")
    rejudged = _peer_sh(tmp_path, "three", PEER_SEED=str(seed))
    assert "3 finished cases stand, 0 with no recorded outcome run again, 1 the judge decided" in rejudged.stdout, \
        rejudged.stdout
    # the same sources under another backward (a scan switch) are other cases: every case runs again
    (seed / "state_key.txt").write_text(" ".join(key) + "\n")
    fresh = _peer_sh(tmp_path, "four", PEER_SEED=str(seed), FASTPATH_SSCAN_BWD="seq")
    assert "NOT continuing" in fresh.stdout and "0 done before" in fresh.stdout, fresh.stdout
    assert (tmp_path / "four" / "peer" / "state_key.txt").read_text().split()[0] != key[0]


def _key(tree: Path, upstream: Path, **env: str) -> list[str]:
    """`peer.sh --key` run from `tree` (a copy of the keyed sources)."""
    import os

    base = {k: v for k, v in os.environ.items() if not k.startswith(("PEER_", "FASTPATH_SSCAN_"))}
    proc = subprocess.run(["bash", str(BENCHMARKS / "device" / "peer.sh"), "--key"], cwd=tree,
                          env={**base, "MAMBA_PEER_TESTS": str(upstream), **env},
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    return proc.stdout.split()


def test_peer_key_covers_code_not_comments(tmp_path):
    """The state's key over a copy of the keyed sources: a full-line comment changed or added
    keeps it (a finished grid survives a corrected comment); a line of code, the judge's files,
    a scan switch or the upstream commit change their part; --key writes nothing."""
    import shutil

    from repo_paths import ROOT

    tree = tmp_path / "tree"
    for part in ("src/fastpath/kernels", "src/fastpath/causal_conv1d", "tests/peer"):
        shutil.copytree(ROOT / part, tree / part, ignore=shutil.ignore_patterns("__pycache__"))
    upstream = tmp_path / "upstream"
    upstream.mkdir()
    (upstream / "UPSTREAM").write_text("commit one\n")
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    key = _key(tree, upstream)
    assert [k.split("=")[0] for k in key] == ["cases", "judge"], key
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before

    kernel = tree / "src/fastpath/kernels/selective_scan/fwd_tile.py"
    text = kernel.read_text()
    first_comment = next(line for line in text.splitlines() if line.startswith("# "))
    kernel.write_text(text.replace(first_comment, "# reworded", 1) + "    # added, indented\n")
    assert _key(tree, upstream) == key
    kernel.write_text(text + "EXTRA = 1\n")
    code_key = _key(tree, upstream)
    assert code_key[0] != key[0] and code_key[1] == key[1]
    kernel.write_text(text)
    assert _key(tree, upstream, FASTPATH_SSCAN_FWD="tile")[0] != key[0]
    (upstream / "UPSTREAM").write_text("commit two\n")
    assert _key(tree, upstream)[0] != key[0]
    (upstream / "UPSTREAM").write_text("commit one\n")
    judge = tree / "tests/peer/float64_judge.py"
    judge.write_text(judge.read_text() + "EXTRA = 1\n")
    judged = _key(tree, upstream)
    assert judged[0] == key[0] and judged[1] != key[1]
