"""The live service's persistent store: the source of truth for jobs, decisions, tenants
and the cluster, in SQLite (embedded default, WAL) or PostgreSQL, migrated by Alembic.

    store = Store.open("/var/lib/loom/loom.db")        # or "postgresql://loom@127.0.0.1:5432/loom"
    tenant, token = store.create_tenant("alice")
    row = store.submit("alice", {"gpus": 4, "duration": 600})
"""

from loom.service.store.base import StoreError
from loom.service.store.rows import (
    JOB_STATES,
    NODE_STATES,
    SUBMITTED,
    TERMINAL_STATES,
    DecisionRow,
    EventRow,
    JobRow,
    ReservationRow,
    Tenant,
    TransitionRow,
)
from loom.service.store.store import Store

__all__ = [
    "JOB_STATES", "NODE_STATES", "SUBMITTED", "TERMINAL_STATES",
    "DecisionRow", "EventRow", "JobRow", "ReservationRow", "Store", "StoreError", "Tenant", "TransitionRow",
]
