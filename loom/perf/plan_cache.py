"""Best plans kept on disk across runs, so sweeps and reruns skip plan searches.

A simulation prices every (model, batch, GPU type, GPU count, placement) it meets
with a plan search (`loom.perf.search.fastest_plan`); a sweep of policies over one
trace meets the same ones in every run and every Ray worker. With a cache
(``LOOM_PLAN_CACHE=path`` or ``loom simulate --plan-cache path``) each search's
answer — the plan, or "none" — is stored in a SQLite file and later runs read it
instead of searching. The plan is then priced again (`Estimator.estimate`), so a
cached run returns exactly what a cold one does.

What keys an answer: everything the search reads — the job (model spec with its
experts, batch, precisions, overlap flags, capacity factor), the hardware, GPU count, placement,
pinned knobs (cp and ep among them), whether an unfit plan may be returned, the estimator's calibration and
communication model — plus a fingerprint of the estimator's code and data
(`loom/perf/*.py`, plan and GPU-spec modules, ``gpus.yaml``): change any of them
and old entries are never read (`loom perf` users editing calibration or code
get fresh searches without clearing anything). SQLite in WAL mode lets several
processes share one file; a write that fails (read-only or locked file) is
skipped, never an error — the cache only saves time.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
from importlib.resources import files
from pathlib import Path
from typing import Any

from loom.core.plan import ParallelPlan
from loom.errors import LoomInputError

ENV = "LOOM_PLAN_CACHE"
_PLAN_FIELDS = ("dp", "tp", "pp", "micro_batch", "virtual_stages", "zero_stage", "recompute", "zero_shard", "cp", "ep")
_FINGERPRINT: str | None = None


def code_fingerprint() -> str:
    """Hash of the sources and data an estimate depends on (computed once per process)."""
    global _FINGERPRINT
    if _FINGERPRINT is None:
        digest = hashlib.sha256()
        perf = Path(__file__).parent
        sources = sorted(perf.glob("*.py")) + sorted((perf / "data").glob("*.yaml"))
        here = perf.parent
        sources += [here / "core" / "plan.py", here / "hardware" / "gpus.py"]
        for path in sources:
            digest.update(path.name.encode())
            digest.update(path.read_bytes())
        digest.update(files("loom.hardware").joinpath("data", "gpus.yaml").read_bytes())
        _FINGERPRINT = digest.hexdigest()
    return _FINGERPRINT


class PlanCache:
    """A SQLite file of search answers: key → plan (or none)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path).expanduser()
        self.hits = self.misses = 0
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(self.path, timeout=5.0, isolation_level=None)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.execute("CREATE TABLE IF NOT EXISTS plans (key TEXT PRIMARY KEY, plan TEXT)")
        except (OSError, sqlite3.Error) as err:
            raise LoomInputError(f"cannot open the plan cache: {err}", source=str(self.path)) from err

    @staticmethod
    def key(*parts: Any) -> str:
        """A key from the search's inputs (frozen dataclasses: their repr lists every field)."""
        return hashlib.sha256(repr((code_fingerprint(), *parts)).encode()).hexdigest()

    def get(self, key: str) -> tuple[bool, ParallelPlan | None]:
        """(found, plan); a found None means the search found no plan."""
        try:
            row = self._db.execute("SELECT plan FROM plans WHERE key = ?", (key,)).fetchone()
        except sqlite3.Error:
            row = None
        if row is None:
            self.misses += 1
            return False, None
        self.hits += 1
        if row[0] == "null":
            return True, None
        values = json.loads(row[0])
        return True, ParallelPlan(**dict(zip(_PLAN_FIELDS, values)))

    def put(self, key: str, plan: ParallelPlan | None) -> None:
        value = "null" if plan is None else json.dumps([getattr(plan, f) for f in _PLAN_FIELDS])
        try:
            self._db.execute("INSERT OR REPLACE INTO plans (key, plan) VALUES (?, ?)", (key, value))
        except sqlite3.Error:  # read-only or locked: the cache only saves time
            pass

    def __len__(self) -> int:
        return int(self._db.execute("SELECT COUNT(*) FROM plans").fetchone()[0])

    def close(self) -> None:
        self._db.close()


_OPEN: dict[Path, PlanCache] = {}


def default_plan_cache() -> PlanCache | None:
    """The cache named by ``LOOM_PLAN_CACHE`` (one per path and process), or None."""
    path = os.environ.get(ENV)
    if not path:
        return None
    resolved = Path(path).expanduser().resolve()
    if resolved not in _OPEN:
        _OPEN[resolved] = PlanCache(resolved)
    return _OPEN[resolved]


__all__ = ["ENV", "PlanCache", "code_fingerprint", "default_plan_cache"]
