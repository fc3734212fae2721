"""SIGINT, SIGTERM and SIGHUP clean up alike. `timeout 3 fastpath doctor --hosts
fleet.txt --timeout 100` left ten `sleep` targets orphaned (PPID 1); CI cancellations send
SIGTERM. Every target's process group is killed, the doctor exits 128+signal with one line, and
asyncio prints nothing after the interrupt. A cancellation that lands while a target is being
started, or a second one during the cleanup, must not hang the run, leave a target behind, or
let a target be reaped behind asyncio's child watcher ("Unknown child process")."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from hostile_fakes import env


def _sleepers(tag: str) -> list[int]:
    """pids of live processes whose command line carries `tag`."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                cmdline = fh.read()
            with open(f"/proc/{entry}/stat") as fh:
                state = fh.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if tag.encode() in cmdline and state != "Z":
            out.append(int(entry))
    return out


def _children(pids: list[int]) -> list[int]:
    out = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/task/{pid}/children") as fh:
                out += [int(p) for p in fh.read().split()]
        except OSError:
            continue
    return out


def _wait_for(predicate, timeout: float) -> bool:  # type: ignore[no-untyped-def]
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.1)
    return predicate()


@pytest.mark.parametrize(("sig", "mode"), [(signal.SIGTERM, "hosts"), (signal.SIGHUP, "hosts"),
                                           (signal.SIGINT, "hosts"), (signal.SIGTERM, "on")])
def test_signal_kills_every_target(tmp_path: Path, sig: signal.Signals, mode: str) -> None:
    tag = f"fastpath-hostile-{uuid.uuid4().hex[:12]}"
    # each target: a shell that leaves a `sleep` child (the shape of ssh -> remote command)
    prefix = f"sh -c 'sleep 1000; :' {tag}"  # the tag is the shell's $0: only the shell has it
    if mode == "hosts":
        hosts = tmp_path / "fleet.txt"
        hosts.write_text(f"{prefix}\n" * 10)
        args = ["--hosts", str(hosts)]
        expected = 10
    else:
        args = ["--on", prefix]
        expected = 1
    # default dispositions, also when this test runs with SIGINT ignored (a background job)
    proc = subprocess.Popen([sys.executable, "-m", "fastpath", "doctor", *args, "--timeout", "100"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env(),
                            preexec_fn=lambda: signal.signal(sig, signal.SIG_DFL))
    def started() -> bool:
        shells = _sleepers(tag)
        return len(shells) >= expected and len(_children(shells)) >= expected

    shells: list[int] = []
    try:
        assert _wait_for(started, 60), "targets did not start"
        shells = _sleepers(tag)
        children = _children(shells)
        proc.send_signal(sig)
        _out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
        leftovers = [pid for pid in shells if os.path.exists(f"/proc/{pid}")]
        for pid in leftovers:  # this test's own targets (each leads its process group)
            try:
                os.killpg(pid, signal.SIGKILL)
            except OSError:
                pass
    assert proc.returncode == (130 if sig == signal.SIGINT else 128 + sig), err.decode()
    text = err.decode()
    assert "Traceback" not in text and "Unknown child process" not in text, text
    assert f"interrupted by {sig.name}; every target was stopped" in text, text  # one path for all
    assert "loop is closed" not in text.lower() and "Task was destroyed" not in text, text
    assert len(text.strip().splitlines()) <= (2 if mode == "hosts" else 1), text
    # nothing left: neither the shells nor their sleep children (no PPID-1 orphans)
    assert _wait_for(lambda: not _sleepers(tag), 10), "targets left running"
    assert _wait_for(lambda: not any(os.path.exists(f"/proc/{c}") and
                                     open(f"/proc/{c}/stat").read().rsplit(")", 1)[1].split()[0]
                                     != "Z" for c in children), 10), "orphaned children"


@pytest.mark.parametrize("how", ["timeout", "cancel"])
def test_unread_stdin_leaves_no_asyncio_noise(how: str) -> None:
    """A target that never reads its stdin, sent a little more than a pipe holds (the probe is
    over 64 KiB; the rest stays in asyncio's buffer, below its flow-control mark), then stopped by the timeout or by a cancellation (what SIGTERM does): asyncio logged
    InvalidStateError from pipe_connection_lost, because the stdin-closed future had been
    cancelled with the task awaiting it."""
    code = f"""
import asyncio
from fastpath.doctor.remote import run_command

async def main():
    work = run_command(["sh", "-c", "sleep 1000"], b"x" * 70_000, timeout=1.0)
    if {how!r} == "timeout":
        assert (await work).timed_out
        return
    task = asyncio.ensure_future(work)
    await asyncio.sleep(0.5)
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        pass

asyncio.run(main())
print("done")
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env(), timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == "done", proc.stderr
    assert proc.stderr == "", proc.stderr


def test_ignored_signal_stays_ignored(tmp_path: Path) -> None:
    """Under nohup (SIGHUP ignored) a closed terminal does not stop the fleet; SIGTERM still does."""
    tag = f"fastpath-hostile-{uuid.uuid4().hex[:12]}"
    hosts = tmp_path / "fleet.txt"
    hosts.write_text(f"sh -c 'sleep 1000; :' {tag}\n" * 2)
    proc = subprocess.Popen(
        [sys.executable, "-m", "fastpath", "doctor", "--hosts", str(hosts), "--timeout", "100"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env(),
        preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN))
    shells: list[int] = []
    try:
        assert _wait_for(lambda: len(_sleepers(tag)) >= 2, 60), "targets did not start"
        shells = _sleepers(tag)
        proc.send_signal(signal.SIGHUP)
        time.sleep(1.0)
        assert proc.poll() is None, proc.communicate()[1].decode()
        proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
        for pid in shells:
            try:
                os.killpg(pid, signal.SIGKILL)
            except OSError:
                pass
    assert proc.returncode == 128 + signal.SIGTERM, err.decode()
    assert _wait_for(lambda: not _sleepers(tag), 10), "targets left running"


def _leftovers(marker: str) -> list[int]:
    """pids of live processes whose argv carries `marker` (not ourselves)."""
    return [pid for pid in _sleepers(marker) if pid != os.getpid()]


def _run_fresh(code: str, marker: str) -> subprocess.CompletedProcess[str]:
    """Run `code` in a fresh interpreter; kill whatever it left carrying `marker` afterwards."""
    try:
        return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              env=env(), timeout=60)
    finally:
        left = _leftovers(marker)
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        assert not left, f"{len(left)} target processes left running"


def test_cancel_while_the_target_starts() -> None:
    """The child runs before its pipes are connected. Cancelled in between, asyncio's own cleanup
    killed only the shell, then (before Python 3.12) waited for the pipes its `sleep` child still
    held: the run hung and the child lived on. Here the loop is kept busy meanwhile, so the shell
    has started its child by the time the cancellation lands, after 1 to 4 loop turns."""
    marker = f"1000.{uuid.uuid4().int % 10**9}"
    code = f"""
import asyncio, time
from fastpath.doctor.remote import run_command

async def main():
    for turns in range(1, 5):
        task = asyncio.ensure_future(run_command(["sh", "-c", "sleep {marker} & wait"], b"", 100))
        for _ in range(turns):
            await asyncio.sleep(0)
        time.sleep(0.1)
        task.cancel()
        try:
            await asyncio.wait_for(asyncio.shield(task), 10)
        except asyncio.CancelledError:
            continue
        except asyncio.TimeoutError:
            print("hung after", turns, "turns")
            return

asyncio.run(main())
print("done")
"""
    proc = _run_fresh(code, marker)
    assert proc.returncode == 0 and proc.stdout.strip() == "done", proc.stdout + proc.stderr
    assert proc.stderr == "", proc.stderr


def test_second_cancellation_still_reaps_through_asyncio() -> None:
    """gather() ends at its first cancelled run and asyncio.run cancels the others again at exit.
    Their cleanup was cut short and the transport's close() polled (waitpid) the killed target;
    with the child watcher late, as on a loaded machine, the poll took the exit status and asyncio
    logged "Unknown child process pid N, will report returncode 255". The watcher's blocking
    waitpid is delayed here, a little more for each target, so that window is always open."""
    marker = f"1000.{uuid.uuid4().int % 10**9}"
    code = f"""
import asyncio, itertools, os, time
from fastpath.doctor.remote import run_command

_waitpid = os.waitpid
_order = itertools.count()

def late_waitpid(pid, options):
    if options == 0:  # the child watcher's blocking wait
        late = 0.1 + 0.3 * next(_order)
        while True:
            try:
                with open(f"/proc/{{pid}}/stat") as fh:
                    if fh.read().rsplit(")", 1)[1].split()[0] == "Z":
                        break
            except OSError:
                break
            time.sleep(0.005)
        time.sleep(late)
    return _waitpid(pid, options)

os.waitpid = late_waitpid

async def main():
    runs = asyncio.gather(*(run_command(["sh", "-c", "sleep {marker}; :"], b"", 100)
                            for _ in range(4)))
    await asyncio.sleep(1.0)
    runs.cancel()
    try:
        await runs
    except asyncio.CancelledError:
        pass

asyncio.run(main())
time.sleep(1.5)  # a late watcher logs after the loop is gone
print("done")
"""
    proc = _run_fresh(code, marker)
    assert proc.returncode == 0 and proc.stdout.strip() == "done", proc.stdout + proc.stderr
    assert proc.stderr == "", proc.stderr
