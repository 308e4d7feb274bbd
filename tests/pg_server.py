"""A real, throw-away PostgreSQL server for tests (Debian's ``postgresql`` package).

Use from a conftest.py::

    pytest_plugins = ["pg_server"]          # or: from pg_server import postgres_server, postgres_url

Fixtures (session-scoped):

* ``postgres_server`` -> :class:`PgServer` (host, port, user, password, ``url(db, driver)``,
  ``create_database(name)`` for tests that need a fresh, empty database)
* ``postgres_url``   -> ``postgresql+<driver>://advisor:<password>@127.0.0.1:<port>/advisor``

What it does: ``initdb`` into a fresh temp dir, TCP on 127.0.0.1 only (a free port, no
unix socket at all), scram-sha-256 password auth for the bootstrap superuser ``advisor``
with a random password, one database ``advisor``; at the end ``pg_ctl stop -m fast``
and the dir is removed. PostgreSQL refuses to run as root: as root the server runs as
the ``postgres`` user (created by the Debian package; override with $PGTEST_OS_USER),
and the temp dir is chowned to it. Skips (never errors) when the server binaries, the
Python driver, or a non-root user are missing. Start-up takes ~1-2 s.

Environment: ``PGTEST_BINDIR`` (a dir holding initdb/pg_ctl/postgres; default: the
newest ``/usr/lib/postgresql/*/bin``), ``PGTEST_DRIVER`` (``psycopg`` or ``psycopg2``;
default: whichever is importable, psycopg first), ``PGTEST_OS_USER``.
"""

from __future__ import annotations

import contextlib
import glob
import importlib.util
import os
import pwd
import re
import secrets
import shutil
import socket
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

USER = "advisor"
DBNAME = "advisor"
_TOOLS = ("initdb", "pg_ctl", "postgres", "createdb")
# driver name in the URL -> (module to import, pip package)
DRIVERS = {"psycopg": ("psycopg", "psycopg[binary]"), "psycopg2": ("psycopg2", "psycopg2-binary")}


class PgUnavailable(Exception):
    """The server cannot be started here (missing binaries/driver/user): tests skip."""


def find_bindir() -> Path:
    """The newest Debian PostgreSQL bin dir that has every tool we need."""
    env = os.environ.get("PGTEST_BINDIR")
    candidates = [Path(env)] if env else sorted(
        (Path(p) for p in glob.glob("/usr/lib/postgresql/*/bin")),
        key=lambda p: [int(x) if x.isdigit() else 0 for x in re.split(r"[.]", p.parent.name)],
        reverse=True,
    )
    for d in candidates:
        if all(os.access(d / t, os.X_OK) for t in _TOOLS):
            return d
    where = env or "/usr/lib/postgresql/*/bin"
    raise PgUnavailable(
        f"PostgreSQL server binaries not found in {where} (need {', '.join(_TOOLS)}); "
        "install them with: apt-get install -y postgresql"
    )


def pick_driver() -> str:
    wanted = os.environ.get("PGTEST_DRIVER")
    order = [wanted] if wanted else list(DRIVERS)
    for name in order:
        if name not in DRIVERS:
            raise PgUnavailable(f"PGTEST_DRIVER={name!r}: expected one of {sorted(DRIVERS)}")
        if importlib.util.find_spec(DRIVERS[name][0]) is not None:
            return name
    pkgs = " or ".join(DRIVERS[n][1] for n in order)
    raise PgUnavailable(f"no PostgreSQL driver for SQLAlchemy is installed; pip install {pkgs}")


def _os_user() -> pwd.struct_passwd | None:
    """The user the server runs as: None (ourselves) unless we are root."""
    if os.geteuid() != 0:
        return None
    name = os.environ.get("PGTEST_OS_USER", "postgres")
    try:
        return pwd.getpwnam(name)
    except KeyError:
        raise PgUnavailable(
            f"running as root and there is no {name!r} user to run PostgreSQL as "
            "(PostgreSQL refuses root); `apt-get install postgresql` creates one, or: useradd -r postgres"
        ) from None


def _base_tmp(pw: pwd.struct_passwd | None) -> str | None:
    """A parent dir the server user can traverse (root's TMPDIR might be private)."""
    if pw is None:
        return None
    d = Path(tempfile.gettempdir()).resolve()
    for p in (d, *d.parents):
        if not p.stat().st_mode & stat.S_IXOTH:
            return "/tmp"
    return str(d)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class PgServer:
    bindir: Path
    root: Path
    port: int
    password: str
    driver: str
    host: str = "127.0.0.1"
    user: str = USER
    dbname: str = DBNAME
    os_user: pwd.struct_passwd | None = None
    _started: bool = field(default=False, repr=False)

    # -- public ---------------------------------------------------------------------------
    def url(self, dbname: str | None = None, driver: str | None = None) -> str:
        drv = self.driver if driver is None else driver
        scheme = "postgresql" if drv == "" else f"postgresql+{drv}"
        return f"{scheme}://{self.user}:{self.password}@{self.host}:{self.port}/{dbname or self.dbname}"

    def create_database(self, name: str) -> str:
        """A fresh empty database (e.g. to test table-creation races); returns its URL."""
        if not re.fullmatch(r"[a-z_][a-z0-9_]{0,62}", name):
            raise ValueError(f"database name {name!r}: use [a-z_][a-z0-9_]*")
        self._run([self.bindir / "createdb", "-h", self.host, "-p", str(self.port), "-U", self.user, name],
                  env={"PGPASSWORD": self.password})
        return self.url(name)

    # -- lifecycle ------------------------------------------------------------------------
    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def log(self) -> Path:
        return self.root / "server.log"

    def _run(self, cmd: list, env: dict | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
        kw = {}
        if self.os_user is not None:
            kw = {"user": self.os_user.pw_uid, "group": self.os_user.pw_gid, "extra_groups": []}
        full_env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C", "HOME": str(self.root)}
        full_env.update(env or {})
        proc = subprocess.run([str(c) for c in cmd], cwd=self.root, env=full_env, capture_output=True, text=True,
                              timeout=timeout, **kw)
        if proc.returncode != 0:
            raise RuntimeError(
                f"{Path(str(cmd[0])).name} failed (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
                + self._log_tail()
            )
        return proc

    def _log_tail(self) -> str:
        try:
            return "\n--- server.log (tail) ---\n" + "\n".join(self.log.read_text().splitlines()[-20:])
        except OSError:
            return ""

    def initdb(self) -> None:
        pwfile = self.root / "pw"
        pwfile.write_text(self.password + "\n")
        pwfile.chmod(0o600)
        if self.os_user is not None:
            os.chown(pwfile, self.os_user.pw_uid, self.os_user.pw_gid)
        try:
            self._run([self.bindir / "initdb", "-D", self.data, "-U", self.user, f"--pwfile={pwfile}",
                       "--auth=scram-sha-256", "-E", "UTF8", "--locale=C", "--no-sync", "--no-instructions"])
        finally:
            pwfile.unlink(missing_ok=True)
        conf = {
            "listen_addresses": "'127.0.0.1'",
            "unix_socket_directories": "''",  # TCP only: no socket in /var/run/postgresql or /tmp
            "fsync": "off", "synchronous_commit": "off", "full_page_writes": "off",  # throw-away data
            "shared_buffers": "16MB", "max_connections": "60",
            "logging_collector": "off", "log_min_messages": "warning",
        }
        with (self.data / "postgresql.conf").open("a") as f:
            f.write("\n# pg_server.py\n" + "".join(f"{k} = {v}\n" for k, v in conf.items()))

    def start(self) -> None:
        # pg_ctl -w waits for "ready" in postmaster.pid, which works without a unix socket.
        self._run([self.bindir / "pg_ctl", "-D", self.data, "-l", self.log, "-w", "-t", "30",
                   "-o", f"-p {self.port}", "start"])
        self._started = True
        self._run([self.bindir / "createdb", "-h", self.host, "-p", str(self.port), "-U", self.user, self.dbname],
                  env={"PGPASSWORD": self.password})

    def stop(self) -> None:
        if not self._started:
            return
        try:
            self._run([self.bindir / "pg_ctl", "-D", self.data, "-m", "fast", "-w", "-t", "20", "stop"])
        except Exception:
            with contextlib.suppress(Exception):
                self._run([self.bindir / "pg_ctl", "-D", self.data, "-m", "immediate", "-w", "stop"])
        self._started = False


@contextlib.contextmanager
def running_postgres() -> Iterator[PgServer]:
    """Start a server, yield it, always stop it and remove its dir. Raises PgUnavailable."""
    bindir = find_bindir()
    driver = pick_driver()
    os_user = _os_user()
    root = Path(tempfile.mkdtemp(prefix="pgtest-", dir=_base_tmp(os_user)))
    try:
        if os_user is not None:
            os.chown(root, os_user.pw_uid, os_user.pw_gid)
        srv = PgServer(bindir=bindir, root=root, port=0, password=secrets.token_urlsafe(18), driver=driver,
                       os_user=os_user)
        srv.initdb()
        for attempt in range(3):  # a "free" port can be taken between free_port() and the server's bind()
            srv.port = free_port()
            try:
                srv.start()
                break
            except RuntimeError as exc:
                srv.stop()
                if attempt == 2 or not re.search(r"could not bind|already in use|could not create any TCP", str(exc)):
                    raise
        try:
            yield srv
        finally:
            srv.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PgServer]:
    try:
        cm = running_postgres()
        srv = cm.__enter__()
    except PgUnavailable as exc:
        if os.environ.get("ADVISOR_REQUIRE_POSTGRES"):  # CI installs the server: a skip would hide a failure
            pytest.fail(f"PostgreSQL test server unavailable: {exc}")
        pytest.skip(f"PostgreSQL test server unavailable: {exc}")
    try:
        yield srv
    finally:
        cm.__exit__(None, None, None)


@pytest.fixture(scope="session")
def postgres_url(postgres_server: PgServer) -> str:
    return postgres_server.url()


if __name__ == "__main__":  # manual smoke test: python tests/pg_server.py
    t0 = time.perf_counter()
    with running_postgres() as s:
        print(f"up in {time.perf_counter() - t0:.2f}s: {s.url().replace(s.password, '***')} (data {s.data})")
    print(f"total {time.perf_counter() - t0:.2f}s")
