"""Singularity's distributed barrier (loom/runtime/barrier.py) on real gloo process groups.

Randomised trials run inside one forked process set (cheap): each trial picks a
requesting rank, the iteration of the request and how it arrives (before or after
the iteration's data all-reduce, or from another thread at an arbitrary moment),
runs iterations whose data all-reduce overlaps the iteration boundary (as DDP
overlaps communication), and checks on every rank: taken within two iterations,
every rank cuts at the same iteration, phase-2 collectives synchronous, nothing in
flight at the cut.
"""

from __future__ import annotations

import json
import random
import threading
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from loom.runtime.barrier import Barrier
from loom.runtime.testing import run_local

MAX_ITERATIONS = 12


def _trial(barrier: Barrier, rank: int, requester: int, request_in: int, how: str,
           delay_s: float) -> dict:
    """One trial on this rank: iterate until the barrier is taken; return what was observed."""
    data = torch.ones(16)
    in_flight = None  # the data all-reduce of the previous iteration, still running
    phase2_data_sync = []
    timer = None
    for it in range(1, MAX_ITERATIONS + 1):
        if in_flight is not None:
            in_flight.wait()  # the overlapped all-reduce ends during the next iteration
            in_flight = None
        mine = rank == requester and it == request_in
        if mine and how == "before":
            barrier.request()
        if mine and how == "thread":
            timer = threading.Timer(delay_s, barrier.request)
            timer.start()
        was_phase2 = barrier.phase2
        work = barrier.collective(dist.all_reduce, data)
        if was_phase2:
            phase2_data_sync.append(work.is_completed())
        else:
            in_flight = work
        if mine and how == "after":
            barrier.request()
        if barrier.step(it):
            flight = barrier.in_flight()
            if timer is not None:
                timer.join()
            return {"cut": it, "requested_at": barrier.requested_at, "in_flight": flight,
                    "phase2_data_sync": phase2_data_sync, "records": _records(barrier)}
    raise AssertionError(f"rank {rank}: barrier not taken within {MAX_ITERATIONS} iterations")


def _records(barrier: Barrier) -> list[list]:
    return [[r.iteration, r.ack, r.sum_need, r.sum_ack, r.synchronous, r.completed_on_return]
            for r in barrier.records or []]


def barrier_trials(out: str, trials: int, seed: int) -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    choose = random.Random(seed)  # same sequence on every rank: they agree on each trial's setup
    results = []
    for _ in range(trials):
        requester, request_in = choose.randrange(world), choose.randint(1, 5)
        how, delay_s = choose.choice(["before", "after", "thread"]), choose.uniform(0.0, 0.002)
        barrier = Barrier(dist.group.WORLD, record=True)
        seen = _trial(barrier, rank, requester, request_in, how, delay_s)
        barrier.reset()
        for it in range(seen["cut"] + 1, seen["cut"] + 3):  # the job goes on after the cut
            barrier.step(it)
        barrier.drain()
        everyone = [None] * world
        dist.all_gather_object(everyone, seen)
        results.append({"requester": requester, "request_in": request_in, "how": how,
                        "ranks": everyone})
    if rank == 0:
        Path(out).write_text(json.dumps(results))
    dist.destroy_process_group()


@pytest.mark.parametrize("world,trials,seed", [(2, 30, 11), (3, 30, 12)])
def test_barrier_randomised_trials(tmp_path, world, trials, seed):
    out = tmp_path / "trials.json"
    results = run_local(barrier_trials, world, args=(str(out), trials, seed), timeout_s=120)
    assert [r.exitcode for r in results] == [0] * world, results
    trials_seen = json.loads(out.read_text())
    assert len(trials_seen) == trials  # 2 x 30 = 60 randomised trials in all
    assert {t["how"] for t in trials_seen} == {"before", "after", "thread"}
    assert {t["requester"] for t in trials_seen} == set(range(world))
    for trial in trials_seen:
        ranks = trial["ranks"]
        cuts = {r["cut"] for r in ranks}
        assert len(cuts) == 1, f"ranks cut at different iterations: {trial}"
        requested_at = ranks[trial["requester"]]["requested_at"]
        cut = cuts.pop()
        assert 1 <= cut - requested_at <= 2, f"taken {cut - requested_at} iterations after the request: {trial}"
        for seen in ranks:
            assert seen["in_flight"] == 0
            assert all(seen["phase2_data_sync"]), "a phase-2 data all-reduce was not synchronous"
            for iteration, ack, sum_need, sum_ack, synchronous, completed in seen["records"]:
                assert synchronous == bool(ack), "phase-2 meta all-reduces are synchronous, phase-1 not"
                if synchronous:
                    assert completed
            last = seen["records"][-1]
            assert last[0] == cut and last[3] == world and last[4], "taken when Σack == world size"


def test_single_process_barrier_without_torch_distributed():
    """A script run by plain python (no process group) still gets the protocol, world size 1."""
    barrier = Barrier(None, record=True)
    assert not barrier.step(1)
    barrier.request()
    assert not barrier.step(2)  # the request rides on this meta all-reduce
    assert barrier.step(3) and barrier.phase2 and barrier.in_flight() == 0
    assert barrier.taken_at - barrier.requested_at == 2
    barrier.reset()
    assert not barrier.step(4)


def settle_after_destroy(out: str) -> None:
    """Leave a meta all-reduce pending, destroy the group as a script's last line does, settle."""
    import sys
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    barrier = Barrier(dist.group.WORLD)

    def refcounts() -> list[int]:  # holds no reference between calls (one would never be released)
        return [sys.getrefcount(t) for t in (barrier._buf, barrier._plan, barrier._vote, barrier._sums)]

    unheld = refcounts()
    barrier.step(1)  # phase 1: the meta all-reduce is left in flight
    held = refcounts()
    checkpoint, stop = barrier.broadcast_plan(rank == 0, False)
    vote = barrier.unanimous(True)
    dist.destroy_process_group()
    settled = barrier.settle(timeout_s=30)
    after = refcounts()
    Path(f"{out}.{rank}").write_text(json.dumps(
        {"held": [h - u for h, u in zip(held, unheld)], "settled": settled, "in_flight": barrier.in_flight(),
         "after": [a - u for a, u in zip(after, unheld)], "plan": [checkpoint, stop], "vote": vote}))


def test_settle_waits_until_no_collective_holds_the_barriers_tensors(tmp_path):
    """A gloo worker that frees a finished Work holding a Python tensor needs the GIL; at interpreter
    exit that aborts the process, so `settle` must return only once no Work holds them."""
    out = tmp_path / "settle"
    results = run_local(settle_after_destroy, 2, args=(str(out),), timeout_s=120)
    assert [r.exitcode for r in results] == [0, 0], results
    for rank in (0, 1):
        seen = json.loads(Path(f"{out}.{rank}").read_text())
        assert seen["held"][0] == 1  # the in-flight Work holds the meta tensor: visible in its refcount
        assert seen["settled"] and seen["in_flight"] == 0 and seen["after"] == [0, 0, 0, 0], seen
        assert seen["plan"] == [True, False] and seen["vote"] is True, seen
