"""The run's outputs built column-wise (fast paths of `loom simulate`) against plain per-job and
per-decision loops: `JobTable` and the metrics, sanity checks and job records read from it, the
decision log, the trace cache read by polars, `Scheduler.add_all` and the registries' lazy lookup.
Each reference below is the straightforward loop the fast path replaced; the two must agree
exactly (same floats, same dtypes, same bytes)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import polars as pl
import pyarrow as pa
import pytest

from loom.core.decisions import Release, Reserve, Resize, Start
from loom.core.jobs import JobState
from loom.core.plan import ParallelPlan
from loom.core.protocols import PLACERS, POLICIES
from loom.hardware.state import Allocation
from loom.hardware.topology import NodeDef, Tier, Topology
from loom.report.columns import JobTable
from loom.report.decision_log import decision_frame
from loom.report.energy import energy, gpu_power
from loom.report.metrics import job_records, summary
from loom.report.sanity import SanityLimits, sanity_warnings
from loom.sim.engine import Simulation
from loom.workload.faults import NodeFailure
from loom.workload.job import JobClass, JobSpec

DAY = 86_400.0


def _topology() -> Topology:
    """Two GPU types on two leaves: spans, GPU types and energy differ between jobs."""
    nodes = [NodeDef(f"a{i}", ("c", "l0"), "A100-80GB", 8) for i in range(3)]
    nodes += [NodeDef(f"v{i}", ("c", "l1"), "V100", 4) for i in range(3)]
    return Topology.build("mixed", (Tier("core"), Tier("leaf")), nodes)


def _run():
    """Finished, preempted, failed-over, rejected (too large, no duration) and unfinished jobs."""
    specs = [JobSpec(f"j{i}", 600.0 * i, (1, 2, 4, 8, 16)[i % 5], 3_000.0 + 700.0 * i,
                     gpu_type=("A100-80GB", "V100", None)[i % 3], priority=i % 3,
                     job_class=(JobClass.PRETRAIN, JobClass.SFT, JobClass.EVAL)[i % 3],
                     vc=("a", None)[i % 2]) for i in range(40)]
    specs += [JobSpec("huge", 100.0, 64, 60.0), JobSpec("nodur", 200.0, 1, None),
              JobSpec("long", 50.0, 4, 400 * DAY, gpu_type="V100")]
    failures = [NodeFailure("a1", 5_000.0, 3_000.0), NodeFailure("v2", 9_000.0)]
    sim = Simulation(_topology(), specs, POLICIES.get("priority")(), PLACERS.get("best-fit")(), failures=failures)
    return sim.run()


@pytest.fixture(scope="module")
def result():
    res = _run()
    states = {j.state for j in res.jobs}
    assert {JobState.FINISHED, JobState.REJECTED} <= states  # the run covers what the references branch on
    assert any(j.preemptions for j in res.jobs) or any(j.failures for j in res.jobs)
    return res


# ------------------------------------------------------------------ references: plain loops
def _ref_job_records(result) -> pl.DataFrame:
    topo = result.topology
    tiers = [t.name for t in topo.tiers]
    rows: dict[str, list] = {k: [] for k in (
        "job_id", "state", "submit", "start", "end", "queue_s", "jct_s", "run_s", "gpus", "gpu_type", "nodes",
        "preemptions", "migrations", "resizes", "failures", "gpu_seconds", "setup_s", "job_class", "vc", "reason")}
    spans = []
    for job in result.jobs:
        spec, alloc = job.spec, job.allocation
        start, end = job.first_start, job.end_time
        for key, value in (
                ("job_id", spec.job_id), ("state", job.state.name.lower()), ("submit", spec.submit_time),
                ("start", start), ("end", end), ("queue_s", None if start is None else start - spec.submit_time),
                ("jct_s", None if end is None else end - spec.submit_time), ("run_s", spec.duration),
                ("gpus", spec.gpus),
                ("gpu_type", None if alloc is None else topo.gpu_types[topo.node_type[alloc.nodes[0]]]),
                ("nodes", 0 if alloc is None else len(alloc.nodes)), ("preemptions", job.preemptions),
                ("migrations", job.migrations), ("resizes", job.resizes), ("failures", job.failures),
                ("gpu_seconds", job.gpu_seconds), ("setup_s", job.setup_s), ("job_class", spec.job_class.value),
                ("vc", spec.vc), ("reason", job.reason or None)):
            rows[key].append(value)
        spans.append((0,) * len(tiers) if alloc is None else topo.switches_spanned(alloc.nodes))
    frame = pl.DataFrame(rows, schema_overrides={"start": pl.Float64, "end": pl.Float64, "queue_s": pl.Float64,
                                                 "jct_s": pl.Float64, "run_s": pl.Float64})
    return frame.with_columns(**{f"{name}_spanned": pl.Series([s[i] for s in spans], dtype=pl.Int32)
                                 for i, name in enumerate(tiers)})


def _ref_energy_busy_j(result) -> float:
    _, board = gpu_power()
    topo = result.topology
    default = topo.largest_gpu_type()
    busy = 0.0
    for job in result.jobs:
        if not job.gpu_seconds:
            continue
        kind = job.spec.gpu_type
        if job.allocation is not None:
            kind = topo.gpu_types[int(topo.node_type[job.allocation.nodes[0]])]
        busy += job.gpu_seconds * board.get(kind or default, board.get(default, 400.0))
    return busy


def _ref_decision_frame(decisions, topology) -> pl.DataFrame:
    names = topology.node_names
    cols: dict[str, list] = {"time": [], "decision": [], "job": [], "gpus": [], "plan": [], "reason": []}
    nodes_col = []
    for when, d in decisions:
        alloc, nodes = getattr(d, "allocation", None), getattr(d, "nodes", None)
        cols["time"].append(when)
        cols["decision"].append(type(d).__name__.lower())
        cols["job"].append(getattr(d, "job_id", None) or getattr(d, "for_job", None))
        cols["gpus"].append(alloc.total if alloc is not None else None)
        if alloc is not None:
            nodes_col.append([f"{names[n]}:{g}" for n, g in zip(alloc.nodes, alloc.gpus)])
        else:
            nodes_col.append(None if nodes is None else [names[n] for n in nodes])
        plan = getattr(d, "plan", None)
        cols["plan"].append(None if plan is None else f"{plan.dp}x{plan.tp}x{plan.pp}")
        cols["reason"].append(d.reason)
    frame = pl.DataFrame(cols, schema={"time": pl.Float64, "decision": pl.Utf8, "job": pl.Utf8, "gpus": pl.Int64,
                                       "plan": pl.Utf8, "reason": pl.Utf8})
    nodes = pl.Series("nodes", pl.from_arrow(pa.array(nodes_col, pa.list_(pa.string()))), dtype=pl.List(pl.Utf8))
    return frame.insert_column(4, nodes)


# ------------------------------------------------------------------ the fast paths agree
def test_job_records_equal_a_per_job_loop(result) -> None:
    fast, ref = job_records(result), _ref_job_records(result)
    assert fast.schema == ref.schema
    assert fast.equals(ref)
    assert job_records(result, JobTable(result)).equals(ref)


def test_summary_counts_and_statistics_equal_per_job_loops(result) -> None:
    stats = summary(result)
    jobs = result.jobs
    finished = [j for j in jobs if j.state is JobState.FINISHED]
    jct = np.array([j.end_time - j.spec.submit_time for j in finished], dtype=float)
    queue = np.array([j.first_start - j.spec.submit_time for j in jobs if j.first_start is not None], dtype=float)
    ended = (JobState.FINISHED, JobState.FAILED, JobState.REJECTED, JobState.CANCELLED)
    assert stats["finished"] == len(finished)
    assert stats["failed"] == sum(1 for j in jobs if j.state is JobState.FAILED)
    assert stats["unfinished"] == sum(1 for j in jobs if j.state not in ended)
    assert stats["avg_jct_s"] == float(np.mean(jct)) and stats["p99_jct_s"] == float(np.percentile(jct, 99))
    assert stats["avg_queue_s"] == float(np.mean(queue)) and stats["p50_queue_s"] == float(np.median(queue))
    assert stats["preemptions"] == sum(j.preemptions for j in jobs)
    assert stats["failure_evictions"] == sum(j.failures for j in jobs)
    assert summary(result, JobTable(result)) | {"sim_wall_s": 0} == stats | {"sim_wall_s": 0}


def test_energy_is_summed_in_job_order_like_a_loop(result) -> None:
    # the same float, not merely a close one: summary.json must not change by a last bit
    assert energy(result)["energy_busy_kwh"] == _ref_energy_busy_j(result) / 3.6e6


def test_sanity_checks_name_the_same_jobs_as_per_job_loops(result) -> None:
    limits = SanityLimits(duration_over_span=1.0, single_job_queue_share=0.0, min_total_queue_s=0.0)
    found = {w.code: w.message for w in sanity_warnings(result, summary(result), limits)}
    started = [j for j in result.jobs if j.first_start is not None]
    waits = [j.first_start - j.spec.submit_time for j in started]
    hog = started[int(np.argmax(waits))]
    assert f"job {hog.job_id} " in found["queue-one-job"]
    submits = [j.spec.submit_time for j in result.jobs]
    span = max(submits) - min(submits)

    def run_time(j) -> float:
        if j.end_time is not None and j.first_start is not None:
            return j.end_time - j.first_start
        return j.spec.duration or 0.0

    long = sorted(((run_time(j), j) for j in result.jobs if j.state is not JobState.REJECTED
                   and run_time(j) > span), key=lambda dj: -dj[0])
    assert found["job-longer-than-trace"].startswith(f"job {long[0][1].job_id} runs {long[0][0] / DAY:,.1f} days")
    assert f"({len(long) - 1} more like it)" in found["job-longer-than-trace"]


def test_decision_log_equals_one_list_per_decision() -> None:
    topo = _topology()
    plan = ParallelPlan(dp=2, tp=2, pp=1)
    decisions = [
        (0.0, Start("a", Allocation((0,), (8,)), "one node")),
        (1.0, Start("b", Allocation((3, 4, 0), (4, 4, 3)), "three nodes", plan)),
        (2.0, Reserve(7, (1, 2), 50.0, "c", "hold two nodes")),
        (2.5, Reserve(8, (), 60.0, "d", "hold nothing")),
        (3.0, Release(7, "done")),
        (4.0, Resize("b", Allocation((5,), (9,)), "more GPUs than the node list's widest label", plan)),
    ]
    fast, ref = decision_frame(decisions, topo), _ref_decision_frame(decisions, topo)
    assert fast.schema == ref.schema
    assert fast.equals(ref)
    assert fast.write_ndjson() == ref.write_ndjson()
    assert decision_frame([], topo).schema == ref.schema


def test_the_trace_cache_reads_back_the_parsed_specs(tmp_path, monkeypatch) -> None:
    from loom.workload import cache
    from loom.workload.common import TraceJobs

    specs = TraceJobs([JobSpec(f"j{i}", float(i), 1 + i % 3, 10.0 * i, user=("u1", "u2")[i % 2], vc="same",
                               job_class=JobClass.SFT, gpu_types=("A", "B") if i % 2 else None,
                               priority=i % 4) for i in range(50)], {"cpu-only": 3})
    target = tmp_path / "t.parquet"
    cache.write_cache(target, specs)
    back = cache.read_cache(target)
    assert list(back) == list(specs) and back.skipped == {"cpu-only": 3}
    assert len({id(s.user) for s in back}) == 2  # repeated strings share one object
    empty = tmp_path / "e.parquet"
    cache.write_cache(empty, TraceJobs([], {}))
    assert list(cache.read_cache(empty)) == []


def test_add_all_makes_the_jobs_add_makes() -> None:
    from loom.core.scheduler import Scheduler
    from loom.errors import LoomInputError
    from loom.sim.backend import SimBackend
    from loom.sim.events import EventQueue
    from loom.sim.speed import TraceDurationSpeed

    def core() -> Scheduler:
        backend = SimBackend(_topology(), TraceDurationSpeed(), EventQueue(), None, None, 600.0, 3600.0)
        return Scheduler(backend, POLICIES.get("fcfs")(), PLACERS.get("best-fit")())

    specs = [JobSpec(f"j{i}", float(i), 1, 5.0, announce_time=0.0 if i % 2 else None) for i in range(6)]
    one, bulk = core(), core()
    singly = [one.add(s) for s in specs]
    together = bulk.add_all(specs)
    for a, b in zip(singly, together, strict=True):
        assert {k: getattr(a, k) for k in a.__slots__} == {k: getattr(b, k) for k in b.__slots__}
    assert one.record.ids == bulk.record.ids and list(one.jobs) == list(bulk.jobs)
    with pytest.raises(LoomInputError, match="j1"):
        core().add_all([*specs, JobSpec("j1", 9.0, 1, 1.0)])


def test_registries_find_a_builtin_without_importing_the_others() -> None:
    """`get` of a built-in imports its own module alone, and finds what a full load finds."""
    head = """
import json, sys
from loom.core.protocols import PLACERS, POLICIES, SPEED_MODELS
from loom.workload.loaders import LOADERS
regs = (POLICIES, PLACERS, SPEED_MODELS, LOADERS)
"""
    names = json.loads(subprocess.run([sys.executable, "-c", head + "print(json.dumps([r.names() for r in regs]))"],
                                      capture_output=True, text=True, check=True).stdout)
    check = head + f"""
names = {names!r}
before = set(sys.modules)
fcfs = [POLICIES.get("fcfs"), PLACERS.get("best-fit"), SPEED_MODELS.get("trace"), LOADERS.get("rfold")]
new = sorted(m for m in set(sys.modules) - before if m.startswith("loom."))
lazy = [{{n: r.get(n) for n in ns}} for r, ns in zip(regs, names)]
still_lazy = [r._loaded for r in regs]
same = all(r.names() == ns and all(r.get(n) is got[n] for n in ns) for r, ns, got in zip(regs, names, lazy))
print(json.dumps({{"new": new, "loaded": still_lazy, "same": same}}))
"""
    info = json.loads(subprocess.run([sys.executable, "-c", check], capture_output=True, text=True,
                                     check=True).stdout.strip().splitlines()[-1])
    assert info["same"] and info["loaded"] == [False] * 4  # every built-in name found without a full load
    assert not any(m.startswith(("loom.policies.crius", "loom.policies.gavel", "loom.sim.estimator_speed",
                                 "loom.placement.arnold")) for m in info["new"]), info["new"]


def test_a_run_records_its_phases_and_leaves_the_collector_as_it_was(tmp_path) -> None:
    """`manifest.json` → `timing` names every phase (what bench/sim_philly.py --main-command reads;
    the values are wall times, so only their presence and sign are checked), and `run` leaves the
    garbage collector on and nothing frozen."""
    import gc

    from loom.config import load_config
    from loom.run import run

    trace = tmp_path / "jobs.csv"
    trace.write_text("job_id,submit_time,gpus,duration\n" + "".join(f"j{i},{i * 10},{1 + i % 4},{100 + i}\n"
                                                                       for i in range(30)))
    cfg = load_config(None, {"trace": f"csv:{trace}", "cluster": "arnold-i", "outputs.dir": str(tmp_path / "run"),
                             "outputs.report": False})
    frozen = gc.get_freeze_count()
    outputs = run(cfg)
    assert gc.isenabled() and gc.get_freeze_count() == frozen
    timing = json.loads((outputs.out_dir / "manifest.json").read_text())["timing"]
    assert set(timing) == {"load_s", "sim_s", "records_s", "report_s", "total_s"}
    assert all(isinstance(v, float) and v >= 0 for v in timing.values()) and timing["report_s"] == 0.0
    assert outputs.summary["finished"] == 30 and len(outputs.result.jobs) == 30  # the result outlives `release`
