"""Node-failure sources: the InfiniteHBD trace, its mapping onto a cluster, rate failures, the CLI parser."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import numpy as np
import pytest

from loom.errors import LoomInputError
from loom.hardware.clos import clos
from loom.paths import shared_traces_dir
from loom.workload.faults import NodeFailure
from loom.workload.faults import (
    DAY,
    INFINITEHBD_PATH,
    load_fault_trace,
    parse_failures,
    rate_failures,
    summary,
)


@pytest.fixture(scope="module")
def trace():
    try:  # found the same way `parse_failures("infinitehbd")` finds it
        path = shared_traces_dir().joinpath(*INFINITEHBD_PATH)
    except LoomInputError:
        pytest.skip("shared traces folder absent")
    if not path.is_file():
        pytest.skip(f"shared fault trace absent: {path}")
    return load_fault_trace(path)


def _topo(nodes: int):
    return clos("f", minipods=max(1, -(-nodes // 128)), nodes=nodes, gpus_per_node=8, nodes_per_leaf=4)


def _event(node: str, day: float, kind: str, desc: str = "d") -> dict:
    return {"node_id": node, "event_time": day, "event_type": kind,
            "fault_type": {"Level": "Hardware Failure", "Class": "GPU", "Desc": desc}}


def _write(tmp_path, data, name: str = "faults.json") -> Path:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


# --------------------------------------------------------------- real trace
def test_real_trace_matches_readme(trace):
    s = trace.stats()
    assert s["episodes"] == 584 and s["censored"] == 0 and s["faulty_servers"] == 231
    rep = s["repair_days"]
    assert rep["p50"] == pytest.approx(0.85, abs=0.05)
    assert rep["mean"] == pytest.approx(5.5, abs=0.2)
    assert rep["p90"] == pytest.approx(13, abs=0.5)
    assert s["failures_per_server_day"] == pytest.approx(584 / (400 * 348.98), rel=1e-3)
    assert s["by_class"]["GPU"] == 158 and s["by_class"]["Unknown Error"] == 144


def test_full_period_on_400_nodes_replays_every_episode_once(trace):
    topo = _topo(400)
    faults = trace.to_cluster(topo, 0.0, trace.horizon, seed=3)
    assert len(faults) == 584 and not any(faults.ongoing)
    assert summary(faults, topo)["by_class"] == trace.stats()["by_class"]
    # 800 nodes: two rounds of the 400 servers, each episode exactly twice
    assert summary(trace.to_cluster(_topo(800), 0.0, trace.horizon, seed=3), _topo(800))["failures"] == 1168


def test_to_cluster_preserves_rate_and_is_valid(trace):
    topo = _topo(16)
    start, end = 5000.0, 5000.0 + 3 * 365 * DAY
    names = set(topo.node_names)
    rates = []
    for seed in range(60):
        faults = trace.to_cluster(topo, start, end, seed=seed)
        assert len(faults.classes) == len(faults.levels) == len(faults.ongoing) == len(faults)
        for f, ongoing in zip(faults.failures, faults.ongoing):
            assert f.node in names
            assert start <= f.at < end and f.repair_after >= 0 and math.isfinite(f.repair_after)
            assert (f.at == start) or not ongoing
        rates.append(summary(faults, topo)["failures_per_node_day"])
    assert statistics.mean(rates) == pytest.approx(trace.stats()["failures_per_server_day"], rel=0.15)


def test_to_cluster_deterministic_and_seed_dependent(trace):
    topo = _topo(40)
    a = trace.to_cluster(topo, 0.0, 60 * DAY, seed=7)
    assert a == trace.to_cluster(topo, 0.0, 60 * DAY, seed=7)
    assert a.failures != trace.to_cluster(topo, 0.0, 60 * DAY, seed=8).failures
    fixed = trace.to_cluster(topo, 0.0, 60 * DAY, seed=1, offset_days=300.0)  # wraps past the trace end
    assert all(0.0 <= f.at < 60 * DAY for f in fixed.failures)
    with pytest.raises(LoomInputError, match="offset_days"):
        trace.to_cluster(topo, 0.0, DAY, seed=1, offset_days=400.0)
    with pytest.raises(LoomInputError, match="window"):
        trace.to_cluster(topo, DAY, 0.0, seed=1)


def test_ongoing_episode_keeps_remaining_repair(tmp_path):
    path = _write(tmp_path, [_event("a", 0.0, "fault_start"), _event("a", 10.0, "fault_end"),
                             _event("b", 20.0, "fault_start")])  # b: censored, repaired at day 20 (horizon)
    tr = load_fault_trace(path)
    assert [e.censored for e in tr.episodes] == [False, True] and tr.horizon == 20 * DAY
    topo = _topo(2)
    faults = tr.to_cluster(topo, 100.0, 100.0 + 5 * DAY, seed=0, sampled_servers=2, offset_days=4.0)
    (f,) = faults.failures
    assert faults.ongoing == [True] and f.at == 100.0 and f.repair_after == pytest.approx(6 * DAY)
    with pytest.raises(LoomInputError, match="sampled_servers"):
        tr.to_cluster(topo, 0.0, DAY, seed=0, sampled_servers=1)


# --------------------------------------------------------------- bad input
@pytest.mark.parametrize(("data", "needle"), [
    ({"a": 1}, "JSON list"),
    ("[1, 2", "not valid JSON"),
    ([_event("a", 1.0, "fault_start"), {"node_id": "a", "event_time": 2.0, "event_type": "fault_end"}],
     r"\[1\]\.fault_type"),
    ([_event("a", -1.0, "fault_start")], r"\[0\]\.event_time"),
    ([_event("a", 1.0, "fault_start"), _event("a", 2.0, "fault_restart")], r"entry 1: unknown event type"),
    ([_event("a", 5.0, "fault_start"), _event("a", 1.0, "fault_end")], r"entry 1: .*no earlier"),
    ([_event("a", 1.0, "fault_end", "x"), _event("a", 1.0, "fault_start", "x")], r"entry 0"),
    ([_event("a", 1.0, "fault_start"), "oops"], r"entry 1: expected an object"),
    ([_event("", 1.0, "fault_start")], r"\[0\]\.node_id"),
    ([_event("a", True, "fault_start")], r"\[0\]\.event_time"),
])
def test_bad_trace_names_file_and_entry(tmp_path, data, needle):
    path = _write(tmp_path, data)
    with pytest.raises(LoomInputError, match=needle) as err:
        load_fault_trace(path)
    assert str(path) in str(err.value)


def test_missing_file(tmp_path):
    with pytest.raises(LoomInputError, match="not found"):
        load_fault_trace(tmp_path / "nope.json")


# --------------------------------------------------------------- rate failures
def test_rate_failures_statistics():
    topo = _topo(200)
    days = 365
    faults = rate_failures(topo, 0.0, days * DAY, 0.01, seed=4)
    expected = 0.01 * 200 * days
    assert abs(len(faults) - expected) < 4 * math.sqrt(expected)
    rep = [f.repair_after / DAY for f in faults.failures]
    assert statistics.median(rep) == pytest.approx(0.85, rel=0.15)
    assert statistics.mean(rep) == pytest.approx(5.5, rel=0.3)
    assert all(0 <= f.at < days * DAY and f.node in topo.node_index for f in faults.failures)
    assert [f.at for f in faults.failures] == sorted(f.at for f in faults.failures)
    assert faults == rate_failures(topo, 0.0, days * DAY, 0.01, seed=4)
    assert summary(faults, topo)["failures_per_node_day"] == pytest.approx(0.01, rel=0.1)
    assert len(rate_failures(topo, 0.0, DAY, 0.0, seed=1)) == 0


@pytest.mark.parametrize(("kwargs", "fld"), [
    ({"per_node_per_day": -1.0}, "per_node_per_day"),
    ({"per_node_per_day": float("nan")}, "per_node_per_day"),
    ({"repair_median_s": 0.0}, "repair_median_s"),
    ({"repair_mean_s": -5.0}, "repair_mean_s"),
    ({"repair_median_s": 10 * DAY, "repair_mean_s": DAY}, "repair_mean_s"),
    ({"end": -1.0}, "window"),
])
def test_rate_failures_validation(kwargs, fld):
    args = {"start": 0.0, "end": DAY, "per_node_per_day": 0.1, "seed": 0} | kwargs
    with pytest.raises(LoomInputError) as err:
        rate_failures(_topo(4), **args)
    assert err.value.field == fld


# --------------------------------------------------------------- parser + summary
def test_parse_failures_variants(tmp_path):
    topo = _topo(8)
    assert len(parse_failures("none", topo, 0.0, DAY, 0)) == 0
    rate = parse_failures("rate:0.5", topo, 0.0, 10 * DAY, 1)
    assert rate == rate_failures(topo, 0.0, 10 * DAY, 0.5, 1)
    path = _write(tmp_path, [_event("a", 0.5, "fault_start"), _event("a", 1.5, "fault_end")])
    from_file = parse_failures(str(path), topo, 0.0, 30 * DAY, 2)
    assert all(f.node in topo.node_index for f in from_file.failures)
    for bad, needle in (("rate:lots", "rate:lots"), ("rate:-2", "rate:-2"), ("no/such.json", "no/such.json")):
        with pytest.raises(LoomInputError, match=needle):
            parse_failures(bad, topo, 0.0, DAY, 0)


def test_parse_infinitehbd(trace):
    topo = _topo(64)
    got = parse_failures("infinitehbd", topo, 0.0, 90 * DAY, 5)
    assert got == trace.to_cluster(topo, 0.0, 90 * DAY, 5)


def test_summary_merges_overlaps_and_clips():
    topo = _topo(4)
    names = topo.node_names
    fl = [NodeFailure(names[0], 0.0, 2 * DAY), NodeFailure(names[0], DAY, 2 * DAY),
          NodeFailure(names[1], 9 * DAY)]  # never repaired: counted until the window end
    s = summary(fl, topo, start=0.0, end=10 * DAY)
    assert s["node_days_down"] == pytest.approx(3 + 1)
    assert s["failures"] == 3 and s["never_repaired"] == 1 and s["nodes_affected"] == 2
    assert s["failures_per_node_day"] == pytest.approx(3 / 40)
    assert s["by_class"] == {"unknown": 3}
    assert np.isclose(s["availability"], 1 - 4 / 40)


def test_simulation_accepts_generated_failures():
    from loom.core.protocols import PLACERS, POLICIES
    from loom.sim.engine import Simulation
    from loom.workload.job import JobSpec

    topo = _topo(8)
    faults = rate_failures(topo, 0.0, 20 * DAY, 0.2, seed=3)
    assert len(faults) > 0
    specs = [JobSpec(job_id=f"j{i}", submit_time=i * 3600.0, gpus=8, duration=DAY) for i in range(20)]
    sim = Simulation(topo, specs, POLICIES.get("fcfs")(), PLACERS.get("best-fit")(), failures=faults.failures)
    result = sim.run()
    assert len(result.jobs) == 20
