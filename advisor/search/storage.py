"""Optuna storage URLs as the advisor writes and prints them: secrets never leave the process.

A PostgreSQL password given in ``--storage`` is used to connect but never written to a file
or printed: files keep the URL without it (libpq then reads ``PGPASSWORD`` or ``~/.pgpass``,
the standard places for it), output shows ``***``.
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path
from typing import Any

import optuna

from advisor.errors import InputError, SetupError

_SECRET_RE = re.compile(r"^(?P<scheme>[a-zA-Z][\w+.-]*://)(?P<user>[^:/@]*):(?P<password>[^@/]*)@")


def redact_url(url: str) -> str:
    """``url`` with any password replaced by ``***`` (for output)."""
    return _SECRET_RE.sub(lambda m: f"{m['scheme']}{m['user']}:***@", url)


def url_without_password(url: str) -> str:
    """``url`` with any password removed (for files); libpq falls back to PGPASSWORD / ~/.pgpass."""
    return _SECRET_RE.sub(lambda m: f"{m['scheme']}{m['user']}@", url)


def redact_text(text: str, url: str | None) -> str:
    """``text`` with the password of ``url`` (if any) replaced by ``***`` wherever it appears."""
    if not url:
        return text
    m = _SECRET_RE.match(url)
    if not m or not m["password"]:
        return text
    return text.replace(m["password"], "***")


JOURNAL_PREFIX = "journal:"
DEFAULT_DB = "study.db"


def default_url(run_dir: Path, workers: int = 1) -> str:
    """SQLite file in the run folder for one process; Optuna's journal file for several."""
    if workers > 1:
        return f"{JOURNAL_PREFIX}{(run_dir / 'study.journal').resolve()}"
    return f"sqlite:///{(run_dir / DEFAULT_DB).resolve()}"


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


def open_storage(url: str, heartbeat_s: int | None = None) -> optuna.storages.BaseStorage:
    """Optuna's own storage for ``url``: RDB (SQLite, PostgreSQL, MySQL) with a heartbeat, whose
    stale trials Optuna fails and :class:`RetryHeartbeatStaleTrialCallback` re-enqueues, or the journal
    file (processes of one host; no heartbeat in Optuna 5, see ``search.recovery``)."""
    if url.startswith(JOURNAL_PREFIX):
        from optuna.storages.journal import JournalFileBackend

        path = Path(url.removeprefix(JOURNAL_PREFIX))
        path.parent.mkdir(parents=True, exist_ok=True)
        return optuna.storages.JournalStorage(JournalFileBackend(str(path)))
    check_driver(url)
    kwargs: dict[str, Any] = {}
    if heartbeat_s:
        from optuna.storages import RetryHeartbeatStaleTrialCallback

        kwargs = {"heartbeat_interval": heartbeat_s, "grace_period": 3 * heartbeat_s,
                  "heartbeat_stale_trial_callback": RetryHeartbeatStaleTrialCallback(max_retry=2)}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return optuna.storages.RDBStorage(url, **kwargs)
    except Exception as exc:  # SQLAlchemy and the drivers raise many kinds
        msg = redact_text(str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__, url)
        raise InputError(f"storage: cannot open {redact_url(url)}: {msg}") from None


# URL scheme (dialect[+driver]) -> (importable module, pip package)
_DRIVERS = {
    "postgresql": ("psycopg2", "psycopg2-binary"),
    "postgresql+psycopg2": ("psycopg2", "psycopg2-binary"),
    "postgresql+psycopg": ("psycopg", "psycopg[binary]"),
    "mysql": ("MySQLdb", "mysqlclient"),
    "mysql+pymysql": ("pymysql", "pymysql"),
}


def check_driver(url: str) -> None:
    """Refuse a database URL whose driver is not installed, naming the package (exit 3)."""
    import importlib.util

    scheme = url.split("://", 1)[0].lower()
    if scheme == "sqlite":
        return
    if scheme not in _DRIVERS:
        allowed = ", ".join(["sqlite:///PATH", "journal:PATH", *(f"{s}://" for s in _DRIVERS)])
        raise InputError(f"storage: unsupported URL scheme {scheme!r} in {redact_url(url)}; use one of {allowed}")
    module, package = _DRIVERS[scheme]
    if importlib.util.find_spec(module) is None:
        raise SetupError(f"storage {redact_url(url)} needs the database driver {module!r}: "
                         f"pip install {package}")
