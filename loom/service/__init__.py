"""The live scheduler service (`loom serve`): the scheduling core run against real jobs.

`loom.service.store` is its source of truth (SQLite by default, PostgreSQL by URL); the
engine, backends and API build on it. Nothing here changes the core: the service feeds
it the same events the simulator does and records what it decides before carrying it out.
"""
