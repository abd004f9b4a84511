"""Schema migrations, run by `Store.open` (no alembic.ini for users).

Developers add a revision with `python -m loom.service.store revision -m MSG --db URL`
(see __main__.py).
"""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.engine import Connection

MIGRATIONS = Path(__file__).with_name("migrations")
VERSION_TABLE = "loom_schema_version"  # as in migrations/env.py


def config(conn: Connection) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.attributes["connection"] = conn
    return cfg


def head() -> str:
    return ScriptDirectory(str(MIGRATIONS)).get_current_head() or ""


def current(conn: Connection) -> str | None:
    return MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE}).get_current_revision()


def upgrade(conn: Connection) -> None:
    """Bring the schema to head inside the caller's (write-locked) transaction. A database
    at a revision this Loom does not know was made by a newer Loom: refuse, not guess."""
    known = {s.revision for s in ScriptDirectory(str(MIGRATIONS)).walk_revisions()}
    now = current(conn)
    if now is not None and now not in known:
        raise NewerSchema(now)
    if now != head():
        command.upgrade(config(conn), "head")


class NewerSchema(RuntimeError):
    def __init__(self, revision: str) -> None:
        super().__init__(f"its schema is at revision {revision}, which this version of Loom does not know "
                         f"(made by a newer Loom?); upgrade Loom to open it")
        self.revision = revision
