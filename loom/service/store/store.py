"""`Store`: the service's source of truth, opened from a path or a database URL."""

from __future__ import annotations

import os

from sqlalchemy.exc import DBAPIError, SQLAlchemyError

from loom.errors import LoomInputError
from loom.service.store import connect, migrate
from loom.service.store.cluster import ClusterMixin


class Store(ClusterMixin):
    """Jobs, their transitions and decisions, tenants and tokens, the node inventory,
    reservations and an event log, in SQLite (a file, the default) or PostgreSQL.

    Thread-safe: the API's threads and the engine thread share one Store. Every method
    commits before it returns, except inside `transaction()`, which commits at its end.
    """

    @classmethod
    def open(cls, url: str | os.PathLike[str]) -> Store:
        """Open (creating a SQLite file and its directory if needed) and migrate to the newest
        schema. `url`: a file path, sqlite:///path, or postgresql://user[:password]@host:port/db.
        A bad URL or an unreachable server is a LoomInputError naming it (password masked)."""
        parsed = connect.parse(url)
        shown = connect.masked(parsed)
        if parsed.get_backend_name() == "sqlite" and parsed.database:
            shown = parsed.database  # the path the user gave, resolved
        engine = connect.create(parsed)
        try:
            with engine.connect() as conn:
                conn.execution_options(**{connect.WRITE_OPTION: True})
                with conn.begin():
                    connect.lock_for_write(conn)  # two processes opening a fresh database migrate it once
                    migrate.upgrade(conn)
        except migrate.NewerSchema as e:
            engine.dispose()
            raise LoomInputError(f"cannot open the store at {shown}: {e}", field="db") from None
        except (DBAPIError, SQLAlchemyError, OSError) as e:
            engine.dispose()
            raise LoomInputError(f"cannot open the store at {shown}: {connect.describe_failure(parsed, e)}",
                                 field="db") from None
        return cls(engine, shown)

    @property
    def dialect(self) -> str:
        """'sqlite' or 'postgresql'."""
        return self.engine.dialect.name
