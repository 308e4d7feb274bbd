"""One `advisor search` per run folder: an exclusive lock taken before any work.

The lock is ``RUN_DIR/run.lock`` held with ``flock``: the kernel drops it when its process ends,
however it ends, so taking it is atomic and never waits for a dead holder. The file names its
holder (host, pid, start time) for the refusal message. A record left by a process that no
longer runs on this host is taken over with one warning line; one left by another host
(a shared folder whose file system does not share locks) is refused, since this host cannot
tell whether that process still runs.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from advisor.errors import InputError
from advisor.search.storage import describe_holder, holder_is_running, this_process

LOCK_NAME = "run.lock"


@contextmanager
def run_folder_lock(run_dir: Path, warn: Callable[[str], None], command: str = "advisor search") -> Iterator[None]:
    """Hold ``run_dir`` for this process; raise InputError naming the holder when another has it."""
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / LOCK_NAME
    fd = _acquire(path, warn, command)
    try:
        yield
    finally:
        _release(path, fd)


def _acquire(path: Path, warn: Callable[[str], None], command: str) -> int:
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)  # not inherited by children (O_CLOEXEC)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read(fd)
            os.close(fd)
            raise InputError(f"run folder {path.parent} is in use by {describe_holder(holder)}; wait for it to "
                             "finish, or choose another --name or --out") from None
        if not _is_current(fd, path):  # its holder removed the file between our open and flock: take the new one
            os.close(fd)
            continue
        previous = _read(fd)
        if previous:
            _check_previous(path, fd, previous, warn)
        record = {**this_process(), "command": command}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(record).encode(), 0)
        os.fsync(fd)
        return fd


def _check_previous(path: Path, fd: int, previous: dict[str, Any], warn: Callable[[str], None]) -> None:
    """A record under a free lock: its process ended without removing it (killed, or a power cut)."""
    running = holder_is_running(previous)
    if running is None:
        os.close(fd)
        raise InputError(f"run folder {path.parent} is held by {describe_holder(previous)} on another host, "
                         f"which this host cannot check; if that run is gone, delete {path}, or choose another "
                         "--name or --out")
    if running is False:  # (a live holder that let go of the lock has nothing to take over)
        warn(f"run folder {path.parent}: taking over the lock of {describe_holder(previous)}, which is no "
             "longer running")


def _is_current(fd: int, path: Path) -> bool:
    try:
        return os.fstat(fd).st_ino == os.stat(path).st_ino
    except FileNotFoundError:
        return False


def _read(fd: int) -> dict[str, Any]:
    try:
        data = json.loads(os.pread(fd, 4096, 0) or b"{}")
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _release(path: Path, fd: int) -> None:
    """Remove the file while still holding the lock, so the next run never sees a stale record."""
    try:
        if _is_current(fd, path):
            path.unlink()
    finally:
        os.close(fd)
