"""Report v2 (`report.html`): a summary grouped into sections with one unit format per kind of
value, and the metrics researchers compare schedulers by — bounded slowdown, queue length over
time, per-group queueing with Jain's index, SLA attainment per tier, failures and goodput,
elastic resizes — each checked on a tiny run against values derived by hand in the comments.

Runs go through `loom simulate` (typer's CliRunner) or `loom.run.run`, and the report through
`loom report` / `write_report`, so what is checked is what a user opens.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from loom.cli.main import app
from loom.config import load_config
from loom.report import data as D
from loom.report import jobstats, sections, tables, tiers, timelines
from loom.report.failures import stops
from loom.report.html import write_report
from loom.report.sla import sla_attainment
from loom.run import run
from loom.workload.tiers import TierRule

runner = CliRunner()

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

# One node of 8 GPUs, FCFS. a (8 GPUs) runs 1000-1100; b, c (4 each) and d (2) wait for it; at 1100
# b and c start (8 GPUs), d does not fit and starts when b ends at 1150, running 4 s to 1154;
# c ends at 1300; e asks for 16 GPUs and is rejected at 1200.
FCFS_TRACE = """job_id,submit_time,gpus,duration,vc
a,1000,8,100,x
b,1010,4,50,x
c,1020,4,200,y
d,1020,2,4,y
e,1200,16,30,y
"""


def cluster_and_trace(tmp_path: Path, cluster: str, trace: str) -> tuple[str, str]:
    (tmp_path / "cluster.yaml").write_text(cluster)
    (tmp_path / "trace.csv").write_text(trace)
    return f"yaml:{tmp_path / 'cluster.yaml'}", f"csv:{tmp_path / 'trace.csv'}"


def simulate(tmp_path: Path, cluster: str, trace: str, *flags: str, policy: str = "fcfs") -> Path:
    """`loom simulate` (report included) into tmp_path/run."""
    cluster_spec, trace_spec = cluster_and_trace(tmp_path, cluster, trace)
    out = tmp_path / "run"
    res = runner.invoke(app, ["simulate", "--trace", trace_spec, "--cluster", cluster_spec, "--policy", policy,
                              "--placer", "first-fit", "--out", str(out), "-q", *flags])
    assert res.exit_code == 0, res.output
    return out


def headings(page: str, level: int) -> list[str]:
    return re.findall(rf"<h{level}[^>]*>([^<]*)</h{level}>", page)


def card_rows(page: str, title: str) -> dict[str, str]:
    """label → value of one summary card."""
    match = re.search(rf"<section class='card'><h3>{re.escape(title)}</h3><table class='kv'>(.*?)</table>", page)
    assert match, f"no summary card {title!r}"
    return dict(re.findall(r"<tr><th>([^<]*)</th><td>([^<]*)</td></tr>", match.group(1)))


@pytest.fixture(scope="module")
def fcfs_run(tmp_path_factory) -> Path:
    return simulate(tmp_path_factory.mktemp("fcfs"), ONE_NODE, FCFS_TRACE)


# ------------------------------------------------------------------ the summary
def test_summary_is_grouped_into_sections_with_units(fcfs_run):
    page = (fcfs_run / "report.html").read_text()
    assert "Summary" in headings(page, 2)
    cards = headings(page, 3)
    for title in ("Run", "Workload", "Time", "Utilisation", "Energy", "Engine"):
        assert title in cards
    assert "Failures and recovery" not in cards  # nothing failed: its one zero sits under utilisation
    time_rows = card_rows(page, "Time")
    # JCT of the finished jobs: a 100, b 140, c 280, d 134 → mean 163.5 s; makespan 1000 → 1300 = 300 s
    assert time_rows["JCT, mean"] == "164 s (2.7 min)" and time_rows["queueing delay, median"] == "85.0 s (1.4 min)"
    assert time_rows["makespan"] == "300 s (5.0 min)"
    # busy GPU-seconds 8 × 100 + 4 × 50 + 4 × 200 + 2 × 4 = 1,808 of 8 × 300 = 2,400
    util = card_rows(page, "Utilisation")
    assert util["GPU utilisation"] == "75.3 %" and util["busy GPU time"] == "0.5 GPU-h"
    assert util["jobs stopped by failures"] == "0"
    engine = card_rows(page, "Engine")
    assert re.fullmatch(r"[\d,]+ events/s", engine["simulation speed"])  # a rate, never a duration
    assert re.fullmatch(r"[\d.]+ ms", engine["decision latency, median"])
    assert card_rows(page, "Energy")["total"].endswith(" kWh")


def test_every_summary_key_lands_in_a_section(fcfs_run, tmp_path):
    """Known keys under their label, a policy's counters under "Policy counters", the rest under
    "Other" with a unit read from the key's name — none dropped."""
    summary = json.loads((fcfs_run / "summary.json").read_text())
    summary["fcfs_heads_skipped"] = 3
    summary["mystery_wait_s"] = 7200.0
    groups = dict(sections.summary_sections(summary, [], "fcfs"))
    shown = {label for rows in groups.values() for label, _ in rows}
    for key in summary:
        assert key in sections.KNOWN or key in ("fcfs_heads_skipped", "mystery_wait_s"), key
        if key in sections.KNOWN:
            assert sections.KNOWN[key][1] in shown, key
    assert groups["Policy counters (fcfs)"] == [("heads skipped", "3")]
    assert groups["Other"] == [("mystery_wait_s", "7,200 s (2.0 h)")]
    # and through `loom report` on a run directory holding such keys
    (tmp_path / "r").mkdir()
    for name in ("jobs.parquet", "decisions.jsonl", "manifest.json"):
        (tmp_path / "r" / name).write_bytes((fcfs_run / name).read_bytes())
    (tmp_path / "r" / "summary.json").write_text(json.dumps(summary))
    assert runner.invoke(app, ["report", str(tmp_path / "r")]).exit_code == 0
    other = card_rows((tmp_path / "r" / "report.html").read_text(), "Other")
    assert other == {"mystery_wait_s": "7,200 s (2.0 h)"}
    page = write_report(tmp_path / "r", tmp_path / "elsewhere" / "page.html").read_text()
    assert card_rows(page, "Policy counters (fcfs)") == {"heads skipped": "3"}


# ------------------------------------------------------------------ per-job metrics
def test_bounded_slowdown_by_hand(fcfs_run):
    """JCT ÷ max(run time, 10 s), at least 1: a 100/100 = 1; b 140/50 = 2.8; c 280/200 = 1.4; d ran
    4 s, so its 134 s are divided by the 10 s threshold: 13.4 (33.5 without it). e was rejected."""
    run_ = D.load_run(fcfs_run)
    values = dict(zip(run_.jobs["job_id"], jobstats.with_slowdown(run_.jobs)["slowdown"]))
    assert values["a"] == pytest.approx(1.0) and values["b"] == pytest.approx(2.8)
    assert values["c"] == pytest.approx(1.4) and values["d"] == pytest.approx(13.4) and values["e"] is None
    dist = jobstats.distribution(jobstats.bounded_slowdown(run_.jobs))
    # sorted 1, 1.4, 2.8, 13.4: mean 18.6 / 4; median (1.4 + 2.8) / 2; p99 at rank 2.97
    assert dist["n"] == 4 and dist["mean"] == pytest.approx(4.65) and dist["p50"] == pytest.approx(2.1)
    assert dist["p99"] == pytest.approx(2.8 + 0.97 * (13.4 - 2.8))
    page = (fcfs_run / "report.html").read_text()
    assert "<td>finished jobs</td><td>4</td><td>4.65</td><td>2.10</td><td>13.08</td><td>13.40</td>" in page
    assert "max(run time, 10 s)" in page and "bounded slowdown" in page


def test_queue_length_series_by_hand(fcfs_run):
    """Waiting = submitted, not ended, holding no GPUs: b from 1010, c and d from 1020 (3), b and c
    start at 1100 (1 left: d), d starts at 1150 (0). a never waits; e is rejected."""
    times, levels = timelines.waiting_jobs(D.load_run(fcfs_run))
    changes = [(t, v) for i, (t, v) in enumerate(zip(times, levels)) if i == 0 or v != levels[i - 1]]
    assert changes == [(1000.0, 0), (1010.0, 1), (1020.0, 3), (1100.0, 1), (1150.0, 0)]
    assert "at most 3 jobs waited at once" in (fcfs_run / "report.html").read_text()


def test_per_vc_queueing_and_jain_index(fcfs_run):
    """VC x: a (queue 0, slowdown 1) and b (90 s, 2.8); VC y: c (80 s, 1.4), d (130 s, 13.4) and
    the rejected e. Jain's index over the mean slowdowns 1.9 and 7.4: (9.3)² / (2 × (1.9² + 7.4²))."""
    table = jobstats.group_table(D.load_run(fcfs_run).jobs, "vc")
    rows = {r["vc"]: r for r in table.iter_rows(named=True)}
    assert rows["x"]["jobs"] == 2 and rows["y"]["jobs"] == 3
    assert rows["x"]["queue_mean_s"] == pytest.approx(45.0) and rows["x"]["queue_p99_s"] == pytest.approx(89.1)
    assert rows["y"]["queue_mean_s"] == pytest.approx(105.0) and rows["y"]["queue_p50_s"] == pytest.approx(105.0)
    assert rows["x"]["no_wait_share"] == pytest.approx(0.5) and rows["y"]["no_wait_share"] == 0.0
    assert rows["x"]["slowdown_mean"] == pytest.approx(1.9) and rows["y"]["slowdown_mean"] == pytest.approx(7.4)
    jain = 9.3 ** 2 / (2 * (1.9 ** 2 + 7.4 ** 2))  # 0.7409
    assert jobstats.group_jain(table) == pytest.approx(jain)
    page = (fcfs_run / "report.html").read_text()
    assert "Per VC" in headings(page, 3)
    assert f"mean bounded slowdown: <strong>{jain:.3f}</strong>" in page


def test_did_not_wait_note_when_most_jobs_start_at_once(tmp_path):
    """a, b, c (2 GPUs each) start on arrival; d (4) finds 2 free GPUs and waits for a's end at 100:
    3 of 4 jobs did not wait, so the queueing CDF is that of the one job that did."""
    out = simulate(tmp_path, ONE_NODE, "job_id,submit_time,gpus,duration\na,0,2,100\nb,5,2,200\nc,6,2,200\n"
                                       "d,7,4,50\n")
    page = (out / "report.html").read_text()
    assert "75% of jobs did not wait (&lt; 1 s);" in page and "curves: the 1 job that did" in page
    assert ">queueing delay, jobs that waited</text>" in page
    assert "75% of started jobs did not wait (queueing delay &lt; 1 s)" in page


def test_no_did_not_wait_note_when_most_jobs_wait(fcfs_run):
    page = (fcfs_run / "report.html").read_text()  # a alone started at once: 25% did not wait
    assert "did not wait (&lt; 1 s);" not in page and ">queueing delay</text>" in page
    assert "25% of started jobs did not wait" in page


# ------------------------------------------------------------------ failures
FAILING = "job_id,submit_time,gpus,duration\nA,0,16,1000\nB,0,8,1000\nC,0,8,1000\n"
FAILURES = [{"node": "n1", "at": 400.0, "repair_after": 300.0}, {"node": "n3", "at": 500.0, "repair_after": 250.0},
            {"node": "n2", "at": 800.0}, {"node": "n3", "at": 1000.0}]


def failure_run(tmp_path: Path) -> Path:
    """The failure scenario of tests/test_metric_values.py: first-fit puts A on n0+n1, B on n2, C on
    n3; n1 fails at 400 (A), n3 at 500 (C), n2 at 800 (B), n3 again at 1000 (B, resumed there at 860)."""
    cluster_spec, trace_spec = cluster_and_trace(tmp_path, FIVE_NODES, FAILING)
    config = load_config(None, {
        "cluster": cluster_spec, "trace": trace_spec, "placer": "first-fit", "policy": "fcfs",
        "outputs.dir": str(tmp_path / "run"), "failures": FAILURES,
        "interruptions": {"checkpoint_interval_s": 300.0, "checkpoint_mode": "sync"},
        "recovery": {"detection_s": 10.0, "diagnosis_s": 20.0, "localisation_round_s": 15.0,
                     "localisation_rounds": 2}})
    return run(config).out_dir


def test_failure_section_timeline_and_goodput(tmp_path):
    out = failure_run(tmp_path)
    run_ = D.load_run(out)
    summary = run_.summary
    # a failure stops a job without a decision: the busy GPUs over time end each stopped span at
    # the failure, so they hold exactly the run's busy GPU-seconds
    times, levels = D.busy_gpus(run_)
    assert D.step_integral(times, levels) == pytest.approx(summary["busy_gpu_seconds"], rel=1e-9)
    found = stops(run_)
    assert sorted(zip(found["job"], found["at"])) == [("A", 400.0), ("B", 800.0), ("B", 1000.0), ("C", 500.0)]
    page = (out / "report.html").read_text()
    assert "Failures and recovery" in headings(page, 2) and "Failures and recovery" in headings(page, 3)
    assert "node failed (4)" in page and "job stopped by a failure (4)" in page
    assert "job restarted by recovery (2)" in page  # A at 460 and B at 860; C and B@1000 went to the policy
    busy_h = summary["busy_gpu_seconds"] / 3600
    assert summary["goodput_gpu_hours"] == pytest.approx(32_000 / 3600)  # A 16 × 1000 + B, C 8 × 1000 each
    share = f"{100 * summary['goodput_gpu_hours'] / busy_h:.1f} %"
    assert f"<td>useful work</td><td>{summary['goodput_gpu_hours']:,.1f}</td><td>{share}</td>" in page
    assert "lost work, re-done" in page and "checkpointing" in page


def test_no_failure_section_without_failures(fcfs_run):
    page = (fcfs_run / "report.html").read_text()
    assert "id='failures'" not in page and "where busy GPU time went" not in page


# ------------------------------------------------------------------ SLA tiers and resizes
# Two nodes × 8 GPUs, sla policy. s (standard, 16 GPUs, 1000 s) starts at 0; p (premium, 8) at 100
# takes n1: s shrinks to its guarantee of 8 (half speed); b (basic, 8, 50 s) arrives at 150 and
# waits for p's end at 200, runs 200-250; at 400 (300 s after its shrink) s grows back to 16 and
# finishes its last 750 s of work at 1150 (100 s at full speed, 300 s at half = 150 s of work).
SLA_TRACE = "job_id,submit_time,gpus,duration,priority\ns,0,16,1000,1\np,100,8,100,2\nb,150,8,50,0\n"


@pytest.fixture(scope="module")
def sla_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sla")
    cluster_spec, trace_spec = cluster_and_trace(tmp, TWO_NODES, SLA_TRACE)
    config = load_config(None, {"cluster": cluster_spec, "trace": trace_spec, "placer": "first-fit",
                                "policy": "sla", "outputs.dir": str(tmp / "run")})
    return run(config)


def test_sla_attainment_per_tier_by_hand(sla_run):
    """s holds ≥ its guarantee 8 throughout (attainment 1), held (16 × 100 + 8 × 300 + 16 × 750) /
    1150 / 16; p holds its 8 for all of its 100 s; b (guarantee 0: needs ≥ 1 GPU) holds them for 50
    of its 100 s in system. The in-memory computation (`loom.report.sla`) agrees."""
    found = tiers.attainment(D.load_run(sla_run.out_dir))
    rows = {r["tier"]: r for r in found["rows"]}
    assert found["missing"] == 0
    assert rows["premium"]["attainment"] == pytest.approx(1.0) and rows["premium"]["held_share"] == pytest.approx(1.0)
    assert rows["standard"]["attainment"] == pytest.approx(1.0) and rows["standard"]["met_99"] == 1.0
    assert rows["standard"]["held_share"] == pytest.approx(16_000 / 1150 / 16)
    assert rows["basic"]["attainment"] == pytest.approx(0.5) and rows["basic"]["met_99"] == 0.0
    for mine, theirs in zip(found["rows"], sla_attainment(sla_run.result, TierRule())):
        for key in ("jobs", "attainment", "met_99", "held_share"):
            assert mine[key] == pytest.approx(theirs[key]), (mine["tier"], key)
    page = (sla_run.out_dir / "report.html").read_text()
    assert "SLA attainment per tier" in headings(page, 2)
    assert card_rows(page, "SLA attainment") == {"premium (1 job)": "100.0 % attained",
                                                  "standard (1 job)": "100.0 % attained",
                                                  "basic (1 job)": "50.0 % attained"}
    assert "<td>basic</td><td>0.0 %</td><td>1</td><td>50.0 %</td><td>0.0 %</td><td>50.0 %</td>" in page


def test_resize_timeline_of_an_elastic_run(sla_run):
    table = timelines.resizes(D.load_run(sla_run.out_dir))
    assert table.rows() == [(100.0, "s", 16, 8), (400.0, "s", 8, 16)]
    assert timelines.resize_counts(table) == {"resizes": 2, "grows": 1, "shrinks": 1, "jobs resized": 1}
    times, levels = timelines.resized_jobs_gpus(D.load_run(sla_run.out_dir), ["s"])
    assert list(zip(times, levels)) == [(0.0, 16), (100.0, 8), (400.0, 16), (1150.0, 0)]
    page = (sla_run.out_dir / "report.html").read_text()
    assert "Elastic resizing" in headings(page, 2) and "grown (1)" in page and "shrunk (1)" in page


def test_no_sla_or_resize_sections_for_fcfs(fcfs_run):
    page = (fcfs_run / "report.html").read_text()
    assert "id='sla'" not in page and "id='elastic'" not in page


# ------------------------------------------------------------------ placements, decision log, size
def test_placements_collapsed_for_at_most_three_jobs(tmp_path):
    """Seven jobs on five 8-GPU nodes; j6 (40 GPUs) waits for the whole cluster."""
    trace = "job_id,submit_time,gpus,duration\n" + "".join(f"j{i},{i},{g},100\n" for i, g in
                                                           enumerate([8, 4, 16, 2, 7, 1, 40]))
    out = simulate(tmp_path, FIVE_NODES, trace)
    page = (out / "report.html").read_text()
    details = re.search(r"<details>(.*?)</details>", page, re.DOTALL)
    assert details, "placements are not in a collapsed <details>"
    figures = re.findall(r"<figure class='placement'><figcaption>job (\w+):", details.group(1))
    assert figures == ["j6", "j2", "j0"]  # the three largest by GPUs: 40, 16, 8
    assert page.count("<figure class='placement'>") == 3
    assert "job j6: 40 GPUs on 5 nodes, 3 leaf switch(es), 2 minipod(s)" in page
    # the decision log names at most 4 nodes of an allocation
    row = re.search(r"<tr data-job='j6'>(.*?)</tr>", page).group(1)
    assert "<td>n0:8, n1:8, n2:8, n3:8 … (+1 more)</td>" in row


def test_decision_log_reasons_in_plain_words(fcfs_run):
    assert tables.plain_reason("fcfs: queue position 3; best-fit on 2 node(s)") == (
        "fcfs", ("position 3 in the queue (0 = head)", "placed by best-fit on 2 nodes"))
    assert tables.plain_reason("recovered after 300s: topology replacement n1→n4") == (
        "", ("recovered after 300 s: topology replacement n1→n4",))
    page = (fcfs_run / "report.html").read_text()
    row = re.search(r"<tr data-job='d'>(.*?)</tr>", page).group(1)
    assert row == ("<td>3</td><td>1,150.0</td><td class='k start'>start</td><td>d</td><td>2</td><td>n0:2</td>"
                   "<td class='why'><span class='who'>fcfs</span> head of the queue · placed by first-fit on "
                   "1 node</td>")
    assert "class='tablewrap declog'" in page  # the log scrolls inside its own box


def test_page_is_self_contained_and_fits(fcfs_run):
    page = (fcfs_run / "report.html").read_text()
    assert "<script src" not in page and "<link" not in page and "http://" not in page.replace(
        "http://www.w3.org/2000/svg", "")
    assert "max-width:1310px" in page and "overflow-x:auto" in page  # wide tables scroll in their box
    assert re.findall(r"<svg class='chart'[^>]*width='(\d+)'", page) and all(
        int(w) <= 1250 for w in re.findall(r"<svg class='chart'[^>]*width='(\d+)'", page))


def test_mid_size_report_stays_small(tmp_path):
    """3,000 jobs on a 552-node cluster: the page (figures, 3 placements, a capped decision log) ≤ 3 MB."""
    rng = np.random.default_rng(0)
    sizes = rng.choice([1, 1, 1, 2, 4, 8, 16, 32], 3000)
    rows = "".join(f"j{i},{t:.0f},{g},{d:.0f}\n" for i, (t, g, d) in enumerate(
        zip(np.cumsum(rng.exponential(60, 3000)), sizes, rng.lognormal(7, 1.5, 3000) + 1)))
    (tmp_path / "trace.csv").write_text("job_id,submit_time,gpus,duration\n" + rows)
    config = load_config(None, {"cluster": "philly", "trace": f"csv:{tmp_path / 'trace.csv'}",
                                "outputs.dir": str(tmp_path / "run"), "outputs.report": False})
    out = run(config).out_dir
    res = runner.invoke(app, ["report", str(out)])
    assert res.exit_code == 0, res.output
    page = out / "report.html"
    assert page.stat().st_size <= 3_000_000
    text = page.read_text()
    for heading in ("Summary", "JCT, queueing delay and slowdown", "Utilisation and queue over time",
                    "Occupancy heatmap", "Placements of the 3 largest jobs", "Decision log"):
        assert heading in headings(text, 2)
    assert "utilisation per GPU type" in text  # Philly has P100 and P40 nodes


def test_utilisation_per_gpu_type_by_hand(tmp_path):
    """n0: 4 V100, n1: 8 H800. a (4 V100) runs 0-100, b (8 H800) 50-150. Over two bins of 75 s:
    V100 busy 75 of 75 s then 25 of 75 s → 1 and 1/3; H800 25 of 75 s then 75 of 75 s → 1/3 and 1."""
    cluster = ("name: mixed\ntiers: [{name: leaf}]\nnodes:\n  - {name: n0, path: [l0], gpu_type: V100, gpus: 4}\n"
               "  - {name: n1, path: [l0], gpu_type: H800, gpus: 8}\n")
    out = simulate(tmp_path, cluster, "job_id,submit_time,gpus,duration,gpu_type\na,0,4,100,V100\n"
                                      "b,50,8,100,H800\n")
    run_ = D.load_run(out)
    util = timelines.utilisation_by_type(run_, D.run_topology(run_), np.array([0.0, 75.0, 150.0]))
    assert util["V100"] == pytest.approx([1.0, 1 / 3]) and util["H800"] == pytest.approx([1 / 3, 1.0])
    assert "utilisation per GPU type" in (out / "report.html").read_text()
