"""`loom place`, the placement picture, the Arnold placer in a simulation, and the Table 1 benchmark."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from typer.testing import CliRunner

from conftest import job
from loom.cli.main import app
from loom.core.protocols import PLACERS, POLICIES
from loom.hardware.clos import clos
from loom.placement.arnold.benchmark import run_table1
from loom.sim.engine import Simulation

runner = CliRunner()
SETTING_I = ["--cluster", "arnold-i", "--dp", "12", "--tp", "4", "--pp", "2"]


def place(*args: str):
    return runner.invoke(app, ["place", *args])


def test_place_json_reports_spreads_and_every_rank():
    res = place(*SETTING_I, "--alpha", "0.3", "--exact", "--json")
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    for key in ("dp_max_spread", "pp_max_spread", "weighted_spread", "minipods_used", "solve_s", "optimal", "ranks"):
        assert key in out
    assert len(out["ranks"]) == 96
    assert set(Counter(out["ranks"]).values()) == {8}  # whole nodes, 8 ranks each
    assert out["weighted_spread"] == pytest.approx(0.3 * out["dp_max_spread"] + 0.7 * out["pp_max_spread"])
    assert out["weighted_spread"] == pytest.approx(out["exact"]["weighted_spread"])
    assert len(out["pp_group_spreads"]) == 6 and len(out["dp_group_spreads"]) == 2


@pytest.mark.parametrize("placer", ["best-fit", "random-fit", "gpu-packing", "topo-aware"])
def test_baselines_place_through_the_cli(placer):
    res = place(*SETTING_I, "--placer", placer, "--occupancy", "0.25", "--seed", "3", "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["status"] == "baseline"


def test_arnold_never_worse_than_best_fit_on_busy_cluster():
    spreads = {}
    for placer in ("arnold", "best-fit"):
        res = place("--cluster", "arnold-ii", "--dp", "24", "--tp", "4", "--pp", "8", "--placer", placer,
                    "--occupancy", "0.5", "--seed", "2", "--alpha", "0.3", "--json")
        assert res.exit_code == 0, res.output
        spreads[placer] = json.loads(res.output)["weighted_spread"]
    assert spreads["arnold"] <= spreads["best-fit"]


@pytest.mark.parametrize("suffix", [".png", ".svg", ".html"])
def test_plot_and_hostfile(tmp_path, suffix):
    picture, hosts = tmp_path / f"p{suffix}", tmp_path / "hosts"
    res = place(*SETTING_I, "--plot", str(picture), "--hostfile", str(hosts), "--color-by", "dp")
    assert res.exit_code == 0, res.output
    assert picture.stat().st_size > 1000
    lines = hosts.read_text().splitlines()
    assert len(lines) == 12 and all(line.endswith("slots=8") for line in lines)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--cluster", "arnold-i", "--dp", "100", "--tp", "8", "--pp", "2"], "only"),
        (["--cluster", "arnold-i", "--dp", "2", "--tp", "16", "--pp", "1"], "TP 16"),
        (["--cluster", "arnold-i", "--dp", "3", "--tp", "2", "--pp", "1"], "multiple"),
        ([*SETTING_I, "--alpha", "1.5"], "alpha"),
        ([*SETTING_I, "--plot", "x.bmp"], "plot"),
        ([*SETTING_I, "--placer", "magic"], "magic"),
        (["--cluster", "nowhere", "--dp", "4"], "nowhere"),
    ],
)
def test_bad_requests_get_clear_errors(args, message):
    res = place(*args)
    assert res.exit_code == 2
    assert message in res.output and "Traceback" not in res.output


def test_alpha_from_the_affinity_database():
    res = place("--cluster", "arnold-ii", "--dp", "8", "--tp", "4", "--pp", "4", "--model", "arnold-24b-dense",
                "--json")
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["alpha_source"].startswith("affinity database")
    assert 0.0 <= out["alpha"] <= 1.0


def test_arnold_placer_runs_whole_node_jobs_in_a_simulation():
    topo = clos("t", minipods=2, nodes=8, gpus_per_node=8, gpu_type="H800", nodes_per_leaf=2)
    specs = [job("big", 0.0, 32, 100.0), job("small", 1.0, 4, 50.0), job("mid", 2.0, 16, 30.0)]
    result = Simulation(topo, specs, POLICIES.get("fcfs")(), PLACERS.get("arnold")()).run()
    assert all(j.end_time is not None for j in result.jobs)
    big = next(j for j in result.jobs if j.job_id == "big")
    assert big.first_start == 0.0


def test_table1_benchmark_writes_its_outputs(tmp_path):
    summary = run_table1(tmp_path, settings=("i",), occupancies=1)
    assert summary["instances"] == 5
    assert summary["mean_ratio"] >= 1.0 and not summary["arnold_worse"]
    for name in ("rows.csv", "table.md", "figure.png", "summary.json"):
        assert (tmp_path / name).stat().st_size > 0


def test_report_draws_pp_groups_for_jobs_with_a_plan():
    from loom.report.html import _group_figure

    topo = clos("t", minipods=2, nodes=8, gpus_per_node=8, gpu_type="H800", nodes_per_leaf=2)
    nodes = {name: 8 for name in topo.node_names[:4]}
    png = _group_figure(topo, {"job": "x", "nodes": nodes, "plan": "2x8x2"})
    assert png is not None and png[:4] == b"\x89PNG"
    assert _group_figure(topo, {"job": "y", "nodes": nodes, "plan": None}) is None
    assert _group_figure(topo, {"job": "z", "nodes": nodes, "plan": "4x8x1"}) is None


def test_communication_matrix_carries_appendix_c_volumes():
    from loom.perf import preset
    from loom.placement.arnold.problem import JobShape, communication_matrix

    shape = JobShape(16, 4, 4)
    model = preset("arnold-24b-dense")
    m = communication_matrix(shape, model, micro_batch=2)
    assert m.shape == (8, 4, 3)
    assert (m[:, 0, 1] > m[:, 1, 1]).all() and (m[:, 3, 1] > m[:, 2, 1]).all()
    assert m[0, 1, 2] == 2 * 2 * model.seq_len * model.hidden * 2 / 4
    assert m[:, :, 0].sum() * shape.tp / shape.rows == pytest.approx(
        model.total_params() + model.embedding_params() - model.norm_params(), rel=1e-9)


def test_arnold_placer_reports_the_plan_it_aligned_for(tmp_path):
    from loom.report.decision_log import decision_frame

    topo = clos("t", minipods=2, nodes=8, gpus_per_node=8, gpu_type="H800", nodes_per_leaf=2)
    specs = [job("llm", 0.0, 32, 100.0, model="arnold-24b-dense")]
    result = Simulation(topo, specs, POLICIES.get("fcfs")(), PLACERS.get("arnold")()).run()
    frame = decision_frame(result.decisions, topo)
    (plan,) = frame.filter(frame["decision"] == "start")["plan"].to_list()
    dp, tp, pp = (int(x) for x in plan.split("x"))
    assert dp * tp * pp == 32
