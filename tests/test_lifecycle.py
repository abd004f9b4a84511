"""The job lifecycle and the core's handling of a changing inventory, through the core's API.

The inventory tests drive the core with `InstantBackend`, a second, minimal
implementation of the backend protocol (it starts and stops jobs at once and
lets the test change the node list), so the core's rules are tested apart from
the simulator's world.
"""

from __future__ import annotations

import pytest

from loom.core.backend import EventSink, Inventory, InventoryChanged
from loom.core.decisions import (
    Cancel,
    Decision,
    Migrate,
    Preempt,
    Reserve,
    Resize,
    Resume,
    Start,
)
from loom.core.events import JobFinished, JobStarted, JobStopped, NodeDrained, NodeUp
from loom.core.lifecycle import (
    TERMINAL,
    TRANSITIONS,
    IllegalTransition,
    JobState,
    check_transition,
)
from loom.core.protocols import PLACERS, POLICIES
from loom.core.scheduler import Scheduler
from loom.hardware.topology import NodeDef, Tier, Topology
from loom.workload.job import JobSpec

S = JobState


def test_an_illegal_transition_names_the_job_the_states_and_the_event():
    with pytest.raises(IllegalTransition) as err:
        check_transition("j7", S.FINISHED, S.RUNNING, "JobStarted")
    message = str(err.value)
    assert "job 'j7'" in message and "FINISHED → RUNNING" in message and "JobStarted" in message
    assert "terminal" in message


def test_every_state_can_end_and_terminal_states_are_final():
    for state in JobState:
        seen, frontier = {state}, [state]
        while frontier:
            for nxt in TRANSITIONS[frontier.pop()]:
                if nxt not in seen:
                    seen.add(nxt)
                    frontier.append(nxt)
        assert seen & TERMINAL, f"{state.name} can never end"
    assert all(not TRANSITIONS[s] for s in TERMINAL)


# ------------------------------------------------------------------ a minimal second backend
def _topology(names: list[str], gpus: int = 8) -> Topology:
    return Topology.build("inv", (Tier("core"), Tier("leaf")),
                          [NodeDef(n, ("c", "l0"), "A100-80GB", gpus) for n in names])


class InstantBackend:
    """Carries decisions out at once; the test moves time and changes the inventory."""

    name = "instant"

    def __init__(self, topology: Topology) -> None:
        self.current = Inventory(topology, 0)
        self.sink: EventSink = lambda _: None
        self.now = 0.0
        self.timers: list[tuple[float, tuple]] = []

    def bind(self, sink: EventSink) -> None:
        self.sink = sink

    def inventory(self) -> Inventory:
        return self.current

    def apply(self, decision: Decision, ticket: int, at: float) -> None:
        if isinstance(decision, (Start, Resume)):
            self.sink(JobStarted(decision.job_id, at, 1.0, 0.0, ticket))
        elif isinstance(decision, (Preempt, Cancel)):
            self.sink(JobStopped(decision.job_id, at, None, ticket))
        elif isinstance(decision, (Migrate, Resize)):
            raise AssertionError("not used here")

    def set_timer(self, at: float, token: tuple) -> None:
        self.timers.append((at, token))

    def change(self, topology: Topology, at: float) -> None:
        self.current = Inventory(topology, self.current.generation + 1)
        self.sink(InventoryChanged(self.current, at))


def _core(names: list[str]) -> tuple[Scheduler, InstantBackend]:
    backend = InstantBackend(_topology(names))
    return Scheduler(backend, POLICIES.get("fcfs")(), PLACERS.get("first-fit")()), backend


def _submit(core: Scheduler, job_id: str, gpus: int, at: float = 0.0):
    job = core.add(JobSpec(job_id, at, gpus, 100.0))
    core.submit(job, at)
    return job


def test_a_node_leaving_the_inventory_fails_its_jobs_and_the_tree_is_rebuilt():
    core, backend = _core(["n0", "n1"])
    a, b = _submit(core, "a", 8), _submit(core, "b", 8)
    core.round(0.0)
    assert a.state is b.state is S.RUNNING
    on_n1 = a if core.topology.node_names[a.allocation.nodes[0]] == "n1" else b
    backend.change(_topology(["n0", "n2", "n3"]), 10.0)
    assert core.generation == 1 and core.topology.node_names == ("n0", "n2", "n3")
    assert on_n1.state is S.SUSPENDED and on_n1.failures == 1  # never silently kept
    other = b if on_n1 is a else a
    assert other.state is S.RUNNING and core.topology.node_names[other.allocation.nodes[0]] == "n0"
    assert int(core.ctx.state.free_total) == 16
    core.round(10.0)
    assert on_n1.state is S.RUNNING and core.topology.node_names[on_n1.allocation.nodes[0]] in ("n2", "n3")
    assert [e for e in core.record.node_events if e.kind == "down"][0].node == "n1"


def test_an_older_generation_is_ignored_and_reservations_follow_node_names():
    core, backend = _core(["n0", "n1", "n2"])
    planned = core.add(JobSpec("llm", 50.0, 16, 100.0, announce_time=0.0))
    core.announce(planned)
    core.issue([Reserve(0, (1, 2), 100.0, "llm", "hold n1, n2")], 0.0)
    backend.change(_topology(["n2", "n1"]), 5.0)  # n0 gone, order changed
    assert core.ctx.reservations[0].nodes == (1, 0)  # n1 and n2 at their new indices
    assert core.ctx.state.reserved_by.tolist() == [0, 0]
    stale = InventoryChanged(Inventory(_topology(["x"]), 0), 6.0)
    core.observe(stale)
    assert core.topology.node_names == ("n2", "n1") and core.record.stale_events == 1


def test_drained_nodes_take_no_new_work_and_stale_job_events_are_dropped():
    core, _backend = _core(["n0", "n1"])
    core.observe(NodeDrained(0, 0.0, "maintenance"))
    a = _submit(core, "a", 8)
    core.round(0.0)
    assert core.topology.node_names[a.allocation.nodes[0]] == "n1"
    b = _submit(core, "b", 8, 1.0)
    core.round(1.0)
    assert b.state is S.PENDING  # n0 is drained
    core.observe(NodeUp(0, 2.0))
    core.round(2.0)
    assert b.state is S.RUNNING
    core.observe(JobFinished("a", 3.0))
    core.observe(JobFinished("a", 3.0))  # delivered twice
    assert a.state is S.FINISHED and core.record.stale_events == 1
