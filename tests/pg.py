"""A real, throwaway PostgreSQL server for the tests (Debian's `postgresql` package, which
scripts/setup.sh installs): no mock database.

`postgres_server` (session scope: one server per pytest process, so one per xdist
worker) runs initdb into a temporary directory as the unprivileged `postgres` user
(postgres refuses to run as root), starts it on 127.0.0.1 and a free port with its
socket in that directory, and stops it and deletes the directory at the end.
`server.create_database()` gives each test a fresh, empty database URL.
"""

from __future__ import annotations

import glob
import itertools
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

PG_USER = "postgres"
START_TIMEOUT_S = 60


def find_bindir() -> Path | None:
    """The newest /usr/lib/postgresql/<version>/bin holding initdb and pg_ctl."""
    found = [Path(p) for p in glob.glob("/usr/lib/postgresql/*/bin") if Path(p, "initdb").exists()]
    version = lambda p: [int(x) for x in re.findall(r"\d+", p.parent.name)]
    return max(found, key=version) if found else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PostgresServer:
    def __init__(self, bindir: Path, root: Path) -> None:
        self.bindir, self.root = bindir, root
        self.data = root / "data"
        self.log = root / "server.log"
        self.port = 0
        self._names = itertools.count(1)
        self._as_postgres = os.geteuid() == 0
        if self._as_postgres:
            try:
                pw = pwd.getpwnam(PG_USER)
            except KeyError:
                pytest.fail(f"no '{PG_USER}' user to run PostgreSQL as (root is refused): run ./scripts/setup.sh")
            self._ids = (pw.pw_uid, pw.pw_gid)
            os.chown(root, *self._ids)

    def _run(self, *args: str, timeout: float = START_TIMEOUT_S, check: bool = True) -> subprocess.CompletedProcess:
        kw: dict = {"cwd": self.root, "capture_output": True, "text": True, "timeout": timeout,
                    "env": {"PATH": f"{self.bindir}:/usr/bin:/bin", "LC_ALL": "C", "HOME": str(self.root)}}
        if self._as_postgres:
            kw.update(user=self._ids[0], group=self._ids[1], extra_groups=[])
        done = subprocess.run([str(self.bindir / args[0]), *args[1:]], check=False, **kw)
        if check and done.returncode != 0:
            raise RuntimeError(f"{' '.join(args)} failed ({done.returncode}):\n{done.stdout}{done.stderr}"
                               f"{self.log.read_text() if self.log.exists() else ''}")
        return done

    def start(self) -> None:
        self._run("initdb", "-D", str(self.data), "-U", PG_USER, "--auth=trust", "-E", "UTF8", "--locale=C",
                  "--no-sync", "--no-instructions")
        for attempt in range(3):  # another process may take the free port before the server binds it
            self.port = free_port()
            opts = f"-k {self.root} -h 127.0.0.1 -p {self.port} -c fsync=off -c full_page_writes=off"
            started = self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-w", "-t",
                                str(START_TIMEOUT_S), "-o", opts, "start", check=attempt == 2)
            if started.returncode == 0:
                break
        deadline = time.monotonic() + START_TIMEOUT_S
        while self._run("pg_isready", "-h", "127.0.0.1", "-p", str(self.port), "-t", "2", check=False).returncode:
            if time.monotonic() > deadline:
                raise RuntimeError(f"PostgreSQL on port {self.port} never answered:\n{self.log.read_text()}")
            time.sleep(0.1)

    def stop(self) -> None:
        if self.data.exists():
            self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "-t", "30", "stop", check=False)
            pidfile = self.data / "postmaster.pid"
            if pidfile.exists():  # still there: it did not stop in time
                try:
                    os.kill(int(pidfile.read_text().split()[0]), signal.SIGKILL)
                except (ValueError, IndexError, ProcessLookupError):
                    pass
        shutil.rmtree(self.root, ignore_errors=True)

    def url(self, database: str) -> str:
        return f"postgresql://{PG_USER}@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str | None = None) -> str:
        """A new empty database; its URL."""
        import psycopg

        name = name or f"t{next(self._names)}"
        with psycopg.connect(host="127.0.0.1", port=self.port, user=PG_USER, dbname="postgres",
                             autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    bindir = find_bindir()
    if bindir is None:
        pytest.fail("PostgreSQL is not installed (no /usr/lib/postgresql/*/bin/initdb): run ./scripts/setup.sh")
    server = PostgresServer(bindir, Path(tempfile.mkdtemp(prefix="loom-pg-")))
    try:
        server.start()
        yield server
    finally:
        server.stop()
