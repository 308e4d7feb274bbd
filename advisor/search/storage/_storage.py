"""Optuna storage URLs as the advisor writes and prints them: secrets never leave the process.

A PostgreSQL password given in ``--storage`` is used to connect but never written to a file
or printed: files keep the URL without it (libpq then reads ``PGPASSWORD`` or ``~/.pgpass``,
the standard places for it), output shows ``***``.
"""

from __future__ import annotations

import os
import time
import warnings
from pathlib import Path
from typing import Any

import optuna

from advisor.errors import InputError, SetupError
from advisor.files import disk_full_message
from advisor.search.storage._url import (
    JOURNAL_PREFIX,
    redact_text,
    redact_url,
    url_without_password,
)

DEFAULT_DB = "study.db"


def default_url(run_dir: Path, workers: int = 1) -> str:
    """SQLite file in the run folder for one process; Optuna's journal file for several."""
    if workers > 1:
        return f"{JOURNAL_PREFIX}{(run_dir / 'study.journal').resolve()}"
    return f"sqlite:///{(run_dir / DEFAULT_DB).resolve()}"


def absolute_url(url: str) -> str:
    """``url`` with a relative SQLite or journal file made absolute against the current folder: resolved
    once, when a run starts, so its study is found again from any folder (`advisor report RUN_DIR`)."""
    if url.startswith(JOURNAL_PREFIX):
        path = url.removeprefix(JOURNAL_PREFIX)
        return JOURNAL_PREFIX + os.path.abspath(os.path.expanduser(path)) if path else url
    if url.startswith("sqlite:///"):
        path, sep, query = url.removeprefix("sqlite:///").partition("?")
        if path and path != ":memory:" and not path.startswith("file:"):
            return f"sqlite:///{os.path.abspath(os.path.expanduser(path))}{sep}{query}"
    return url


def portable_url(url: str, run_dir: Path) -> str:
    """The URL as a run folder records it: files inside the folder relative to it, no password."""
    for prefix in ("sqlite:///", JOURNAL_PREFIX):
        if url.startswith(prefix):
            path = Path(url.removeprefix(prefix))
            try:
                return prefix + str(path.resolve().relative_to(run_dir.resolve()))
            except ValueError:
                return url
    return url_without_password(url)


def resolve_url(url: str | None, run_dir: Path) -> str:
    """A recorded URL made usable again: relative files resolved against the run folder."""
    if not url:
        return f"sqlite:///{(run_dir / DEFAULT_DB).resolve()}"
    for prefix in ("sqlite:///", JOURNAL_PREFIX):
        if url.startswith(prefix):
            path = Path(url.removeprefix(prefix))
            if not path.is_absolute():
                return prefix + str((run_dir / path).resolve())
    return url


def _commit_without_fsync(storage: optuna.storages.RDBStorage) -> None:
    """SQLite in WAL mode with ``synchronous=NORMAL``: Optuna commits every suggested parameter,
    and with SQLite's default (a rollback journal, an fsync per commit) that took 2.5-3 s per
    120-group trial here. A crash or Ctrl-C still keeps every finished trial; only an OS crash
    or power cut can lose the last ones, and the file stays consistent (sqlite.org/wal.html)."""
    from sqlalchemy import event

    def on_connect(dbapi_connection: Any, _record: Any) -> None:
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()

    event.listen(storage.engine, "connect", on_connect)
    storage.engine.dispose()  # connections opened while creating the tables had the defaults


def open_storage(url: str, heartbeat_s: int | None = None) -> optuna.storages.BaseStorage:
    """Optuna's own storage for ``url``: RDB (SQLite, PostgreSQL, MySQL) with a heartbeat, whose
    stale trials Optuna fails and :class:`RetryHeartbeatStaleTrialCallback` re-enqueues, or the journal
    file (processes of one host; no heartbeat in Optuna 5, see ``search.storage._recovery``)."""
    from advisor.search.storage._driver import check_storage_url

    check_storage_url(url, folder_must_exist=False)
    if url.startswith(JOURNAL_PREFIX):
        from optuna.storages.journal import JournalFileBackend

        path = Path(url.removeprefix(JOURNAL_PREFIX))
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            return optuna.storages.JournalStorage(JournalFileBackend(str(path)))
        except OSError as exc:
            if (full := disk_full_message(exc)) is not None:
                raise SetupError(full) from None
            raise InputError(f"storage: cannot open the journal {path} ({exc.strerror or exc}); give a journal file "
                             "in a folder you can write to") from None
    kwargs: dict[str, Any] = {}
    if heartbeat_s:
        from advisor.search.storage._recovery import retry_callback

        kwargs = {"heartbeat_interval": heartbeat_s, "grace_period": 3 * heartbeat_s,
                  "heartbeat_stale_trial_callback": retry_callback(), "engine_kwargs": {"pool_pre_ping": True}}
    import sqlalchemy.exc

    for attempt in range(5):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                storage = optuna.storages.RDBStorage(url, **kwargs)
            if url.startswith("sqlite:"):
                _commit_without_fsync(storage)
            return storage
        except (sqlalchemy.exc.IntegrityError, sqlalchemy.exc.ProgrammingError):
            # Several processes creating the tables of a fresh PostgreSQL database race
            # (measured: 1-3 of 3 lose); the tables exist on the next try.
            if attempt == 4:
                raise
            time.sleep(0.2 * (attempt + 1))
        except Exception as exc:  # SQLAlchemy and the drivers raise many kinds
            if (full := disk_full_message(exc)) is not None:
                raise SetupError(full) from None
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise InputError(f"storage: cannot open {redact_url(url)}: {redact_text(first, url)}; give a storage you "
                             "can write to (an SQLite file in a folder you can write to) or fix the URL") from None
    raise AssertionError("unreachable")
