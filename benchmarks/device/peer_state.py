"""The peer grid's state between calls and its counts (benchmarks/device/peer.sh calls this).

A state folder holds, per grid: <grid>_done.txt (one "node id<TAB>outcome" line per finished
case; a bare node id in states written before outcomes were kept), the JUnit XML and log of every
call (<grid>_<call>_<shard>.{xml,txt}, <call> = the call's start in epoch seconds) and
<grid>_judged.jsonl (one line per case the float64 judge decided).

    python3 benchmarks/device/peer_state.py adopt FOLDER [--rejudge]
        before a call continues the state: a case in <grid>_done.txt with no outcome there and
        none in any XML (its process was killed before pytest wrote the XML) leaves the list, to
        run again, and so does a case that failed for want of GPU memory (the shards share one
        GPU: an out-of-memory error says nothing of the kernels). With --rejudge (the judge
        changed, the kernels did not) so does every case the judge decided and every failed or
        errored case (and their <grid>_judged.jsonl lines); the rest stands.
    python3 benchmarks/device/peer_state.py summary FOLDER GRID...
        counts per grid and per upstream test function from the XML: a case recorded by several
        calls counts once, as its latest call left it; only cases in FOLDER/<grid>_done.txt count
        (when it is there), so a record an adopt --rejudge set aside does not; a done case that no
        XML holds, or whose XML record says otherwise, counts by its done line's outcome. Expected
        counts from FOLDER/<grid>_collect.txt (pytest --collect-only): a case counted nowhere did
        not run. A case the judge skipped as beyond its dtype's range (tests/peer/float64_judge.py)
        counts as skipped_beyond_range, apart from upstream's own skips; a failure for want of GPU
        memory is listed as such. Writes FOLDER/summary.json, then prints the table.
"""

from __future__ import annotations

import collections
import json
import re
import statistics
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

SUITES_FILE = "tests/peer/test_mamba_ssm_suites.py"
_XML = re.compile(r"^(?P<grid>[a-z]+)_(?P<call>\d+)_(?P<shard>\d+)\.xml$")
_CLASS_PREFIX = SUITES_FILE[:-3].replace("/", ".") + "."
BEYOND_RANGE = "skipped_beyond_range"  # tests/peer/conftest.py's outcome for such a case
OUTCOMES = ("passed", "passed_float64_judge", "failed", "error", "skipped", BEYOND_RANGE)
JUDGED_OR_FAILED = ("passed_float64_judge", "failed", "error", BEYOND_RANGE)
_OOM = re.compile(r"out of memory|OutOfMemoryError", re.IGNORECASE)


def node_id(case: ET.Element) -> str | None:
    """The pytest node id of an upstream case's JUnit testcase (as PEER_DONE lists them); None for
    the harness's own tests in the same file."""
    classname = case.get("classname", "")
    if not classname.startswith(_CLASS_PREFIX):
        return None
    return f"{SUITES_FILE}::{classname.removeprefix(_CLASS_PREFIX)}::{case.get('name', '')}"


def latest_cases(folder: Path, grid: str) -> dict[str, ET.Element]:
    """node id -> its testcase element in the latest call's XML that has it."""
    found = []
    for path in folder.glob(f"{grid}_*_*.xml"):
        m = _XML.match(path.name)
        if m and m["grid"] == grid:
            found.append((int(m["call"]), int(m["shard"]), path))
    cases: dict[str, ET.Element] = {}
    for _, _, path in sorted(found):
        try:
            root = ET.parse(path).getroot()
        except ET.ParseError:  # a process killed while writing: its cases count by their done lines
            continue
        for case in root.iter("testcase"):
            nodeid = node_id(case)
            if nodeid is not None:
                cases[nodeid] = case
    return cases


def outcome(case: ET.Element) -> tuple[str, dict[str, Any] | None]:
    """One of OUTCOMES, and the judge's verdict if any."""
    tags = [child.tag for child in case if child.tag in ("failure", "error", "skipped")]
    kind = {"failure": "failed", "error": "error", "skipped": "skipped"}.get(tags[0] if tags else "", "passed")
    verdict = next((json.loads(p.get("value", "null")) for p in case.iter("property")
                    if p.get("name") == "float64_judge"), None)
    if verdict is not None and kind in ("passed", "skipped"):
        kind = "passed_float64_judge" if kind == "passed" else BEYOND_RANGE
    return kind, verdict


def out_of_memory(case: ET.Element) -> bool:
    """A failed or errored case whose error (or the judge's note on it) is a GPU out-of-memory."""
    kind, verdict = outcome(case)
    if kind not in ("failed", "error"):
        return False
    element = case.find("failure" if kind == "failed" else "error")
    text = "" if element is None else f"{element.get('message', '')}\n{element.text or ''}"
    return bool(_OOM.search(text) or _OOM.search((verdict or {}).get("note", "")))


def done_list(path: Path) -> dict[str, str | None]:
    """node id -> outcome (None where the line has none), first line of a node id wins."""
    done: dict[str, str | None] = {}
    for line in path.read_text().splitlines() if path.is_file() else []:
        nodeid, _, outcome = line.strip().partition("\t")
        if nodeid and nodeid not in done:
            done[nodeid] = outcome if outcome and outcome != "unknown" else None
    return done


def _line(nodeid: str, outcome: str | None) -> str:
    return f"{nodeid}\t{outcome}\n" if outcome else f"{nodeid}\n"


def grids_in(folder: Path) -> list[str]:
    return sorted(p.name.removesuffix("_done.txt") for p in folder.glob("*_done.txt"))


def adopt(folder: Path, rejudge: bool) -> int:
    """Drop from every grid's done list the cases no XML records and, with `rejudge`, those whose
    outcome the judge decided or that failed."""
    kept_n = unrecorded_n = again_n = oom_n = 0
    for grid in grids_in(folder):
        cases = latest_cases(folder, grid)
        again = {n for n, case in cases.items() if out_of_memory(case)}
        oom_n += len(again)
        judged = folder / f"{grid}_judged.jsonl"
        if rejudge:
            if judged.is_file():
                for line in judged.read_text().splitlines():
                    try:
                        again.add(json.loads(line)["nodeid"])
                    except (ValueError, KeyError, TypeError):
                        continue
                judged.write_text("")
            for nodeid, case in cases.items():
                kind, verdict = outcome(case)
                if verdict is not None or kind in ("failed", "error"):
                    again.add(nodeid)
        path = folder / f"{grid}_done.txt"
        done = done_list(path)
        if rejudge:
            again |= {n for n, o in done.items() if n not in cases and o in JUDGED_OR_FAILED}
        recorded = {n for n, o in done.items() if n in cases or o is not None}
        kept = [n for n in done if n in recorded and n not in again]
        path.write_text("".join(_line(n, done[n]) for n in kept))
        kept_n += len(kept)
        unrecorded_n += len(done) - len(recorded)
        again_n += sum(1 for n in done if n in recorded and n in again)
    why = f", {again_n} the judge decided (or that failed) run again under this judge" if rejudge else ""
    oom = f", {oom_n} that ran out of GPU memory run again" if oom_n and not rejudge else ""
    print(f"peer: continuing: {kept_n} finished cases stand, {unrecorded_n} with no recorded outcome "
          f"run again{why}{oom}")
    return 0


def _expected(folder: Path, grid: str) -> tuple[int | None, set[str]]:
    """This call's collection: its count and the node ids `pytest --collect-only -q` listed (a
    seeded state may hold cases of a wider -k than this call's)."""
    try:
        text = (folder / f"{grid}_collect.txt").read_text()
        count = int(re.findall(r"(\d+)(?:/\d+)? tests? collected", text)[-1])
    except (OSError, IndexError, ValueError):
        return None, set()
    return count, {line.strip() for line in text.splitlines() if "::" in line and " " not in line.strip()}


def summarize(folder: Path, grid: str) -> dict[str, Any]:
    counts: collections.Counter = collections.Counter()
    per_test: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    failures, judged = [], []
    cases: dict[str, ET.Element | str] = dict(latest_cases(folder, grid))
    path = folder / f"{grid}_done.txt"
    if path.is_file():
        done = done_list(path)
        # a done line's outcome is the latest word on its case: an XML record that disagrees is an
        # earlier call's (set aside by adopt --rejudge, run again since, the new XML lost)
        cases = {k: (done[k] if done[k] is not None and outcome(v)[0] != done[k] else v)
                 for k, v in cases.items() if k in done}
        cases.update({n: o for n, o in done.items() if n not in cases and o is not None})
    lost = 0
    for nodeid, case in cases.items():
        suite, name = nodeid.split("::")[1:3]
        test = f"{suite}::{name.split('[')[0]}"
        label = f"{test}[{name.split('[', 1)[-1]}" if "[" in name else test
        if isinstance(case, str):  # its process's XML was lost: the done list's outcome
            lost += 1
            if case in ("failed", "error"):
                failures.append(f"{label} (outcome from the done list; no XML of that run)")
            counts[case] += 1
            per_test[test][case] += 1
            continue
        kind, verdict = outcome(case)
        counts[kind] += 1
        per_test[test][kind] += 1
        if verdict is not None:
            judged.append({"case": label, "outcome": kind, "assertion": verdict.get("assertion", ""),
                           "note": verdict.get("note", ""), "tensors": verdict.get("tensors", [])})
        if kind in ("failed", "error"):
            element = case.find("failure" if kind == "failed" else "error")
            message = (element.get("message", "") if element is not None else "")[:160]
            why = (" (out of GPU memory beside the other shards: runs again)" if out_of_memory(case)
                   else " (float64 judge upheld it)" if verdict else "")
            failures.append(f"{label} {message}{why}")
    expected, collected = _expected(folder, grid)
    ran = sum(counts.values())
    if collected:  # the collection's cases with no outcome (the state may hold more than it)
        not_run = len(collected - cases.keys())
    else:
        not_run = None if expected is None else max(0, expected - ran)
    return {"expected": expected, "ran": ran, "counted_from_done_list": lost,
            **{k: counts[k] for k in OUTCOMES},
            "not_run": not_run,
            "per_test": {t: dict(c) for t, c in sorted(per_test.items())},
            "failures": failures, "float64_judge": judged}


def _word(tensor: dict[str, Any]) -> str:
    if tensor.get("beyond_range"):
        return f"BEYOND ITS DTYPE'S RANGE (exact result reaches {tensor['beyond_range']:.3g})"
    return "ok" if tensor["ok"] else "WORSE"


def print_summary(grid: str, s: dict[str, Any]) -> None:
    not_run = f", {s['not_run']} NOT RUN" if s["not_run"] else ""
    print(f"peer {grid}: {s['expected']} collected, {s['ran']} ran: {s['passed']} passed, "
          f"{s['passed_float64_judge']} passed only by the float64 judge, {s['failed']} failed, "
          f"{s['error']} errors, {s['skipped']} skipped, {s.get(BEYOND_RANGE, 0)} skipped by the judge as "
          f"beyond their dtype's range{not_run}")
    if s.get("counted_from_done_list"):
        print(f"  {s['counted_from_done_list']} of them counted from the done list (their process's XML was lost)")
    for test, c in s["per_test"].items():
        print(f"  {test}: " + ", ".join(f"{k} {v}" for k, v in sorted(c.items())))
    for line in s["failures"][:15]:
        print(f"  FAIL {line}")
    for j in s["float64_judge"]:  # every re-judged case, with fastpath's and the reference's distances
        print(f"  JUDGED {j['outcome']} {j['case']}  <- {j['assertion']}")
        for t in j["tensors"]:
            f, r = t["fastpath"], t["reference"]
            draws = t.get("draws") or []
            median = (f" | {len(draws)} draws, median ratio {statistics.median(a for a, _ in draws):.2f}"
                      f"/{statistics.median(b for _, b in draws):.2f}") if draws else ""
            print(f"    {t['tensor']} ({t['dtype']}): fastpath max_abs {f['max_abs']:.3g} rel_l2 "
                  f"{f['rel_l2']:.3g} | reference max_abs {r['max_abs']:.3g} rel_l2 "
                  f"{r['rel_l2']:.3g} | {_word(t)}{median}")
        if j["note"]:
            print(f"    {j['note']}")


def main(argv: list[str]) -> int:
    usage = "usage: peer_state.py adopt FOLDER [--rejudge] | summary FOLDER GRID..."
    if (len(argv) < 2 or argv[0] not in ("adopt", "summary") or (argv[0] == "summary" and len(argv) < 3)
            or (argv[0] == "adopt" and argv[2:] not in ([], ["--rejudge"]))):
        print(usage, file=sys.stderr)
        return 2
    folder = Path(argv[1])
    if not folder.is_dir():
        print(f"peer_state.py: {folder} is not a folder", file=sys.stderr)
        return 2
    if argv[0] == "adopt":
        return adopt(folder, rejudge=argv[2:] == ["--rejudge"])
    summary = {grid: summarize(folder, grid) for grid in argv[2:]}
    (folder / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")  # before any printing
    for grid, counts in summary.items():
        print_summary(grid, counts)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
