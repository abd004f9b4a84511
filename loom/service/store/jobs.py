"""Jobs as the API sees them: submit, cancel, look up, list.

A submission is one transaction: the job row (state SUBMITTED) and its event. Its
`seq` increases in commit order (writes are serialised), so the engine takes in new
work by asking for everything after the last seq it saw, and a restart resumes there.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable, Sequence
from typing import Any

import sqlalchemy as sa

from loom.errors import LoomInputError
from loom.service.store import validate as check
from loom.service.store.rows import SUBMITTED, TERMINAL_STATES, JobRow
from loom.service.store.schema import jobs
from loom.service.store.tenants import TenantsMixin

_CHUNK = 500  # ids per IN (...) list


def to_job(r: Any) -> JobRow:
    return JobRow(job_id=r.job_id, tenant=r.tenant, spec=r.spec, state=r.state, seq=r.seq,
                  submitted_at=r.submitted_at, cancel_requested=bool(r.cancel_requested),
                  allocation=r.allocation, plan=r.plan, updated_at=r.updated_at,
                  idempotency_key=r.idempotency_key, cancel_handled=bool(r.cancel_handled))


class JobsMixin(TenantsMixin):
    def submit(self, tenant: str, spec: dict[str, Any], *, idempotency_key: str | None = None) -> JobRow:
        """Store a new job (state SUBMITTED) and return its row. A job id is generated when the
        spec has none. The same idempotency key from the same tenant returns the job it
        created the first time (a retried request), and is refused with a different spec."""
        tenant = check.tenant_name(tenant)
        spec = check.json_object(spec, "spec")
        given_id = spec.get("job_id")
        if given_id is not None:
            check.identifier(given_id, "job_id")
        key = None if idempotency_key is None else check.label(idempotency_key, "idempotency_key")
        with self._write() as c:  # under the write lock: as few round trips as possible
            now = time.time()  # taken under the lock: submission times follow seq
            self._require_tenant(c, tenant)
            job_id = given_id or _new_job_id()
            while True:
                same = jobs.c.job_id == job_id
                if key is not None:
                    same = sa.or_(same, sa.and_(jobs.c.tenant == tenant, jobs.c.idempotency_key == key))
                clashes = c.execute(sa.select(jobs).where(same)).all()
                for row in clashes:
                    if key is not None and row.tenant == tenant and row.idempotency_key == key:
                        return _replay(row, spec)
                if not clashes:
                    break
                if given_id is not None:
                    raise LoomInputError(f"a job '{job_id}' already exists; job ids are unique", field="job_id")
                job_id = _new_job_id()
            stored = {**spec, "job_id": job_id}
            seq = c.execute(jobs.insert().values(
                job_id=job_id, tenant=tenant, spec=stored, state=SUBMITTED, submitted_at=now, updated_at=now,
                cancel_requested=False, cancel_handled=False, allocation=None, plan=None, idempotency_key=key,
            )).inserted_primary_key[0]
            self._emit(c, now, "submitted", job_id, tenant, {"seq": seq, "state": SUBMITTED})
        return JobRow(job_id, tenant, stored, SUBMITTED, seq, now, False, None, None, now, key)

    def request_cancel(self, job_id: str, tenant: str | None) -> JobRow | None:
        """Ask the engine to cancel a job. None if there is no such job or it is not `tenant`'s
        (tenant None: an admin, any job) — the two look the same to a client on purpose.
        A job already finished, or already asked, is returned unchanged."""
        if not check.is_identifier(job_id):
            return None
        with self._write() as c:
            row = c.execute(sa.select(jobs).where(jobs.c.job_id == job_id)).first()
            if row is None or (tenant is not None and row.tenant != tenant):
                return None
            if row.cancel_requested or row.state in TERMINAL_STATES:
                return to_job(row)
            now = time.time()
            c.execute(jobs.update().where(jobs.c.job_id == job_id).values(cancel_requested=True, updated_at=now))
            self._emit(c, now, "cancel_requested", job_id, row.tenant, {"state": row.state})
            row = c.execute(sa.select(jobs).where(jobs.c.job_id == job_id)).one()
        return to_job(row)

    def job(self, job_id: str) -> JobRow | None:
        if not check.is_identifier(job_id):
            return None
        with self._read() as c:
            row = c.execute(sa.select(jobs).where(jobs.c.job_id == job_id)).first()
        return None if row is None else to_job(row)

    def jobs(self, *, tenant: str | None = None, states: Sequence[str] | None = None, limit: int = 1000,
             after: str | None = None) -> list[JobRow]:
        """Jobs in submission order, at most `limit`; `after` (a job id from the previous page)
        continues a listing. `tenant` restricts to that tenant's jobs (None: all)."""
        limit = check.limit(limit)
        q = sa.select(jobs)
        if tenant is not None:
            q = q.where(jobs.c.tenant == check.tenant_name(tenant))
        if states is not None:
            if isinstance(states, str):
                states = [states]
            q = q.where(jobs.c.state.in_([check.job_state(s, "states") for s in states]))
        if after is not None and not check.is_identifier(after):
            raise LoomInputError(f"no job {after!r} to continue after", field="after")
        with self._read() as c:
            if after is not None:
                seq = c.execute(sa.select(jobs.c.seq).where(jobs.c.job_id == after)).scalar_one_or_none()
                if seq is None or (tenant is not None and self._tenant_of(c, after) != tenant):
                    raise LoomInputError(f"no job '{after}' to continue after", field="after")
                q = q.where(jobs.c.seq > seq)
            rows = c.execute(q.order_by(jobs.c.seq).limit(limit)).all()
        return [to_job(r) for r in rows]

    def count_jobs(self, *, tenant: str | None = None) -> dict[str, int]:
        """Jobs per state (for metrics and the dashboard) without reading them."""
        q = sa.select(jobs.c.state, sa.func.count()).group_by(jobs.c.state)
        if tenant is not None:
            q = q.where(jobs.c.tenant == check.tenant_name(tenant))
        with self._read() as c:
            return {state: n for state, n in c.execute(q).all()}

    # ------------------------------------------------------------------ the engine side
    def submissions_after(self, seq: int, *, limit: int | None = None) -> list[JobRow]:
        """Jobs submitted after submission number `seq`, in submission order."""
        check.integer(seq, "seq")
        q = sa.select(jobs).where(jobs.c.seq > seq).order_by(jobs.c.seq)
        if limit is not None:
            q = q.limit(check.limit(limit, maximum=1_000_000))
        with self._read() as c:
            return [to_job(r) for r in c.execute(q).all()]

    def cancel_requests(self) -> list[str]:
        """Ids of jobs whose cancel was asked and not yet handled, in submission order."""
        q = (sa.select(jobs.c.job_id).where(jobs.c.cancel_requested == sa.true(), jobs.c.cancel_handled == sa.false())
             .order_by(jobs.c.seq))
        with self._read() as c:
            return list(c.execute(q).scalars())

    def mark_cancel_handled(self, job_ids: Iterable[str]) -> None:
        ids = [j for j in job_ids if check.is_identifier(j)]
        with self._write() as c:
            for i in range(0, len(ids), _CHUNK):
                c.execute(jobs.update().where(jobs.c.job_id.in_(ids[i:i + _CHUNK])).values(cancel_handled=True))


def _new_job_id() -> str:
    return "j-" + uuid.uuid4().hex[:12]


def _replay(row: Any, spec: dict[str, Any]) -> JobRow:
    """The job an idempotency key made before, if `spec` is the request that made it."""
    stored = dict(row.spec)
    if "job_id" not in spec:
        stored.pop("job_id", None)
    if stored != spec:
        raise LoomInputError(f"this idempotency key was used for job '{row.job_id}' with a different spec; "
                             "use a new key for a new job", field="idempotency_key")
    return to_job(row)
