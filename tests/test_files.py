"""advisor.files: non-regular inputs refused, broken links named, writes that replace (never write
through) a symbolic link, temporary folders removed on every exit, a full disk named."""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import sqlite3
import tempfile
from pathlib import Path

import pytest

from advisor.errors import InputError
from advisor.files import (
    broken_link,
    check_regular_file,
    disk_full_message,
    non_regular_kind,
    replace_atomically,
    temporary_folder,
    write_text_atomically,
)


def test_non_regular_files_are_named(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    (tmp_path / "file").write_text("x")
    assert non_regular_kind(fifo) == "a FIFO (named pipe)"
    assert non_regular_kind(tmp_path) == "a folder"
    assert non_regular_kind("/dev/null") == "a character device"
    assert non_regular_kind(tmp_path / "file") is None
    assert non_regular_kind(tmp_path / "missing") is None
    with pytest.raises(InputError, match="is a FIFO \\(named pipe\\), not a regular file; give a file"):
        check_regular_file(fifo, "recipe", "give a file")


def test_broken_links_anywhere_on_the_path(tmp_path):
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    (tmp_path / "good").symlink_to(tmp_path)
    link, why = broken_link(tmp_path / "dangling" / "run")
    assert link == tmp_path / "dangling" and "which does not exist" in why
    link, why = broken_link(tmp_path / "loop")
    assert link == tmp_path / "loop" and "loops" in why
    assert broken_link(tmp_path / "good" / "new" / "run") is None


def test_a_write_replaces_a_symlink_and_never_writes_through_it(tmp_path):
    outside = tmp_path / "outside.txt"
    outside.write_text("keep me")
    run = tmp_path / "run"
    run.mkdir()
    (run / "report.md").symlink_to(outside)
    write_text_atomically(run / "report.md", "the report")
    assert outside.read_text() == "keep me"
    assert not (run / "report.md").is_symlink() and (run / "report.md").read_text() == "the report"
    assert [p.name for p in run.iterdir()] == ["report.md"]


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    target = tmp_path / "summary.json"
    target.write_text("old")

    def half_then_fail(tmp: Path) -> None:
        tmp.write_text("half")
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp))

    with pytest.raises(OSError):
        replace_atomically(target, half_then_fail)
    assert target.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["summary.json"]


@pytest.mark.parametrize("way_out", ["return", "error", "sigterm"])
def test_a_temporary_folder_is_removed_on_every_way_out(way_out):
    before = signal.getsignal(signal.SIGTERM)
    expected = pytest.raises((RuntimeError, KeyboardInterrupt)) if way_out != "return" else contextlib.nullcontext()
    with expected, temporary_folder("advisor-test-") as folder:
        (folder / "tokens.pt").write_text("x")
        if way_out == "error":
            raise RuntimeError("boom")
        if way_out == "sigterm":
            os.kill(os.getpid(), signal.SIGTERM)
    assert Path(tempfile.gettempdir()) in folder.parents and not folder.exists()
    assert signal.getsignal(signal.SIGTERM) == before


def test_a_full_disk_is_named_from_any_depth_of_the_exception_chain(tmp_path):
    full = OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "run" / "tokens.pt"))
    message = disk_full_message(full)
    assert message is not None and str(tmp_path / "run" / "tokens.pt") in message and "mounted at" in message
    try:
        try:
            raise sqlite3.OperationalError("database or disk is full")
        except sqlite3.OperationalError as inner:
            raise RuntimeError("(sqlite3.OperationalError) commit failed") from inner
    except RuntimeError as outer:
        assert "SQLite study storage" in disk_full_message(outer)
    assert disk_full_message(OSError(errno.EACCES, "Permission denied")) is None
