"""Alembic's entry point for the store's migrations.

`Store.open` runs these itself (`loom.service.store.migrate.upgrade`), handing over a
connection that already holds the store's write lock, so two processes opening a fresh
database at once migrate it once. A developer adding a revision runs

    python -m loom.service.store revision -m "what changes" --db sqlite:///scratch.db

which goes through here with a URL instead.
"""

from __future__ import annotations

from alembic import context

from loom.service.store.schema import metadata

config = context.config
connection = config.attributes.get("connection")
if connection is None or context.is_offline_mode():
    raise RuntimeError("the store's migrations run on a live connection: use loom.service.store.migrate")

context.configure(
    connection=connection,
    target_metadata=metadata,
    version_table="loom_schema_version",
    transactional_ddl=True,
    render_as_batch=True,  # SQLite alters tables by copying them: let autogenerate write it that way
)
with context.begin_transaction():
    context.run_migrations()
