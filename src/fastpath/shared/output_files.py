"""Where verify, bench and capture write their files, checked before any work starts.

Why: a bench that ran for minutes and then died on `mkdir` lost every result (`bench --out FILE`
raised FileExistsError after the whole run; `verify --save DIR` raised IsADirectoryError and exited
with the FAIL code; `--out /proc/nope` passed a permission check, as root passes every one, and
failed at the end). A bad path is bad input: one line and exit 2 before the model is built. So the
check *tries*: the missing folders are created, a probe file written and removed, and the folders
removed again (the writer creates them when it has something to write).

An earlier run's files are never replaced silently: an explicit path that holds them is refused
unless the user passes --force; a default name moves on to the next free one (`NAME-2`, ...).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from fastpath.shared.errors import UsageError


def _why(exc: OSError) -> str:
    what = exc.strerror or exc.__class__.__name__
    return f"{what} ({exc.filename})" if exc.filename else what


#: the name prefix of probe_dir's short-lived file (a directory holding only those is still empty)
PROBE_PREFIX = ".fastpath-probe-"


def _probe_write(path: Path, flag: str) -> None:
    """Create and remove a file in the directory `path` (root passes os.access on a read-only or
    virtual file system; only writing says whether writing works)."""
    try:
        fd, name = tempfile.mkstemp(prefix=PROBE_PREFIX, dir=path)
        os.close(fd)
        os.unlink(name)
    except OSError as exc:
        raise UsageError(f"{flag} {path} is not writable: {_why(exc)}") from None


def probe_dir(path: Path, flag: str) -> None:
    """UsageError (one line) unless `path` is a directory this process can write in, or can be
    created as one. Nothing is left behind: folders created for the probe are removed."""
    if path.exists():
        if not path.is_dir():
            raise UsageError(f"{flag} {path} exists and is not a directory; pass a directory "
                             "(it is created if missing)")
        _probe_write(path, flag)
        return
    missing = []
    anchor = path.absolute()
    while not anchor.exists() and anchor != anchor.parent:
        missing.append(anchor)
        anchor = anchor.parent
    if not anchor.is_dir():
        raise UsageError(f"cannot create {flag} {path}: {anchor} is not a directory")
    created: list[Path] = []
    # under torchrun every rank probes the same path at once: a folder another rank made first is
    # not an error, and none removes what it made (a rank could be writing its probe in it)
    shared = os.environ.get("WORLD_SIZE", "1") not in ("", "1")
    try:
        for folder in reversed(missing):
            try:
                folder.mkdir()
            except FileExistsError:
                if not folder.is_dir():
                    raise
                continue
            created.append(folder)
        _probe_write(path, flag)
    except OSError as exc:
        raise UsageError(f"cannot create {flag} {path}: {_why(exc)}") from None
    finally:
        for folder in reversed(created if not shared else []):
            try:
                folder.rmdir()
            except OSError:
                pass


def check_out_dir(path: Path, flag: str, names: tuple[str, ...], force: bool = False) -> dict[str, Path]:
    """Check that the files `names` can be written in directory `path` (created later, by the
    writer); returns name -> path. A name that exists as a directory is refused; one that exists
    as a file (an earlier run's) is refused unless `force`."""
    probe_dir(path, flag)
    files = {name: path / name for name in names}
    for file in files.values():
        if file.is_dir():
            raise UsageError(f"{flag} {path}: {file} is a directory; it would be overwritten by a file")
        if file.exists() and not os.access(file, os.W_OK):
            raise UsageError(f"{flag} {path}: {file} is not writable")
    earlier = [name for name, file in files.items() if file.exists()]
    if earlier and not force:
        raise UsageError(f"{flag} {path} already holds {', '.join(earlier)} from an earlier run; pass --force "
                         f"to replace {'them' if len(earlier) > 1 else 'it'}, or give another {flag}")
    return files


def free_dir(base: Path, names: tuple[str, ...]) -> Path:
    """`base`, or the first of base-2, base-3, ... that holds none of `names` (a default output
    folder never replaces an earlier run's files)."""
    candidate, n = base, 1
    while candidate.is_dir() and any((candidate / name).exists() for name in names):
        n += 1
        candidate = base.with_name(f"{base.name}-{n}")
    return candidate


def free_file(path: Path) -> Path:
    """`path`, or the first of NAME-2.EXT, NAME-3.EXT, ... that does not exist."""
    candidate, n = path, 1
    while candidate.exists():
        n += 1
        candidate = path.with_name(f"{path.stem}-{n}{path.suffix}")
    return candidate


def resolve_save_file(text: str, flag: str, default_name: str, force: bool = False) -> Path:
    """The file that `flag TEXT` writes: TEXT itself, or a file inside TEXT when TEXT is an
    existing directory or ends with a path separator (`default_name`, or the next free
    NAME-2.EXT when an earlier run's is there and not `force`). Checked (folders creatable and
    writable, not a directory, an explicit existing file only with `force`) before any work."""
    path = Path(text).expanduser()
    if path.is_dir() or text.endswith(("/", os.sep)):
        probe_dir(path, flag)
        path = path / default_name
        if path.is_dir():
            raise UsageError(f"{flag} {text}: {path} is a directory")
        if not force:
            path = free_file(path)
    else:
        probe_dir(path.parent, f"{flag}'s folder")
        if path.exists() and not force:
            raise UsageError(f"{flag} {path} already exists; pass --force to replace it, or give another name")
    if path.exists() and not os.access(path, os.W_OK):
        raise UsageError(f"{flag} {path} is not writable")
    return path
