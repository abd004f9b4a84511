"""From a `--db` value to a configured SQLAlchemy engine.

Both databases get the same discipline: writes are serialised. On SQLite that is
`BEGIN IMMEDIATE` (the write lock taken up front, waited for under a busy timeout,
instead of a deferred transaction failing with SQLITE_BUSY when it tries to upgrade);
on PostgreSQL a transaction-scoped advisory lock. Serialised writes make every
autoincrement (a job's submission `seq`, an event's `seq`) commit in the order it was
handed out, so a reader polling "everything after N" can never skip a row that commits
late — PostgreSQL sequences alone do not promise that.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import URL, Connection, Engine, make_url

from loom.errors import LoomInputError

WRITE_OPTION = "loom_write"  # execution option marking a connection whose next BEGIN is a write
PG_LOCK_KEY = 0x4C6F6F6D  # "Loom": the advisory lock that serialises the store's writes
SQLITE_BUSY_TIMEOUT_S = 60.0  # a writer waits this long for the lock before SQLITE_BUSY
# SQLite's durability: "normal" (the default) keeps every commit through a crash or kill -9 of
# the service; "full" also through a power cut or OS crash, at an fsync per commit (the
# commit rate then is the disk's fsync rate: ~100/s on slow disks, under the service's floor)
SYNCHRONOUS = ("normal", "full")
POOL = {"pool_size": 8, "max_overflow": 40, "pool_timeout": 60.0}  # API threads + the engine thread


def masked(url: URL | str) -> str:
    """The URL as it may be shown: password replaced by ***."""
    try:
        return (url if isinstance(url, URL) else make_url(url)).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001 - whatever is wrong with it, the text must not show a password
        return "<unparseable database URL>"


def parse(target: str | os.PathLike[str]) -> URL:
    """A `--db` value as a SQLAlchemy URL: a plain path or sqlite:///path means SQLite,
    postgresql://… PostgreSQL through psycopg 3. Anything else is a LoomInputError."""
    text = os.fspath(target).strip()
    if not text:
        raise LoomInputError("empty database URL: give a file path or postgresql://user@host:port/db", field="db")
    if "://" not in text:
        return _sqlite_url(text, text)
    try:
        url = make_url(text)
    except Exception:  # noqa: BLE001 - make_url raises ArgumentError, ValueError, KeyError...
        raise LoomInputError(f"cannot parse database URL '{masked(text)}'", field="db") from None
    backend, _, driver = url.drivername.partition("+")
    if backend == "sqlite":
        extra = set(url.query) - {"synchronous"}
        if extra:
            raise LoomInputError(f"{masked(url)}: unknown option(s) {', '.join(sorted(extra))}; SQLite URLs take "
                                 "only synchronous=normal|full", field="db")
        sync = str(url.query.get("synchronous", "normal")).lower()
        if sync not in SYNCHRONOUS:
            raise LoomInputError(f"{masked(url)}: synchronous must be normal or full (got {sync!r})", field="db")
        if not url.database or url.database == ":memory:" or url.database.startswith("file:"):
            raise LoomInputError(f"{masked(url)}: the store must outlive the process; give a file, "
                                 "e.g. sqlite:///var/lib/loom/loom.db", field="db")
        return _sqlite_url(url.database, text).update_query_dict({"synchronous": sync})
    if backend in ("postgresql", "postgres"):
        if driver not in ("", "psycopg"):
            raise LoomInputError(f"{masked(url)}: the store talks to PostgreSQL through psycopg 3; "
                                 "write postgresql://… (no driver)", field="db")
        if not url.database:
            raise LoomInputError(f"{masked(url)}: name the database, e.g. postgresql://loom@127.0.0.1:5432/loom",
                                 field="db")
        return url.set(drivername="postgresql+psycopg")
    raise LoomInputError(f"unsupported database '{masked(url)}': use a SQLite file path (or sqlite:///path) "
                         "or postgresql://user@host:port/db", field="db")


def _sqlite_url(path: str, given: str) -> URL:
    p = Path(path).expanduser()
    if p.is_dir():
        raise LoomInputError(f"'{given}' is a directory; give the database file, e.g. {p / 'loom.db'}", field="db")
    try:
        p.parent.mkdir(parents=True, exist_ok=True)  # a fresh data directory on first start
    except OSError as e:
        raise LoomInputError(f"cannot create the directory of '{given}': {e.strerror}", field="db") from None
    return URL.create("sqlite+pysqlite", database=str(p.resolve()))


def create(url: URL) -> Engine:
    """An engine with the store's connection setup and write discipline (see the module doc)."""
    if url.get_backend_name() == "sqlite":
        sync = url.query.get("synchronous", "normal")
        engine = sa.create_engine(url.difference_update_query(["synchronous"]), poolclass=sa.QueuePool, **POOL,
                                  connect_args={"timeout": SQLITE_BUSY_TIMEOUT_S, "check_same_thread": False})
        event.listen(engine, "connect", lambda dbapi_conn, _record: _sqlite_connect(dbapi_conn, str(sync)))
        event.listen(engine, "begin", _sqlite_begin)
        return engine
    return sa.create_engine(url, pool_pre_ping=True, **POOL,  # a restarted server costs no failed call
                            connect_args={"connect_timeout": 10, "application_name": "loom"})


def _sqlite_connect(dbapi_conn: sqlite3.Connection, synchronous: str) -> None:
    # sqlite3's own transaction handling is off: it would BEGIN DEFERRED lazily and never
    # around SELECTs; `_sqlite_begin` issues the BEGIN instead (SQLAlchemy's documented recipe)
    dbapi_conn.isolation_level = None
    cur = dbapi_conn.cursor()
    cur.execute(f"PRAGMA busy_timeout = {int(SQLITE_BUSY_TIMEOUT_S * 1000)}")
    cur.execute("PRAGMA journal_mode = WAL")  # readers never block the writer, nor it them
    cur.execute(f"PRAGMA synchronous = {synchronous.upper()}")  # see SYNCHRONOUS
    cur.execute("PRAGMA foreign_keys = ON")
    cur.close()


def _sqlite_begin(conn: Connection) -> None:
    write = conn.get_execution_options().get(WRITE_OPTION, False)
    conn.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")


def lock_for_write(conn: Connection) -> None:
    """Called first in every write transaction: PostgreSQL's half of the write discipline."""
    if conn.dialect.name == "postgresql":
        conn.execute(sa.text("SELECT pg_advisory_xact_lock(:k)"), {"k": PG_LOCK_KEY})


def describe_failure(url: URL, error: BaseException) -> str:
    """One line about why a database could not be opened, never showing the password."""
    orig = getattr(error, "orig", None) or error
    text = " ".join(str(orig).split()) or type(orig).__name__
    if url.password:
        text = text.replace(str(url.password), "***")
    return text
