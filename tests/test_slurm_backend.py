"""The Slurm backend (loom/service/backends/slurm.py) against a real Slurm cluster.

One throwaway cluster for the module (loom.service.backends.slurmtest: munged, slurmctld and
16 slurmd with fake GPUs in a loopback-only network namespace). Jobs are the built-in sleep
job on the wall clock, scheduled by the live engine: they must run on exactly the nodes and
GPUs Loom chose (as `scontrol show job -d` reports them), be preempted through the control
channel and resumed from their checkpoint, report Slurm's exit status, and survive a service
restart without being submitted twice.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from loom.core.events import JobFailed, JobStopped, NodeDrained, NodeUp
from loom.core.jobs import JobState
from loom.core.protocols import POLICIES
from loom.errors import LoomInputError
from loom.service.backends import backend_class
from loom.service.backends.runs import Layout
from loom.service.backends.slurm import SlurmBackend, job_nodes, node_condition
from loom.service.backends.slurmcli import SlurmCLI, exit_status, gpu_gres, parse_record, time_limit
from loom.service.backends.slurmtest import SlurmCluster, missing_requirements
from loom.service.clock import WallClock
from loom.service.engine import LiveEngine
from loom.service.specs import LaunchSpec
from loom.workload.job import JobSpec

S = JobState


# ------------------------------------------------------------------ parsing (no cluster needed)
def test_slurm_output_is_parsed_from_its_one_line_formats():
    record = parse_record("JobId=7 JobName=loom.a b JobState=FAILED Reason=NonZeroExitCode ExitCode=3:0 "
                          "Command=/x/job.sh WorkDir=/tmp/w")
    assert record["JobName"] == "loom.a b" and record["ExitCode"] == "3:0" and record["WorkDir"] == "/tmp/w"
    assert gpu_gres("gpu:8") == (None, 8) and gpu_gres("gpu:a100:4(S:0-1),gpu:v100:2") == ("a100", 6)
    assert gpu_gres("(null)") == (None, 0)
    assert time_limit(30) == "0-00:01:00" and time_limit(3601) == "0-01:01:00" and time_limit(90000) == "1-01:00:00"
    assert exit_status("COMPLETED", "0:0") == 0 and exit_status("FAILED", "3:0") == 3
    assert exit_status("CANCELLED", "0:15") == 143 and exit_status("NODE_FAIL", "0:0") == 137
    assert exit_status("TIMEOUT", "0:0") == 143
    assert [node_condition(s) for s in ("IDLE", "MIXED", "DOWN*", "IDLE+DRAIN", "DRAINED", "ALLOCATED*")] == \
        ["up", "up", "down", "drained", "drained", "up"]
    assert backend_class("slurm") is SlurmBackend


# ------------------------------------------------------------------ a real cluster
needs_slurm = pytest.mark.skipif(missing_requirements() is not None, reason=str(missing_requirements()))


@pytest.fixture(scope="module")
def cluster():
    with SlurmCluster() as made:
        yield made


def _cli(cluster: SlurmCluster) -> SlurmCLI:
    env = cluster.env()
    return SlurmCLI(tuple(cluster._ns([])), {"SLURM_CONF": env["SLURM_CONF"], "MUNGE_SOCKET": env["MUNGE_SOCKET"]})


class World:
    """The live engine and a Slurm backend on the wall clock, watching every event."""

    def __init__(self, cluster: SlurmCluster, root: Path, *, policy: Any = "priority", placer: str = "first-fit",
                 **backend: Any) -> None:
        self.cluster, self.cli = cluster, _cli(cluster)
        self.clock = WallClock()
        options = {"poll_s": 0.05, "grace_s": 10.0, "hang_s": 0.0, "node_poll_s": 0.5, **backend}
        self.backend = SlurmBackend(self.cli, root=root, gpu_type="A100-80GB", clock=self.clock, **options)
        self.events: list[Any] = []
        self.decisions: list[Any] = []
        self.engine = LiveEngine(self.backend, POLICIES.get(policy)() if isinstance(policy, str) else policy,
                                 placer, clock=self.clock, round_interval=0.2, on_event=self.events.append,
                                 on_decision=lambda d, _t, _at: self.decisions.append(d))
        self.engine.start()

    def submit(self, job_id: str, gpus: int, duration: float, priority: int = 0, env: dict | None = None) -> None:
        spec = JobSpec(job_id, self.clock.now(), gpus, duration, priority=priority, preemptible=True)
        launch = LaunchSpec(job_id, None, None, duration, tuple(sorted((env or {}).items())))
        self.engine.submit(spec, launch).result(timeout=10)

    def job(self, job_id: str):
        return self.engine.core.jobs[job_id]

    def until(self, check, timeout: float = 60.0) -> None:
        self.engine.run_until(check, timeout=timeout)

    def slurm_id(self, job_id: str) -> int:
        return int(json.loads(self.backend.layout.record(job_id).read_text())["slurm_id"])

    def close(self, kill: bool = True) -> None:
        try:
            self.engine.stop()
        finally:
            self.backend.close(kill=kill)
            self.clock.close()


@pytest.fixture
def world(cluster, tmp_path):
    made: list[World] = []

    def make(**kwargs: Any) -> World:
        made.append(World(cluster, tmp_path / f"root{len(made)}", **kwargs))
        return made[-1]

    yield make
    for w in made:
        w.close()
    cluster.run("scancel --name=loom.* 2>/dev/null; scancel -u root")


@needs_slurm
@pytest.mark.slurm
def test_the_inventory_is_slurms_nodes_gpus_and_switch_tree(cluster):
    backend = SlurmBackend(_cli(cluster), root=cluster.root / "inv", gpu_type="A100-80GB", node_poll_s=0)
    topo = backend.inventory().topology
    assert topo.num_nodes == 16 and set(topo.node_gpus.tolist()) == {8}
    assert [t.name for t in topo.tiers] == ["core", "spine", "leaf"]
    leaf = len(topo.tiers) - 1
    leaves = {topo.node_names[i]: str(topo.switch_names[leaf][int(topo.switch_of[leaf, i])]) for i in range(16)}
    assert leaves["n0"] == leaves["n3"] == "core/spine0/leaf0" and leaves["n5"] == "core/spine0/leaf1"
    assert leaves["n15"] == "core/spine1/leaf3"
    with pytest.raises(LoomInputError, match="no type in its Gres="):
        SlurmBackend(_cli(cluster), root=cluster.root / "inv2", node_poll_s=0)


@needs_slurm
@pytest.mark.slurm
def test_jobs_run_on_exactly_the_nodes_and_gpus_loom_chose(world):
    w = world(placer="topo-aware")
    sizes = {"a": 8, "b": 16, "c": 4, "d": 12, "e": 2, "f": 24}
    for job_id, gpus in sizes.items():
        w.submit(job_id, gpus, 4.0)
    seen: dict[str, dict[str, int]] = {}
    ids: dict[str, int] = {}

    def all_seen() -> bool:
        for job_id in sizes:
            if job_id not in seen and w.job(job_id).state is S.RUNNING:
                ids[job_id] = w.slurm_id(job_id)
                seen[job_id] = job_nodes(w.cli, ids[job_id])
        return len(seen) == len(sizes)

    w.until(all_seen, timeout=90)
    for job_id in sizes:
        start = next(d for d in w.decisions if type(d).__name__ == "Start" and d.job_id == job_id)
        chosen = {w.backend.topology.node_names[n]: g for n, g in zip(start.allocation.nodes, start.allocation.gpus)}
        assert seen[job_id] == chosen, (job_id, seen[job_id], chosen)
        record = w.cli.job(ids[job_id])[0]
        assert record["JobName"] == f"loom.{job_id}" and record["TimeLimit"] != "UNLIMITED"
    w.until(lambda: all(w.job(j).state is S.FINISHED for j in sizes), timeout=90)
    for job_id in sizes:
        assert w.cli.job(ids[job_id])[0]["JobState"] == "COMPLETED"


@needs_slurm
@pytest.mark.slurm
def test_a_preempted_job_stops_through_the_control_channel_and_resumes_from_its_checkpoint(world):
    w = world()
    for n in range(16):  # fill the cluster so the high-priority job needs low's GPUs
        w.submit(f"fill{n}", 8, 30.0, priority=1)
    w.submit("low", 8, 4.0)
    w.until(lambda: sum(w.job(f"fill{n}").state is S.RUNNING for n in range(16)) == 16)
    w.engine.cancel("fill0")
    w.until(lambda: w.job("low").state is S.RUNNING, timeout=60)
    first = w.slurm_id("low")
    time.sleep(1.5)
    w.submit("high", 8, 0.5, priority=5)
    w.until(lambda: w.job("high").state is S.FINISHED and w.job("low").state is S.FINISHED, timeout=90)
    stopped = [e for e in w.events if isinstance(e, JobStopped) and e.job_id == "low"]
    assert len(stopped) == 1 and 0.5 < stopped[0].progress < 4.0
    assert w.cli.job(first)[0]["JobState"] == "COMPLETED"  # it checkpointed and exited 0
    assert w.slurm_id("low") != first if w.backend.layout.record("low").exists() else True
    assert w.job("low").preemptions == 1 and w.job("low").progress == 4.0
    for n in range(1, 16):
        w.engine.cancel(f"fill{n}")


@needs_slurm
@pytest.mark.slurm
def test_a_failing_job_reports_slurms_exit_status_and_its_log(world):
    w = world()
    w.submit("crash", 2, 30.0, env={"LOOM_SLEEP_FAIL_AFTER": "0.3"})
    w.until(lambda: w.job("crash").state is S.FAILED, timeout=60)
    failed = [e for e in w.events if isinstance(e, JobFailed)]
    assert len(failed) == 1 and failed[0].fatal
    assert "exit status 3" in failed[0].cause and "emulated failure after" in failed[0].cause


@needs_slurm
@pytest.mark.slurm
def test_a_node_drained_in_slurm_is_reported_and_resumed(world):
    w = world()
    w.cluster.run(["scontrol", "update", "nodename=n9", "state=drain", "reason=loom-test"], check=True)
    try:
        w.until(lambda: any(isinstance(e, NodeDrained) for e in w.events), timeout=30)
        drained = next(e for e in w.events if isinstance(e, NodeDrained))
        assert w.backend.topology.node_names[drained.node] == "n9" and "loom-test" in drained.cause
    finally:
        w.cluster.run(["scontrol", "update", "nodename=n9", "state=resume"], check=True)
    w.until(lambda: any(isinstance(e, NodeUp) for e in w.events), timeout=30)


@needs_slurm
@pytest.mark.slurm
def test_a_restarted_service_adopts_running_jobs_and_settles_held_ones(cluster, tmp_path):
    root = tmp_path / "root"
    first = World(cluster, root)
    try:
        first.submit("long", 8, 4.0)
        first.until(lambda: first.job("long").state is S.RUNNING, timeout=60)
        running = first.slurm_id("long")
    finally:
        first.close(kill=False)  # the service dies; its Slurm job goes on
    cli = _cli(cluster)
    script = root / "slurm" / "orphan.sh"
    script.write_text("#!/bin/sh\nsleep 30\n")
    layout = Layout(root)

    def held(name: str) -> int:
        out = cli.run(["sbatch", "--parsable", "--hold", "--job-name", f"loom.{name}", "--time", "5",
                       "--output", "/dev/null", str(script)])
        return int(out.strip())

    recorded, unrecorded = held("kept"), held("never")
    layout.record("kept").write_text(json.dumps({"job_id": "kept", "pid": None, "sleep": True, "gpus": {"n12": [0]},
                                                 "slurm_id": recorded}))
    clock = WallClock()
    backend = SlurmBackend(cli, root=root, gpu_type="A100-80GB", clock=clock, poll_s=0.05, node_poll_s=0)
    engine = LiveEngine(backend, "priority", "first-fit", clock=clock, round_interval=0.2)
    try:
        assert backend.held == {"released": [recorded], "cancelled": [unrecorded]}
        assert cli.job(unrecorded)[0]["JobState"] == "CANCELLED"
        survivors = backend.survivors()
        assert survivors["long"] == {first.backend.topology.node_names[n]: 8
                                     for n in first.job("long").allocation.nodes}
        engine.adopt(JobSpec("long", 0.0, 8, 4.0), survivors["long"],
                     launch=LaunchSpec("long", None, None, 4.0)).result(timeout=10)
        engine.run_until(lambda: engine.core.jobs["long"].state is S.FINISHED, timeout=60)
        assert cli.job(running)[0]["JobState"] == "COMPLETED"
        names = cli.run(["squeue", "-h", "-a", "-t", "all", "-o", "%j"]).split()
        assert names.count("loom.long") == 1  # adopted, never submitted again
    finally:
        engine.stop()
        backend.close()
        clock.close()
        cli.run(["scancel", str(recorded)], check=False)


@needs_slurm
@pytest.mark.slurm
def test_loom_serve_schedules_through_slurm(cluster, tmp_path):
    """`loom serve --backend slurm`: jobs submitted through the API run as Slurm jobs and finish."""
    from loom.service.testing import start, wait_for

    env = cluster.env()
    served = start(tmp_path / "data", "--backend", "slurm", "--gpu-type", "A100-80GB", "--policy", "fcfs",
                   "--placer", "topo-aware", "--round-interval", "1",
                   env={"LOOM_SLURM_PREFIX": " ".join(cluster._ns([])), "SLURM_CONF": env["SLURM_CONF"],
                        "MUNGE_SOCKET": env["MUNGE_SOCKET"]})
    try:
        with served.client() as c:
            for job_id, gpus in (("s1", 8), ("s2", 16), ("s3", 3)):
                c.submit({"job_id": job_id, "gpus": gpus, "duration": 2.0})
            wait_for(lambda: all(c.status(j)["state"] == "FINISHED" for j in ("s1", "s2", "s3")), 120, "finished")
            listed = c.nodes()
            rows = listed.get("nodes", listed) if isinstance(listed, dict) else listed
            assert {n["name"] for n in rows} == set(cluster.nodes)  # the inventory is Slurm's
        done = _cli(cluster).run(["squeue", "-h", "-a", "-t", "all", "-o", "%j|%T"]).split()
        for job_id in ("s1", "s2", "s3"):
            assert f"loom.{job_id}|COMPLETED" in done, done
    finally:
        served.kill()
        cluster.run("scancel -u root")


@needs_slurm
@pytest.mark.slurm
@pytest.mark.slow
def test_kill_9_of_the_service_at_10_random_moments_of_200_jobs_loses_and_duplicates_nothing():
    """Issue 21's crash test (`bench/slurm_jobs.py --crash 10`, which records the figures in
    docs/BENCHMARKS.md): a real `loom serve --backend slurm` killed with SIGKILL at 10 random moments
    while 200 jobs arrive and run, restarted each time. Every acknowledged job finishes; none is
    started twice (the service's records) or run as two Slurm jobs (Slurm's); no GPU is bound twice;
    no Slurm job is left held."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_slurm_jobs", Path(__file__).parents[1] / "bench" / "slurm_jobs.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    jobs = bench.workload(200, 21, gap_s=0.2, durations=(1, 4))
    with SlurmCluster() as crashed:
        r = bench.run_crash(crashed, _cli(crashed), jobs, kills=10, seed=21)
    assert r["acknowledged"] == 200 and r["kills"] == 10
    assert r["lost"] == 0, r["lost_ids"]
    assert r["started_twice"] == 0 and r["slurm_ran_twice"] == [] and r["double_bound_gpus"] == 0
    assert r["left_held"] == 0
