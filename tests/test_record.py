"""The run record's transition log and the sink's per-type handlers, through a simulation."""

from __future__ import annotations

import pytest

from loom.core.backend import handler_for
from loom.core.events import JobFinished, JobStarted
from loom.core.lifecycle import JobState
from loom.core.protocols import PLACERS, POLICIES
from loom.core.record import TransitionLog
from loom.hardware.topology import NodeDef, Tier, Topology
from loom.sim import engine
from loom.sim.engine import Simulation
from loom.workload.job import JobSpec


def _run(jobs: int = 40):
    topo = _topology(["n0", "n1"])
    specs = [JobSpec(f"j{i}", submit_time=float(i), duration=50.0 + i % 7, gpus=1 + i % 8) for i in range(jobs)]
    return Simulation(topo, specs, POLICIES.get("fcfs")(), PLACERS.get("best-fit")()).run()


def test_sealed_chunks_read_back_the_same_transitions(monkeypatch: pytest.MonkeyPatch) -> None:
    plain = [(t.at, t.job_id, t.old, t.new, t.event) for t in _run().record.transitions]
    monkeypatch.setattr(TransitionLog, "CHUNK", 4)  # seal once 4 transitions have piled up …
    monkeypatch.setattr(engine, "PROGRESS_EVERY", 3)  # … checked every 3 events the loop handles
    result = _run()
    log = result.record.transitions
    assert len(log._chunks) > 3  # the engine did compact as it went
    chunked = [(t.at, t.job_id, t.old, t.new, t.event) for t in log]
    assert chunked == plain and len(log) == len(plain) == 3 * 40  # STARTING, RUNNING, FINISHED each
    assert log[len(log) - 1].new is JobState.FINISHED
    j7 = result.record.transitions_of("j7")
    assert [(t.old, t.new) for t in j7] == [(JobState.PENDING, JobState.STARTING),
                                            (JobState.STARTING, JobState.RUNNING),
                                            (JobState.RUNNING, JobState.FINISHED)]
    assert [t.event for t in j7] == ["start decision", "JobStarted", "JobFinished"]


def test_the_sink_offers_its_handlers_and_a_wrapped_sink_gets_every_event() -> None:
    sim = Simulation(*_inputs())
    sink = sim.core.sink
    assert handler_for(sink, JobStarted) == sim.core._on_started  # direct, same effect as sink(event)
    seen: list[object] = []

    def wrapper(event: object) -> None:  # a harness that watches: no `handlers`, so nothing bypasses it
        seen.append(event)
        sink(event)

    assert handler_for(wrapper, JobFinished) is wrapper
    sim.backend.bind(wrapper)
    result = sim.run()
    assert sum(type(e) is JobFinished for e in seen) == len(result.jobs) == 5
    assert all(j.state is JobState.FINISHED for j in result.jobs)


def _topology(names: list[str]) -> Topology:
    return Topology.build("t", (Tier("core"), Tier("leaf")), [NodeDef(n, ("c", "l0"), "A100-80GB", 8) for n in names])


def _inputs():
    topo = _topology(["n0"])
    specs = [JobSpec(f"j{i}", submit_time=float(i), duration=10.0, gpus=4) for i in range(5)]
    return topo, specs, POLICIES.get("fcfs")(), PLACERS.get("best-fit")()
