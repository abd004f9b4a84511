"""`loom experiment`: grid expansion, naming, validation, local and Ray execution, combined outputs."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest
import typer
import yaml
from typer.testing import CliRunner

from loom.cli.experiment import register
from loom.errors import LoomInputError
from loom.experiment import load_experiment, run_name, safe

runner = CliRunner()

TRACE = """#job id,arrival time (sec),topology,shape,size,duration (sec)
0,0.0,CLOS,8,8,100.0
1,10.0,CLOS,8+8,16,50.0
2,10.0,CLOS,1,1,20.0
3,20.0,CLOS,8,8,30.0
4,25.0,CLOS,8,8,30.0
"""


def make_app() -> typer.Typer:
    app = typer.Typer()

    @app.callback()
    def main() -> None:
        """test app"""

    register(app)
    return app


@pytest.fixture
def trace(tmp_path) -> Path:
    path = tmp_path / "t.csv"
    path.write_text(TRACE)
    return path


def write(tmp_path: Path, data: dict, name: str = "exp.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def tiny(trace: Path, **grid) -> dict:
    return {"trace": f"rfold:{trace}", "cluster": "arnold-i", "outputs": {"report": False},
            "grid": grid or {"policies": ["fcfs", "easy"], "seeds": [1, 2]}}


# ------------------------------------------------------------------ expansion and naming
def test_expansion_is_the_cartesian_product_with_deterministic_unique_names(tmp_path, trace):
    path = write(tmp_path, tiny(trace, policies=["fcfs", "easy", "sjf"], seeds=[1, 2], placers=["best-fit"]))
    exp = load_experiment(path, tmp_path / "out")
    names = [p.name for p in exp.points]
    assert len(names) == 6 and len(set(names)) == 6
    assert names[0] == "policy=fcfs,seed=1,placer=best-fit"
    assert names == [p.name for p in load_experiment(path, tmp_path / "out").points]  # deterministic
    for p in exp.points:
        assert p.valid, p.error
        assert p.config.outputs.dir == tmp_path / "out" / p.name
        assert p.config.policy.name == p.values["policy"] and p.config.seed == p.values["seed"]
        assert p.config.limit_jobs is None and p.config.outputs.report is False  # base kept


def test_dotted_keys_and_component_params(tmp_path, trace):
    data = tiny(trace, **{"policy.params.x": [1, 2], "limit_jobs": [2, 3]})
    exp = load_experiment(write(tmp_path, data), tmp_path / "o")
    assert [p.name for p in exp.points][:2] == ["policy.params.x=1,limit_jobs=2", "policy.params.x=1,limit_jobs=3"]
    cfg = exp.points[0].config
    assert cfg.policy.name == "fcfs" and cfg.policy.params == {"x": 1} and cfg.limit_jobs == 2


def test_names_are_filesystem_safe_and_colliding_values_get_a_hash(tmp_path):
    name = run_name({"trace": "rfold:/data/a b/x.csv", "policy": {"name": "easy", "params": {"w": 2}}})
    assert name == "trace=rfold_x.csv,policy=easy_w-2"
    assert "/" not in name and " " not in name and ":" not in name
    assert safe("../etc") == "_.._etc" and safe("-x") == "_-x"
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    for d in ("a", "b"):
        (tmp_path / d / "t.csv").write_text(TRACE)
    exp = load_experiment(write(tmp_path, {"grid": {"traces": [f"rfold:{tmp_path}/a/t.csv",
                                                               f"rfold:{tmp_path}/b/t.csv"]}}), tmp_path / "o")
    names = [p.name for p in exp.points]
    assert len(set(names)) == 2 and all(n.startswith("trace=rfold_t.csv~") for n in names)


# ------------------------------------------------------------------ validation
@pytest.mark.parametrize(("data", "field", "text"), [
    ({"grid": {"polcies": ["fcfs"]}}, "grid.polcies", "unknown config key"),
    ({"grid": {"seeds": []}}, "grid.seeds", "empty list"),
    ({"grid": {"seeds": 3}}, "grid.seeds", "must be a list"),
    ({"grid": {"seeds": [1, 1]}}, "grid.seeds[1]", "more than once"),
    ({"grid": {"policy": ["fcfs"], "policies": ["easy"]}}, "grid.policies", "both set"),
    ({"grid": {"outputs.dir": ["a"]}}, "grid.outputs.dir", "set by the experiment"),
    ({"grid": []}, "grid", "non-empty mapping"),
    ({"seeds": [1]}, "grid", "no 'grid:'"),
    ({"bogus": 1, "grid": {"seeds": [1]}}, "bogus", "unknown field"),
    ({"outputs": {"extra": 1}, "grid": {"seeds": [1]}}, "outputs.extra", "Extra inputs"),
])
def test_file_errors_name_the_file_and_field(tmp_path, data, field, text):
    path = write(tmp_path, data)
    with pytest.raises(LoomInputError) as info:
        load_experiment(path, tmp_path / "o")
    assert info.value.field == field and text in str(info.value)
    assert str(path) in str(info.value)


def test_invalid_grid_points_are_named_not_fatal(tmp_path, trace):
    path = write(tmp_path, tiny(trace, policies=["fcfs", "nope"], seeds=[1, -0.5]))
    points = load_experiment(path, tmp_path / "o").points
    bad = {p.name: p.error for p in points if not p.valid}
    assert [p.name for p in points if p.valid] == ["policy=fcfs,seed=1"]
    assert "unknown policy 'nope'" in bad["policy=nope,seed=1"]
    assert "field 'policy.name'" in bad["policy=nope,seed=1"] and str(path) in bad["policy=nope,seed=1"]
    assert "grid point 'policy=fcfs,seed=-0.5', field 'seed'" in bad["policy=fcfs,seed=-0.5"]


def test_cli_reports_file_errors_without_traceback(tmp_path):
    path = write(tmp_path, {"grid": {"seeds": []}})
    res = runner.invoke(make_app(), ["experiment", str(path)])
    assert res.exit_code == 2
    assert "field 'grid.seeds'" in res.output and "Traceback" not in res.output


def test_dry_run_prints_the_grid_and_runs_nothing(tmp_path, trace):
    out = tmp_path / "out"
    res = runner.invoke(make_app(), ["experiment", str(write(tmp_path, tiny(trace))), "--out", str(out),
                                     "--dry-run"])
    assert res.exit_code == 0, res.output
    assert "4 runs" in res.output and "easy" in res.output
    assert not out.exists()


# ------------------------------------------------------------------ running
def check_outputs(out: Path, expected: list[str], rows: list[str] | None = None) -> pl.DataFrame:
    for name in expected:
        for f in ("summary.json", "jobs.parquet", "decisions.jsonl", "manifest.json"):
            assert (out / name / f).is_file(), (name, f)
    frame = pl.read_csv(out / "summary.csv")
    assert frame["run"].to_list() == (rows or expected)
    assert pl.read_parquet(out / "summary.parquet")["run"].to_list() == (rows or expected)
    assert (out / "comparison.html").is_file()
    return frame


def test_tiny_experiment_runs_in_parallel_and_failures_do_not_stop_the_others(tmp_path, trace):
    # "nope" is caught at validation; a bad constructor parameter fails at run time (in the worker)
    data = tiny(trace, policies=["fcfs", "easy", "nope", {"name": "easy", "params": {"bogus": 1}}], seeds=[1, 2])
    out = tmp_path / "out"
    res = runner.invoke(make_app(), ["experiment", str(write(tmp_path, data)), "--out", str(out), "--workers", "2"])
    assert res.exit_code == 1, res.output
    assert "4 of 8 runs did not succeed" in res.output
    assert "unknown policy 'nope'" in res.output and "bogus" in res.output
    ok = ["policy=fcfs,seed=1", "policy=fcfs,seed=2", "policy=easy,seed=1", "policy=easy,seed=2"]
    bad = ["policy=nope,seed=1", "policy=nope,seed=2", "policy=easy_bogus-1,seed=1", "policy=easy_bogus-1,seed=2"]
    frame = check_outputs(out, ok, ok + bad)
    assert frame["status"].to_list() == ["ok"] * 4 + ["invalid"] * 2 + ["failed"] * 2
    assert frame["policy"].to_list()[:4] == ["fcfs", "fcfs", "easy", "easy"]
    assert frame["seed"].to_list() == [1, 2] * 4
    assert frame["jobs"].to_list() == [5] * 4 + [None] * 4 and "avg_jct_s" in frame.columns
    assert frame["error"][:4].is_null().all() and "bogus" in frame["error"][7]
    summary = json.loads((out / ok[2] / "summary.json").read_text())
    # the five jobs (41 GPUs) all start on arrival on arnold-i's 144 GPUs: JCT = duration,
    # (100 + 50 + 20 + 30 + 30) / 5 = 46, in the run's summary.json and in the combined table
    assert summary["avg_jct_s"] == pytest.approx(46.0)
    assert frame.row(2, named=True)["avg_jct_s"] == pytest.approx(46.0)
    assert json.loads((out / ok[2] / "manifest.json").read_text())["config"]["policy"]["name"] == "easy"
    assert not (out / bad[0]).exists()
    assert "bogus" in (out / bad[2] / "error.txt").read_text()
    errors = json.loads((out / "experiment.json").read_text())["errors"]
    assert [e["name"] for e in errors] == bad


def test_ray_local(tmp_path, trace):
    pytest.importorskip("ray")
    import ray

    out = tmp_path / "out"
    try:
        res = runner.invoke(make_app(), ["experiment", str(write(tmp_path, tiny(trace, policies=["fcfs", "sjf"]))),
                                         "--out", str(out), "--ray-address", "local"])
    finally:
        ray.shutdown()
    assert res.exit_code == 0, res.output
    check_outputs(out, ["policy=fcfs", "policy=sjf"])


def test_ray_missing_is_a_clear_error(tmp_path, trace, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "ray", None)  # import ray → ImportError
    out = tmp_path / "out"
    res = runner.invoke(make_app(), ["experiment", str(write(tmp_path, tiny(trace))), "--out", str(out),
                                     "--ray-address", "auto"])
    assert res.exit_code == 2
    assert "pip install ray" in res.output and "Traceback" not in res.output
    assert not out.exists()


@pytest.mark.parametrize("name, runs", [("experiment.yaml", 12), ("arena-crius.yaml", 15),
                                        ("crius-search-depth.yaml", 8), ("alibaba-crius.yaml", 5)])
def test_shipped_examples_are_valid(tmp_path, name, runs):
    exp = load_experiment(Path(__file__).parent.parent / "examples" / name, out=tmp_path)
    assert len(exp.points) == runs
    assert all(p.valid for p in exp.points), [p.error for p in exp.points if not p.valid]
