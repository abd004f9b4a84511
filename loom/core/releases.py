"""Running jobs ordered by expected end, for reservation-style policies (EASY
backfill's shadow time, Arnold's reserved regions) without a per-round sort.

The core reports every start, progress report and stop here, but many policies
(FCFS, SJF) never read the order. So changes are noted in a dict (one entry per
job, the latest wins) and sorted into place only when someone reads the index:
the same order as keeping it sorted all along (entries are unique by job key),
at no cost for a run whose policy never looks.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Iterator

Entry = tuple[float, int, int]  # (expected_end, job_key, gpus)


class ReleaseIndex:
    __slots__ = ("_items", "_todo", "_where")

    def __init__(self) -> None:
        self._items: list[Entry] = []  # sorted, as of the last read
        self._where: dict[int, Entry] = {}  # job key → its entry in `_items`
        self._todo: dict[int, Entry | None] = {}  # job key → its newest entry (None: remove it) since then

    def add(self, key: int, expected_end: float, gpus: int) -> None:
        """Enter (or move) job `key`: it is expected to give back `gpus` GPUs at `expected_end`."""
        self._todo[key] = (expected_end, key, gpus)

    def remove(self, key: int) -> None:
        if key in self._where:
            self._todo[key] = None
        else:  # never sorted in: forgetting the pending entry is enough
            self._todo.pop(key, None)

    def _sync(self) -> None:
        """Sort the changes noted since the last read into place."""
        items, where = self._items, self._where
        for key, item in self._todo.items():
            old = where.pop(key, None)
            if old is not None:
                del items[bisect_left(items, old)]
            if item is not None:
                insort(items, item)
                where[key] = item
        self._todo.clear()

    def __iter__(self) -> Iterator[Entry]:
        if self._todo:
            self._sync()
        return iter(self._items)

    def __len__(self) -> int:
        if self._todo:
            self._sync()
        return len(self._items)
