"""A storage URL judged before the study is opened: it parses, names a database SQLAlchemy
knows, its Python driver (DBAPI module) is installed, and an SQLite file is a database.

Which driver a URL needs is SQLAlchemy's answer, not ours: ``postgresql://`` means the
dialect's default driver, which SQLAlchemy 2.1 makes ``psycopg`` (psycopg 3; 2.0 used
``psycopg2``). Importing the driver is the check, so the message names exactly the module
that is missing and the package that provides it.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from advisor.errors import InputError, SetupError
from advisor.files import check_regular_file
from advisor.search.storage._url import JOURNAL_PREFIX, ambiguous_password, redact_text, redact_url, remember_url

# The pip package that provides each DBAPI module SQLAlchemy's dialects import.
DRIVER_PACKAGES = {
    "psycopg": "psycopg[binary]",
    "psycopg2": "psycopg2-binary",
    "pg8000": "pg8000",
    "MySQLdb": "mysqlclient",
    "pymysql": "PyMySQL",
    "mysql": "mysql-connector-python",
    "mariadb": "mariadb",
    "oracledb": "oracledb",
    "cx_Oracle": "cx_Oracle",
    "pyodbc": "pyodbc",
    "pymssql": "pymssql",
}
# Synchronous drivers per database, in the order a message suggests them: (URL driver name, module).
ALTERNATIVES = {
    "postgresql": [("psycopg", "psycopg"), ("psycopg2", "psycopg2"), ("pg8000", "pg8000")],
    "mysql": [("pymysql", "pymysql"), ("mysqldb", "MySQLdb"), ("mysqlconnector", "mysql.connector")],
}
SQLITE_MAGIC = b"SQLite format 3\x00"
CONNECT_TIMEOUT_S = 10
# How each backend's default drivers take a connection timeout (SQLite needs none).
_TIMEOUT_ARGS = {"postgresql": "connect_timeout", "mysql": "connect_timeout"}
EXAMPLES = "sqlite:///runs/study.db, journal:runs/study.journal or postgresql://user@host/db"


def check_storage_url(url: str, *, folder_must_exist: bool = True) -> None:
    """Raise InputError (bad URL) or SetupError (driver not installed) before any study exists.

    ``folder_must_exist``: the folder of an SQLite file must be there already (SQLite does
    not create folders); False for the run's own ``study.db``, whose folder the run creates.
    """
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError

    if url.startswith(JOURNAL_PREFIX):
        _check_journal(url.removeprefix(JOURNAL_PREFIX), folder_must_exist)
        return
    remember_url(url)
    shown = redact_url(url)
    if ambiguous_password(url):
        raise InputError(f"storage: the password in {shown} holds a raw '@' (or the URL another '@'), so the "
                         "host cannot be told from the password; percent-encode it ('@' as %40, ':' as %3A, "
                         "'/' as %2F) or leave it out and set PGPASSWORD")
    try:
        parsed = make_url(url)
    except ArgumentError:
        raise InputError(f"storage: cannot parse {shown!r} as a database URL; give one like {EXAMPLES}") from None
    try:
        dialect = parsed.get_dialect()
    except NoSuchModuleError:
        raise InputError(f"storage: {parsed.drivername!r} in {shown!r} is not a database SQLAlchemy knows; "
                         f"give a URL like {EXAMPLES}") from None
    if getattr(dialect, "is_async", False):
        raise InputError(f"storage: {parsed.drivername} is an asyncio driver, which Optuna cannot use; "
                         f"name a synchronous one, e.g. {EXAMPLES}")
    try:
        dialect.import_dbapi()
    except ImportError as exc:
        raise SetupError(_missing_driver(parsed, shown, exc.name or str(exc))) from None
    if parsed.get_backend_name() == "sqlite":
        _check_sqlite_file(parsed.database, shown, folder_must_exist)


def _check_journal(name: str, folder_must_exist: bool) -> None:
    """The journal file's path names a file (or none yet) in a folder, and an existing file holds
    Optuna's journal: JSON lines, each an operation with an ``op_code``."""
    if not name.strip():
        raise InputError(f"storage: journal: names no file; give one like {JOURNAL_PREFIX}runs/study.journal")
    path = Path(name).expanduser()
    if path.is_dir() or name.endswith("/"):
        raise InputError(f"storage: {name} is a folder; give the journal file inside it, e.g. "
                         f"{JOURNAL_PREFIX}{path / 'study.journal'}")
    check_regular_file(path, "storage: the journal", "give the path of an Optuna journal file")
    if path.is_file():
        try:
            with path.open("rb") as f:
                first = f.readline(1_000_000)
        except OSError as exc:
            raise InputError(f"storage: cannot read the journal {path} ({exc.strerror})") from None
        if first.strip() and not _is_journal_line(first):
            raise InputError(f"storage: {path} is not an Optuna journal file (its first line is no journal "
                             "operation); move it away and rerun the search, or give another storage")
    elif folder_must_exist and not path.parent.is_dir():
        raise InputError(f"storage: the folder {path.parent} of the journal file does not exist; create it or give "
                         "another path")


def _is_journal_line(line: bytes) -> bool:
    """A complete first line is one JSON operation; one still being written (no newline yet, another
    process is creating the journal) must at least start as a JSON object."""
    if not line.endswith(b"\n"):
        return line.lstrip().startswith(b"{")
    try:
        entry = json.loads(line)
    except ValueError:  # not JSON, or not UTF-8
        return False
    return isinstance(entry, dict) and "op_code" in entry


def _missing_driver(parsed, shown: str, module: str) -> str:
    top = module.split(".")[0]
    package = DRIVER_PACKAGES.get(module, DRIVER_PACKAGES.get(top, top))
    message = (f"storage: {shown} needs the database driver module {top!r} "
               f"(SQLAlchemy dialect {parsed.get_backend_name()}+{parsed.get_driver_name()}), which is not "
               f"installed: pip install '{package}'")
    installed = [name for name, mod in ALTERNATIVES.get(parsed.get_backend_name(), [])
                 if mod != module and module_installed(mod)]
    if installed:
        other = installed[0]
        message += (f", or use the installed {other} driver: "
                    f"{redact_url(parsed.set(drivername=f'{parsed.get_backend_name()}+{other}').render_as_string(False))}")
    return message


def module_installed(module: str) -> bool:
    """Whether ``module`` can be imported (found without importing it)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package that is missing
        return False


def _check_sqlite_file(database: str | None, shown: str, folder_must_exist: bool) -> None:
    if not database or database == ":memory:":
        raise InputError(f"storage: {shown} is an in-memory SQLite database, which keeps nothing after the run; "
                         "give a file: sqlite:///path/to/study.db")
    path = Path(database)
    if path.is_dir():
        raise InputError(f"storage: {path} is a folder; give the SQLite file inside it, e.g. sqlite:///{path}/study.db")
    if path.is_file():
        check_sqlite_file(path, "storage")
    elif folder_must_exist and not path.parent.is_dir():
        raise InputError(f"storage: the folder {path.parent} of the SQLite file does not exist "
                         "(SQLite does not create folders); create it or give another path")


def check_sqlite_file(path: Path, what: str) -> None:
    """Refuse a file that is not an SQLite database (an empty file is a new database)."""
    try:
        with path.open("rb") as f:
            head = f.read(len(SQLITE_MAGIC))
    except OSError as exc:
        raise InputError(f"{what}: cannot read {path} ({exc.strerror})") from None
    if head and head != SQLITE_MAGIC:
        raise InputError(f"{what}: {path} is not an SQLite database (corrupt, or another kind of file); "
                         "move it away and rerun the search, or give another storage")


def check_storage_reachable(url: str) -> None:
    """Connect once to a database server (not SQLite), so a wrong host, port or password fails
    here with the URL redacted, not later inside Optuna with it in clear."""
    from sqlalchemy import create_engine
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import SQLAlchemyError
    from sqlalchemy.pool import NullPool

    if url.startswith(JOURNAL_PREFIX):
        return
    parsed = make_url(url)
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        return
    connect_args = {_TIMEOUT_ARGS[backend]: CONNECT_TIMEOUT_S} if backend in _TIMEOUT_ARGS else {}
    engine = create_engine(parsed, poolclass=NullPool, connect_args=connect_args)
    try:
        with engine.connect():
            pass
    except SQLAlchemyError as exc:
        detail = str(getattr(exc, "orig", None) or exc).strip().splitlines()
        reason = redact_text(detail[0] if detail else type(exc).__name__, url)
        raise InputError(f"storage: cannot connect to {redact_url(url)} ({reason}); start the database "
                         "or fix the URL (host, port, user; the password comes from PGPASSWORD or ~/.pgpass "
                         "when the URL has none)") from None
    finally:
        engine.dispose()
