"""The numbers a run reports, each checked against a value worked out by hand.

Every key of `summary.json` (and the SLA attainment of `loom.report.sla`) is checked on a
small run — a handful of jobs on a one- to five-node cluster, through `loom simulate`, the
`loom.run.run` API or `Simulation` + `loom.report.metrics.summary` (what `run` writes) —
against a value derived in the test, with the arithmetic in the comments. A changed definition
(a mean computed as a median, p99 as p90, failed GPU time left in the denominator, idle GPUs
drawing nothing...) changes a number and fails here.

Conventions of the derivations: percentiles interpolate linearly between order statistics (the
numpy default: pXX of n sorted values sits at rank XX/100 × (n − 1)); powers come from
`loom/hardware/data/gpu_power.yaml` (H800 700 W busy, every idle GPU 60 W); 1 kWh = 3.6e6 J.
Runs have no interruption prices unless said so, so a stopped job keeps its progress.
"""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest
from typer.testing import CliRunner

from loom.cli.main import app
from loom.config import load_config
from loom.core.decisions import Preempt, Resize, Resume, Start, Timer
from loom.core.protocols import PLACERS, POLICIES
from loom.core.recovery import RecoveryConfig
from loom.hardware.clos import clos
from loom.hardware.state import Allocation
from loom.perf.interruptions import InterruptionCosts, InterruptionModel
from loom.report.metrics import summary
from loom.report.sla import sla_attainment
from loom.run import run
from loom.sim.engine import Simulation
from loom.workload.faults import NodeFailure
from loom.workload.job import JobSpec
from loom.workload.job_failures import FailurePlan
from loom.workload.tiers import TierRule
from simharness import FakeClock

BUSY_W, IDLE_W = 700.0, 60.0  # H800 board power; idle draw of any GPU
J_PER_KWH = 3.6e6
HOUR = 3600.0

# keys every run writes (summary(), then what `loom.run` adds around it)
BASE_KEYS = {
    "jobs", "finished", "rejected", "failed", "unfinished",
    "avg_jct_s", "p50_jct_s", "p99_jct_s", "avg_queue_s", "p50_queue_s", "p99_queue_s",
    "makespan_s", "gpu_utilization", "busy_gpu_seconds", "preemptions", "failure_evictions",
    "avg_setup_s", "launch_failures", "decisions", "events", "rounds", "sim_wall_s", "events_per_s",
    "decision_ms_median", "decision_ms_p99", "decision_ms_max",
    "energy_busy_kwh", "energy_idle_kwh", "energy_kwh",
}
RUN_KEYS = {"trace_jobs", "dropped", "rejected_reasons", "warnings", "setup_wall_s"}
# with interruptions priced; with at least one recovery
PRICED_KEYS = {"goodput_gpu_hours", "goodput_fraction", "gpu_hours_paused", "gpu_hours_checkpointing",
               "gpu_hours_lost_to_failures"}
RECOVERY_KEYS = {"recoveries", "recoveries_handed_to_policy", "recovery_s_median", "recovery_s_max",
                 "gpu_hours_held_recovering", "restarts_per_failed_job", "spares_used", "minipods_before_mean",
                 "minipods_after_mean", "recoveries_spread_grew_pct", "recoveries_spread_grew"}

ONE_NODE = "name: one\ntiers: [{name: leaf}]\nnodes:\n  - {name: n0, path: [l0], gpu_type: H800, gpus: 8}\n"
TWO_NODES = ("name: two\ntiers: [{name: leaf}]\nnodes:\n  - {name: n0, path: [l0], gpu_type: H800, gpus: 8}\n"
             "  - {name: n1, path: [l0], gpu_type: H800, gpus: 8}\n")
# two minipods: mp0 = leaf0 {n0, n1} + leaf1 {n2}, mp1 = leaf2 {n3, n4}; 5 × 8 H800
FIVE_NODES = """name: five
tiers: [{name: core}, {name: minipod}, {name: leaf}]
minipod_tier: minipod
nodes:
  - {name: n0, path: [c, mp0, leaf0], gpu_type: H800, gpus: 8}
  - {name: n1, path: [c, mp0, leaf0], gpu_type: H800, gpus: 8}
  - {name: n2, path: [c, mp0, leaf1], gpu_type: H800, gpus: 8}
  - {name: n3, path: [c, mp1, leaf2], gpu_type: H800, gpus: 8}
  - {name: n4, path: [c, mp1, leaf2], gpu_type: H800, gpus: 8}
"""


def files(tmp_path: Path, cluster: str, trace: str) -> tuple[str, str]:
    """`--cluster` and `--trace` values for a cluster spec and a csv trace written to tmp_path."""
    (tmp_path / "cluster.yaml").write_text(cluster)
    (tmp_path / "trace.csv").write_text(trace)
    return f"yaml:{tmp_path / 'cluster.yaml'}", f"csv:{tmp_path / 'trace.csv'}"


def simulate_config(tmp_path: Path, cluster: str, trace: str, **overrides) -> dict:
    """`loom.run.run` on the files; returns summary.json as written."""
    cluster_spec, trace_spec = files(tmp_path, cluster, trace)
    config = load_config(None, {"cluster": cluster_spec, "trace": trace_spec, "placer": "first-fit",
                                "outputs.dir": str(tmp_path / "run"), "outputs.report": False, **overrides})
    run(config)
    return json.loads((tmp_path / "run" / "summary.json").read_text())


def check(summary_: dict, expected: dict) -> None:
    """Every expected key, numbers to a relative 1e-9."""
    for key, value in expected.items():
        assert key in summary_, f"{key} missing from the summary"
        if isinstance(value, float):
            assert summary_[key] == pytest.approx(value, rel=1e-9, abs=1e-12), key
        else:
            assert summary_[key] == value, key


# ----------------------------------------------------------------------------- a plain FCFS run
PLAIN = """job_id,submit_time,gpus,duration
a,1000,8,100
b,1010,4,50
c,1020,4,200
d,1020,2,10
e,1200,16,30
"""


def test_summary_json_of_a_plain_fcfs_run(tmp_path, monkeypatch):
    """`loom simulate`, FCFS, one node of 8 H800s. The k-th scheduling round "takes" k² ms on a
    fake clock, so the wall-time figures are known too.

    Timeline: a (8 GPUs) runs 1000-1100; b (4) and c (4) wait for it and start at 1100, b ends at
    1150, c at 1300; d (2, arriving with c) waits behind b and c (FCFS) and runs 1150-1160; e asks
    for 16 GPUs of a cluster of 8 and is rejected when it arrives at 1200.
    """
    import loom.run
    import loom.sim.engine

    clock = FakeClock()
    monkeypatch.setattr(loom.sim.engine, "time", clock)
    monkeypatch.setattr(loom.run, "time", clock)
    fcfs = POLICIES.get("fcfs")
    schedule, rounds = fcfs.schedule, []

    def timed(self, ctx):
        rounds.append(ctx.now)
        clock.now += len(rounds) ** 2 / 1000  # round k: k² ms
        return schedule(self, ctx)

    monkeypatch.setattr(fcfs, "schedule", timed)
    cluster, trace = files(tmp_path, ONE_NODE, PLAIN)
    out = tmp_path / "run"
    res = CliRunner().invoke(app, ["simulate", "--trace", trace, "--cluster", cluster, "--policy", "fcfs",
                                   "--placer", "first-fit", "--no-report", "--out", str(out), "-q"])
    assert res.exit_code == 0, res.output
    s = json.loads((out / "summary.json").read_text())
    assert set(s) == BASE_KEYS | RUN_KEYS, "a key without a test here (or a key gone)"
    # one round at each instant something happened: 5 arrivals (1000, 1010, 1020 twice, 1200) and
    # 4 finishes (1100, 1150, 1160, 1300)
    assert rounds == [1000.0, 1010.0, 1020.0, 1100.0, 1150.0, 1160.0, 1200.0, 1300.0]
    check(s, {
        "jobs": 5, "finished": 4, "rejected": 1, "failed": 0, "unfinished": 0,
        # JCT (end - submit) of the finished jobs: a 1100-1000 = 100, b 1150-1010 = 140,
        # c 1300-1020 = 280, d 1160-1020 = 140; sorted 100 140 140 280
        "avg_jct_s": (100 + 140 + 280 + 140) / 4,  # 165
        "p50_jct_s": (140 + 140) / 2,  # 140
        "p99_jct_s": 140 + 0.97 * (280 - 140),  # rank 0.99 × 3 = 2.97: 275.8 (p90 would be 238)
        # queueing (first start - submit) of the started jobs: a 0, b 90, c 80, d 130; sorted 0 80 90 130
        "avg_queue_s": (0 + 90 + 80 + 130) / 4,  # 75
        "p50_queue_s": (80 + 90) / 2,  # 85
        "p99_queue_s": 90 + 0.97 * (130 - 90),  # 128.8
        # first arrival 1000 to last finish 1300
        "makespan_s": 300.0,
        # GPU-seconds held: a 8 × 100 + b 4 × 50 + c 4 × 200 + d 2 × 10
        "busy_gpu_seconds": 1820.0,
        "gpu_utilization": 1820 / (8 * 300),  # 0.7583
        "energy_busy_kwh": 1820 * BUSY_W / J_PER_KWH,
        "energy_idle_kwh": (8 * 300 - 1820) * IDLE_W / J_PER_KWH,  # 580 idle GPU-seconds
        "energy_kwh": (1820 * BUSY_W + 580 * IDLE_W) / J_PER_KWH,
        "preemptions": 0, "failure_evictions": 0, "avg_setup_s": 0.0, "launch_failures": 0,
        "decisions": 4,  # Start a, b, c, d (a rejection is not a decision)
        "events": 9, "rounds": 8,
        # rounds took 1, 4, 9, ..., 64 ms: 204 ms in the policy, and nothing else moves the clock
        "decision_ms_median": (16 + 25) / 2,  # 20.5 (the mean would be 25.5)
        "decision_ms_p99": 49 + 0.93 * (64 - 49),  # rank 0.99 × 7 = 6.93: 62.95
        "decision_ms_max": 64.0,
        "sim_wall_s": 0.204,
        "events_per_s": 9 / 0.204,  # 44.1 (events, not rounds)
        "setup_wall_s": 0.0,  # building the simulation takes no (fake) time
        "trace_jobs": 5, "dropped": {"count": 0, "reasons": {}},
        "rejected_reasons": {"larger than the cluster": 1},
        # arrivals span 200 s, no job runs > 5 × that; nobody queued an hour; the run is < 1 day
        "warnings": [],
    })
    jobs = pl.read_parquet(out / "jobs.parquet").sort("job_id")
    assert jobs["queue_s"].to_list() == [0.0, 90.0, 80.0, 130.0, None]
    assert jobs["jct_s"].to_list() == [100.0, 140.0, 280.0, 140.0, None]
    assert jobs["gpu_seconds"].to_list() == [800.0, 200.0, 800.0, 20.0, 0.0]


# ---------------------------------------------------------------------- failures and recovery
FAILING = """job_id,submit_time,gpus,duration
A,0,16,1000
B,0,8,1000
C,0,8,1000
"""


def test_failure_recovery_and_interruption_figures(tmp_path):
    """Five nodes, two minipods; node failures with topology-preserving recovery (60 s pipeline)
    and priced interruptions (sync checkpoints every 300 s of progress), through `loom.run`.

    The cost model prices each primitive (tested in test_interruptions.py); its prices are the
    inputs here: s16 / s8 one checkpoint stall and L16 / L8 one restart's load (download,
    restore, rendezvous) of a 16-GPU job on two nodes / an 8-GPU job on one node. A segment of
    P seconds of progress stalls ceil(P / 300) - 1 times (none at the very end); a failure loses
    the progress since the last checkpoint.

    First-fit at t=0: A on n0+n1 (mp0), B on n2 (mp0), C on n3 (mp1); n4 free.

    * 400: n1 fails (back at 700). A (one checkpoint at 300, stall to 300+s16) loses 100-s16 s;
      its survivor n0 is held idle 60 s. 460: replacement for n1 in n1's leaf/minipod? n0 is A's,
      n2 B's: n4 in mp1, so A spreads over 2 minipods. A resumes (L16, then 700 s with 2 stalls):
      A ends at 460 + L16 + 700 + 2 s16.
    * 500: n3 fails (back at 750). C (stall at 300) loses 200-s8. 560: no free node (n1 down): C is
      handed back to the policy. 700: n1 is back, FCFS resumes C there: L8 + 700 + 2 s8, C ends at
      1400 + L8 + 2 s8.
    * 800: n2 fails for good. B (stalls at 300 and 600+s8) loses 200-2 s8. 860: n3 (back since
      750, free) replaces it, one minipod before and after. B resumes: pause L8, 400 s left.
    * 1000: n3 fails for good. B lost 140-L8 s (progress since its pause ended, no checkpoint
      yet). 1060: no free node: handed back. When A ends, FCFS resumes B on n0: L8 + 400 + s8,
      B ends at A_end + L8 + 400 + s8 — the last finish.
    """
    overrides = {"policy": "fcfs",
                 "failures": [{"node": "n1", "at": 400.0, "repair_after": 300.0},
                              {"node": "n3", "at": 500.0, "repair_after": 250.0},
                              {"node": "n2", "at": 800.0}, {"node": "n3", "at": 1000.0}],
                 "interruptions": {"checkpoint_interval_s": 300.0, "checkpoint_mode": "sync"},
                 "recovery": {"detection_s": 10.0, "diagnosis_s": 20.0, "localisation_round_s": 15.0,
                              "localisation_rounds": 2}}
    s = simulate_config(tmp_path, FIVE_NODES, FAILING, **overrides)
    model = InterruptionModel(InterruptionCosts(checkpoint_interval_s=300.0, checkpoint_mode="sync"))
    big, small = JobSpec("A", 0.0, 16, 1000.0), JobSpec("B", 0.0, 8, 1000.0)
    s16, l16 = model.checkpoint_stall_s(model.shape(big, 16, 2)), model.load(model.shape(big, 16, 2)).total_s
    s8, l8 = model.checkpoint_stall_s(model.shape(small, 8, 1)), model.load(model.shape(small, 8, 1)).total_s
    # the timeline above assumes: a stall shorter than 100 s, a restart shorter than 140 s
    assert 0 < s16 < 100 and 0 < s8 < 100 and 0 < l8 < 140 and l16 > 0

    a_end = 460 + l16 + 700 + 2 * s16
    c_end = 1400 + l8 + 2 * s8
    b_end = a_end + l8 + 400 + s8
    assert a_end < c_end < b_end
    assert set(s) == BASE_KEYS | RUN_KEYS | PRICED_KEYS | RECOVERY_KEYS
    # GPU time held (a job in recovery holds nothing itself: its survivors are counted apart)
    held = {"A": 16 * 400 + 16 * (a_end - 460),
            "B": 8 * 800 + 8 * (1000 - 860) + 8 * (b_end - a_end),
            "C": 8 * 500 + 8 * (c_end - 700)}
    busy = sum(held.values())
    # where it went: the work (every job finished) and the priced overheads
    work = 16 * 1000 + 8 * 1000 + 8 * 1000
    paused = 16 * l16 + 8 * l8 * 3  # A's restart; B's two, C's one
    checkpointing = 16 * 3 * s16 + 8 * 3 * s8 + 8 * 3 * s8  # A 1 + 2 stalls; B 2 + 0 + 1; C 1 + 2
    lost = 16 * (100 - s16) + 8 * (200 - 2 * s8) + 8 * (140 - l8) + 8 * (200 - s8)
    assert busy == pytest.approx(work + paused + checkpointing + lost)
    # nodes down inside the run [0, b_end]: n1 300 s, n3 250 s then from 1000, n2 from 800
    failed = 8 * (300 + 250 + (b_end - 1000) + (b_end - 800))
    capacity = 40 * b_end
    # JCTs (all submitted at 0), sorted: A, C, B
    check(s, {
        "jobs": 3, "finished": 3, "rejected": 0, "failed": 0, "unfinished": 0,
        "avg_jct_s": (a_end + b_end + c_end) / 3,
        "p50_jct_s": c_end,
        "p99_jct_s": c_end + 0.98 * (b_end - c_end),  # rank 0.99 × 2 = 1.98
        "avg_queue_s": 0.0, "p50_queue_s": 0.0, "p99_queue_s": 0.0,  # all started at once
        "makespan_s": b_end,
        "busy_gpu_seconds": busy,
        "gpu_utilization": busy / (capacity - failed),  # failed GPUs are not capacity
        "energy_busy_kwh": busy * BUSY_W / J_PER_KWH,
        "energy_idle_kwh": (capacity - failed - busy) * IDLE_W / J_PER_KWH,  # failed GPUs draw nothing
        "energy_kwh": (busy * BUSY_W + (capacity - failed - busy) * IDLE_W) / J_PER_KWH,
        "preemptions": 0,
        "failure_evictions": 4,  # A once, B twice, C once
        "avg_setup_s": 0.0, "launch_failures": 0,
        "decisions": 7,  # Start A, B, C; Resume A (460), C (700), B (860), B (A_end)
        # 3 arrivals, 4 failures, 2 repairs, 4 recovery timers, 3 finishes; rounds at 0, 400, 460,
        # 500, 560, 700, 750, 800, 860, 1000, 1060 and the three finishes
        "events": 16, "rounds": 14,
        "goodput_gpu_hours": work / HOUR,
        "goodput_fraction": work / busy,
        "gpu_hours_paused": paused / HOUR,
        "gpu_hours_checkpointing": checkpointing / HOUR,
        "gpu_hours_lost_to_failures": lost / HOUR,
        "recoveries": 4,  # A@400, C@500, B@800, B@1000
        "recoveries_handed_to_policy": 2,  # C@500, B@1000
        "recovery_s_median": 60.0, "recovery_s_max": 60.0,  # detection 10 + diagnosis 20 + 2 × 15
        "gpu_hours_held_recovering": 8 * 60 / HOUR,  # A's survivor n0; B and C had none
        "restarts_per_failed_job": (1 + 2 + 1) / 3,
        "spares_used": 0,
        # over the two restarts by recovery: A 1 → 2 minipods, B 1 → 1
        "minipods_before_mean": 1.0, "minipods_after_mean": 1.5,
        "recoveries_spread_grew_pct": 50.0, "recoveries_spread_grew": 1,
        "trace_jobs": 3, "dropped": {"count": 0, "reasons": {}}, "rejected_reasons": {}, "warnings": [],
    })


def test_failed_and_unfinished_jobs():
    """`Simulation` + `summary`: a job ended by its own error, one a permanent node failure strands.

    Two nodes × 8 H800, FCFS, no recovery, no interruption prices. X (8 GPUs) hits a script error
    after 100 s of progress: FAILED at 100. Y (16) waits for X's GPUs, runs from 100; n1 fails for
    good at 120, Y goes back to the queue (behind Z) and never fits the 8 healthy GPUs again. Z
    (4, submitted at 10) waits behind Y (FCFS), starts when Y is evicted at 120 and ends at 150.
    """
    topo = clos("two", minipods=1, nodes=2, gpus_per_node=8, gpu_type="H800")
    specs = [JobSpec("X", 0.0, 8, 500.0), JobSpec("Y", 0.0, 16, 50.0), JobSpec("Z", 10.0, 4, 30.0)]
    sim = Simulation(topo, specs, POLICIES.get("fcfs")(), PLACERS.get("first-fit")(),
                     failures=[NodeFailure(topo.node_names[1], 120.0, float("inf"))],
                     job_failures={"X": [FailurePlan("X", "script", 100.0)]})
    s = summary(sim.run())
    assert set(s) == BASE_KEYS | {"gpu_hours_in_failed_jobs"}
    busy = 8 * 100 + 16 * 20 + 4 * 30  # X 0-100, Y 100-120, Z 120-150: 1240
    # the run ends at the last moment a job held GPUs (150); n1 is down 120-150
    failed = 8 * 30
    check(s, {
        "jobs": 3, "finished": 1, "rejected": 0, "failed": 1, "unfinished": 1,
        # JCT over finished jobs only: Z 150 - 10
        "avg_jct_s": 140.0, "p50_jct_s": 140.0, "p99_jct_s": 140.0,
        # queueing over every job that started, finished or not: X 0, Y 100, Z 110
        "avg_queue_s": (0 + 100 + 110) / 3,  # 70
        "p50_queue_s": 100.0,
        "p99_queue_s": 100 + 0.98 * (110 - 100),  # rank 1.98: 109.8
        "makespan_s": 150.0,
        "busy_gpu_seconds": float(busy),
        "gpu_utilization": busy / (16 * 150 - failed),  # 1240 / 2160
        "energy_busy_kwh": busy * BUSY_W / J_PER_KWH,
        "energy_idle_kwh": (16 * 150 - failed - busy) * IDLE_W / J_PER_KWH,  # 920 idle GPU-seconds
        "energy_kwh": (busy * BUSY_W + (16 * 150 - failed - busy) * IDLE_W) / J_PER_KWH,
        "preemptions": 0,
        "failure_evictions": 1,  # Y; X's error ended it, it was not evicted
        "avg_setup_s": 0.0, "launch_failures": 0,
        "decisions": 3,  # Start X, Y, Z
        # 3 arrivals, X's error, n1's failure, Z's finish; rounds at 0, 10, 100, 120, 150
        "events": 6, "rounds": 5,
        "gpu_hours_in_failed_jobs": 8 * 100 / HOUR,  # the GPU time X held
    })


def test_recovery_on_a_hot_spare(small_clos):
    """`Simulation` + `summary`: two minipods × 4 nodes × 8 A100s (400 W busy), one hot spare per
    minipod (nodes 3 and 7), the default recovery pipeline (60 + 120 + 2 × 60 = 300 s), no prices.

    big (24 GPUs, 10,000 s) runs on nodes 0-2 of minipod 0; other (8, 100 s) on node 4. Node 1
    fails at 1000 for 100 s: big's survivors (nodes 0 and 2, 16 GPUs) are held 300 s, then the
    spare of its own minipod (node 3) replaces node 1 and big resumes at 1300 with 9000 s left.
    """
    specs = [JobSpec("big", 0.0, 24, 10_000.0), JobSpec("other", 0.0, 8, 100.0)]
    sim = Simulation(small_clos, specs, POLICIES.get("fcfs")(), PLACERS.get("first-fit")(),
                     failures=[NodeFailure(small_clos.node_names[1], 1000.0, 100.0)],
                     recovery=RecoveryConfig(spares_per_minipod=1))
    s = summary(sim.run())
    assert set(s) == BASE_KEYS | RECOVERY_KEYS
    busy = 24 * 1000 + 24 * 9000 + 8 * 100  # big 0-1000 and 1300-10300, other 0-100
    capacity, failed = 64 * 10_300, 8 * 100  # the run ends at 10,300; node 1 down 1000-1100
    check(s, {
        "makespan_s": 10_300.0, "busy_gpu_seconds": float(busy),
        "gpu_utilization": busy / (capacity - failed),
        "energy_busy_kwh": busy * 400.0 / J_PER_KWH,  # A100-80GB board power
        "energy_idle_kwh": (capacity - failed - busy) * IDLE_W / J_PER_KWH,
        "failure_evictions": 1,
        "recoveries": 1, "recoveries_handed_to_policy": 0,
        "recovery_s_median": 300.0, "recovery_s_max": 300.0,
        "gpu_hours_held_recovering": 16 * 300 / HOUR,
        "restarts_per_failed_job": 1.0,  # over the jobs a failure hit (big), not all jobs
        "spares_used": 1,
        "minipods_before_mean": 1.0, "minipods_after_mean": 1.0,  # the spare is in big's minipod
        "recoveries_spread_grew_pct": 0.0, "recoveries_spread_grew": 0,
    })


# --------------------------------------------------------------------------------- launches
def test_launch_figures(tmp_path):
    """Launches take 30 s (10 s for eval jobs); n1 fails 5 s into Q's launch and is back at 25.

    P (pretrain, 8) launches on n0 0-30 and runs 30-130. Q (eval, 8) launches on n1 at 0; the
    failure at 5 calls the launch off (a launch failure; its first start did not happen) and
    puts Q back at the head of the queue; at 25 it launches again on n1, runs 35-135. R asks for
    32 GPUs of 16: rejected.
    """
    trace = "job_id,submit_time,gpus,duration,job_class\nP,0,8,100,pretrain\nQ,0,8,100,eval\nR,0,32,10,eval\n"
    s = simulate_config(tmp_path, TWO_NODES, trace, launch={"default_s": 30.0, "latency_s": {"eval": 10.0}},
                        failures=[{"node": "n1", "at": 5.0, "repair_after": 20.0}])
    assert set(s) == BASE_KEYS | RUN_KEYS
    busy = 8 * 130 + 8 * 5 + 8 * 110  # GPUs are held while launching: P 0-130, Q 0-5 and 25-135
    failed = 8 * 20  # n1 down 5-25
    check(s, {
        "jobs": 3, "finished": 2, "rejected": 1, "failed": 0, "unfinished": 0,
        "avg_jct_s": (130 + 135) / 2, "p50_jct_s": 132.5, "p99_jct_s": 130 + 0.99 * 5,
        # Q's first start is the launch that came up (25), not the one called off
        "avg_queue_s": (0 + 25) / 2, "p50_queue_s": 12.5, "p99_queue_s": 0.99 * 25,
        "makespan_s": 135.0,
        "busy_gpu_seconds": float(busy),  # 1960
        "gpu_utilization": busy / (16 * 135 - failed),  # 1960 / 2000
        "energy_busy_kwh": busy * BUSY_W / J_PER_KWH,
        "energy_idle_kwh": (16 * 135 - failed - busy) * IDLE_W / J_PER_KWH,  # 40 idle GPU-seconds
        "energy_kwh": (busy * BUSY_W + (16 * 135 - failed - busy) * IDLE_W) / J_PER_KWH,
        # set-up over the jobs that started (not R): P 30, Q 5 (called off) + 10
        "avg_setup_s": (30 + 15) / 2,
        "launch_failures": 1,
        "preemptions": 0, "failure_evictions": 0,
        "decisions": 3,  # Start P, Q, Q
        # 3 arrivals, the failure and the repair, 2 launches that came up (Q's first was called
        # off), 2 finishes; rounds at 0, 5, 25, 30, 35, 130, 135
        "events": 9, "rounds": 7,
        "trace_jobs": 3, "dropped": {"count": 0, "reasons": {}},
        "rejected_reasons": {"larger than the cluster": 1}, "warnings": [],
    })


# ------------------------------------------------------------------------------- preemption
def test_preemptions_are_counted(tmp_path):
    """Priority policy, two nodes: L (priority 0, 16 GPUs, 100 s) runs from 0; H (priority 2,
    8 GPUs, 20 s) arrives at 10 and preempts it; L resumes at 30 with 90 s left, ends at 120."""
    trace = "job_id,submit_time,gpus,duration,priority\nL,0,16,100,0\nH,10,8,20,2\n"
    s = simulate_config(tmp_path, TWO_NODES, trace, policy="priority")
    busy = 16 * 10 + 8 * 20 + 16 * 90  # L 0-10, H 10-30, L 30-120
    check(s, {
        "preemptions": 1,
        "avg_jct_s": (120 + 20) / 2, "avg_queue_s": 0.0,  # L started at 0, H at once at 10
        "makespan_s": 120.0, "busy_gpu_seconds": float(busy), "gpu_utilization": busy / (16 * 120),
        "decisions": 4,  # Start L, Preempt L, Start H, Resume L
    })


# -------------------------------------------------------------------------- policy counters
def test_policy_counters_are_passed_through(tmp_path):
    """The reservation policy's own counters land in summary.json as `reserve_<name>`.

    Best-effort reservation on two nodes: llm (16 GPUs, announced at 0, arrives at 1000)
    reserves both. long (8 GPUs, 5000 s, not preemptible) arrives at 10 and runs inside the
    reserved region (an inside start). At 1000 it holds a reserved node (one violation) and no
    free node can stand in: it is preempted by hand, llm starts on time (delay 0) and long
    resumes when llm ends at 1100.
    """
    trace = "job_id,submit_time,gpus,duration,announce_time\nllm,1000,16,100,0\nlong,10,8,5000,\n"
    s = simulate_config(tmp_path, TWO_NODES, trace,
                        policy={"name": "reserve", "params": {"mode": "best-effort",
                                                              "reservation_placer": "best-fit"}})
    policy_keys = {"reserve_violations", "reserve_preempted_at_arrival", "reserve_start_delay_s",
                   "reserve_inside_starts"}
    assert set(s) == BASE_KEYS | RUN_KEYS | policy_keys
    check(s, {
        "reserve_violations": 1, "reserve_preempted_at_arrival": 0, "reserve_start_delay_s": {"llm": 0.0},
        "reserve_inside_starts": 1,
        "preemptions": 1,
        # long: 10-1000, then 1100 to 1100 + (5000 - 990) = 5110
        "makespan_s": 5110.0 - 10.0,
        "busy_gpu_seconds": 8 * 990 + 16 * 100 + 8 * 4010.0,
    })


def test_quota_fairness_figures(tmp_path):
    """Quota policy on two nodes, quotas A 8 and B 8 GPUs (VCs not named: 0).

    a1 (A, 8, 100 s) and b1 (B, 8, 50 s) start at 1000. e1 (B, eval: best-effort, 4, 20 s) arrives
    at 1010, finds no free GPU and runs 1050-1070. c1 (C, 4 GPUs, guaranteed) has no quota: it
    never starts. The run spans 1000-1100.
    """
    trace = ("job_id,submit_time,gpus,duration,vc,job_class\na1,1000,8,100,A,pretrain\nb1,1000,8,50,B,pretrain\n"
             "e1,1010,4,20,B,eval\nc1,1000,4,10,C,pretrain\n")
    s = simulate_config(tmp_path, TWO_NODES, trace, policy={"name": "quota", "params": {"quotas": {"A": 8, "B": 8}}})
    assert set(s) == BASE_KEYS | RUN_KEYS | {"quota_jain_index", "quota_per_vc"}
    # used ÷ entitled (quota × 100 s): A 800 / 800 = 1; B (400 + 80) / 800 = 0.6; C no entitlement
    # Jain over A and B: (1 + 0.6)² / (2 × (1² + 0.6²)) = 2.56 / 2.72
    check(s, {"unfinished": 1, "quota_jain_index": 2.56 / 2.72})
    rows = {r["vc"]: r for r in s["quota_per_vc"]}
    assert list(rows) == ["A", "B", "C"]
    expected = {
        "A": {"quota": 8, "jobs": 1, "finished": 1, "unstarted": 0, "guaranteed_gpu_seconds": 800.0,
              "best_effort_gpu_seconds": 0.0, "best_effort_preemptions": 0, "quota_share": 0.5,
              "guaranteed_share": 800 / 1200, "entitled_gpu_seconds": 800.0, "normalized_share": 1.0,
              "avg_queue_s": 0.0, "avg_guaranteed_queue_s": 0.0},
        "B": {"quota": 8, "jobs": 2, "finished": 2, "unstarted": 0, "guaranteed_gpu_seconds": 400.0,
              "best_effort_gpu_seconds": 80.0, "best_effort_preemptions": 0, "quota_share": 0.5,
              "guaranteed_share": 400 / 1200, "entitled_gpu_seconds": 800.0, "normalized_share": 0.6,
              "avg_queue_s": (0 + 40) / 2, "avg_guaranteed_queue_s": 0.0},
        "C": {"quota": 0, "jobs": 1, "finished": 0, "unstarted": 1, "guaranteed_gpu_seconds": 0.0,
              "best_effort_gpu_seconds": 0.0, "best_effort_preemptions": 0, "quota_share": 0.0,
              "guaranteed_share": 0.0, "entitled_gpu_seconds": 0.0, "normalized_share": None,
              "avg_queue_s": None, "avg_guaranteed_queue_s": None},
    }
    for vc, fields in expected.items():
        assert set(rows[vc]) == {"vc", *fields}
        check(rows[vc], fields)


def test_load_scaling_is_recorded(tmp_path):
    """`load` other than 1 is written down with the run (the figures then describe the scaled trace)."""
    s = simulate_config(tmp_path, ONE_NODE, PLAIN, load=2.0)
    check(s, {"load_scaling": {"load": 2.0, "repeat": 1}, "trace_jobs": 5, "jobs": 5})


# ----------------------------------------------------------------------------------- SLA tiers
class Script:
    """At time t, the next decision list of `script[t]` (one per round at t)."""

    name = "script"

    def __init__(self, script: dict) -> None:
        self.script = {t: list(v) for t, v in script.items()}

    def schedule(self, ctx):
        todo = self.script.get(ctx.now)
        return todo.pop(0) if todo else []


def test_sla_attainment_by_tier():
    """Four nodes × 8 GPUs, the default tiers (premium ≥ 2: all its GPUs; standard 1: half;
    basic ≤ 0: best effort, attains while it holds ≥ 1 GPU), all jobs submitted at 0.

    * s1 (standard, 16 GPUs, 1000 s): 16 GPUs 0-200, then shrunk to 8 (half speed: 800 s of work
      take 1600 s), ends at 1800. Its guarantee is 8: attained throughout.
    * s2 (standard, 16, 500 s): waits until 300, runs to 800.
    * p1 (premium, 8, 400 s): 0-100, preempted, resumed at 250, ends at 550.
    * b1 (basic, 8, 100 s): waits until 100, ends at 200. b2 (basic, 8, 100 s): 0-50, preempted,
      resumed at 100, ends at 150 (a basic job attains only while it holds GPUs).
    """
    topo = clos("four", minipods=1, nodes=4, gpus_per_node=8, gpu_type="H800")
    specs = [JobSpec("s1", 0.0, 16, 1000.0, priority=1), JobSpec("s2", 0.0, 16, 500.0, priority=1),
             JobSpec("p1", 0.0, 8, 400.0, priority=2), JobSpec("b1", 0.0, 8, 100.0, priority=0),
             JobSpec("b2", 0.0, 8, 100.0, priority=0)]

    def on(*nodes: int) -> Allocation:
        return Allocation(nodes, (8,) * len(nodes))

    script = Script({
        0.0: [[Start("s1", on(0, 1), "s"), Start("p1", on(2), "s"), Start("b2", on(3), "s"), Timer(50.0, "t")]],
        50.0: [[Preempt("b2", "p"), Timer(100.0, "t")]],
        100.0: [[Preempt("p1", "p"), Start("b1", on(2), "s"), Resume("b2", on(3), "r")]],
        200.0: [[Resize("s1", on(0), "shrink"), Timer(250.0, "t"), Timer(300.0, "t")]],  # b1 ended
        250.0: [[Resume("p1", on(1), "r")]],
        300.0: [[Start("s2", on(2, 3), "s")]],
    })
    result = Simulation(topo, specs, script, PLACERS.get("first-fit")()).run()
    ends = {j.job_id: j.end_time for j in result.jobs}
    assert ends == {"s1": 1800.0, "s2": 800.0, "p1": 550.0, "b1": 200.0, "b2": 150.0}
    rows = {r["tier"]: r for r in sla_attainment(result, TierRule())}
    assert list(rows) == ["premium", "standard", "basic"]
    # per job: attainment = time holding ≥ its guarantee (and ≥ 1 GPU) ÷ time in system (submit
    # to end); held share = time-averaged GPUs held ÷ GPUs requested
    # p1: holds 8 ≥ 8 for 100 + 300 s of 550
    p1 = 400 / 550
    # s1: ≥ 8 throughout; held (16 × 200 + 8 × 1600) / 1800 / 16 = 5/9
    s1, s1_held = 1.0, (16 * 200 + 8 * 1600) / 1800 / 16
    # s2: 500 of 800 s, at its full 16 GPUs
    s2 = 500 / 800
    # b1: 100 of 200 s; b2: 50 + 50 of 150 s
    b1, b2 = 100 / 200, 100 / 150
    expected = {
        "premium": {"fraction": 1.0, "jobs": 1, "attainment": p1, "met_99": 0.0, "held_share": p1},
        "standard": {"fraction": 0.5, "jobs": 2, "attainment": (s1 + s2) / 2, "met_99": 1 / 2,
                     "held_share": (s1_held + s2) / 2},
        "basic": {"fraction": 0.0, "jobs": 2, "attainment": (b1 + b2) / 2, "met_99": 0.0,
                  "held_share": (b1 + b2) / 2},
    }
    for tier, fields in expected.items():
        assert set(rows[tier]) == {"tier", *fields}
        check(rows[tier], fields)
