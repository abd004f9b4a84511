"""The local backend under the live engine: real process groups on emulated nodes.

The default tier runs the built-in sleep job (a process that speaks the control channel)
on the wall clock, with durations of a second or two: preemption through the control
channel and resumption from its checkpoint, a crash, a hang, a stop that is never
answered (SIGTERM after the grace period), a node failure, migrate and resize, and a
service restart that adopts a job still running. The slow tier trains the example GPT
through `loom run`, resizes it (2 → 1 process) and migrates it, and compares its loss
curve with an uninterrupted run, bit for bit (preempted and resumed elsewhere through the
service's API: tests/test_serve_e2e.py).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from loom.core.decisions import Migrate, Resize, Timer
from loom.core.events import JobFailed, JobProgress, JobStopped, NodeDown, NodeUp
from loom.core.jobs import JobState
from loom.core.protocols import POLICIES
from loom.errors import LoomInputError
from loom.hardware.state import Allocation
from loom.service.backends import backend_class
from loom.service.backends.inventory import load_inventory
from loom.service.backends.local import LocalBackend
from loom.service.backends.runs import Layout
from loom.service.clock import WallClock
from loom.service.engine import LiveEngine
from loom.service.specs import LaunchSpec
from loom.service.testing import loss_curve
from loom.workload.job import JobSpec

S = JobState
EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "jobs" / "gpt_train.py"


# ------------------------------------------------------------------ the inventory file
def _write(tmp_path: Path, text: str, name: str = "inventory.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_an_inventory_gives_emulated_nodes_a_cluster_or_switch_paths(tmp_path):
    inv = load_inventory(_write(tmp_path, "nodes: 3\ngpus_per_node: 2\nlaunch_delay_s: 1.5\nroot: state\n"))
    assert inv.topology.node_names == ("node0", "node1", "node2") and inv.topology.node_gpus.tolist() == [2, 2, 2]
    assert inv.settings.launch_delay_s == 1.5 and inv.settings.root == (tmp_path / "state").resolve()
    _write(tmp_path, "name: lab\ntiers: [{name: spine}, {name: leaf}]\nnodes:\n"
                     "  - {name: a0, path: [s0, l0], gpu_type: A100-80GB, gpus: 2}\n"
                     "  - {name: a1, path: [s0, l1], gpu_type: A100-80GB, gpus: 4}\n", "lab.yaml")
    inv = load_inventory(_write(tmp_path, "cluster: yaml:lab.yaml\n"))  # relative to the inventory file
    assert inv.topology.node_names == ("a0", "a1") and inv.topology.node_gpus.tolist() == [2, 4]
    inv = load_inventory(_write(tmp_path, "topology:\n  name: inline\n  tiers: [{name: spine}, {name: leaf}]\n"
                                          "  nodes:\n  - {name: n0, path: [s0, l0], gpu_type: A100-80GB, gpus: 1}\n"))
    assert inv.topology.node_names == ("n0",) and inv.topology.num_switches(1) == 1


@pytest.mark.parametrize(("text", "field", "words"), [
    ("nodes: 3\ngpus_per_node: two\n", "gpus_per_node", "expected an integer"),
    ("nodes: 3\n", "gpus_per_node", "missing required key 'gpus_per_node'"),
    ("nodes: 2\ngpus_per_node: 2\ncluster: arnold-i\n", "cluster", "exactly one of"),
    ("gpus_per_node: 2\n", "nodes", "exactly one of"),
    ("nodes: 2\ngpus_per_node: 2\ngrace: 3\n", "grace", "unknown key 'grace'"),
    ("nodes: 2\ngpus_per_node: 2\nhang_s: -1\n", "hang_s", "non-negative"),
    ("cluster: yaml:missing.yaml\n", "cluster", "cannot load cluster"),
    (("topology:\n  name: t\n  tiers: [{name: spine}, {name: leaf}]\n  nodes:\n"
      "  - {name: n0, path: [s0], gpu_type: A100-80GB, gpus: 1}\n"), "topology.nodes[0].path", "2 tiers"),
])
def test_a_bad_inventory_names_the_field(tmp_path, text, field, words):
    with pytest.raises(LoomInputError) as err:
        load_inventory(_write(tmp_path, text))
    assert err.value.field == field and words in str(err.value) and "inventory.yaml" in str(err.value)


def test_backends_by_name():
    assert backend_class("local") is LocalBackend
    with pytest.raises(LoomInputError, match="unknown backend 'lcoal'.*did you mean local"):
        backend_class("lcoal")


# ------------------------------------------------------------------ sleep jobs on the wall clock
class World:
    """An engine and a local backend on the wall clock, watching every event."""

    def __init__(self, root: Path, *, nodes: int = 2, gpus: int = 2, policy: Any = "priority", **backend: Any) -> None:
        from loom.service.backends.inventory import emulated

        self.clock = WallClock()
        options = {"poll_s": 0.02, "grace_s": 5.0, "hang_s": 0.0, **backend}
        self.backend = LocalBackend(emulated(nodes, gpus), root=root, clock=self.clock, **options)
        self.events: list[Any] = []
        self.engine = LiveEngine(self.backend, POLICIES.get(policy)() if isinstance(policy, str) else policy,
                                 "first-fit", clock=self.clock, round_interval=0.2, on_event=self.events.append)
        self.engine.start()

    def submit(self, job_id: str, gpus: int, duration: float, priority: int = 0, env: dict | None = None,
               command: list[str] | None = None, iterations: int | None = None) -> None:
        spec = JobSpec(job_id, self.clock.now(), gpus, duration, priority=priority, preemptible=True,
                       iterations=iterations)
        launch = LaunchSpec(job_id, tuple(command) if command else None, None, duration,
                            tuple(sorted((env or {}).items())))
        self.engine.submit(spec, launch).result(timeout=10)

    def job(self, job_id: str):
        return self.engine.core.jobs[job_id]

    def until(self, check, timeout: float = 60.0) -> None:
        self.engine.run_until(check, timeout=timeout)

    def state(self, job_id: str) -> S:
        return self.engine.call(lambda core: core.jobs[job_id].state).result(timeout=10)

    def close(self) -> None:
        try:
            self.engine.stop()
        finally:
            self.backend.close()
            self.clock.close()


@pytest.fixture
def world(tmp_path):
    made: list[World] = []

    def make(**kwargs: Any) -> World:
        made.append(World(tmp_path / f"root{len(made)}", **kwargs))
        return made[-1]

    yield make
    for w in made:
        w.close()


def test_a_preempted_sleep_job_resumes_from_its_checkpoint(world):
    w = world(nodes=1)
    w.submit("low", 2, 3.0)
    w.until(lambda: w.job("low").state is S.RUNNING)
    time.sleep(0.5)
    w.submit("high", 2, 0.3, priority=5)
    w.until(lambda: w.job("high").state is S.FINISHED and w.job("low").state is S.FINISHED, timeout=30)
    stopped = [e for e in w.events if isinstance(e, JobStopped) and e.job_id == "low"]
    assert len(stopped) == 1 and 0.3 < stopped[0].progress < 3.0  # what it had done, checkpointed
    low = w.job("low")
    assert low.preemptions == 1 and low.progress == 3.0
    held = low.end_time - low.first_start
    assert held >= 3.0 + 0.3  # its work, plus the high-priority job's turn
    resumed = [e for e in w.events if type(e).__name__ == "JobStarted" and e.job_id == "low"][1]
    assert resumed.progress == stopped[0].progress  # it went on from where it stopped


def test_a_crash_is_a_fatal_failure_naming_the_log(world):
    w = world()
    w.submit("crash", 1, 30.0, env={"LOOM_SLEEP_FAIL_AFTER": "0.2"})
    w.until(lambda: w.job("crash").state is S.FAILED, timeout=30)
    failed = [e for e in w.events if isinstance(e, JobFailed)]
    assert len(failed) == 1 and failed[0].fatal
    assert "exit status 3" in failed[0].cause and "emulated failure after" in failed[0].cause
    assert "emulated failure" in w.job("crash").reason


def test_a_hang_is_caught_by_the_watchdog(world):
    w = world(hang_s=1.0)
    w.submit("stuck", 1, 30.0, env={"LOOM_SLEEP_HANG_AFTER": "0.1"})
    w.until(lambda: any(isinstance(e, JobFailed) for e in w.events), timeout=30)
    failed = next(e for e in w.events if isinstance(e, JobFailed))
    assert not failed.fatal and "no progress for 1 s" in failed.cause
    w.engine.cancel("stuck")
    w.until(lambda: w.job("stuck").state is S.CANCELLED, timeout=30)


def test_a_stop_nobody_answers_ends_in_sigterm_after_the_grace_period(world):
    w = world(grace_s=0.5)
    w.submit("deaf", 1, 30.0, env={"LOOM_SLEEP_HANG_AFTER": "0.1"})
    w.until(lambda: w.job("deaf").state is S.RUNNING)
    time.sleep(0.3)
    asked = time.monotonic()
    w.engine.cancel("deaf")
    w.until(lambda: w.job("deaf").state is S.CANCELLED, timeout=30)
    assert time.monotonic() - asked >= 0.5
    assert any(isinstance(e, JobStopped) and e.job_id == "deaf" and e.ticket is not None for e in w.events)
    assert not w.backend.running()


def test_a_failed_node_kills_its_jobs_and_they_go_on_elsewhere(world):
    w = world(nodes=2, gpus=2)
    w.submit("a", 2, 2.0)
    w.until(lambda: w.job("a").state is S.RUNNING)
    node = w.engine.core.topology.node_names[w.job("a").allocation.nodes[0]]
    w.backend.fail_node(node)
    w.until(lambda: w.job("a").state is S.FINISHED, timeout=30)
    failed = [e for e in w.events if isinstance(e, JobFailed)]
    assert len(failed) == 1 and failed[0].nodes and not failed[0].fatal
    assert any(isinstance(e, NodeDown) for e in w.events)
    assert w.engine.core.topology.node_names[w.job("a").allocation.nodes[0]] != node
    w.backend.repair_node(node)
    w.until(lambda: any(isinstance(e, NodeUp) for e in w.events), timeout=10)


def test_migrate_and_resize_restart_the_job_on_its_new_gpus(world, tmp_path):
    class Mover:
        """FCFS; once `a` runs, migrate it to node1 and at once (before that is done) resize it to 1 GPU."""

        name = "mover"

        def __init__(self) -> None:
            self.fcfs, self.step = POLICIES.get("fcfs")(), 0

        def schedule(self, ctx):
            job = ctx.running.get("a")
            if job is None:
                return self.fcfs.schedule(ctx)
            self.step += 1
            if self.step == 1:
                return [Timer(ctx.now + 0.3, "let it run a little")]
            if self.step == 2:
                return [Migrate("a", Allocation((1,), (2,)), "to node1"),
                        Resize("a", Allocation((1,), (1,)), "to one GPU")]
            return []

    w = world(nodes=2, gpus=2, policy=Mover())
    w.submit("a", 2, 2.0)
    w.until(lambda: w.job("a").state is S.FINISHED, timeout=30)
    answers = [e for e in w.events if isinstance(e, JobProgress) and e.ticket is not None]
    assert len(answers) == 2  # the migrate and the resize, each done once the job ran again
    a = w.job("a")
    assert a.migrations == 1 and a.resizes == 1 and a.allocation == Allocation((1,), (1,))
    assert a.progress == 2.0


def test_a_restarted_service_adopts_a_job_that_kept_running(tmp_path):
    from loom.service.backends.inventory import emulated

    root = tmp_path / "root"
    first = World(root, nodes=1, gpus=2)
    try:
        first.submit("long", 2, 2.5)
        first.until(lambda: first.job("long").state is S.RUNNING)
        pid = json.loads(Layout(root).record("long").read_text())["pid"]
    finally:
        first.engine.stop()
        first.backend.close(kill=False)  # the service dies; its jobs go on
    clock = WallClock()
    backend = LocalBackend(emulated(1, 2), root=root, clock=clock, poll_s=0.02)
    engine = LiveEngine(backend, "priority", "first-fit", clock=clock, round_interval=0.2)
    try:
        survivors = backend.survivors()
        assert survivors == {"long": {"node0": 2}}
        spec = JobSpec("long", 0.0, 2, 2.5)
        engine.adopt(spec, survivors["long"], launch=LaunchSpec("long", None, None, 2.5)).result(timeout=10)
        engine.submit(JobSpec("next", 0.0, 2, 0.2)).result(timeout=10)
        engine.run_until(lambda: all(j.state is S.FINISHED for j in engine.core.jobs.values()), timeout=30)
        long = engine.core.jobs["long"]
        assert [t.event for t in engine.core.record.transitions_of("long")][:2] == ["adopted: found running",
                                                                                   "adopted"]
        assert engine.core.jobs["next"].first_start >= long.end_time  # its GPUs were taken meanwhile
        assert json.loads((root / "runtime" / "long" / "status.json").read_text())["pid"] == pid  # not relaunched
    finally:
        engine.stop()
        backend.close()
        clock.close()


def test_a_job_that_ended_before_its_end_was_stored_is_reported_again_never_relaunched(tmp_path):
    """The backend keeps a finished run's record (marked ended) until the service says the end is
    stored; a service killed in between adopts the record and sees the job finish, not run again."""
    from loom.service.backends.inventory import emulated

    root = tmp_path / "root"
    first = World(root, nodes=1, gpus=2)
    try:
        first.submit("short", 1, 0.2)
        first.until(lambda: first.job("short").state is S.FINISHED)
        kept = json.loads(Layout(root).record("short").read_text())
        assert kept["ended"] == {"exit_code": 0}
    finally:
        first.engine.stop()
        first.backend.close(kill=False)  # the service dies before it stored the end
    status = (root / "runtime" / "short" / "status.json").read_text()
    clock = WallClock()
    backend = LocalBackend(emulated(1, 2), root=root, clock=clock, poll_s=0.02)
    engine = LiveEngine(backend, "priority", "first-fit", clock=clock, round_interval=0.2)
    try:
        assert backend.survivors() == {"short": {"node0": 1}}
        engine.adopt(JobSpec("short", 0.0, 1, 0.2), {"node0": 1},
                     launch=LaunchSpec("short", None, None, 0.2)).result(timeout=10)
        engine.run_until(lambda: engine.core.jobs["short"].state is S.FINISHED, timeout=30)
        assert [t.event for t in engine.core.record.transitions_of("short")][-1] == "JobFinished"
        assert (root / "runtime" / "short" / "status.json").read_text() == status  # not launched again
        assert backend.forget_ended(["short", "unknown"]) == ["short"]  # the service stored the end
        assert not Layout(root).record("short").exists() and backend.survivors() == {}
    finally:
        engine.stop()
        backend.close()
        clock.close()


@pytest.mark.parametrize("end_stored", [False, True])
def test_a_restart_adopts_a_kept_end_unless_the_store_has_it(tmp_path, end_stored):
    """Reconciliation with a finished run's kept record and a store that lost every transition of the
    run (the service died before its group commit): the run is adopted and finishes, never launched
    again. With the end stored (the job waits again), the record is dropped and the job queued."""
    from loom.service.backends.inventory import emulated
    from loom.service.reconcile import reconcile
    from loom.service.store import Store

    root = tmp_path / "root"
    first = World(root, nodes=1, gpus=2)
    try:
        first.submit("short", 1, 0.2)
        first.until(lambda: first.job("short").state is S.FINISHED)
    finally:
        first.engine.stop()
        first.backend.close(kill=False)
    started = json.loads(Layout(root).record("short").read_text())["started_at"]
    store = Store.open(f"sqlite:///{tmp_path / 'loom.db'}")
    store.create_tenant("t")
    store.submit("t", {"job_id": "short", "gpus": 1, "duration": 0.2})
    store.record_transition("short", "SUBMITTED", "PENDING", started - 1, "taken up by the scheduler")
    if end_stored:
        store.record_transitions([("short", "PENDING", "STARTING", started, "start decision"),
                                  ("short", "STARTING", "RUNNING", started + 0.1, "JobStarted"),
                                  ("short", "RUNNING", "PENDING", started + 0.3, "requeued")])
    clock = WallClock()
    backend = LocalBackend(emulated(1, 2), root=root, clock=clock, poll_s=0.02)
    engine = LiveEngine(backend, "priority", "first-fit", clock=clock, round_interval=0.2)
    try:
        out = reconcile(store, engine, backend, clock.now())
        assert (out.adopted, out.requeued) == (([], ["short"]) if end_stored else (["short"], []))
        assert Layout(root).record("short").exists() is not end_stored
        engine.start()
        engine.run_until(lambda: engine.core.jobs["short"].state is S.FINISHED, timeout=30)
        events = [t.event for t in engine.core.record.transitions_of("short")]
        assert ("start decision" in events) is end_stored  # launched again only when its end was stored
    finally:
        engine.stop()
        backend.close()
        clock.close()
        store.close()


# ------------------------------------------------------------------ a real training job (slow)
ITERS = 24
JOB_ARGS = ["--iters", str(ITERS), "--layers", "1", "--d-model", "32"]


def _baseline(tmp_path: Path, *options: str) -> tuple[subprocess.Popen[str], Path]:
    """An uninterrupted `loom run` of the example, in the background: (process, its loss log)."""
    base = tmp_path / "baseline"
    proc = subprocess.Popen(
        [sys.executable, "-m", "loom.cli.main", "run", "--runtime-dir", str(base / "rt"), "--job-id", "base",
         "--workdir", str(base / "w"), *options, str(EXAMPLE), "--", *JOB_ARGS],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return proc, base / "w" / "loss.jsonl"


# A training job preempted and resumed elsewhere, bit for bit: tests/test_serve_e2e.py (through the API).


@pytest.mark.slow
def test_a_training_job_resized_and_migrated_by_the_runtime_keeps_its_loss_curve(world, tmp_path):
    """2 → 1 process (same 2 logical ranks) on its node, then to another node: `loom run` restarts it
    each time (world-size virtualisation; the working directory's files travel); deterministic mode,
    so the curve is the 2-process run's, bit for bit."""

    class Mover:
        name = "mover"

        def __init__(self) -> None:
            self.fcfs, self.step = POLICIES.get("fcfs")(), 0

        def schedule(self, ctx):
            job = ctx.running.get("gpt")
            if job is None:
                return self.fcfs.schedule(ctx)
            self.step += 1
            if self.step == 1:
                return [Timer(ctx.now + 2.0, "let it train a little")]
            if self.step == 2:
                node = job.allocation.nodes[0]
                return [Resize("gpt", Allocation((node,), (1,)), "to one GPU"),
                        Migrate("gpt", Allocation((1 - node,), (1,)), "to the other node")]
            return []

    baseline, expected = _baseline(tmp_path, "--nproc", "2", "--deterministic")
    w = world(nodes=2, gpus=2, policy=Mover(), grace_s=60.0, hang_s=300.0)
    w.submit("gpt", 2, 60.0, command=[str(EXAMPLE), *JOB_ARGS, "--step-delay", "0.5"], iterations=ITERS,
             env={"LOOM_DETERMINISTIC": "1"})
    w.until(lambda: w.job("gpt").state is S.FINISHED, timeout=400)
    out, _ = baseline.communicate(timeout=300)
    assert baseline.returncode == 0, out
    answers = [e for e in w.events if isinstance(e, JobProgress) and e.ticket is not None]
    assert len(answers) == 2 and all(e.progress and e.progress < 60.0 for e in answers)
    gpt = w.job("gpt")
    assert gpt.resizes == 1 and gpt.migrations == 1 and gpt.progress == 60.0
    from loom.service.backends.runs import current_workdir

    restarts = [e for e in json.loads("[" + ",".join((w.backend.layout.job_dir("gpt") / "events.jsonl")
                                                     .read_text().splitlines()) + "]")
                if e.get("event") == "restart"]
    assert [(e["action"], e["processes"]) for e in restarts] == [("resize", 1), ("migrate", 1)]
    log = current_workdir(w.backend.layout, "gpt") / "loss.jsonl"
    assert log.parent.name == "gpt.m1"  # the migration's new working directory, files and all
    assert loss_curve(log) == loss_curve(expected)
    assert sorted(loss_curve(log)) == list(range(1, ITERS + 1))
