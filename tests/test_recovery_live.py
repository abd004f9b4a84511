"""The core's live recovery pipeline: a backend that does not know why a job died reports
`JobFailed(diagnose=True)`; the core asks it to `Diagnose` and, for an infrastructure error
with no node to blame, to `Localize`; faulty nodes are cordoned and replaced, the job resumes
from its checkpoint; script and framework errors are not retried. Driven here by a backend
that only records what it is asked (each test plays the backend's answers)."""

from __future__ import annotations

import pytest

from loom.core.backend import Inventory
from loom.core.decisions import Diagnose, Localize, Resume
from loom.core.events import DecisionFailed, FaultsLocalized, JobDiagnosed, JobFailed, JobStarted
from loom.core.jobs import JobState
from loom.core.protocols import PLACERS, POLICIES
from loom.core.recovery import RecoveryConfig
from loom.core.scheduler import DRAINED, Scheduler
from loom.hardware.clos import clos
from loom.hardware.state import NO_RESERVATION
from loom.workload.job import JobSpec

S = JobState


class _Asked:
    """Records every decision with its ticket; answers nothing by itself."""

    name = "asked"

    def __init__(self, topology) -> None:
        self.inv = Inventory(topology, 0)
        self.applied: list[tuple[object, int]] = []
        self.timers: list[tuple[float, tuple]] = []

    def bind(self, sink) -> None:
        self.sink = sink

    def inventory(self):
        return self.inv

    def apply(self, decision, ticket, at) -> None:
        self.applied.append((decision, ticket))

    def set_timer(self, at, token) -> None:
        self.timers.append((at, token))

    def last(self, kind):
        found = [(d, t) for d, t in self.applied if isinstance(d, kind)]
        assert found, f"no {kind.__name__} was asked for: {self.applied}"
        return found[-1]


def _running_job(recovery: RecoveryConfig | None = RecoveryConfig()):
    """A 16-GPU job running on n0 and n1 of a 4-node, 8-GPU-per-node cluster."""
    topo = clos("live", minipods=1, nodes=4, gpus_per_node=8, gpu_type="A100-80GB", nodes_per_leaf=4)
    backend = _Asked(topo)
    core = Scheduler(backend, POLICIES.get("fcfs")(), PLACERS.get("first-fit")(), recovery=recovery)
    job = core.add(JobSpec("a", 0.0, 16, 1000.0))
    core.submit(job, 0.0)
    core.round(0.0)
    start, ticket = backend.applied[0]
    assert start.allocation.nodes == (0, 1)
    core.observe(JobStarted("a", 1.0, 1.0, 0.0, ticket))
    assert job.state is S.RUNNING
    return core, backend, job


def test_an_infrastructure_failure_is_diagnosed_localised_cordoned_and_replaced():
    core, backend, job = _running_job()
    core.observe(JobFailed("a", 100.0, "exit status 1: ...", diagnose=True, progress=60.0))
    diagnose, ticket = backend.last(Diagnose)
    assert job.state is S.RECOVERING and diagnose.job_id == "a"
    assert core.ctx.state.free[[0, 1]].tolist() == [0, 0]  # its nodes are held while it recovers
    assert not backend.timers  # the live pipeline waits for answers, not for a priced delay

    core.observe(JobDiagnosed("a", 110.0, "infrastructure", "NCCLTimeout", True, "watchdog timeout on rank 3",
                              "restart without the faulty node", ticket))
    localize, ticket = backend.last(Localize)
    assert localize.nodes == (0, 1) and "NCCLTimeout" in localize.reason
    assert job.diagnosis == "infrastructure/NCCLTimeout: watchdog timeout on rank 3"

    core.observe(FaultsLocalized("a", 130.0, (1,), "n1 hung in round 2", ticket))
    resume, _ = backend.last(Resume)
    names = core.topology.node_names
    # the replacement takes the faulty node's rank slot: n0 keeps rank 0, the new node is second
    assert resume.allocation.nodes[0] == 0 and resume.allocation.nodes[1] not in (0, 1)
    assert f"{names[1]}→{names[resume.allocation.nodes[1]]}" in resume.reason
    assert core.ctx.state.reserved_by[1] == DRAINED  # cordoned: nothing new lands there
    assert core.record.node_events[-1].node == names[1] and core.record.node_events[-1].kind == "drained"
    assert job.state is S.STARTING and job.progress == 60.0  # from its last durable checkpoint
    record = core.recovery.records[-1]
    assert record.failed_nodes == (names[1],) and record.diagnosis.startswith("infrastructure/NCCLTimeout")
    assert not core.unanswered or all(not isinstance(d, (Diagnose, Localize)) for d in core.unanswered)


def test_a_script_or_framework_error_is_not_retried_and_says_why():
    core, backend, job = _running_job()
    core.observe(JobFailed("a", 100.0, "exit status 1", diagnose=True))
    _, ticket = backend.last(Diagnose)
    core.observe(JobDiagnosed("a", 105.0, "framework", "KeyError", False, "KeyError: 'lr' in train.py line 12",
                              "fix the script; a restart would fail the same way", ticket))
    assert job.state is S.FAILED
    assert "framework/KeyError" in job.reason and "not retried" in job.reason and "fix the script" in job.reason
    assert core.ctx.state.free[[0, 1]].tolist() == [8, 8]  # nothing held for it any more
    assert not any(isinstance(d, (Localize, Resume)) for d, _ in backend.applied)
    assert core.record.transitions_of("a")[-1].event == job.reason


def test_no_faulty_node_found_restarts_it_on_its_own_nodes():
    core, backend, job = _running_job()
    core.observe(JobFailed("a", 100.0, "no progress for 30 s (hung); killed", diagnose=True))
    core.observe(JobDiagnosed("a", 101.0, "infrastructure", "NCCLTimeout", True, ticket=backend.last(Diagnose)[1]))
    core.observe(FaultsLocalized("a", 102.0, (), "every pair passed", backend.last(Localize)[1]))
    resume, _ = backend.last(Resume)
    assert resume.allocation.nodes == (0, 1) and "own nodes" in resume.reason
    assert core.ctx.state.reserved_by[[0, 1]].tolist() == [NO_RESERVATION] * 2


def test_a_step_the_backend_cannot_carry_out_is_skipped():
    core, backend, job = _running_job()
    core.observe(JobFailed("a", 100.0, "exit status 134", diagnose=True))
    core.observe(DecisionFailed(backend.last(Diagnose)[1], 101.0, "the log is gone"))
    _, ticket = backend.last(Localize)  # an unknown cause counts as infrastructure: test the nodes
    assert job.diagnosis.startswith("infrastructure/Unknown") and "the log is gone" in job.diagnosis
    core.observe(DecisionFailed(ticket, 102.0, "agents did not start"))
    resume, _ = backend.last(Resume)
    assert resume.allocation.nodes == (0, 1)


def test_answers_for_a_job_not_waiting_for_them_are_stale():
    core, backend, job = _running_job()
    core.observe(JobDiagnosed("a", 50.0, "infrastructure", "CUDAError", True))  # it never failed
    assert core.record.stale_events == 1 and job.state is S.RUNNING
    core.observe(JobFailed("a", 100.0, "exit status 1", diagnose=True))
    core.observe(FaultsLocalized("a", 101.0, (0,), "", None))  # it waits for a diagnosis, not this
    assert core.record.stale_events == 2 and job.state is S.RECOVERING
    core.cancel("a", "the owner withdrew it", 102.0)
    core.observe(JobDiagnosed("a", 103.0, "infrastructure", "CUDAError", True, ticket=backend.last(Diagnose)[1]))
    assert job.state is S.CANCELLED and core.ctx.state.free[[0, 1]].tolist() == [8, 8]


@pytest.mark.parametrize("fatal, end", [(True, S.FAILED), (False, S.PENDING)])
def test_without_recovery_the_backends_own_verdict_stands(fatal, end):
    core, backend, job = _running_job(recovery=None)
    core.observe(JobFailed("a", 100.0, "exit status 1", fatal=fatal, diagnose=True))
    assert not any(isinstance(d, Diagnose) for d, _ in backend.applied)
    assert job.state is (S.FAILED if fatal else S.SUSPENDED)


def test_a_job_that_keeps_failing_is_not_recovered_forever():
    core, backend, job = _running_job(recovery=RecoveryConfig(max_failures=2))
    for attempt in range(1, 4):
        core.observe(JobFailed("a", 100.0 * attempt, "exit status 1", diagnose=True))
        if attempt == 3:
            break
        core.observe(JobDiagnosed("a", 100.0 * attempt + 1, "infrastructure", "CUDAError", True,
                                  ticket=backend.last(Diagnose)[1]))
        core.observe(FaultsLocalized("a", 100.0 * attempt + 2, (), "", backend.last(Localize)[1]))
        core.observe(JobStarted("a", 100.0 * attempt + 3, 1.0, 0.0, backend.last(Resume)[1]))
        assert job.state is S.RUNNING
    assert job.state is S.FAILED and "failed 3 times" in job.reason
    assert len([d for d, _ in backend.applied if isinstance(d, Diagnose)]) == 2
