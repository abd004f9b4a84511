"""The service's store (loom.service.store) through its public interface, on real databases:
every test runs on SQLite (a file in tmp_path) and on PostgreSQL (a server that tests/pg.py
starts; marker `postgres`)."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

from loom.errors import LoomInputError
from loom.service.store import Store, StoreError, migrate, schema


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store_url(request, tmp_path) -> str:
    if request.param == "sqlite":
        return str(tmp_path / "data" / "loom.db")
    return request.getfixturevalue("postgres_server").create_database()


@pytest.fixture
def store(store_url):
    s = Store.open(store_url)
    yield s
    s.close()


@pytest.fixture
def two(store):
    """A store with tenants alice, bob and an admin."""
    store.create_tenant("alice")
    store.create_tenant("bob")
    store.create_tenant("root", admin=True)
    return store


@contextmanager
def raises_field(field: str, match: str | None = None):
    """A LoomInputError naming `field` (and matching `match`)."""
    with pytest.raises(LoomInputError, match=match) as info:
        yield info
    assert info.value.field == field, info.value


# ----------------------------------------------------------------------------- opening and migrations
def test_fresh_database_is_migrated_to_head_and_matches_the_metadata(store):
    with store.engine.connect() as c:
        assert migrate.current(c) == migrate.head() == "0001"
        ctx = MigrationContext.configure(c, opts={"version_table": migrate.VERSION_TABLE, "compare_type": True})
        assert compare_metadata(ctx, schema.metadata) == []


def test_reopening_keeps_everything_and_does_not_migrate_again(store_url):
    s = Store.open(store_url)
    _, token = s.create_tenant("alice")
    job = s.submit("alice", {"gpus": 2})
    s.set_meta("engine.seq", 7)
    s.close()
    s = Store.open(store_url)
    try:
        assert s.job(job.job_id) == job
        assert s.authenticate(token).name == "alice"
        assert s.meta("engine.seq") == 7
        with s.engine.connect() as c:
            assert migrate.current(c) == migrate.head()
    finally:
        s.close()


def test_concurrent_opens_of_a_fresh_database_migrate_it_once(store_url):
    errors, stores = [], []

    def open_one():
        try:
            stores.append(Store.open(store_url))
        except Exception as e:  # noqa: BLE001 - collected and asserted below
            errors.append(e)

    threads = [threading.Thread(target=open_one) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for s in stores:
        s.close()
    assert errors == [] and len(stores) == 4


def test_a_schema_from_a_newer_loom_is_refused(store_url):
    Store.open(store_url).close()
    engine = sa.create_engine(Store.open(store_url).engine.url)  # same database, plain engine
    with engine.begin() as c:
        c.execute(sa.text(f"UPDATE {migrate.VERSION_TABLE} SET version_num = '9999'"))
    engine.dispose()
    with raises_field("db", match="9999.*newer Loom"):
        Store.open(store_url)


def test_sqlite_url_forms_and_pragmas(tmp_path):
    path = tmp_path / "a" / "b" / "loom.db"
    for url in (str(path), f"sqlite:///{path}", path):
        s = Store.open(url)
        assert s.dialect == "sqlite" and s.url == str(path)
        with s.engine.connect() as c:
            assert c.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
            assert c.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
            assert c.exec_driver_sql("PRAGMA busy_timeout").scalar() >= 10_000
            assert c.exec_driver_sql("PRAGMA synchronous").scalar() == 1  # NORMAL: survives kill -9
        s.close()
    with Store.open(f"sqlite:///{path}?synchronous=full") as s, s.engine.connect() as c:
        assert c.exec_driver_sql("PRAGMA synchronous").scalar() == 2  # FULL: survives a power cut


@pytest.mark.parametrize("url, match", [
    ("", "empty"),
    ("mysql://u@h/db", "unsupported"),
    ("sqlite://", "outlive"),
    ("sqlite:///:memory:", "outlive"),
    ("sqlite:///x.db?mode=ro", "unknown option.*mode"),
    ("sqlite:///x.db?synchronous=sometimes", "normal or full"),
    ("postgresql+psycopg2://u@h/db", "psycopg 3"),
    ("postgresql://u@127.0.0.1:5432", "name the database"),
])
def test_bad_urls_are_clear_input_errors(url, match):
    with raises_field("db", match=match):
        Store.open(url)


def test_a_directory_or_a_file_that_is_no_database_is_refused(tmp_path):
    with raises_field("db", match="directory"):
        Store.open(tmp_path)
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"this is not a database" * 200)
    with raises_field("db", match=f"{junk}.*not a database"):
        Store.open(junk)


def test_an_unreachable_server_is_named_with_its_password_masked():
    from pg import free_port

    url = f"postgresql://loom:s3cret-pw@127.0.0.1:{free_port()}/loom"
    with raises_field("db") as info:
        Store.open(url)
    text = str(info.value)
    assert "s3cret-pw" not in text
    assert "postgresql+psycopg://loom:***@127.0.0.1" in text and "cannot open the store" in text


def test_a_closed_store_says_so(store):
    store.close()
    with pytest.raises(StoreError, match="closed"):
        store.jobs()


# ----------------------------------------------------------------------------- tenants and tokens
def test_tenants_and_tokens(store):
    alice, token = store.create_tenant("alice")
    root, root_token = store.create_tenant("root", admin=True)
    assert (alice.name, alice.admin, root.admin) == ("alice", False, True)
    assert store.authenticate(token) == alice
    assert store.authenticate(root_token) == root
    second = store.add_token("alice")
    assert second != token and store.authenticate(second) == alice
    for bad in ("", "x" * 10_000, token[:-1], token + "x", None, 42):
        assert store.authenticate(bad) is None
    assert [t.name for t in store.tenants()] == ["alice", "root"]
    assert store.tenant("alice") == alice and store.tenant("nobody") is None
    assert store.revoke_token(token) and not store.revoke_token(token)
    assert store.authenticate(token) is None and store.authenticate(second) == alice
    with raises_field("name", match="already exists"):
        store.create_tenant("alice")
    for bad in ("", "has space", "-dash", "x" * 65, None):
        with raises_field("name"):
            store.create_tenant(bad)
    with raises_field("tenant", match="no tenant 'alicia'; did you mean alice"):
        store.add_token("alicia")


def test_tokens_are_stored_hashed_never_in_clear(store, store_url):
    tokens = [store.create_tenant(f"t{i}")[1] for i in range(5)] + [store.add_token("t0")]
    dump = []
    with store.engine.connect() as c:
        for table in schema.metadata.sorted_tables:
            dump += [str(tuple(r)) for r in c.execute(sa.select(table)).all()]
    text = "\n".join(dump)
    assert all(t not in text for t in tokens)
    if store.dialect == "sqlite":  # the bytes on disk, WAL included
        raw = b"".join(p.read_bytes() for p in Path(store_url).parent.glob("loom.db*"))
        assert all(t.encode() not in raw for t in tokens)
        import hashlib

        assert hashlib.sha256(tokens[0].encode()).hexdigest().encode() in raw  # what is kept instead


# ----------------------------------------------------------------------------- submit
def test_submit_generates_ids_numbers_submissions_and_logs_them(two):
    a = two.submit("alice", {"gpus": 4, "duration": 60.0})
    b = two.submit("bob", {"job_id": "train-7", "gpus": 1, "command": ["python", "t.py"]})
    assert a.job_id.startswith("j-") and len(a.job_id) == 14 and b.job_id == "train-7"
    assert a.state == b.state == "SUBMITTED" and b.seq > a.seq
    assert a.spec == {"gpus": 4, "duration": 60.0, "job_id": a.job_id}
    assert not a.cancel_requested and a.allocation is None and a.plan is None
    assert abs(a.submitted_at - time.time()) < 60 and a.updated_at == a.submitted_at
    assert two.job(a.job_id) == a and two.job("nope") is None
    assert [(e.kind, e.job_id, e.tenant) for e in two.events_after(0)] == [
        ("submitted", a.job_id, "alice"), ("submitted", "train-7", "bob")]


def test_submit_rejects_bad_input_naming_the_field(two):
    two.submit("alice", {"job_id": "dup"})
    with raises_field("job_id", match="already exists"):
        two.submit("bob", {"job_id": "dup"})
    with raises_field("tenant", match="no tenant"):
        two.submit("carol", {})
    for bad_id in ("", "has space", "a/b", "x" * 201, 7):
        with raises_field("job_id"):
            two.submit("alice", {"job_id": bad_id})
    for bad_spec in ([1], "spec", {"x": math.nan}, {"x": {1, 2}}):
        with raises_field("spec"):
            two.submit("alice", bad_spec)
    with raises_field("idempotency_key"):
        two.submit("alice", {}, idempotency_key="has space")
    assert len(two.jobs()) == 1  # nothing half-written


def test_idempotency_key_returns_the_first_submission(two):
    first = two.submit("alice", {"gpus": 2}, idempotency_key="req-1")
    again = two.submit("alice", {"gpus": 2}, idempotency_key="req-1")
    assert again == first and len(two.jobs()) == 1 and len(two.events_after(0)) == 1
    named = two.submit("alice", {"job_id": "n1"}, idempotency_key="req-2")
    assert two.submit("alice", {"job_id": "n1"}, idempotency_key="req-2") == named
    other = two.submit("bob", {"gpus": 2}, idempotency_key="req-1")  # keys are per tenant
    assert other.job_id != first.job_id
    with raises_field("idempotency_key", match="different spec"):
        two.submit("alice", {"gpus": 3}, idempotency_key="req-1")


def test_32_threads_submitting_50_each(two):
    """No error, no duplicate seq, and a poller reading submissions_after as they commit
    (as the engine does) sees every submission exactly once, in seq order."""
    errors: list[BaseException] = []
    seen: list[int] = []
    done = threading.Event()

    def submitter(i: int) -> None:
        try:
            for k in range(50):
                two.submit("alice" if i % 2 else "bob", {"gpus": 1, "n": k}, idempotency_key=f"{i}-{k}")
        except BaseException as e:  # noqa: BLE001 - asserted below
            errors.append(e)

    def poller() -> None:
        last = 0
        while True:
            finished = done.is_set()
            rows = two.submissions_after(last)
            seen.extend(r.seq for r in rows)
            last = rows[-1].seq if rows else last
            if finished:
                return
            time.sleep(0.01)

    watcher = threading.Thread(target=poller)
    watcher.start()
    threads = [threading.Thread(target=submitter, args=(i,)) for i in range(32)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - t0
    done.set()
    watcher.join()
    assert errors == []
    seqs = [r.seq for r in two.jobs(limit=10_000)]
    assert len(seqs) == len(set(seqs)) == 1600
    assert seen == sorted(seqs)
    events = [e.seq for e in two.events_after(0, limit=10_000)]
    assert len(events) == len(set(events)) == 1600
    assert elapsed < 60, elapsed


CHILD = """
import os, signal, sys
from loom.service.store import Store
store = Store.open(sys.argv[1])
if sys.argv[2] == "once":
    store.submit("alice", {"job_id": "last-words"})
    os.kill(os.getpid(), signal.SIGKILL)
i = 0
while True:
    row = store.submit("alice", {"job_id": f"c{i}"})
    print(row.job_id, flush=True)
    i += 1
"""


def test_a_committed_submission_survives_sigkill(two, store_url):
    child = subprocess.run([sys.executable, "-c", CHILD, store_url, "once"], capture_output=True, timeout=120,
                           check=False)
    assert child.returncode == -signal.SIGKILL, child.stderr.decode()
    proc = subprocess.Popen([sys.executable, "-c", CHILD, store_url, "loop"], stdout=subprocess.PIPE, text=True)
    acked = [proc.stdout.readline().strip() for _ in range(20)]
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    proc.stdout.close()
    two.close()
    s = Store.open(store_url)
    try:
        assert s.job("last-words") is not None
        assert all(s.job(j) is not None for j in acked), acked
        seqs = [r.seq for r in s.submissions_after(0)]
        assert len(seqs) == len(set(seqs)) >= 21
    finally:
        s.close()


# ----------------------------------------------------------------------------- listing, cancel, isolation
def test_jobs_filters_and_pages(two):
    ids = [two.submit("alice" if i % 3 else "bob", {"job_id": f"j{i}"}).job_id for i in range(10)]
    assert [j.job_id for j in two.jobs()] == ids
    alice = [j for j in ids if int(j[1:]) % 3]
    assert [j.job_id for j in two.jobs(tenant="alice")] == alice
    page1 = two.jobs(tenant="alice", limit=4)
    page2 = two.jobs(tenant="alice", limit=4, after=page1[-1].job_id)
    assert [j.job_id for j in page1 + page2] == alice[:8]
    two.record_transition("j1", "SUBMITTED", "PENDING", 1.0, "submitted")
    assert [j.job_id for j in two.jobs(states=["PENDING"])] == ["j1"]
    assert [j.job_id for j in two.jobs(states="SUBMITTED", limit=2)] == ["j0", "j2"]
    assert two.jobs(tenant="nobody") == []
    with raises_field("after"):
        two.jobs(after="missing")
    with raises_field("after"):  # another tenant's job is no cursor either
        two.jobs(tenant="alice", after="j0")
    with raises_field("states", match="did you mean PENDING"):
        two.jobs(states=["PENDNG"])
    for bad in (0, -1, 10_001, 2.5):
        with raises_field("limit"):
            two.jobs(limit=bad)
    assert two.count_jobs() == {"SUBMITTED": 9, "PENDING": 1}
    assert two.count_jobs(tenant="bob") == {"SUBMITTED": 4}


def test_cancel_requests_and_tenant_isolation(two):
    a = two.submit("alice", {"job_id": "a1"})
    two.submit("bob", {"job_id": "b1"})
    assert two.request_cancel("a1", "bob") is None  # not bob's: looks like no job at all
    assert two.request_cancel("zz", "alice") is None and two.request_cancel("zz", None) is None
    assert two.cancel_requests() == []
    got = two.request_cancel("a1", "alice")
    assert got.cancel_requested and got.seq == a.seq and got.updated_at >= a.updated_at
    assert two.request_cancel("a1", "alice") == got  # asked once is enough
    assert two.request_cancel("b1", None).cancel_requested  # admins cancel anyone's
    assert two.cancel_requests() == ["a1", "b1"]
    two.mark_cancel_handled(["a1"])
    assert two.cancel_requests() == ["b1"] and two.job("a1").cancel_handled
    two.submit("alice", {"job_id": "done"})
    two.record_transition("done", "SUBMITTED", "CANCELLED", 2.0, "cancelled")
    assert not two.request_cancel("done", "alice").cancel_requested  # already over: nothing to ask
    kinds = [(e.kind, e.job_id) for e in two.events_after(0, tenant="alice")]
    assert ("cancel_requested", "a1") in kinds and all(j != "b1" for _, j in kinds)
    assert [e.job_id for e in two.events_after(0, tenant="bob")] == ["b1", "b1"]


def test_events_are_scoped_to_tenants_and_cluster_events_to_admins(two):
    two.submit("alice", {"job_id": "a1"})
    two.submit("bob", {"job_id": "b1"})
    two.save_inventory(1, [{"name": "n0", "gpus": 8, "gpu_type": "A100"}])
    two.set_node_state("n0", "down", 5.0)
    two.record_decision(1, "start", "a1", {"nodes": ["n0"]}, "fits", 6.0)
    two.answer_decision(1, "accepted", None, 7.0)
    two.record_decision(2, "timer", None, {"at": 60.0}, "reservation deadline", 8.0)
    every = two.events_after(0)
    assert [e.kind for e in every] == ["submitted", "submitted", "inventory", "node", "decision", "answer",
                                       "decision"]
    assert [e.seq for e in every] == sorted({e.seq for e in every})
    mine = two.events_after(0, tenant="alice")
    assert [(e.kind, e.job_id) for e in mine] == [("submitted", "a1"), ("decision", "a1"), ("answer", "a1")]
    assert mine[1].data == {"ticket": 1, "kind": "start", "reason": "fits", "payload": {"nodes": ["n0"]}}
    assert [e.kind for e in two.events_after(0, tenant="bob")] == ["submitted"]
    assert two.events_after(every[2].seq, limit=2) == every[3:5]
    assert two.last_event_seq() == every[-1].seq
    with raises_field("limit"):
        two.events_after(0, limit=0)


def test_hostile_strings_get_answers_not_database_errors(two):
    """What a client can put in a path or a query (NUL bytes, which PostgreSQL refuses outright,
    huge or non-ASCII text) is answered 'no such thing' or a LoomInputError on both databases."""
    nul, huge, odd = "a\x00b", "j" * 100_000, "j\u00e9\U0001f600"
    row = two.submit("alice", {"job_id": "ok", "command": ["echo", nul, odd]})
    assert two.job("ok").spec == row.spec  # anything JSON can say is kept as it was
    for bad in (nul, huge, odd, None, 3):
        assert two.job(bad) is None and two.request_cancel(bad, "alice") is None
        assert two.decisions_of(bad) == [] and two.transitions_of(bad) == []
        assert two.tenant(bad) is None and two.authenticate(bad) is None
    for bad in (nul, huge, odd, 3):
        with raises_field("after"):
            two.jobs(after=bad)
    for call, field in ((lambda: two.events_after(0, tenant=nul), "tenant"),
                        (lambda: two.jobs(tenant=huge), "tenant"),
                        (lambda: two.count_jobs(tenant=nul), "tenant"),
                        (lambda: two.submit("alice", {"job_id": nul}), "job_id"),
                        (lambda: two.submit("alice", {}, idempotency_key=nul), "idempotency_key"),
                        (lambda: two.submit(nul, {}), "tenant"),
                        (lambda: two.set_node_state(nul, "up", 1.0), "node"),
                        (lambda: two.meta(nul), "key")):
        with raises_field(field):
            call()


# ----------------------------------------------------------------------------- the engine side
def test_submissions_after_is_the_engines_intake(two):
    rows = [two.submit("alice", {"n": i}) for i in range(5)]
    assert two.submissions_after(0) == rows
    assert two.submissions_after(rows[2].seq) == rows[3:]
    assert two.submissions_after(rows[-1].seq) == []
    assert two.submissions_after(0, limit=2) == rows[:2]


def test_transitions_in_a_batch_are_what_one_at_a_time_writes(two):
    for job in ("a1", "a2"):
        two.submit("alice", {"job_id": job, "gpus": 1})
    two.submit("bob", {"job_id": "b1", "gpus": 1})
    rows = [("a1", "SUBMITTED", "PENDING", 1.0, "fed"), ("b1", "SUBMITTED", "PENDING", 1.0, "fed"),
            ("a1", "PENDING", "STARTING", 2.0, "start decision"), ("a1", "STARTING", "RUNNING", 3.0, "JobStarted")]
    after = two.last_event_seq()
    two.record_transitions(rows)
    assert two.job("a1").state == "RUNNING" and two.job("a1").updated_at == 3.0
    assert two.job("b1").state == "PENDING" and two.job("a2").state == "SUBMITTED"
    assert [(t.old, t.new, t.at, t.event) for t in two.transitions_of("a1")] == [r[1:] for r in rows if r[0] == "a1"]
    events = two.events_after(after)
    assert [(e.kind, e.job_id, e.tenant, e.data["new"]) for e in events] == [
        ("transition", j, "bob" if j == "b1" else "alice", new) for j, _, new, _, _ in rows]
    assert [e.job_id for e in two.events_after(after, tenant="bob")] == ["b1"]
    with pytest.raises(StoreError, match="ghost"):
        two.record_transitions([("a2", "SUBMITTED", "PENDING", 4.0, "fed"), ("ghost", "PENDING", "STARTING", 4.0, "x")])
    assert two.job("a2").state == "SUBMITTED"  # all or nothing
    with raises_field("new"):
        two.record_transitions([("a2", "SUBMITTED", "PENDNG", 4.0, "fed")])
    two.record_transitions([])


def test_transitions_and_allocations(two):
    two.submit("alice", {"job_id": "a1", "gpus": 8})
    two.record_transition("a1", "SUBMITTED", "PENDING", 10.0, "submitted")
    two.record_transition("a1", "PENDING", "STARTING", 11.0, "start decision")
    two.set_allocation("a1", {"nodes": ["n0", "n1"], "gpus": [4, 4]}, {"dp": 2, "tp": 4})
    two.record_transition("a1", "STARTING", "RUNNING", 12.5, "JobStarted")
    row = two.job("a1")
    assert (row.state, row.updated_at) == ("RUNNING", 12.5)
    assert row.allocation == {"nodes": ["n0", "n1"], "gpus": [4, 4]} and row.plan == {"dp": 2, "tp": 4}
    assert [(t.old, t.new, t.at, t.event) for t in two.transitions_of("a1")] == [
        ("SUBMITTED", "PENDING", 10.0, "submitted"), ("PENDING", "STARTING", 11.0, "start decision"),
        ("STARTING", "RUNNING", 12.5, "JobStarted")]
    two.set_allocation("a1", None, None)
    assert two.job("a1").allocation is None
    with pytest.raises(StoreError, match="ghost"):
        two.record_transition("ghost", "PENDING", "STARTING", 1.0, "x")
    with pytest.raises(StoreError, match="ghost"):
        two.set_allocation("ghost", None, None)
    with raises_field("new", match="did you mean RUNNING"):
        two.record_transition("a1", "RUNNING", "RUNING", 1.0, "x")
    with raises_field("at"):
        two.record_transition("a1", "RUNNING", "FINISHED", math.inf, "x")
    with raises_field("allocation"):
        two.set_allocation("a1", {"nodes": ["n0"], "gpus": [1, 2]}, None)
    with raises_field("allocation.gpus"):
        two.set_allocation("a1", {"nodes": ["n0"], "gpus": ["1"]}, None)
    assert two.transitions_of("nope") == []


def test_decisions_are_written_ahead_and_answered(two):
    two.submit("alice", {"job_id": "a1"})
    two.record_decision(1, "start", "a1", {"nodes": ["n0"], "gpus": [8]}, "first fit", 1.0)
    two.record_decision(2, "preempt", "a1", {}, "higher priority waits", 2.0)
    two.record_decision(3, "reserve", None, {"nodes": ["n1"]}, "hold for big job", 3.0)
    assert [d.ticket for d in two.open_decisions()] == [1, 2, 3]
    assert two.open_decisions()[0].status == "issued" and two.open_decisions()[0].answered_at is None
    two.answer_decision(1, "accepted", None, 1.5)
    assert [d.status for d in two.open_decisions()] == ["accepted", "issued", "issued"]
    two.answer_decision(1, "done", None, 4.0)
    two.answer_decision(1, "done", None, 5.0)  # a repeated answer changes nothing
    two.answer_decision(2, "failed", "node n0 unreachable", 6.0)
    assert [d.ticket for d in two.open_decisions()] == [3]
    d1, d2 = two.decisions_of("a1")
    assert (d1.status, d1.answered_at, d1.payload) == ("done", 4.0, {"nodes": ["n0"], "gpus": [8]})
    assert (d2.status, d2.answer_reason, d2.reason) == ("failed", "node n0 unreachable", "higher priority waits")
    assert two.decision(3).job_id is None and two.decision(99) is None
    assert [d.ticket for d in two.recent_decisions(2)] == [3, 2] and two.max_ticket() == 3
    with pytest.raises(StoreError, match="already done"):
        two.answer_decision(1, "failed", "late", 7.0)
    with pytest.raises(StoreError, match="never recorded"):
        two.answer_decision(42, "done", None, 7.0)
    with pytest.raises(StoreError, match="already recorded"):
        two.record_decision(1, "start", "a1", {}, "again", 8.0)
    with raises_field("status"):
        two.answer_decision(3, "issued", None, 8.0)
    with raises_field("payload"):
        two.record_decision(4, "start", "a1", ["not", "a", "dict"], "x", 8.0)


def test_transaction_groups_writes_all_or_nothing(two):
    two.submit("alice", {"job_id": "a1"})
    with two.transaction():
        with two.transaction():  # nested: joins the outer one
            two.record_transition("a1", "SUBMITTED", "PENDING", 1.0, "submitted")
        two.record_decision(1, "start", "a1", {}, "fits", 2.0)
        assert two.job("a1").state == "PENDING"  # its own writes are visible inside
        seen_outside: list = []
        reader = threading.Thread(target=lambda: seen_outside.append(two.decision(1)))
        reader.start()
        reader.join()
        assert seen_outside == [None]  # and nobody else's before it commits
    assert two.decision(1) is not None
    with pytest.raises(RuntimeError, match="boom"), two.transaction():
        two.record_transition("a1", "PENDING", "STARTING", 3.0, "start decision")
        two.answer_decision(1, "accepted", None, 3.0)
        raise RuntimeError("boom")
    assert two.job("a1").state == "PENDING" and two.decision(1).status == "issued"
    assert len(two.transitions_of("a1")) == 1 and not two.in_transaction


def test_inventory_and_node_states(two):
    assert two.inventory() is None
    nodes = [{"name": "n1", "gpus": 8, "gpu_type": "A100", "path": ["core", "leaf0"]},
             {"name": "n0", "gpus": 4, "gpu_type": "V100", "state": "drained"}]
    two.save_inventory(1, nodes)
    assert two.inventory() == (1, [
        {"name": "n1", "gpus": 8, "gpu_type": "A100", "state": "up", "path": ["core", "leaf0"]},
        {"name": "n0", "gpus": 4, "gpu_type": "V100", "state": "drained", "path": []}])
    two.set_node_state("n1", "down", 3.0)
    assert two.inventory()[1][0]["state"] == "down"
    two.save_inventory(2, nodes[:1])
    generation, saved = two.inventory()
    assert generation == 2 and [n["name"] for n in saved] == ["n1"] and saved[0]["state"] == "up"
    with raises_field("generation", match="older"):
        two.save_inventory(1, nodes)
    with raises_field("nodes[1].name", match="twice"):
        two.save_inventory(3, [nodes[0], nodes[0]])
    with raises_field("nodes[0].gpu", match="did you mean gpus"):
        two.save_inventory(3, [{"name": "x", "gpu": 8, "gpu_type": "A100"}])
    with raises_field("nodes[0].state"):
        two.save_inventory(3, [{**nodes[0], "state": "broken"}])
    with raises_field("nodes[0].gpus"):
        two.save_inventory(3, [{**nodes[0], "gpus": -1}])
    with raises_field("node", match="did you mean n1"):
        two.set_node_state("n11", "up", 4.0)
    with raises_field("state"):
        two.set_node_state("n1", "gone", 4.0)
    assert two.inventory()[0] == 2


def test_reservations(two):
    two.record_reservation(1, ["n0", "n1"], 100.0, "big", "hold for big", 10.0)
    two.record_reservation(2, ["n2"], 200.0, "other", "hold", 11.0)
    r1, _ = two.reservations()
    assert (r1.nodes, r1.until, r1.for_job, r1.created_at, r1.released_at) == (("n0", "n1"), 100.0, "big", 10.0,
                                                                              None)
    assert two.release_reservation(1, 50.0, "big started") and not two.release_reservation(1, 51.0)
    assert [r.reservation_id for r in two.reservations()] == [2]
    released = two.reservations(active=False)[0]
    assert (released.released_at, released.release_reason) == (50.0, "big started")
    with pytest.raises(StoreError, match="already recorded"):
        two.record_reservation(2, ["n2"], 1.0, "x", "x", 1.0)
    assert [e.kind for e in two.events_after(0) if e.tenant is None] == ["reservation", "reservation", "release"]


def test_meta(store):
    assert store.meta("engine.seq") is None and store.meta("engine.seq", 0) == 0
    store.set_meta("engine.seq", 41)
    store.set_meta("engine.seq", 42)
    store.set_meta("service", {"ticket": 9, "tags": ["a"]})
    assert store.meta("engine.seq") == 42 and store.meta("service") == {"ticket": 9, "tags": ["a"]}
    with raises_field("value"):
        store.set_meta("bad", math.nan)
    with raises_field("key"):
        store.set_meta("has space", 1)
