"""Output folders and files judged before any work: each command that writes checks its target
first, so a bad `--out` costs an `Error:` line, not a model load and a traceback. Nothing here
creates the target; the only trace is a probe file, removed at once."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from advisor.errors import InputError
from advisor.files import check_no_broken_link


def check_output_dir(path: Path | str, what: str, *, must_be_empty: bool = False) -> None:
    """Refuse a folder that is a file, cannot be created, or cannot be written into.

    ``what`` names the flag or field in messages (``--out``). ``must_be_empty``: an existing
    folder must hold nothing (an export never mixes its files with others).
    """
    path = Path(path).expanduser()
    check_no_broken_link(path, what)
    if path.exists():
        if not path.is_dir():
            raise InputError(f"{what}: {path} is a file, not a folder; give a folder path (created if missing)")
        if must_be_empty and any(path.iterdir()):
            raise InputError(f"{what}: {path} exists and is not empty; give a new folder")
        _probe_write(path, what, path)
        return
    _check_creatable(path, what)


def check_output_file(path: Path | str, what: str) -> None:
    """Refuse a file path that is a folder or whose folder cannot be created or written into."""
    path = Path(path).expanduser()
    check_no_broken_link(path, what)
    if path.is_dir():
        raise InputError(f"{what}: {path} is a folder; give a file path")
    _check_creatable(path, what)


def _check_creatable(path: Path, what: str) -> None:
    """``path`` does not exist yet: its nearest existing parent must be a folder we can write into."""
    ancestor = _nearest_existing(path)
    if not ancestor.is_dir():
        raise InputError(f"{what}: cannot create {path}: {ancestor} is a file, not a folder; "
                         "give a path whose parents are folders")
    _probe_write(ancestor, what, path)


def _nearest_existing(path: Path) -> Path:
    """The deepest ancestor of ``path`` that exists (a file or a folder)."""
    for parent in path.absolute().parents:
        if parent.exists():
            return parent
    return Path("/")


def _probe_write(folder: Path, what: str, target: Path) -> None:
    """Write and remove a probe file: permission bits say nothing to root or on read-only mounts."""
    try:
        fd, name = tempfile.mkstemp(prefix=".advisor-probe-", dir=folder)
    except OSError as exc:
        verb = "write into" if folder == target else f"create {target} in"
        raise InputError(f"{what}: cannot {verb} {folder} ({exc.strerror or exc}); "
                         "give a folder you can write to") from None
    os.close(fd)
    os.unlink(name)
