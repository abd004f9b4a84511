from __future__ import annotations

import pytest


@pytest.fixture(autouse=True, scope="session")
def _private_trace_cache(tmp_path_factory):
    """Tests never write the user's ~/.cache/loom."""
    mp = pytest.MonkeyPatch()
    mp.setenv("LOOM_CACHE", str(tmp_path_factory.mktemp("loom-cache")))
    yield
    mp.undo()

from loom.hardware.clos import clos
from loom.hardware.topology import NodeDef, Tier, Topology
from loom.workload.job import JobSpec


@pytest.fixture
def small_clos() -> Topology:
    """2 minipods × 4 nodes × 8 GPUs, 2 nodes per leaf."""
    return clos("t", minipods=2, nodes=8, gpus_per_node=8, gpu_type="A100-80GB", nodes_per_leaf=2)


@pytest.fixture
def hetero() -> Topology:
    """Two GPU types: 2 × 4 V100 and 2 × 8 A100."""
    tiers = (Tier("core"), Tier("leaf"))
    nodes = [
        NodeDef("v0", ("c", "l0"), "V100", 4),
        NodeDef("v1", ("c", "l0"), "V100", 4),
        NodeDef("a0", ("c", "l1"), "A100-80GB", 8),
        NodeDef("a1", ("c", "l1"), "A100-80GB", 8),
    ]
    return Topology.build("hetero", tiers, nodes)


@pytest.fixture
def no_trace_cache(monkeypatch):
    monkeypatch.setenv("LOOM_CACHE", "off")


def write_file(directory, text: str, name: str = "t.csv"):
    path = directory / name
    path.write_text(text)
    return path


def job(jid: str, t: float, gpus: int, duration: float, **kw) -> JobSpec:
    return JobSpec(job_id=jid, submit_time=t, gpus=gpus, duration=duration, **kw)
