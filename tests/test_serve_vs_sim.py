"""The service and the simulator make the same decisions (issue 19, slow tier).

A small workload — sleep-style jobs and two tiny real training jobs (the example GPT through
`loom run`) — goes through `loom serve` with the local backend and the `priority` policy. Then the
simulator replays it with what the live run measured: each job's submission time, its run time
(RUNNING → FINISHED) and each class's mean launch latency (start decision → RUNNING). The order of
starts and every job's placement (its nodes and GPUs) must be the same, and the start times as close
as the spread of launch latencies within a class allows.
"""

from __future__ import annotations

import signal
import statistics
import time

import pytest
from test_local_backend import EXAMPLE

from loom.core.protocols import PLACERS, POLICIES
from loom.service.backends.inventory import emulated
from loom.service.testing import kill_under, start
from loom.sim.engine import Simulation
from loom.sim.launch import LaunchModel
from loom.workload.job import JobClass, JobSpec

pytestmark = pytest.mark.slow
TRAIN = [str(EXAMPLE), "--iters", "12", "--layers", "1", "--d-model", "32"]
# (job, gpus, class, priority, command or sleep seconds): 6 GPUs on 3 nodes; a and b start at
# once, c waits for all six; when a ends, d (priority 2) goes before e (priority 1) and f
WORKLOAD = [
    ("a", 4, "eval", 0, 4.0),
    ("b", 2, "sft", 0, TRAIN),
    ("c", 6, "eval", 0, 2.0),
    ("d", 2, "debug", 2, 3.0),
    ("e", 1, "sft", 1, TRAIN),
    ("f", 3, "eval", 0, 1.5),
]


def _live(tmp_path) -> dict[str, dict]:
    (tmp_path / "inv.yaml").write_text("nodes: 3\ngpus_per_node: 2\nnodes_per_leaf: 3\npoll_s: 0.02\nhang_s: 300\n")
    data = tmp_path / "data"
    served = start(data, "--inventory", str(tmp_path / "inv.yaml"), "--policy", "priority", "--placer", "best-fit",
                   "--round-interval", "1")
    try:
        with served.client() as c:
            for job_id, gpus, cls, prio, what in WORKLOAD:
                body = {"job_id": job_id, "gpus": gpus, "job_class": cls, "priority": prio, "preemptible": False}
                body |= {"command": what, "procs": 1, "duration": 30.0} if isinstance(what, list) else {"duration": what}
                c.submit(body)
            deadline = time.monotonic() + 300
            while {j["state"] for j in c.jobs(all=True)} != {"FINISHED"}:
                assert time.monotonic() < deadline, c.jobs(all=True)
                time.sleep(0.2)
            out = {}
            for job_id, *_ in WORKLOAD:
                explained = c.explain(job_id)
                (start_d,) = [d for d in explained["decisions"] if d["kind"] == "start"]
                at = {t["new"]: t["at"] for t in explained["transitions"]}
                alloc = start_d["payload"]["allocation"]
                out[job_id] = {"submitted": explained["job"]["submitted_at"], "decided": start_d["at"],
                               "running": at["RUNNING"], "finished": at["FINISHED"],
                               "placement": tuple(sorted(zip(alloc["nodes"], alloc["gpus"])))}
            return out
    finally:
        served.kill(signal.SIGTERM)
        kill_under(data)


def test_the_service_and_the_simulator_start_the_same_jobs_in_the_same_order_on_the_same_gpus(tmp_path):
    live = _live(tmp_path)
    t0 = min(j["submitted"] for j in live.values())
    classes = {job_id: cls for job_id, _, cls, _, _ in WORKLOAD}
    latency = {cls: statistics.mean(live[j]["running"] - live[j]["decided"] for j in live if classes[j] == cls)
               for cls in set(classes.values())}
    specs = [JobSpec(job_id, live[job_id]["submitted"] - t0, gpus, live[job_id]["finished"] - live[job_id]["running"],
                     job_class=JobClass(cls), priority=prio, preemptible=False)
             for job_id, gpus, cls, prio, _ in WORKLOAD]
    topology = emulated(3, 2, nodes_per_leaf=3)
    sim = Simulation(topology, specs, POLICIES.get("priority")(), PLACERS.get("best-fit")(),
                     launch=LaunchModel(latency_s=latency))
    result = sim.run()
    names = topology.node_names
    simulated = {}
    for at, d in result.decisions:
        if type(d).__name__ == "Start":
            simulated[d.job_id] = (at, tuple(sorted((names[n], g) for n, g in zip(d.allocation.nodes, d.allocation.gpus))))
    live_order = sorted(live, key=lambda j: (live[j]["decided"], j))
    sim_order = sorted(simulated, key=lambda j: (simulated[j][0], j))
    assert live_order == sim_order
    assert {j: live[j]["placement"] for j in live} == {j: simulated[j][1] for j in simulated}
    # and at about the same moments: the simulator gives every job of a class that class's mean launch
    # latency, so a start may move by as much as latencies within a class differ, plus polling jitter
    spread = sum(max(ls) - min(ls) for ls in ([live[j]["running"] - live[j]["decided"] for j in live
                                              if classes[j] == cls] for cls in latency))
    for job_id in live:
        assert abs((live[job_id]["decided"] - t0) - simulated[job_id][0]) < 1.5 + spread, (job_id, spread)
