"""The store's plumbing: connections per thread, write transactions, the event log, meta.

One Engine with a pool is shared by the API's threads and the engine thread. A write
takes the store's write lock for its whole transaction (connect.py says why); reads
run in their own short transactions and never wait for writers. `transaction()` lets
the engine group many writes into one commit: inside it, every store call on that
thread joins the same connection (and sees its own uncommitted writes).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Self

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from loom.service.store import validate as check
from loom.service.store.connect import WRITE_OPTION, lock_for_write
from loom.service.store.rows import EventRow
from loom.service.store.schema import events, jobs, meta


class StoreError(RuntimeError):
    """The store was used in a way that is a bug in its caller (not a user's mistake)."""


class StoreBase:
    def __init__(self, engine: Engine, url: str) -> None:
        self.engine = engine
        self.url = url  # password masked: safe to log
        self._local = threading.local()
        self._closed = False
        self._known_tenants: set[str] = set()
        self._job_tenants: dict[str, str] = {}
        # one writer at a time within this process: threads queue on a lock instead of on the
        # database's (SQLite's busy handler sleeps with a growing back-off, up to 100 ms a try:
        # 32 API threads polling it measured ~60 submissions/s with a 6 s p99; queued here, the
        # database lock is only ever contended by another process)
        self._writer = threading.Lock()

    # ------------------------------------------------------------------ lifecycle
    def close(self) -> None:
        """Return every pooled connection; the store cannot be used afterwards."""
        self._closed = True
        self.engine.dispose()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Store({self.url!r})"

    # ------------------------------------------------------------------ transactions
    @contextmanager
    def transaction(self) -> Iterator[None]:
        """Group this thread's store writes into one commit (all or none). Nested calls are
        no-ops: the outermost one commits. Keep it short: it holds the write lock."""
        with self._write():
            yield

    @property
    def in_transaction(self) -> bool:
        return getattr(self._local, "conn", None) is not None

    @contextmanager
    def _write(self) -> Iterator[Connection]:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            yield conn
            return
        self._check_open()
        with self._writer, self.engine.connect() as conn:
            conn.execution_options(**{WRITE_OPTION: True})
            with conn.begin():
                lock_for_write(conn)
                self._local.conn = conn
                try:
                    yield conn
                finally:
                    self._local.conn = None

    @contextmanager
    def _read(self) -> Iterator[Connection]:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            yield conn
            return
        self._check_open()
        with self.engine.connect() as conn, conn.begin():
            yield conn

    def _check_open(self) -> None:
        if self._closed:
            raise StoreError(f"{self.url}: the store is closed")

    # ------------------------------------------------------------------ event log
    def _emit(self, conn: Connection, at: float, kind: str, job_id: str | None, tenant: str | None,
              data: dict[str, Any]) -> None:
        conn.execute(events.insert().values(at=at, kind=kind, job_id=job_id, tenant=tenant, data=data))

    def _tenant_of(self, conn: Connection, job_id: str | None) -> str | None:
        """A job's tenant (it never changes, so it is remembered: every event of the job names it)."""
        if job_id is None:
            return None
        known = self._job_tenants.get(job_id)
        if known is not None:
            return known
        tenant = conn.execute(sa.select(jobs.c.tenant).where(jobs.c.job_id == job_id)).scalar_one_or_none()
        if tenant is not None:
            if len(self._job_tenants) > 1_000_000:
                self._job_tenants.clear()
            self._job_tenants[job_id] = tenant
        return tenant

    def events_after(self, seq: int, *, tenant: str | None = None, limit: int = 500) -> list[EventRow]:
        """Events with a seq above `seq`, oldest first: a server-sent stream's next page
        (resume with the last seq seen). A tenant sees only its own jobs' events; tenant
        None (an admin) sees everything, cluster events included."""
        check.integer(seq, "seq")
        limit = check.limit(limit)
        q = sa.select(events).where(events.c.seq > seq)
        if tenant is not None:
            q = q.where(events.c.tenant == check.tenant_name(tenant))
        with self._read() as c:
            rows = c.execute(q.order_by(events.c.seq).limit(limit)).all()
        return [EventRow(r.seq, r.at, r.kind, r.job_id, r.tenant, r.data) for r in rows]

    def last_event_seq(self) -> int:
        """The newest event's seq (0 when none): where a stream that wants only new events starts."""
        with self._read() as c:
            return c.execute(sa.select(sa.func.max(events.c.seq))).scalar() or 0

    # ------------------------------------------------------------------ meta
    def meta(self, key: str, default: Any = None) -> Any:
        """A small JSON value kept across restarts (the engine's last seen submission seq, the
        ticket counter); `default` when never set."""
        key = check.label(key, "key")
        with self._read() as c:
            row = c.execute(sa.select(meta.c.value).where(meta.c.key == key)).first()
        return default if row is None else row.value

    def set_meta(self, key: str, value: Any) -> None:
        key = check.label(key, "key")
        value = check.json_value(value, "value")
        with self._write() as c:
            done = c.execute(meta.update().where(meta.c.key == key).values(value=value)).rowcount
            if not done:  # writes are serialised: nobody inserts the key between these two
                c.execute(meta.insert().values(key=key, value=value))

