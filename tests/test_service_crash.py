"""Crash safety of `loom serve` (issue 19): kill -9 of the service at 20 random moments during a
1,000-job load of sleep-style jobs on the local backend, restarting it each time; afterwards no
acknowledged job is lost, none ran twice, no GPU was bound to two jobs at once (the bench's own
check, `bench/service.py crash`, which records the same figures in docs/BENCHMARKS.md)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from loom.service.testing import double_starts_and_bindings

_spec = importlib.util.spec_from_file_location("bench_service", Path(__file__).parents[1] / "bench" / "service.py")
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


@pytest.mark.slow
def test_kill_9_at_20_random_moments_loses_and_duplicates_nothing() -> None:
    r = bench.bench_crash(jobs=1000, kills=20, seed=7)
    assert r["acknowledged"] == 1000
    assert r["lost"] == 0, r["lost_ids"]
    assert r["started_twice"] == 0
    assert r["double_bound_gpus"] == 0


class _Recorded:
    """What the service would answer, written by hand: the checker is tested on known histories."""

    def __init__(self, jobs: dict[str, dict], nodes: dict[str, int]) -> None:
        self._jobs, self._nodes = jobs, nodes

    def explain(self, job_id: str) -> dict:
        return self._jobs[job_id]

    def nodes(self) -> dict:
        return {"nodes": [{"name": n, "gpus": g} for n, g in self._nodes.items()]}


def _job(starts: list[tuple[float, dict]], runs: list[tuple[float, float]]) -> dict:
    decisions = [{"kind": "start", "status": "done", "at": at, "payload": {"allocation": {
        "nodes": list(alloc), "gpus": list(alloc.values())}}} for at, alloc in starts]
    transitions = []
    for t0, t1 in runs:
        transitions += [{"old": "STARTING", "new": "RUNNING", "at": t0}, {"old": "RUNNING", "new": "FINISHED", "at": t1}]
    return {"decisions": decisions, "transitions": transitions}


def test_the_crash_check_finds_a_double_start_and_an_overbooked_node() -> None:
    clean = _Recorded({"a": _job([(0.0, {"n0": 2})], [(0.0, 5.0)]), "b": _job([(5.0, {"n0": 2})], [(5.0, 9.0)])},
                      {"n0": 2})
    assert double_starts_and_bindings(clean, {"a", "b"}) == ([], 0)
    twice = _Recorded({"a": {"decisions": _job([(0.0, {"n0": 1}), (1.0, {"n0": 1})], [])["decisions"],
                             "transitions": [{"old": "STARTING", "new": "RUNNING", "at": 0.0},
                                             {"old": "STARTING", "new": "RUNNING", "at": 1.0},
                                             {"old": "RUNNING", "new": "FINISHED", "at": 3.0}]}}, {"n0": 2})
    assert double_starts_and_bindings(twice, {"a"})[0] == ["a"]
    adopted = _job([(0.0, {"n0": 1})], [])
    adopted["transitions"] = [{"old": "STARTING", "new": "RUNNING", "at": 0.0, "event": "JobStarted"},
                              {"old": "PENDING", "new": "STARTING", "at": 2.0, "event": "adopted: found running"},
                              {"old": "STARTING", "new": "RUNNING", "at": 2.0, "event": "adopted"},
                              {"old": "RUNNING", "new": "FINISHED", "at": 3.0, "event": "JobFinished"}]
    assert double_starts_and_bindings(_Recorded({"a": adopted}, {"n0": 2}), {"a"})[0] == []
    overbooked = _Recorded({"a": _job([(0.0, {"n0": 2})], [(0.0, 5.0)]), "b": _job([(4.0, {"n0": 1})], [(4.0, 9.0)])},
                           {"n0": 2})
    assert double_starts_and_bindings(overbooked, {"a", "b"}) == ([], 1)
