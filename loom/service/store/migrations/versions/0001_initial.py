"""The first schema: tenants and tokens, jobs and their transitions, decisions, the node
inventory, reservations, the event log and a key-value meta table.

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "tenants",
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("admin", sa.Boolean(), nullable=False),
        sa.Column("created_at", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("name", name="pk_tenants"),
    )
    op.create_table(
        "tokens",
        sa.Column("hash", sa.String(64), nullable=False),
        sa.Column("tenant", sa.String(64), nullable=False),
        sa.Column("created_at", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("hash", name="pk_tokens"),
        sa.ForeignKeyConstraint(["tenant"], ["tenants.name"], name="fk_tokens_tenant_tenants"),
    )
    op.create_index("ix_tokens_tenant", "tokens", ["tenant"])
    op.create_table(
        "jobs",
        sa.Column("seq", BigId, autoincrement=True, nullable=False),
        sa.Column("job_id", sa.String(200), nullable=False),
        sa.Column("tenant", sa.String(64), nullable=False),
        sa.Column("spec", sa.Text(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("submitted_at", sa.Double(), nullable=False),
        sa.Column("updated_at", sa.Double(), nullable=False),
        sa.Column("cancel_requested", sa.Boolean(), nullable=False),
        sa.Column("cancel_handled", sa.Boolean(), nullable=False),
        sa.Column("allocation", sa.Text(), nullable=True),
        sa.Column("plan", sa.Text(), nullable=True),
        sa.Column("idempotency_key", sa.String(200), nullable=True),
        sa.PrimaryKeyConstraint("seq", name="pk_jobs"),
        sa.UniqueConstraint("job_id", name="uq_jobs_job_id"),
        sa.UniqueConstraint("tenant", "idempotency_key", name="uq_jobs_tenant_idempotency_key"),
        sa.ForeignKeyConstraint(["tenant"], ["tenants.name"], name="fk_jobs_tenant_tenants"),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_jobs_state", "jobs", ["state"])
    op.create_index("ix_jobs_tenant_seq", "jobs", ["tenant", "seq"])
    op.create_index("ix_jobs_cancel_requested_cancel_handled", "jobs", ["cancel_requested", "cancel_handled"])
    op.create_table(
        "transitions",
        sa.Column("id", BigId, autoincrement=True, nullable=False),
        sa.Column("job_id", sa.String(200), nullable=False),
        sa.Column("old", sa.String(16), nullable=False),
        sa.Column("new", sa.String(16), nullable=False),
        sa.Column("at", sa.Double(), nullable=False),
        sa.Column("event", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_transitions"),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.job_id"], name="fk_transitions_job_id_jobs"),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_transitions_job_id", "transitions", ["job_id"])
    op.create_table(
        "decisions",
        sa.Column("ticket", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("job_id", sa.String(200), nullable=True),
        sa.Column("payload", sa.Text(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("issued_at", sa.Double(), nullable=False),
        sa.Column("answered_at", sa.Double(), nullable=True),
        sa.Column("answer_reason", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("ticket", name="pk_decisions"),
    )
    op.create_index("ix_decisions_job_id", "decisions", ["job_id"])
    op.create_index("ix_decisions_status", "decisions", ["status"])
    op.create_table(
        "inventory",
        sa.Column("id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("generation", sa.BigInteger(), nullable=False),
        sa.Column("saved_at", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_inventory"),
    )
    op.create_table(
        "nodes",
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("gpus", sa.Integer(), nullable=False),
        sa.Column("gpu_type", sa.String(64), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("updated_at", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("name", name="pk_nodes"),
    )
    op.create_table(
        "reservations",
        sa.Column("reservation_id", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("nodes", sa.Text(), nullable=False),
        sa.Column("until", sa.Double(), nullable=False),
        sa.Column("for_job", sa.String(200), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("created_at", sa.Double(), nullable=False),
        sa.Column("released_at", sa.Double(), nullable=True),
        sa.Column("release_reason", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("reservation_id", name="pk_reservations"),
    )
    op.create_index("ix_reservations_released_at", "reservations", ["released_at"])
    op.create_table(
        "events",
        sa.Column("seq", BigId, autoincrement=True, nullable=False),
        sa.Column("at", sa.Double(), nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("job_id", sa.String(200), nullable=True),
        sa.Column("tenant", sa.String(64), nullable=True),
        sa.Column("data", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("seq", name="pk_events"),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_events_tenant_seq", "events", ["tenant", "seq"])
    op.create_table(
        "meta",
        sa.Column("key", sa.String(200), nullable=False),
        sa.Column("value", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("key", name="pk_meta"),
    )


def downgrade() -> None:
    for table in ("meta", "events", "reservations", "nodes", "inventory", "decisions", "transitions", "jobs",
                  "tokens", "tenants"):
        op.drop_table(table)
