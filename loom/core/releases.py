"""Running jobs ordered by expected end, for reservation-style policies (EASY
backfill's shadow time, Arnold's reserved regions) without a per-round sort."""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Iterator


class ReleaseIndex:
    __slots__ = ("_items", "_where")

    def __init__(self) -> None:
        self._items: list[tuple[float, int, int]] = []  # (expected_end, job_key, gpus)
        self._where: dict[int, tuple[float, int, int]] = {}

    def add(self, key: int, expected_end: float, gpus: int) -> None:
        old = self._where.get(key)  # remove(key), inlined: once per start and progress report
        if old is not None:
            del self._items[bisect_left(self._items, old)]
        item = (expected_end, key, gpus)
        insort(self._items, item)
        self._where[key] = item

    def remove(self, key: int) -> None:
        item = self._where.pop(key, None)
        if item is not None:
            i = bisect_left(self._items, item)
            del self._items[i]

    def __iter__(self) -> Iterator[tuple[float, int, int]]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)
