"""`loom report` / `loom compare` and the data helpers behind them."""

from __future__ import annotations

import base64
import re

import numpy as np
import polars as pl
import pytest
from typer.testing import CliRunner

from loom.cli.main import app
from loom.config import load_config
from loom.hardware.clos import clos
from loom.report import data as D
from loom.report import jobstats
from loom.report.html import write_report
from loom.run import run

runner = CliRunner()

TRACE = "#job id,arrival time (sec),topology,shape,size,duration (sec)\n" + "".join(
    f"j{i},{i * 7.0},CLOS,1,{size},{dur}\n"
    for i, (size, dur) in enumerate([(8, 100), (64, 300), (1, 50), (128, 200), (16, 80), (2, 20), (96, 150),
                                     (4, 400), (32, 60), (1, 5), (144, 30), (8, 10)]))
JOB_IDS = [f"j{i}" for i in range(12)]


def simulate(tmp_path, name: str, policy: str = "fcfs"):
    trace = tmp_path / "trace.csv"
    trace.write_text(TRACE)
    cfg = load_config(None, {"trace": f"rfold:{trace}", "cluster": "arnold-i", "policy": policy,
                             "outputs.dir": str(tmp_path / name)})
    return run(cfg).out_dir


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("runs")
    return simulate(tmp, "fcfs"), simulate(tmp, "sjf", "sjf")


# --------------------------------------------------------------- end to end
def test_report_page(runs, tmp_path):
    out = tmp_path / "r.html"
    res = runner.invoke(app, ["report", str(runs[0]), "--out", str(out)])
    assert res.exit_code == 0, res.output
    page = out.read_text()
    for heading in ("Summary", "JCT, queueing delay and slowdown", "Utilisation and queue over time",
                    "Occupancy heatmap", "Placements of the 3 largest jobs", "Decision log"):
        assert f">{heading}</h2>" in page
    assert page.count("<svg class='chart'") == 3  # CDFs, utilisation and queue, heatmap
    assert page.count("<figure class='placement'>") == 3 and "<details>" in page
    images = re.findall(r"data:image/png;base64,([A-Za-z0-9+/=]+)", page)
    assert len(images) == 1  # the heatmap's grid inside its chart
    for b64 in images:
        png = base64.b64decode(b64)
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 100
    assert "<script src" not in page and "<link" not in page  # self-contained
    rows = set(re.findall(r"<tr data-job='([^']*)'", page))
    assert set(JOB_IDS) <= rows
    assert "oninput='filterDecisions()'" in page


def test_write_report_default_path(runs):
    path = write_report(runs[0])
    assert path == runs[0] / "report.html" and path.stat().st_size > 10_000


def test_compare_prints_and_plots(runs, tmp_path):
    png = tmp_path / "cmp.png"
    res = runner.invoke(app, ["compare", str(runs[0]), str(runs[1]), "--out", str(png)])
    assert res.exit_code == 0, res.output
    assert "fcfs" in res.output and "sjf" in res.output and "avg_jct_s" in res.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    page = tmp_path / "cmp.html"
    assert runner.invoke(app, ["compare", str(runs[0]), str(runs[1]), "-o", str(page)]).exit_code == 0
    assert "data:image/png;base64," in page.read_text()


@pytest.mark.parametrize("args", [["report", "{missing}"], ["report", "{empty}"], ["compare", "{run}", "{missing}"],
                                  ["compare", "{run}", "--out", "{empty}/x.pdf"]])
def test_bad_run_dir_exits_2(args, runs, tmp_path):
    (tmp_path / "empty").mkdir()
    paths = {"missing": str(tmp_path / "nope"), "empty": str(tmp_path / "empty"), "run": str(runs[0])}
    res = runner.invoke(app, [a.format(**paths) for a in args])
    assert res.exit_code == 2
    assert "error:" in res.output and "Traceback" not in res.output
    assert res.exception is None or isinstance(res.exception, SystemExit)


# ------------------------------------------------------- data on hand-made runs
def hand_run(tmp_path, decisions: pl.DataFrame | None) -> D.RunData:
    jobs = pl.DataFrame({
        "job_id": ["a", "b", "c"], "state": ["finished", "finished", "pending"], "submit": [0.0, 5.0, 90.0],
        "start": [0.0, 10.0, None], "end": [100.0, 50.0, None], "queue_s": [0.0, 5.0, None],
        "jct_s": [100.0, 45.0, None], "run_s": [70.0, 40.0, 10.0], "gpus": [4, 2, 16],
        "gpu_seconds": [280.0, 80.0, 0.0], "job_class": ["train", "infer", "train"], "vc": ["x", "y", "y"]})
    return D.RunData(tmp_path, {}, {"cluster": {"gpus": 16}}, jobs, decisions)


def decisions(nodes: list[str]) -> pl.DataFrame:
    n0, n1 = nodes
    return pl.DataFrame({
        "time": [0.0, 10.0, 20.0, 30.0, 60.0],
        "decision": ["start", "start", "preempt", "resume", "resize"],
        "job": ["a", "b", "a", "a", "a"], "gpus": [4, 2, None, 4, 2],
        "nodes": [[f"{n0}:4"], [f"{n1}:2"], None, [f"{n1}:4"], [f"{n1}:2"]],
        "reason": ["r"] * 5}, schema_overrides={"nodes": pl.List(pl.Utf8)})


def test_busy_gpus_from_jobs_table(tmp_path):
    times, levels = D.busy_gpus(hand_run(tmp_path, None))
    assert D.step_integral(times, levels) == 4 * 100 + 2 * 40  # sum of gpus × run time
    assert list(times) == [0.0, 10.0, 50.0, 100.0] and list(levels) == [4, 6, 4, 0]


def test_busy_gpus_follows_preempt_resume_resize(tmp_path):
    run_ = hand_run(tmp_path, decisions(["n0", "n1"]))
    times, levels = D.busy_gpus(run_)
    assert list(times) == [0.0, 10.0, 20.0, 30.0, 50.0, 60.0, 100.0]
    assert list(levels) == [4, 6, 2, 6, 4, 2, 0]
    assert D.step_integral(times, levels) == 4 * 20 + 4 * 30 + 2 * 40 + 2 * 40
    edges = np.array([0.0, 25.0, 100.0])
    b = D.binned(times, levels, edges)
    assert np.allclose(b["mean"] * np.diff(edges), [4 * 10 + 6 * 10 + 2 * 5, 2 * 5 + 6 * 20 + 4 * 10 + 2 * 40])
    assert list(b["min"]) == [2, 2] and list(b["max"]) == [6, 6]


def test_occupancy_heatmap_per_group(tmp_path):
    topo = clos("t", minipods=2, nodes=8, gpus_per_node=8, gpu_type="A100-80GB", nodes_per_leaf=2)
    n0, n1 = topo.node_names[0], topo.node_names[2]  # on two different leaves
    heat = D.occupancy_heatmap(hand_run(tmp_path, decisions([n0, n1])), topo, bins=1)
    occ = dict(zip(heat["groups"], heat["occupancy"][:, 0]))
    tier, group_of, names, cap = D.node_groups(topo)
    prefix = len(names[0]) - len(heat["groups"][sorted(range(len(names)), key=names.__getitem__)[0]])
    g0, g1 = names[group_of[0]][prefix:], names[group_of[2]][prefix:]
    assert occ[g0] == pytest.approx(4 * 20 / (16 * 100))
    assert occ[g1] == pytest.approx((2 * 40 + 4 * 30 + 2 * 40) / (16 * 100))
    assert sum(occ.values()) == pytest.approx(occ[g0] + occ[g1])


def test_cdf_and_groups(tmp_path):
    xs, ys = D.cdf(np.array([3.0, 1.0, 2.0, np.nan]))
    assert list(xs) == [1, 2, 3] and ys[0] == pytest.approx(1 / 3) and ys[-1] == 1.0
    jobs = hand_run(tmp_path, None).jobs
    assert jobstats.grouped(jobs, None)["all"]["jct_s"].drop_nulls().to_list() == [100.0, 45.0]
    assert set(jobstats.grouped(jobs, "job_class")) == {"train", "infer"}
    table = {r["job_class"]: r for r in jobstats.group_table(jobs, "job_class").iter_rows(named=True)}
    assert table["train"]["jobs"] == 2 and table["train"]["jct_mean_s"] == 100.0
    assert table["train"]["gpu_hours_share"] == pytest.approx(280 / 360)


def test_placements_use_last_allocation(tmp_path):
    run_ = hand_run(tmp_path, decisions(["n0", "n1"]))
    top = D.placements(run_, 2)
    assert [p["job"] for p in top] == ["a", "b"]
    assert top[0]["nodes"] == {"n1": 2} and top[0]["decision"] == "resize"
