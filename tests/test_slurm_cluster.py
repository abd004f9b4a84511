"""The real Slurm test cluster (loom/service/backends/slurmtest.py): munge, slurmctld and 16
slurmd's with fake 8-GPU gres in a loopback-only network namespace, started and stopped by the
test.  Needs root and Debian's Slurm/munge packages (scripts/setup.sh); skipped otherwise."""

from __future__ import annotations

import os
import re
import time

import pytest

from loom.service.backends.slurmtest import SlurmCluster, missing_requirements

pytestmark = pytest.mark.slurm

DAEMONS = ("slurmctld", "slurmd", "slurmstepd", "munged")


def _daemon_pids() -> list[tuple[int, str]]:
    """(pid, name) of every Slurm/munge process on the machine, zombies included."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/comm") as f:
                comm = f.read().strip()
        except OSError:
            continue
        if comm in DAEMONS:
            found.append((int(entry), comm))
    return found


def test_slurm_cluster_starts_runs_a_job_and_stops() -> None:
    why = missing_requirements()
    if why:
        pytest.skip(why)
    before = set(_daemon_pids())
    with SlurmCluster() as cluster:
        netns, root = cluster.netns, cluster.root
        assert os.path.exists(cluster.netns_path)

        # 16 idle nodes, each with 8 GPUs
        res = cluster.run(["sinfo", "-h", "-N", "-o", "%N|%t|%G"], check=True)
        rows = [line.split("|") for line in res.stdout.split()]
        assert sorted(r[0] for r in rows) == sorted(f"n{i}" for i in range(16)), res.stdout
        assert all(r[1] == "idle" for r in rows), res.stdout
        assert all(r[2].startswith("gpu:8") for r in rows), res.stdout

        # three-level switch tree: 4 leaves of 4 nodes, 2 spines, 1 core
        topo = cluster.run(["scontrol", "show", "topology"], check=True).stdout
        levels = dict(re.findall(r"SwitchName=(\S+) Level=(\d)", topo))
        assert sorted(levels.values()) == ["0"] * 4 + ["1"] * 2 + ["2"], topo
        assert "SwitchName=leaf0 Level=0" in topo and "Nodes=n[0-3]" in topo, topo
        assert re.search(r"SwitchName=core Level=2 .*Nodes=n\[0-15\]", topo), topo

        # a job on n3 with 2 GPUs runs there and completes
        sub = cluster.run(["sbatch", "--parsable", "--wrap", "hostname; echo NODE=$SLURMD_NODENAME GPUS=$CUDA_VISIBLE_DEVICES",
                           "-w", "n3", "--gres=gpu:2", "-t", "1", "-o", f"{root}/jobs/%j.out"], check=True)
        job_id = sub.stdout.strip().split(";")[0]
        assert job_id.isdigit(), sub.stdout + sub.stderr
        deadline = time.monotonic() + 30
        info = ""
        while time.monotonic() < deadline:
            info = cluster.run(["scontrol", "show", "job", job_id], check=True).stdout
            if re.search(r"JobState=(COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY)", info):
                break
            time.sleep(0.2)
        assert "JobState=COMPLETED" in info, info
        assert "ExitCode=0:0" in info, info
        assert re.search(r"\bNodeList=n3\b", info), info
        assert re.search(r"gres/gpu=2|gpu:2", info), info
        out = (root / "jobs" / f"{job_id}.out").read_text()
        assert "NODE=n3 " in out, out
        assert re.search(r"GPUS=\d+,\d+$", out, re.MULTILINE), out  # two fake GPUs bound through gres File=
        ours = set(cluster.ns_pids())  # this cluster's processes, just before it closes
        assert {comm for pid, comm in _daemon_pids() if pid in ours} >= {"slurmctld", "slurmd", "munged"}

    # nothing left: no daemon started by the cluster, no namespace, no directory
    time.sleep(0.1)
    # only this cluster's processes (its network namespace's, seen just before it closed): other
    # clusters of tests running beside this one have daemons of their own
    leftover = [p for p in _daemon_pids() if p not in before and p[0] in ours]
    assert leftover == [], leftover
    assert not os.path.exists(f"/var/run/netns/{netns}")
    assert not root.exists()
