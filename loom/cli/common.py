"""Helpers more than one `loom` command uses.

They live here, not in `loom/cli/main.py`, because `main` imports every
command module: a command importing `main` back would be an import loop.
"""

from __future__ import annotations

from pathlib import Path


def use_plan_cache(path: Path | None) -> None:
    """Point `loom.perf.plan_cache` at `path` for this process and the workers it starts."""
    if path is not None:
        import os

        from loom.perf.plan_cache import ENV, PlanCache

        PlanCache(path).close()  # a clear error now if it cannot be opened
        os.environ[ENV] = str(path)
