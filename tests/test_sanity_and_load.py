"""Sanity warnings on implausible runs, and load scaling of real traces (library API; the CLI
flags are tested in tests/test_cli_runs.py)."""

from __future__ import annotations

import pytest

from loom.core.protocols import PLACERS, POLICIES
from loom.errors import LoomInputError
from loom.hardware.topology import NodeDef, Tier, Topology
from loom.report.metrics import summary
from loom.report.sanity import SanityLimits, sanity_warnings
from loom.sim.engine import Simulation
from loom.workload.job import JobSpec
from loom.workload.scaling import scale_load

DAY = 86_400.0


def _topology(nodes: int = 2) -> Topology:
    return Topology.build("t", (Tier("core"), Tier("leaf")),
                          [NodeDef(f"n{i}", ("c", "l0"), "A100-80GB", 8) for i in range(nodes)])


def _codes(specs: list[JobSpec], nodes: int = 2) -> list[str]:
    result = Simulation(_topology(nodes), specs, POLICIES.get("fcfs")(), PLACERS.get("best-fit")()).run()
    return [w.code for w in sanity_warnings(result, summary(result))]


def test_a_busy_plausible_run_has_no_warnings() -> None:
    # 8 jobs of 8 GPUs for a day each, one arriving every 12 h on 16 GPUs: ~100% busy, little queueing
    assert _codes([JobSpec(f"j{i}", i * DAY / 2, 8, DAY) for i in range(8)]) == []


def test_a_light_trace_is_flagged_with_the_load_knob() -> None:
    # one 1-GPU job of an hour per day on 16 GPUs: utilisation 1/16 * 1/24 ≈ 0.3%
    specs = [JobSpec(f"j{i}", i * DAY, 1, 3_600.0) for i in range(10)]
    result = Simulation(_topology(), specs, POLICIES.get("fcfs")(), PLACERS.get("best-fit")()).run()
    warnings = sanity_warnings(result, summary(result))
    assert [w.code for w in warnings] == ["low-utilization"]
    assert "--load" in warnings[0].message and "0.3%" in warnings[0].message


def test_one_job_dominating_queueing_and_the_makespan_is_named() -> None:
    # "big" holds one node for 100 days; small jobs run at once on the other; "late" (16 GPUs)
    # arrives last, after a day, and alone waits ~99 days: all the queueing is late's, and big's
    # 100 days are 100x the 1-day arrival span
    specs = [JobSpec("big", 0.0, 8, 100 * DAY), *(JobSpec(f"s{i}", DAY * i / 5, 1, 60.0) for i in range(1, 5)),
             JobSpec("late", DAY, 16, 60.0)]
    codes = _codes(specs)
    assert "queue-one-job" in codes and "job-longer-than-trace" in codes


def test_every_job_rejected_is_said_with_the_cluster_knob() -> None:
    result = Simulation(_topology(1), [JobSpec("huge", 0.0, 64, 60.0), JobSpec("huger", 1.0, 128, 60.0)],
                        POLICIES.get("fcfs")(), PLACERS.get("best-fit")()).run()
    warnings = sanity_warnings(result, summary(result))
    assert warnings[0].code == "all-rejected" and "--cluster" in warnings[0].message


def test_limits_are_data() -> None:
    specs = [JobSpec(f"j{i}", i * DAY, 1, 3_600.0) for i in range(10)]
    result = Simulation(_topology(), specs, POLICIES.get("fcfs")(), PLACERS.get("best-fit")()).run()
    assert sanity_warnings(result, summary(result), SanityLimits(min_utilization=0.001)) == []


def test_load_compresses_gaps_and_keeps_offsets() -> None:
    specs = [JobSpec("a", 100.0, 1, 10.0), JobSpec("b", 300.0, 2, 10.0, announce_time=250.0, deadline=400.0)]
    a, b = scale_load(specs, load=4.0)
    assert a.submit_time == 100.0 and b.submit_time == 150.0  # the 200 s gap / 4
    assert b.announce_time == 100.0 and b.deadline == 250.0  # same offsets from its own arrival
    assert (a.gpus, a.duration, b.gpus, b.duration) == (1, 10.0, 2, 10.0)


def test_repeat_appends_renamed_copies_after_the_span() -> None:
    specs = [JobSpec("a", 0.0, 1, 10.0), JobSpec("b", 100.0, 1, 10.0), JobSpec("c", 200.0, 1, 10.0)]
    out = scale_load(specs, load=2.0, repeat=3)
    # scaled arrivals 0, 50, 100; period = span 100 + mean gap 50 = 150
    assert [(s.job_id, s.submit_time) for s in out] == [
        ("a", 0.0), ("b", 50.0), ("c", 100.0), ("a#2", 150.0), ("b#2", 200.0), ("c#2", 250.0),
        ("a#3", 300.0), ("b#3", 350.0), ("c#3", 400.0)]


@pytest.mark.parametrize(("load", "repeat", "field"), [(0.0, 1, "load"), (-1.0, 1, "load"), (1.0, 0, "repeat")])
def test_bad_scaling_names_the_flag(load: float, repeat: int, field: str) -> None:
    with pytest.raises(LoomInputError, match=f"--{field}"):
        scale_load([JobSpec("a", 0.0, 1, 1.0)], load=load, repeat=repeat)
