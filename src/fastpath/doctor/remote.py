"""Run the probe on another machine through an argv prefix: `ssh h`, `ssh h pct exec 200 --`,
`docker exec -i c`, `kubectl exec -i p --`, `env -i ...`.

Why an argv prefix and stdin: the prefix is split with shlex and executed directly (no local
shell, so a target name like `h;touch PWNED` is just a string), and the probe travels on stdin
to `python3 -`, so nothing is installed or written on the target and there is no nested quoting.
A target without Python gets the POSIX sh probe (`sh -s`) instead, which gathers the toolchain
facts it can and names the rest in probe.errors.

Each run is its own process group, killed as a whole on timeout, so a stuck target (or a
ProxyCommand, or a `pct exec` that never returns) never hangs the caller.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shlex
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastpath.doctor.redact import redact_facts, redact_text
from fastpath.errors import TargetError, UsageError

DEFAULT_TIMEOUT = 60.0
# A facts report is a few tens of KiB; anything far larger is not our probe talking.
MAX_OUTPUT_BYTES = 32 * 1024 * 1024
# After the target command exits, how long to wait for its pipes to close (an ssh ControlPersist
# master forked into the background can hold stderr open forever).
PIPE_GRACE_S = 1.0
# Programs whose exit status 255 means "could not connect" rather than "the command failed".
_SSH_LIKE = frozenset({"ssh", "autossh", "dbclient"})
NO_PYTHON_REASON = "no python on target"


@dataclass
class CommandResult:
    """What one target command did: exit status (None if killed on timeout) and its output."""

    returncode: int | None
    stdout: bytes
    stderr: bytes
    timed_out: bool
    seconds: float


def parse_prefix(prefix: str | list[str] | tuple[str, ...]) -> list[str]:
    """Split a target prefix the way a shell would (quotes, escapes) without running a shell."""
    if isinstance(prefix, (list, tuple)):
        argv = [str(part) for part in prefix]
    else:
        try:
            argv = shlex.split(prefix)
        except ValueError as exc:
            raise UsageError(f"cannot split target prefix {redact_text(prefix)!r}: {exc}") from None
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
    """The prefix as one printable, secret-free string (for tables and error messages)."""
    return redact_text(shlex.join(argv))


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
    return redact_text(shlex.join([host, *rest[1:]]))


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
    text = data.decode("utf-8", "replace")
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        return ""
    line = re.sub(r"[\x00-\x1f\x7f]", " ", lines[-1])
    if len(line) > limit:
        line = line[: limit - 3] + "..."
    return redact_text(line)


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _close_transport(proc: asyncio.subprocess.Process) -> None:
    """Close our pipe ends now, not in a __del__ that runs after the event loop is gone."""
    transport = getattr(proc, "_transport", None)
    if transport is not None:
        transport.close()


async def run_command(argv: list[str], stdin_data: bytes, timeout: float) -> CommandResult:
    """Run argv (no shell) in a new process group, feed stdin, collect output, never hang.

    On timeout the whole process group is SIGKILLed and `timed_out` is set. Whatever the command
    left behind in its group after a normal exit is killed too.
    """
    loop = asyncio.get_running_loop()
    started = loop.time()
    deadline = started + timeout
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
        )
    except FileNotFoundError:
        raise TargetError(f"cannot run {argv[0]!r}: no such program on this machine") from None
    except PermissionError:
        raise TargetError(f"cannot run {argv[0]!r}: permission denied") from None
    except OSError as exc:
        raise TargetError(f"cannot run {argv[0]!r}: {exc.strerror}") from None

    out = bytearray()
    err = bytearray()

    async def pump(stream: asyncio.StreamReader, buf: bytearray) -> None:
        while True:
            chunk = await stream.read(65536)
            if not chunk:
                return
            if len(buf) < MAX_OUTPUT_BYTES:
                buf += chunk

    async def feed() -> None:
        assert proc.stdin is not None
        try:
            proc.stdin.write(stdin_data)
            await proc.stdin.drain()
            proc.stdin.close()
            await proc.stdin.wait_closed()
        except (BrokenPipeError, ConnectionResetError):
            pass  # the target exited without reading its stdin: its exit status tells why

    assert proc.stdout is not None and proc.stderr is not None
    feeder = asyncio.ensure_future(feed())
    readers = [
        asyncio.ensure_future(pump(proc.stdout, out)),
        asyncio.ensure_future(pump(proc.stderr, err)),
    ]
    async def exited() -> None:
        # Not proc.wait(): before Python 3.12 it also waits for the pipes to close, which a
        # daemonised grandchild (ssh ControlPersist master, `setsid cmd &`) can delay forever.
        while proc.returncode is None:
            await asyncio.sleep(0.02)

    timed_out = False
    try:
        await asyncio.wait_for(exited(), timeout=max(0.0, deadline - loop.time()))
    except asyncio.TimeoutError:
        timed_out = True
    except BaseException:  # Ctrl-C / cancellation: the target runs in its own session, so
        _kill_group(proc.pid)  # it did not get the SIGINT; do not leave it running
        for task in [feeder, *readers]:
            task.cancel()
        _close_transport(proc)
        raise
    _kill_group(proc.pid)
    if timed_out:
        try:
            await asyncio.wait_for(exited(), timeout=5)
        except asyncio.TimeoutError:
            pass
    grace = min(PIPE_GRACE_S, max(0.05, deadline - loop.time())) if not timed_out else 0.2
    _done, pending = await asyncio.wait(readers, timeout=grace)
    for task in [*pending, feeder]:
        task.cancel()
    await asyncio.gather(feeder, *readers, return_exceptions=True)
    _close_transport(proc)
    return CommandResult(
        returncode=None if timed_out else proc.returncode,
        stdout=bytes(out),
        stderr=bytes(err),
        timed_out=timed_out,
        seconds=loop.time() - started,
    )


def parse_facts(stdout: bytes) -> dict[str, Any] | None:
    """The facts object in a probe's stdout, or None.

    Login scripts on a target sometimes print banners before the probe runs, so when the whole
    output is not one JSON object the last line that is one is taken.
    """
    text = stdout.decode("utf-8", "replace").strip()
    if not text:
        return None
    candidates = [text] + [line for line in reversed(text.splitlines()) if line.startswith("{")]
    for candidate in candidates:
        try:
            obj = json.loads(candidate)
        except ValueError:
            continue
        if isinstance(obj, dict):
            return obj
    return None


def _failure_reason(argv: list[str], result: CommandResult, timeout: float) -> str:
    """One line saying why a target gave no facts."""
    if result.timed_out:
        return f"timed out after {timeout:g}s"
    last = _one_line(result.stderr)
    if os.path.basename(argv[0]) in _SSH_LIKE and result.returncode == 255:
        return f"unreachable: {last or 'ssh exited with status 255'}"
    if result.returncode != 0:
        return f"exit {result.returncode}: {last or 'no output'}"
    if not result.stdout.strip():
        return f"no output{': ' + last if last else ''}"
    head = re.sub(r"[\x00-\x1f\x7f]", " ", result.stdout.decode("utf-8", "replace").strip())[:80]
    return f"non-JSON output: {redact_text(head)!r}"


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


async def probe_target(
    prefix: str | list[str],
    *,
    python: str | None = None,
    timeout: float | None = None,
    sources: tuple[bytes, bytes] | None = None,
    static: bool = False,
) -> dict[str, Any]:
    """Gather one target's facts (redacted); raise TargetError with a one-line reason.
    static: the probe imports nothing there (`python3 - --static`)."""
    argv = parse_prefix(prefix)
    timeout = DEFAULT_TIMEOUT if timeout is None else float(timeout)
    if timeout <= 0:
        raise UsageError(f"--timeout must be positive, got {timeout:g}")
    probe_py, probe_sh = sources if sources is not None else probe_sources()
    label = describe_prefix(argv)
    tool = stdin_not_forwarded(argv)
    if tool is not None:
        raise UsageError(f"`{tool}` without -i does not pass stdin on, and the probe travels on "
                         f"stdin: add -i (e.g. '{tool} -i NAME')")
    interpreter = python or "python3"
    started = time.monotonic()

    first = await run_command([*argv, interpreter, "-", *(["--static"] if static else [])],
                              probe_py, timeout)
    facts = parse_facts(first.stdout)
    if facts is not None:
        return _annotate(redact_facts(facts), label, time.monotonic() - started)
    reason = _failure_reason(argv, first, timeout)
    if first.timed_out or reason.startswith("unreachable"):
        raise TargetError(reason)

    # No usable Python there: the sh probe still gathers the toolchain facts.
    if _python_missing(first):
        why = NO_PYTHON_REASON if python is None else f"python {interpreter!r} not found on target"
    else:
        why = f"{interpreter} on target failed ({reason})"
    remaining = timeout - (time.monotonic() - started)
    if remaining <= 0:
        raise TargetError(f"timed out after {timeout:g}s")
    second = await run_command([*argv, "sh", "-s"], probe_sh, remaining)
    facts = parse_facts(second.stdout)
    if facts is None:
        if second.timed_out:
            raise TargetError(f"timed out after {timeout:g}s")
        raise TargetError(reason)
    if isinstance(facts.get("probe"), dict):
        facts["probe"]["python_fallback"] = why  # the report's headline says the sh probe ran
    if why != NO_PYTHON_REASON:
        errors = facts.get("probe", {}).get("errors", {})
        for key, value in list(errors.items()):
            if isinstance(value, str):
                errors[key] = value.replace(NO_PYTHON_REASON, why)
    return _annotate(redact_facts(facts), label, time.monotonic() - started)


def probe_remote(
    prefix: str | list[str], python: str | None = None, timeout: float | None = DEFAULT_TIMEOUT,
    static: bool = False,
) -> dict[str, Any]:
    """Blocking form of `probe_target` for `fastpath doctor --on PREFIX`."""
    return asyncio.run(probe_target(prefix, python=python, timeout=timeout, static=static))
