"""Files given as input and files a run writes, handled so that no input hangs and no writer leaves
its folder.

* A path the user gives as a file to read (a recipe, a task YAML, a journal) must be a regular
  file: reading a FIFO blocks until another process writes to it, a device never ends.
* A path the user gives as a folder must not pass through a dangling or looping symbolic link.
* Everything a run writes goes to a temporary file in the target's folder, renamed over the
  target (``os.replace``): a reader never sees half a file, and a symbolic link at the target's
  name is replaced, never written through (it could point anywhere on the machine).
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import signal
import stat
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

from advisor.errors import InputError, exception_chain

_UMASK = os.umask(0)
os.umask(_UMASK)  # read once: a renamed file gets the mode a plain open() would have given it


def non_regular_kind(path: Path | str) -> str | None:
    """What ``path`` is when it exists but is not a regular file (after symlinks), else None."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None  # missing: each caller says so in its own words
    kinds = [(stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"),
             (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device")]
    return next((name for test, name in kinds if test(mode)), None if stat.S_ISREG(mode) else "not a regular file")


def check_regular_file(path: Path | str, what: str, fix: str) -> None:
    """InputError when ``path`` exists but is no regular file (reading it could block forever)."""
    kind = non_regular_kind(path)
    if kind is not None:
        raise InputError(f"{what} {path} is {kind}, not a regular file; {fix}")


def broken_link(path: Path | str) -> tuple[Path, str] | None:
    """The first component of ``path`` that is a symbolic link leading nowhere, and why (dangling or a
    loop), or None. Creating a folder through such a link fails deep inside the run."""
    current = Path(os.path.abspath(Path(path).expanduser()))
    for part in [*reversed(current.parents), current]:
        if not part.is_symlink():
            continue
        try:
            part.resolve(strict=True)
        except FileNotFoundError:
            return part, f"a symbolic link to {os.readlink(part)}, which does not exist"
        except (RuntimeError, OSError):  # Python 3.11: RuntimeError "Symlink loop"; later: OSError ELOOP
            return part, "a symbolic link that loops back on itself"
    return None


def check_no_broken_link(path: Path | str, what: str) -> None:
    found = broken_link(path)
    if found is not None:
        link, why = found
        raise InputError(f"{what}: {link} is {why}; remove the link or give another folder")


def replace_atomically(path: Path, write: Callable[[Path], None]) -> None:
    """Call ``write(tmp)`` on a temporary file in ``path``'s folder, then rename it over ``path``.

    The temporary file is removed on every failure; a symbolic link named ``path`` is replaced by
    the file, never followed.
    """
    path = Path(path)
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        write(tmp)
        tmp.chmod(0o666 & ~_UMASK)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def write_text_atomically(path: Path, text: str) -> None:
    replace_atomically(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
SQLITE_FULL = "database or disk is full"


def disk_full_message(exc: BaseException) -> str | None:
    """One line naming the full disk (and what is free on it) when ``exc``, or an exception it was
    raised from, says the disk or the quota is full; None otherwise. A full disk is the environment's
    problem (exit 3), not the input's, and the storage is not damaged."""
    for current in exception_chain(exc):
        if isinstance(current, OSError) and current.errno in DISK_FULL_ERRNOS:
            return _full_disk_line(current.filename)
        if SQLITE_FULL in str(current):
            return _full_disk_line(None, "the SQLite study storage")
    return None


def _full_disk_line(filename: object, what: str | None = None) -> str:
    where = what or (f"{filename}" if filename else "a file the run writes")
    mount, free = "", ""
    if filename:
        folder = Path(os.path.abspath(str(filename)))
        while not folder.exists() and folder != folder.parent:
            folder = folder.parent
        mount_point = folder
        while not os.path.ismount(mount_point) and mount_point != mount_point.parent:
            mount_point = mount_point.parent
        with contextlib.suppress(OSError):
            free = f", {shutil.disk_usage(folder).free / 1e9:.1f} GB free"
        mount = f" (the disk mounted at {mount_point}{free})"
    return (f"no space left on the disk to write {where}{mount}: the disk or your quota is full; free space there "
            "or write to another disk (--out, --storage) and run the command again")


def name_too_long_message(exc: BaseException) -> str | None:
    """One line naming the path when ``exc`` (or one it was raised from) says a name in it is longer than the file
    system allows (ENAMETOOLONG: 255 bytes a name on Linux); None otherwise. Every path comes from the user: bad
    input (exit 2)."""
    for current in exception_chain(exc):
        if isinstance(current, OSError) and current.errno == errno.ENAMETOOLONG:
            where = f"{current.filename}" if current.filename else "a path given"
            longest = max((len(os.fsencode(part)) for part in Path(where).parts), default=0)
            return (f"{where}: a file name in it is too long for the file system (its longest part is {longest} "
                    "bytes; Linux allows 255); give a shorter path or name")
    return None


@contextlib.contextmanager
def temporary_folder(prefix: str) -> Iterator[Path]:
    """A new folder under the system's temporary directory, removed on every way out: a return, an
    exception, Ctrl-C, and SIGTERM or SIGHUP (turned into KeyboardInterrupt while inside, so that the
    work in flight ends the way Ctrl-C ends it; in the main thread, where Python delivers signals)."""
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    previous: dict[int, object] = {}
    if threading.current_thread() is threading.main_thread():
        def interrupt(signum: int, _frame: object) -> None:
            raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")

        for sig in (signal.SIGTERM, signal.SIGHUP):
            previous[sig] = signal.signal(sig, interrupt)
    try:
        yield folder
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        shutil.rmtree(folder, ignore_errors=True)
