"""Node down-time bookkeeping for the simulator.

Overlapping failures of one node merge: it comes back at the latest repair
time among them (never, if any is permanent). Failed GPU-seconds are counted
only inside the run's window, so utilisation stays within [0, 1].
"""

from __future__ import annotations

INF = float("inf")


class NodeHealth:
    def __init__(self, node_gpus: list[int]) -> None:
        self._gpus = node_gpus
        self._down_since: dict[int, float] = {}
        self._repair_at: dict[int, float] = {}
        self._closed: list[tuple[int, float, float]] = []  # (node, from, to)

    def is_down(self, node: int) -> bool:
        return node in self._down_since

    def fail(self, node: int, now: float, repair_after: float) -> float | None:
        """Record a failure; returns a new repair time to schedule, if it moved."""
        self._down_since.setdefault(node, now)
        latest = max(self._repair_at.get(node, -INF), now + repair_after)
        moved = latest != self._repair_at.get(node)
        self._repair_at[node] = latest
        return latest if moved and latest != INF else None

    def repair(self, node: int, now: float) -> bool:
        """True if the node is back now (an earlier, superseded repair returns False)."""
        if node not in self._down_since or now < self._repair_at[node]:
            return False
        self._closed.append((node, self._down_since.pop(node), now))
        del self._repair_at[node]
        return True

    def failed_gpu_seconds(self, start: float, end: float) -> float:
        total = 0.0
        intervals = self._closed + [(n, since, end) for n, since in self._down_since.items()]
        for node, lo, hi in intervals:
            overlap = min(hi, end) - max(lo, start)
            if overlap > 0:
                total += overlap * self._gpus[node]
        return total
