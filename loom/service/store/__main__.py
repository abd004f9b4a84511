"""Developer tools for the store's schema:

    python -m loom.service.store current --db URL               # the database's revision
    python -m loom.service.store revision -m MSG --db URL       # autogenerate the next one

`revision` compares schema.py with a database at head (give a scratch SQLite file) and
writes migrations/versions/NNNN_msg.py; check both databases with tests/test_store.py.
"""

from __future__ import annotations

import argparse

from alembic import command

from loom.service.store import Store, migrate


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m loom.service.store")
    parser.add_argument("action", choices=["revision", "current"])
    parser.add_argument("--db", required=True, help="a scratch database (it is migrated to head first)")
    parser.add_argument("-m", "--message", default="change")
    args = parser.parse_args(argv)
    store = Store.open(args.db)
    try:
        with store.engine.begin() as conn:
            if args.action == "current":
                print(migrate.current(conn))
            else:
                head = migrate.head()
                rev_id = f"{int(head) + 1:04d}" if head.isdigit() else None
                command.revision(migrate.config(conn), message=args.message, autogenerate=True, rev_id=rev_id)
    finally:
        store.close()


if __name__ == "__main__":
    main()
