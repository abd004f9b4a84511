"""From the agents' answers to a group's outcome: pass, fail (and why, and whom the evidence names) or slow.

Slow rule (documented in docs/RELIABILITY.md): a group that passed is *slow* when its time
(the slowest member's time inside the all-gather) exceeds

    min( max(SLOW_FACTOR × ref, ref + SLOW_MIN_EXCESS_S),  slow_after_s )

where `ref` is the lower median of the times of every group that passed so far in this
localisation (this round included), and `slow_after_s` (default half the test timeout) is an
absolute ceiling. The relative part is the round-median rule: it flags a pair far below
the others' bandwidth as long as at least half of the passing groups are healthy (the
lower median ignores the rest); the absolute part keeps a slow link visible when too few
healthy pairs exist to give a median (two nodes, or most groups slow).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from loom.localize.model import GroupTest

SLOW_FACTOR = 4.0
SLOW_MIN_EXCESS_S = 0.25


def outcome(members: tuple[str, ...], answers: Mapping[str, Mapping[str, Any]], timeout_s: float) -> GroupTest:
    """The group's verdict before the slow rule: pass (with its time) or fail with a reason."""
    dead = [m for m in members if answers[m].get("dead")]
    silent = [m for m in members if answers[m].get("silent")]
    wrong = sorted({p for m in members for p in answers[m].get("wrong_from", ())}, key=members.index)
    errors = {m: a for m, a in answers.items() if a.get("error")}
    times = [a["seconds"] for a in answers.values() if a.get("ok") and "seconds" in a]
    seconds = max(times) if times else None
    if not (dead or silent or wrong or errors):
        return GroupTest(members, "pass", "", seconds)
    reasons = [f"{m} crashed" for m in dead]
    reasons += [f"{m} did not answer (hang)" for m in silent]
    if wrong:
        reasons.append(f"wrong data from {', '.join(wrong)}")
    if errors and not reasons:
        reasons.append(_error_text(errors, timeout_s))
    blamed = list(dead) + (silent if len(silent) < len(members) else []) + [w for w in wrong if w not in dead]
    return GroupTest(members, "fail", "; ".join(reasons), seconds, tuple(dict.fromkeys(blamed)))


def _error_text(errors: Mapping[str, Mapping[str, Any]], timeout_s: float) -> str:
    kinds = {a["error"] for a in errors.values()}
    if kinds == {"timeout"}:
        return f"timeout after {timeout_s:g} s"
    node, answer = next(iter(errors.items()))
    return f"{node}: {answer.get('message', answer['error'])}"


@dataclass
class SlowJudge:
    """Applies the slow rule round after round, remembering every passing group's time."""

    slow_after_s: float
    times: list[float] = field(default_factory=list)

    def judge(self, groups: list[GroupTest]) -> list[GroupTest]:
        self.times += [g.seconds for g in groups if g.outcome == "pass" and g.seconds is not None]
        if not self.times:
            return groups
        ref = statistics.median_low(self.times)
        limit = min(max(SLOW_FACTOR * ref, ref + SLOW_MIN_EXCESS_S), self.slow_after_s)
        return [self._mark(g, ref, limit) for g in groups]

    @staticmethod
    def _mark(group: GroupTest, ref: float, limit: float) -> GroupTest:
        if group.outcome != "pass" or group.seconds is None or group.seconds <= limit:
            return group
        detail = f"{group.seconds:.2f} s against a median of {ref:.3f} s (limit {limit:.2f} s)"
        return replace(group, outcome="slow", detail=detail)
