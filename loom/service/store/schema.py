"""The store's tables, as SQLAlchemy Core metadata (queries are built against these).

The migrations in `migrations/versions` create the same schema; a test compares the
two on both databases, so a change here without a migration fails loudly. JSON goes
into Text columns (`JSONText`): the same bytes on SQLite and PostgreSQL, and no
driver-specific JSON quirks (None vs 'null', NaN). Counters that grow for the life of
a deployment are 64-bit on PostgreSQL; SQLite's autoincrement needs exactly `INTEGER
PRIMARY KEY`, hence the variant.
"""

from __future__ import annotations

import json
from typing import Any

import sqlalchemy as sa
from sqlalchemy.types import TypeDecorator

metadata = sa.MetaData(naming_convention={
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
})

BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
ID_LEN = 200  # job ids, node names, idempotency keys
NAME_LEN = 64  # tenant names, GPU types


class JSONText(TypeDecorator[Any]):
    """A JSON value stored as compact text; SQL NULL stays Python None."""

    impl = sa.Text
    cache_ok = True

    def process_bind_param(self, value: Any, dialect: sa.Dialect) -> str | None:
        return None if value is None else json.dumps(value, separators=(",", ":"), allow_nan=False)

    def process_result_value(self, value: str | None, dialect: sa.Dialect) -> Any:
        return None if value is None else json.loads(value)


tenants = sa.Table(
    "tenants", metadata,
    sa.Column("name", sa.String(NAME_LEN), primary_key=True),
    sa.Column("admin", sa.Boolean(), nullable=False),
    sa.Column("created_at", sa.Double(), nullable=False),
)

tokens = sa.Table(
    "tokens", metadata,
    sa.Column("hash", sa.String(64), primary_key=True),  # sha256 hex of the token; never the token
    sa.Column("tenant", sa.String(NAME_LEN), sa.ForeignKey("tenants.name"), nullable=False, index=True),
    sa.Column("created_at", sa.Double(), nullable=False),
)

jobs = sa.Table(
    "jobs", metadata,
    sa.Column("seq", BigId, primary_key=True, autoincrement=True),
    sa.Column("job_id", sa.String(ID_LEN), nullable=False, unique=True),
    sa.Column("tenant", sa.String(NAME_LEN), sa.ForeignKey("tenants.name"), nullable=False),
    sa.Column("spec", JSONText(), nullable=False),
    sa.Column("state", sa.String(16), nullable=False, index=True),
    sa.Column("submitted_at", sa.Double(), nullable=False),
    sa.Column("updated_at", sa.Double(), nullable=False),
    sa.Column("cancel_requested", sa.Boolean(), nullable=False),
    sa.Column("cancel_handled", sa.Boolean(), nullable=False),
    sa.Column("allocation", JSONText(), nullable=True),
    sa.Column("plan", JSONText(), nullable=True),
    sa.Column("idempotency_key", sa.String(ID_LEN), nullable=True),
    sa.UniqueConstraint("tenant", "idempotency_key"),
    sa.Index(None, "tenant", "seq"),
    sa.Index(None, "cancel_requested", "cancel_handled"),
    sqlite_autoincrement=True,  # never reuse a seq, even of a deleted last row
)

transitions = sa.Table(
    "transitions", metadata,
    sa.Column("id", BigId, primary_key=True, autoincrement=True),
    sa.Column("job_id", sa.String(ID_LEN), sa.ForeignKey("jobs.job_id"), nullable=False, index=True),
    sa.Column("old", sa.String(16), nullable=False),
    sa.Column("new", sa.String(16), nullable=False),
    sa.Column("at", sa.Double(), nullable=False),
    sa.Column("event", sa.Text(), nullable=False),
    sqlite_autoincrement=True,
)

decisions = sa.Table(
    "decisions", metadata,
    sa.Column("ticket", sa.BigInteger(), primary_key=True, autoincrement=False),
    sa.Column("kind", sa.String(32), nullable=False),
    sa.Column("job_id", sa.String(ID_LEN), nullable=True, index=True),  # no FK: Reserve/Timer name none
    sa.Column("payload", JSONText(), nullable=False),
    sa.Column("reason", sa.Text(), nullable=False),
    sa.Column("status", sa.String(16), nullable=False, index=True),
    sa.Column("issued_at", sa.Double(), nullable=False),
    sa.Column("answered_at", sa.Double(), nullable=True),
    sa.Column("answer_reason", sa.Text(), nullable=True),
)

inventory = sa.Table(  # one row: the generation of the node list below
    "inventory", metadata,
    sa.Column("id", sa.Integer(), primary_key=True, autoincrement=False),
    sa.Column("generation", sa.BigInteger(), nullable=False),
    sa.Column("saved_at", sa.Double(), nullable=False),
)

nodes = sa.Table(
    "nodes", metadata,
    sa.Column("name", sa.String(ID_LEN), primary_key=True),
    sa.Column("position", sa.Integer(), nullable=False),  # the inventory's order = the topology's node index
    sa.Column("gpus", sa.Integer(), nullable=False),
    sa.Column("gpu_type", sa.String(NAME_LEN), nullable=False),
    sa.Column("state", sa.String(16), nullable=False),
    sa.Column("path", JSONText(), nullable=False),  # switch path, root first
    sa.Column("updated_at", sa.Double(), nullable=False),
)

reservations = sa.Table(
    "reservations", metadata,
    sa.Column("reservation_id", sa.BigInteger(), primary_key=True, autoincrement=False),
    sa.Column("nodes", JSONText(), nullable=False),
    sa.Column("until", sa.Double(), nullable=False),
    sa.Column("for_job", sa.String(ID_LEN), nullable=False),
    sa.Column("reason", sa.Text(), nullable=False),
    sa.Column("created_at", sa.Double(), nullable=False),
    sa.Column("released_at", sa.Double(), nullable=True, index=True),
    sa.Column("release_reason", sa.Text(), nullable=True),
)

events = sa.Table(
    "events", metadata,
    sa.Column("seq", BigId, primary_key=True, autoincrement=True),
    sa.Column("at", sa.Double(), nullable=False),
    sa.Column("kind", sa.String(32), nullable=False),
    sa.Column("job_id", sa.String(ID_LEN), nullable=True),
    sa.Column("tenant", sa.String(NAME_LEN), nullable=True),
    sa.Column("data", JSONText(), nullable=False),
    sa.Index(None, "tenant", "seq"),
    sqlite_autoincrement=True,
)

meta = sa.Table(
    "meta", metadata,
    sa.Column("key", sa.String(ID_LEN), primary_key=True),
    sa.Column("value", JSONText(), nullable=True),
)
