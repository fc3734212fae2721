"""Where verify and bench write their files, checked before any work starts.

Why: a bench that ran for minutes and then died on `mkdir` of an existing file lost every result
(issue 24: `bench --out FILE` raised FileExistsError after the whole run; `verify --save DIR`
raised IsADirectoryError and exited with the FAIL code). A bad path is bad input: one line and
exit 2 before the model is built.
"""

from __future__ import annotations

import os
from pathlib import Path

from fastpath.errors import UsageError


def _creatable_dir(path: Path, flag: str) -> None:
    """UsageError unless `path` is a writable directory or can be created as one."""
    if path.exists():
        if not path.is_dir():
            raise UsageError(f"{flag} {path} exists and is not a directory; pass a directory "
                             "(it is created if missing)")
        if not os.access(path, os.W_OK | os.X_OK):
            raise UsageError(f"{flag} {path} is not writable")
        return
    parent = next(p for p in path.absolute().parents if p.exists())
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise UsageError(f"cannot create {flag} {path}: {parent} is not a writable directory")


def check_out_dir(path: Path, flag: str, names: tuple[str, ...]) -> dict[str, Path]:
    """Check that the files `names` can be written in directory `path` (created later, by the
    writer); returns name -> path. A name that exists as a directory is refused too."""
    _creatable_dir(path, flag)
    files = {name: path / name for name in names}
    for file in files.values():
        if file.is_dir():
            raise UsageError(f"{flag} {path}: {file} is a directory; it would be overwritten by a file")
        if file.exists() and not os.access(file, os.W_OK):
            raise UsageError(f"{flag} {path}: {file} is not writable")
    return files


def resolve_save_file(text: str, flag: str, default_name: str) -> Path:
    """The file that `flag TEXT` writes: TEXT itself, or TEXT/default_name when TEXT is an
    existing directory or ends with a path separator. Checked (parents creatable, not a
    directory, writable) without creating anything."""
    path = Path(text).expanduser()
    if path.is_dir() or text.endswith(("/", os.sep)):
        _creatable_dir(path, flag)
        path = path / default_name
        if path.is_dir():
            raise UsageError(f"{flag} {text}: {path} is a directory")
    else:
        _creatable_dir(path.parent, f"{flag}'s folder")
    if path.exists() and not os.access(path, os.W_OK):
        raise UsageError(f"{flag} {path} is not writable")
    return path
