"""Run the probe on another machine through an argv prefix: `ssh h`, `ssh h pct exec 200 --`,
`docker exec -i c`, `kubectl exec -i p --`, `env -i ...`.

Why an argv prefix and stdin: the prefix is split with shlex and executed directly (no local
shell, so a target name like `h;touch PWNED` is just a string), and the probe travels on stdin
to `python3 -`, so nothing is installed or written on the target and there is no nested quoting.
A target without Python gets the POSIX sh probe (`sh -s`) instead, which gathers the toolchain
facts it can and names the rest in probe.errors.

Each run is its own process group, killed as a whole on timeout, so a stuck target (or a
ProxyCommand, or a `pct exec` that never returns) never hangs the caller.

`probe_with_python` sends the probe the same way, on stdin to `python -`, to another interpreter
on this machine (a venv, a conda env): `--python` without `--on`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import shlex
import signal
import subprocess
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from fastpath.doctor.facts_check import check_facts
from fastpath.shared.errors import FastpathError, TargetError, UsageError
from fastpath.shared.plain_text import plain
from fastpath.shared.redact import redact_facts, redact_text

T = TypeVar("T")

DEFAULT_TIMEOUT = 60.0
# A facts report is a few tens of KiB (~100 KiB with a large environment); a target that sends
# more is not our probe talking: it is killed once it passes the cap, so its output costs bounded
# memory and no parsing time. stderr keeps only its tail (we show its last line).
MAX_OUTPUT_BYTES = 2 * 1024 * 1024
MAX_STDERR_BYTES = 64 * 1024
# Raw target output one fleet may hold at once, all targets together (16 targets each streaming
# 100 MB must not take gigabytes); a target's share is given back once its output is parsed.
FLEET_OUTPUT_BYTES = 64 * 1024 * 1024
# The probe's JSON travels between these lines, so login banners before it and noise after it
# (`.bashrc` echoes over ssh, motd, a `logout` line) are ignored. probe.py prints them when given
# --framed; probe.sh always does.
FRAME_BEGIN = b"--- fastpath facts begin ---"
FRAME_END = b"--- fastpath facts end ---"
# After the target command exits, how long to wait for its pipes to close (an ssh ControlPersist
# master forked into the background can hold stderr open forever).
PIPE_GRACE_S = 1.0
# Programs whose exit status 255 means "could not connect" rather than "the command failed".
_SSH_LIKE = frozenset({"ssh", "autossh", "dbclient"})
NO_PYTHON_REASON = "no python on target"


@dataclass
class CommandResult:
    """What one target command did: exit status (None if killed on timeout) and its output.
    overflow: it sent more than its share of output bytes and was killed for it."""

    returncode: int | None
    stdout: bytes
    stderr: bytes
    timed_out: bool
    seconds: float
    overflow: bool = False


def parse_prefix(prefix: str | list[str] | tuple[str, ...]) -> list[str]:
    """Split a target prefix the way a shell would (quotes, escapes) without running a shell."""
    if isinstance(prefix, (list, tuple)):
        argv = [str(part) for part in prefix]
    else:
        try:
            argv = shlex.split(prefix)
        except ValueError as exc:
            raise UsageError(f"cannot split target prefix {plain(redact_text(prefix), 200)!r}: "
                             f"{exc}") from None
    if not argv:
        raise UsageError("empty target prefix (expected e.g. 'ssh host' or 'docker exec -i ctr')")
    return argv


# `TOOL exec` forwards stdin only with -i / --interactive (docker, podman, nerdctl) or -i / --stdin
# (kubectl, oc); without it the probe would read an empty stdin and print nothing.
_EXEC_TOOLS = {"docker", "podman", "nerdctl", "kubectl", "oc"}
_STDIN_LONG = ("--interactive", "--stdin")


def stdin_not_forwarded(argv: list[str]) -> str | None:
    """The `TOOL exec` in argv that would not pass the probe's stdin on, or None."""
    for i, word in enumerate(argv[:-1]):
        if os.path.basename(word) not in _EXEC_TOOLS or argv[i + 1] != "exec":
            continue
        for opt in argv[i + 2:]:
            if opt == "--":
                break
            if opt in _STDIN_LONG or opt.startswith(tuple(f"{o}=t" for o in _STDIN_LONG)):
                return None
            if opt.startswith("-") and not opt.startswith("--") and "i" in opt[1:]:
                return None
        return f"{os.path.basename(word)} exec"
    return None


def describe_prefix(argv: list[str]) -> str:
    """The prefix as one printable, secret-free, inert string (for tables and error messages)."""
    return plain(redact_text(shlex.join(argv)[:16384]))


# ssh flags that take a value (OpenSSH ssh(1) synopsis).
_SSH_VALUE_FLAGS = set("BbcDEeFIiJLlmOoPpQRSWw")


def target_label(argv: list[str]) -> str:
    """A short display name: `user@host:port rest...` for ssh prefixes, the prefix otherwise.

    Options such as `-i KEY -o ...` are dropped from the label (the full prefix stays in JSON).
    """
    if os.path.basename(argv[0]) not in _SSH_LIKE:
        return describe_prefix(argv)
    user = port = None
    rest: list[str] = []
    i = 1
    while i < len(argv):
        word = argv[i]
        if rest or word == "--" or not word.startswith("-") or len(word) < 2:
            if word != "--" or rest:
                rest.append(word)
            i += 1
            continue
        flag = word[1]
        value = word[2:] if len(word) > 2 else (argv[i + 1] if i + 1 < len(argv) else "")
        i += 1 if len(word) > 2 or flag not in _SSH_VALUE_FLAGS else 2
        if flag == "p":
            port = value
        elif flag == "l":
            user = value
    if not rest:
        return describe_prefix(argv)
    host = rest[0]
    if user and "@" not in host:
        host = f"{user}@{host}"
    if port:
        host = f"{host}:{port}"
    return plain(redact_text(shlex.join([host, *rest[1:]])[:16384]))


def _package_file(name: str) -> bytes:
    path = Path(__file__).with_name(name)
    try:
        return path.read_bytes()
    except OSError as exc:
        raise TargetError(f"cannot read the probe {path}: {exc.strerror}") from None


def probe_sources() -> tuple[bytes, bytes]:
    """(probe.py, probe.sh) as bytes, read once per call site; they are sent verbatim."""
    return _package_file("probe.py"), _package_file("probe.sh")


def _one_line(data: bytes, limit: int = 200) -> str:
    """Last non-empty line of a command's stderr, cleaned of control characters and secrets."""
    text = data[-8192:].decode("utf-8", "replace")
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        return ""
    return plain(redact_text(lines[-1][:4 * limit]), limit)


def positive_seconds(text: str) -> float:
    """A timeout argument: a finite number of seconds > 0 (argparse `type=`; `nan`, `inf`, 0 and
    words are usage errors, not a silent default)."""
    try:
        value = float(text)
    except (TypeError, ValueError):
        raise ValueError(f"not a number of seconds: {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"must be a finite number of seconds > 0, got {text!r}")
    return value


def positive_int(text: str) -> int:
    """A count argument (--jobs): an integer >= 1."""
    try:
        value = int(text)
    except (TypeError, ValueError):
        raise ValueError(f"not an integer: {text!r}") from None
    if value < 1:
        raise ValueError(f"must be at least 1, got {value}")
    return value


class OutputBudget:
    """Bytes of target output a run may still hold (shared by all targets of a fleet)."""

    def __init__(self, total: int = FLEET_OUTPUT_BYTES) -> None:
        self.left = total

    def take(self, n: int) -> bool:
        if n > self.left:
            return False
        self.left -= n
        return True

    def give(self, n: int) -> None:
        self.left += n


class Interrupted(FastpathError):
    """SIGINT / SIGTERM / SIGHUP arrived: every target's process group was killed before exiting."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"interrupted by {signal.Signals(signum).name}; every target was stopped")
        self.exit_code = 128 + signum


# The signals that stop a run: Ctrl-C, CI cancellation / `timeout`, a closed terminal.
STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP")
                     if hasattr(signal, name))
# How long a SIGKILLed target may take to be reaped before we stop waiting for it (a process in
# uninterruptible sleep dies only once its I/O returns).
REAP_WAIT_S = 5.0
# After a signal, how long interruptible waits for the other stopping tasks (each bounded by
# REAP_WAIT_S) before it reports.
STOPPING_WAIT_S = REAP_WAIT_S + 2.0
_POLL_S = 0.02


async def interruptible(work: Awaitable[T]) -> T:
    """Await `work` so that SIGINT, SIGTERM and SIGHUP all stop it the same way: the work is
    cancelled once, each run_command kills its target's process group and waits until asyncio has
    reaped it, and Interrupted (exit 128 + signal) is raised once every target is stopped.

    Why one handler for all three: asyncio.run's own Ctrl-C handling raises KeyboardInterrupt
    at the second Ctrl-C wherever the code happens to be, which can abandon a target half-stopped;
    here a repeated signal is only noted. Work that finishes all the same (it was done when the
    signal came) is returned as usual. A signal ignored on purpose (nohup, a background job)
    stays ignored."""
    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(work)
    got: list[int] = []

    def on_signal(signum: int) -> None:
        if not got and not task.done():
            got.append(signum)
            task.cancel()

    installed: list[tuple[int, Any]] = []
    for signum in STOP_SIGNALS:
        previous = signal.getsignal(signum)
        if previous is signal.SIG_IGN:
            continue
        try:
            loop.add_signal_handler(signum, on_signal, signum)
        except (NotImplementedError, RuntimeError, ValueError):
            continue  # not the main thread: the caller's own handling applies
        installed.append((signum, previous))
    try:
        try:
            return await task
        except BaseException:
            if not got:
                raise
        await _let_stopping_tasks_finish()
        raise Interrupted(got[0])
    finally:
        for signum, previous in installed:
            loop.remove_signal_handler(signum)
            if previous is not None:
                signal.signal(signum, previous)  # e.g. asyncio.run's own Ctrl-C handler


async def _let_stopping_tasks_finish() -> None:
    """Wait (bounded) for the cancelled tasks still cleaning up. gather() ends at its first
    cancelled child and leaves the others running; asyncio.run would then cancel them a second
    time, cutting short their wait for asyncio to reap their target."""
    me = asyncio.current_task()

    def stopping(t: asyncio.Task[Any]) -> bool:
        cancelling = getattr(t, "cancelling", None)  # Python 3.11+
        return cancelling is None or cancelling() > 0

    pending = [t for t in asyncio.all_tasks() if t is not me and not t.done() and stopping(t)]
    if pending:
        await asyncio.wait(pending, timeout=STOPPING_WAIT_S)


async def _wait_out(done: Callable[[], bool], timeout: float) -> bool:
    """Poll until done() or `timeout` seconds have passed, carrying on when cancelled meanwhile;
    returns whether a cancellation arrived. For cleanup: cut short (a second cancellation,
    asyncio.run cancelling every task at exit) it would leave a target running, or let asyncio's
    transport poll (waitpid) a child behind its own child watcher's back."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    cancelled = False
    while not done() and loop.time() < end:
        try:
            await asyncio.sleep(_POLL_S)
        except asyncio.CancelledError:
            cancelled = True
    return cancelled


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


async def _exited(proc: asyncio.subprocess.Process, timeout: float) -> bool:
    """Whether asyncio has reaped the process within `timeout` seconds.

    Polls returncode, which the loop's child watcher sets, so the process is reaped by asyncio
    alone. Not proc.wait(): before Python 3.12 it also waits for the pipes to close, which a
    daemonised grandchild (ssh ControlPersist master, `setsid cmd &`) can delay forever. Not
    wait_for(): before 3.12 it can swallow a cancellation that arrives as the process exits."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while proc.returncode is None:
        left = end - loop.time()
        if left <= 0:
            return False
        await asyncio.sleep(min(_POLL_S, left))
    return True


def _close_transport(proc: asyncio.subprocess.Process) -> None:
    """Close our pipe ends now, not in a __del__ that runs after the event loop is gone.

    Only once asyncio has reaped the process: closing the transport of a process not reaped yet
    polls it (waitpid) behind the child watcher's back, which then logs "Unknown child process".
    A process still running after REAP_WAIT_S only has its pipes closed."""
    transport = getattr(proc, "_transport", None)
    if transport is None:
        return
    if proc.returncode is not None:
        transport.close()
        return
    for fd in (0, 1, 2):
        pipe = transport.get_pipe_transport(fd)
        if pipe is not None:
            pipe.close()


async def _wind_up(proc: asyncio.subprocess.Process, tasks: list[asyncio.Future[Any]],
                   kill: bool = True) -> None:
    """End a run for good, also when cancelled meanwhile (that cancellation is raised after):
    kill its process group (unless already done), stop its feeding and reading tasks, wait
    (bounded) until asyncio has reaped it, then close its transport."""
    if kill:
        _kill_group(proc.pid)
    for task in tasks:
        task.cancel()
    cancelled = False
    if tasks:
        try:
            await asyncio.wait(tasks, timeout=REAP_WAIT_S)  # they end at their next loop turn
        except asyncio.CancelledError:
            cancelled = True
    cancelled |= await _wait_out(
        lambda: proc.returncode is not None and all(t.done() for t in tasks), REAP_WAIT_S)
    for task in tasks:
        if task.done() and not task.cancelled():
            task.exception()  # retrieved: the run's own outcome is what counts
    _close_transport(proc)
    if cancelled:
        raise asyncio.CancelledError


async def _spawn(argv: list[str]) -> asyncio.subprocess.Process:
    """create_subprocess_exec in a new session, with a cancellation handled like any other.

    The child runs as soon as it is forked; its pipes are connected afterwards. Cancelled in
    between, asyncio's own cleanup kills only that one process (its children live on) and, before
    Python 3.12, then waits for pipes those children still hold: the run hangs. So the creation
    runs in its own task, is let finish, and the whole group is stopped as on any cancellation."""
    creating = asyncio.ensure_future(asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
    ))
    try:
        return await asyncio.shield(creating)
    except asyncio.CancelledError:
        await _wait_out(creating.done, REAP_WAIT_S)
        if not creating.done():
            creating.cancel()  # never seen: connecting three pipes takes a few loop turns
        elif not creating.cancelled() and creating.exception() is None:
            with contextlib.suppress(asyncio.CancelledError):
                await _wind_up(creating.result(), [])
        raise
    except FileNotFoundError:
        raise TargetError(f"cannot run {plain(argv[0], 200)!r}: no such program on this machine") from None
    except PermissionError:
        raise TargetError(f"cannot run {plain(argv[0], 200)!r}: permission denied") from None
    except OSError as exc:
        raise TargetError(f"cannot run {plain(argv[0], 200)!r}: {exc.strerror}") from None


async def run_command(argv: list[str], stdin_data: bytes, timeout: float,
                      budget: OutputBudget | None = None) -> CommandResult:
    """Run argv (no shell) in a new process group, feed stdin, collect output, never hang.

    On timeout the whole process group is SIGKILLed and `timed_out` is set. Whatever the command
    left behind in its group after a normal exit is killed too, and so is the group when the run
    is cancelled (Ctrl-C, SIGTERM): it runs in its own session, so it did not get the signal.
    Either way the process is reaped by asyncio before this returns or raises. stdout is kept up
    to MAX_OUTPUT_BYTES (and what `budget` allows); a target sending more is killed (`overflow`).
    stderr keeps its last MAX_STDERR_BYTES.
    """
    loop = asyncio.get_running_loop()
    started = loop.time()
    deadline = started + timeout
    proc = await _spawn(argv)

    out = bytearray()
    err = bytearray()
    overflow = asyncio.Event()

    async def pump_out(stream: asyncio.StreamReader) -> None:
        while True:
            chunk = await stream.read(65536)
            if not chunk:
                return
            if len(out) + len(chunk) > MAX_OUTPUT_BYTES or (
                    budget is not None and not budget.take(len(chunk))):
                overflow.set()
                _kill_group(proc.pid)
                return
            out.extend(chunk)

    async def pump_err(stream: asyncio.StreamReader) -> None:
        while True:
            chunk = await stream.read(65536)
            if not chunk:
                return
            err.extend(chunk)
            if len(err) > MAX_STDERR_BYTES:
                del err[:len(err) - MAX_STDERR_BYTES]

    async def feed() -> None:
        assert proc.stdin is not None
        try:
            proc.stdin.write(stdin_data)
            await proc.stdin.drain()
            # No wait_closed(): it awaits the protocol's own stdin-closed future, and cancelling
            # this task (timeout, Ctrl-C, SIGTERM) cancels that future; when the killed target's
            # pipe then reports BrokenPipeError, asyncio sets an exception on the cancelled future
            # and logs InvalidStateError from pipe_connection_lost. That happens whenever part of
            # the probe (over 64 KiB, more than a pipe holds) is still buffered when the target
            # dies. The transport flushes and closes the pipe by itself after close().
            proc.stdin.close()
        except (BrokenPipeError, ConnectionResetError):
            pass  # the target exited without reading its stdin: its exit status tells why

    assert proc.stdout is not None and proc.stderr is not None
    feeder = asyncio.ensure_future(feed())
    readers = [asyncio.ensure_future(pump_out(proc.stdout)),
               asyncio.ensure_future(pump_err(proc.stderr))]

    killed = False
    try:
        timed_out = not await _exited(proc, max(0.0, deadline - loop.time()))
        _kill_group(proc.pid)
        killed = True
        if timed_out:
            await _exited(proc, REAP_WAIT_S)
        grace = min(PIPE_GRACE_S, max(0.05, deadline - loop.time())) if not timed_out else 0.2
        await asyncio.wait(readers, timeout=grace)
    finally:
        # also when cancelled, and once more cancelled while at it: no target is left running
        # or unreaped
        await _wind_up(proc, [feeder, *readers], kill=not killed)
    return CommandResult(
        returncode=None if timed_out else proc.returncode,
        stdout=bytes(out),
        stderr=bytes(err),
        timed_out=timed_out and not overflow.is_set(),
        seconds=loop.time() - started,
        overflow=overflow.is_set(),
    )


def _loads(data: bytes) -> Any:
    """json.loads that returns None instead of raising (bad JSON, or nesting so deep the decoder
    gives up with RecursionError); NaN/Infinity are read here and removed by check_facts."""
    try:
        return json.loads(data.decode("utf-8", "replace"))
    except (ValueError, RecursionError):
        return None


def parse_facts(stdout: bytes) -> dict[str, Any] | None:
    """The facts object in a probe's stdout, or None.

    The probe frames its JSON between FRAME_BEGIN and FRAME_END lines, so a login banner before
    it or noise after it is ignored. Older probes print one unframed JSON object: the whole output,
    else its last line starting with '{' (one attempt each, so 32 MB of '{' lines cost one failed
    parse, not one per line).
    """
    begin = stdout.rfind(FRAME_BEGIN)
    if begin >= 0:
        start = begin + len(FRAME_BEGIN)
        end = stdout.find(FRAME_END, start)
        obj = _loads(stdout[start:end if end >= 0 else len(stdout)])
        return obj if isinstance(obj, dict) else None
    text = stdout.strip()
    if not text:
        return None
    obj = _loads(text)
    if isinstance(obj, dict):
        return obj
    last_nl = text.rfind(b"\n")
    if last_nl >= 0 and text[last_nl + 1:].lstrip().startswith(b"{"):
        obj = _loads(text[last_nl + 1:])
        if isinstance(obj, dict):
            return obj
    return None


def arrived(facts: dict[str, Any]) -> dict[str, Any]:
    """Facts as they arrive from anywhere outside this process: checked against the schema
    (malformed parts named in probe.errors), then redacted."""
    return redact_facts(check_facts(facts))


def _failure_reason(argv: list[str], result: CommandResult, timeout: float) -> str:
    """One line saying why a target gave no facts."""
    if result.timed_out:
        return f"timed out after {timeout:g}s"
    if result.overflow:
        return (f"sent more than {MAX_OUTPUT_BYTES // (1024 * 1024)} MiB of output (or the "
                "fleet's output budget ran out): not a facts report")
    last = _one_line(result.stderr)
    if os.path.basename(argv[0]) in _SSH_LIKE and result.returncode == 255:
        return f"unreachable: {last or 'ssh exited with status 255'}"
    if result.returncode != 0:
        return f"exit {result.returncode}: {last or 'no output'}"
    if not result.stdout.strip():
        return f"no output{': ' + last if last else ''}"
    head = result.stdout[:2048].decode("utf-8", "replace").strip()
    return f"non-JSON output: {plain(redact_text(head[:400]), 80)!r}"


def _python_missing(result: CommandResult) -> bool:
    """Exit 127 (or 126 + 'not found'): the interpreter is not there, as shells, env, docker say it."""
    low = result.stderr.decode("utf-8", "replace").lower()
    if result.returncode == 127:
        return True
    return result.returncode in (1, 126) and (
        "not found" in low or "no such file" in low or "executable file not found" in low
    )


def _annotate(facts: dict[str, Any], label: str, seconds: float) -> dict[str, Any]:
    probe = facts.get("probe")
    if not isinstance(probe, dict):
        probe = {}
        facts["probe"] = probe
    probe["target"] = label
    probe["wall_seconds"] = round(seconds, 3)
    return facts


def _facts_from(result: CommandResult, budget: OutputBudget | None) -> dict[str, Any] | None:
    """Parse, check and redact one run's stdout, then give its bytes back to the budget."""
    try:
        facts = parse_facts(result.stdout)
        return arrived(facts) if facts is not None else None
    finally:
        if budget is not None:
            budget.give(len(result.stdout))


async def probe_target(
    prefix: str | list[str],
    *,
    python: str | None = None,
    timeout: float | None = None,
    sources: tuple[bytes, bytes] | None = None,
    static: bool = False,
    budget: OutputBudget | None = None,
) -> dict[str, Any]:
    """Gather one target's facts (checked and redacted); raise TargetError with a one-line reason.
    static: the probe imports nothing there (`python3 - --static`). Reading and checking what it
    sent counts against `timeout` too."""
    argv = parse_prefix(prefix)
    timeout = DEFAULT_TIMEOUT if timeout is None else float(timeout)
    if not math.isfinite(timeout) or timeout <= 0:
        raise UsageError(f"--timeout must be a finite number of seconds > 0, got {timeout:g}")
    probe_py, probe_sh = sources if sources is not None else probe_sources()
    label = describe_prefix(argv)
    tool = stdin_not_forwarded(argv)
    if tool is not None:
        raise UsageError(f"`{tool}` without -i does not pass stdin on, and the probe travels on "
                         f"stdin: add -i (e.g. '{tool} -i NAME')")
    interpreter = python or "python3"
    started = time.monotonic()

    def in_time(facts: dict[str, Any]) -> dict[str, Any]:
        seconds = time.monotonic() - started
        if seconds > timeout:
            raise TargetError(f"timed out after {timeout:g}s (reading its output)")
        return _annotate(facts, label, seconds)

    first = await run_command(
        [*argv, interpreter, "-", "--framed", *(["--static"] if static else [])],
        probe_py, timeout, budget)
    facts = _facts_from(first, budget)
    if facts is not None:
        return in_time(facts)
    reason = _failure_reason(argv, first, timeout)
    if first.timed_out or first.overflow or reason.startswith("unreachable"):
        raise TargetError(reason)

    # No usable Python there: the sh probe still gathers the toolchain facts.
    if _python_missing(first):
        why = NO_PYTHON_REASON if python is None else \
            f"python {plain(interpreter, 200)!r} not found on target"
    else:
        why = f"{plain(interpreter, 200)} on target failed ({reason})"
    remaining = timeout - (time.monotonic() - started)
    if remaining <= 0:
        raise TargetError(f"timed out after {timeout:g}s")
    second = await run_command([*argv, "sh", "-s"], probe_sh, remaining, budget)
    facts = _facts_from(second, budget)
    if facts is None:
        if second.timed_out:
            raise TargetError(f"timed out after {timeout:g}s")
        if second.overflow:
            raise TargetError(_failure_reason(argv, second, timeout))
        raise TargetError(reason)
    if isinstance(facts.get("probe"), dict):
        facts["probe"]["python_fallback"] = why  # the report's headline says the sh probe ran
    if why != NO_PYTHON_REASON:
        errors = facts["probe"]["errors"]
        for key, value in list(errors.items()):
            if isinstance(value, str):
                errors[key] = value.replace(NO_PYTHON_REASON, redact_text(why))
    return in_time(facts)


def probe_remote(
    prefix: str | list[str], python: str | None = None, timeout: float | None = DEFAULT_TIMEOUT,
    static: bool = False,
) -> dict[str, Any]:
    """Blocking form of `probe_target` for `fastpath doctor --on PREFIX` (SIGINT, SIGTERM and
    SIGHUP stop the target and raise Interrupted)."""
    return asyncio.run(interruptible(
        probe_target(prefix, python=python, timeout=timeout, static=static)))


def probe_with_python(python: str, timeout: float | None, static: bool = False) -> dict[str, Any]:
    """Run probe.py under another local interpreter (a venv, a conda env) by stdin."""
    src = Path(__file__).with_name("probe.py").read_bytes()
    try:
        out = subprocess.run([python, "-", "--framed", *(["--static"] if static else [])],
                             input=src, capture_output=True, timeout=timeout or 120)
    except (FileNotFoundError, PermissionError, NotADirectoryError):
        raise UsageError(f"--python {python}: no such interpreter") from None
    except subprocess.TimeoutExpired:
        raise TargetError(f"probe under {python} timed out") from None
    facts = parse_facts(out.stdout)
    if not facts:
        tail = (out.stderr[-8192:].decode(errors="replace").strip().splitlines() or ["no output"])
        raise TargetError(f"probe under {python} failed (exit {out.returncode}): "
                          f"{plain(tail[-1], 300)}")
    return facts
