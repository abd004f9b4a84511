from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, is_hypothesis_test, settings


@pytest.fixture(autouse=True, scope="session")
def _private_trace_cache(tmp_path_factory):
    """Tests never write the user's ~/.cache/loom."""
    mp = pytest.MonkeyPatch()
    mp.setenv("LOOM_CACHE", str(tmp_path_factory.mktemp("loom-cache")))
    yield
    mp.undo()

from pg import postgres_server  # noqa: F401  (a real PostgreSQL server, session-wide: tests/pg.py)

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


# ----------------------------------------------------------------------------- hypothesis profiles
# CI loads no profile: every property keeps the settings written on it (simharness.PROPERTY_SETTINGS:
# 100 derandomised examples, the same every run; a few tests set their own count). The "deep"
# profile is bench/property_profile.py's (docs/BENCHMARKS.md, "Deep property profile"):
#     LOOM_DEEP_EXAMPLES=10000 python3 -m pytest --hypothesis-profile=deep --hypothesis-seed=S tests/...
# runs every @given test randomised from seed S (no derandomize) with LOOM_DEEP_EXAMPLES examples,
# no deadline, no example database, too_slow suppressed. A test's own @settings override any
# profile, so the hook below puts the profile's run-size settings back on top of each collected
# Hypothesis test; it does nothing unless the deep profile is loaded.
DEEP_PROFILE = "deep"
settings.register_profile(
    DEEP_PROFILE,
    max_examples=int(os.environ.get("LOOM_DEEP_EXAMPLES", "10000")),
    derandomize=False,
    deadline=None,
    database=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
_DEEP_KEYS = ("max_examples", "derandomize", "deadline", "database", "print_blob")


LONG_MARKS = ("slow", "slurm", "postgres", "browser")


def pytest_collection_modifyitems(config, items):
    # the long tiers' tests first (in their own order), handed out two at a time (pyproject's
    # --maxschedchunk): xdist's workers then end on short tests instead of one worker finishing
    # minutes-long tests while the other idles
    items.sort(key=lambda item: not any(item.get_closest_marker(m) for m in LONG_MARKS))
    if settings.get_current_profile_name() != DEEP_PROFILE:
        return
    deep = settings.get_profile(DEEP_PROFILE)
    for item in items:
        fn = getattr(getattr(item, "obj", None), "__func__", getattr(item, "obj", None))
        if not is_hypothesis_test(fn) or getattr(fn, "_loom_deep_profile", False):
            continue
        own = fn._hypothesis_internal_use_settings  # what @settings/@given left on the test
        fn._hypothesis_internal_use_settings = settings(
            own, **{k: getattr(deep, k) for k in _DEEP_KEYS},
            suppress_health_check=set(own.suppress_health_check) | set(deep.suppress_health_check))
        fn._loom_deep_profile = True
