"""`loom experiment` over seeds: mean ± 95% CI where the seed matters, said once where it does not."""

from __future__ import annotations

import json
import random
from pathlib import Path

import polars as pl
import pytest
import typer
import yaml
from typer.testing import CliRunner

from loom.cli.experiment import register
from loom.config import SimConfig
from loom.experiment import load_experiment
from loom.experiment_seeds import NO_SEED_EFFECT, mean_ci, seed_uses

EXAMPLE = Path(__file__).parent.parent / "examples" / "experiment.yaml"
runner = CliRunner()


def make_app() -> typer.Typer:
    app = typer.Typer()

    @app.callback()
    def main() -> None:
        """test app"""

    register(app)
    return app


@pytest.fixture
def trace(tmp_path) -> Path:
    """40 jobs of 1, 8 or 16 GPUs (rfold CSV), a few hours each."""
    rng = random.Random(0)
    rows, t = ["#job id,arrival time (sec),topology,shape,size,duration (sec)"], 0.0
    for i in range(40):
        t += rng.expovariate(1 / 60)
        gpus = rng.choice([1, 8, 16])
        rows.append(f"{i},{t:.1f},CLOS,{ {1: '1', 8: '8', 16: '8+8'}[gpus]},{gpus},{rng.uniform(300, 20000):.1f}")
    path = tmp_path / "t.csv"
    path.write_text("\n".join(rows) + "\n")
    return path


def run(tmp_path: Path, data: dict) -> tuple[object, Path]:
    path, out = tmp_path / "exp.yaml", tmp_path / "out"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    res = runner.invoke(make_app(), ["experiment", str(path), "--out", str(out), "--workers", "2"])
    assert res.exit_code == 0, res.output
    return res, out


def base(trace: Path, **extra) -> dict:
    return {"trace": f"rfold:{trace}", "cluster": "arnold-i", "outputs": {"report": False}, **extra}


# ------------------------------------------------------------------ pieces
def test_mean_ci_is_the_student_t_interval():
    mean, half = mean_ci([1.0, 2.0, 3.0, 4.0])
    assert mean == 2.5
    assert half == pytest.approx(3.182446 * 1.290994 / 2, rel=1e-5)  # t(0.975, 3) · s / √n
    assert mean_ci([5.0]) == (5.0, None)


@pytest.mark.parametrize("fields, uses", [
    ({}, []),
    ({"placer": "random-fit"}, ["placer random-fit"]),
    ({"placer": {"name": "random-fit", "params": {"seed": 3}}}, []),  # its own seed: the run's does not reach it
    ({"job_failures": "acme"}, ["job failures (acme)"]),
    ({"failures_from": "rate:0.1"}, ["node failures (rate:0.1)"]),
    ({"launch": {"failure_probability": 0.1}}, ["launch failures"]),
    ({"launch": {"profile": "acme"}}, []),  # latencies only: nothing random
])
def test_seed_uses_lists_what_draws_on_the_seed(fields, uses):
    assert seed_uses(SimConfig.model_validate(fields)) == uses


# ------------------------------------------------------------------ through the CLI
def test_deterministic_runs_are_shown_once_with_the_reason(tmp_path, trace):
    data = base(trace, grid={"policies": ["fcfs", "sjf"], "seeds": [1, 2, 3]})
    res, out = run(tmp_path, data)
    assert res.output.count(NO_SEED_EFFECT) == 1
    assert "±" not in res.output
    table = [line.split() for line in res.output.splitlines() if line.split()[:1] in (["fcfs"], ["sjf"])]
    assert [row[:2] for row in table] == [["fcfs", "3"], ["sjf", "3"]]  # one row per policy, 3 seeds behind it
    seeds = pl.read_csv(out / "summary_seeds.csv")
    assert seeds["seed_effect"].to_list() == ["none", "none"]
    assert seeds["avg_jct_s_ci95"].is_null().all()
    assert pl.read_csv(out / "summary.csv")["seed"].to_list() == [1, 2, 3] * 2  # every run still ran and is kept


def test_dry_run_warns_before_running_identical_seeds(tmp_path, trace):
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(base(trace, grid={"seeds": [1, 2]})))
    res = runner.invoke(make_app(), ["experiment", str(path), "--out", str(tmp_path / "o"), "--dry-run"])
    assert res.exit_code == 0 and NO_SEED_EFFECT in res.output and "2 seeds repeat the same runs" in res.output


def test_seeded_failures_give_mean_and_t_interval(tmp_path, trace):
    res, out = run(tmp_path, base(trace, job_failures="acme", grid={"policies": ["fcfs"], "seeds": [1, 2, 3]}))
    assert NO_SEED_EFFECT not in res.output and "95% confidence interval" in res.output
    runs = pl.read_csv(out / "summary.csv")["avg_jct_s"].to_list()
    assert len(set(runs)) > 1  # the seed changed the run
    mean, half = mean_ci(runs)
    row = pl.read_csv(out / "summary_seeds.csv").row(0, named=True)
    assert row["seed_effect"] == "varies" and row["n"] == 3 and row["seed_uses"] == "job failures (acme)"
    assert row["avg_jct_s_mean"] == pytest.approx(mean) and row["avg_jct_s_ci95"] == pytest.approx(half)
    line = next(line for line in res.output.splitlines() if line.startswith("fcfs"))
    assert f"{mean / 3600:.2f} ± {half / 3600:.2f}" in line
    assert json.loads((out / "experiment.json").read_text())["seeds"][0]["avg_jct_s_ci95"] == pytest.approx(half)


def test_seed_reaching_something_that_changes_nothing_is_reported_as_identical(tmp_path, trace):
    # random-fit draws on the seed, but with trace speeds placement does not change these results
    res, out = run(tmp_path, base(trace, placer="random-fit", grid={"seeds": [1, 2]}))
    assert "identical results, although the seed reaches placer random-fit" in res.output
    assert "±" not in res.output and NO_SEED_EFFECT not in res.output
    assert pl.read_csv(out / "summary_seeds.csv")["seed_effect"].to_list() == ["identical"]


def test_shipped_example_seeds_matter(tmp_path):
    exp = load_experiment(EXAMPLE, out=tmp_path)
    assert len({p.values["seed"] for p in exp.points}) >= 3
    assert all(p.valid and seed_uses(p.config) for p in exp.points)  # every run draws on its seed
    data = yaml.safe_load(EXAMPLE.read_text())  # the example, smaller: its seeds give different runs
    data.update(limit_jobs=300, grid={"policies": ["fcfs"], "seeds": [1, 2]})
    data["outputs"].update(decision_log=False)
    res, out = run(tmp_path, data)
    assert NO_SEED_EFFECT not in res.output and "±" in res.output
    assert pl.read_csv(out / "summary_seeds.csv")["seed_effect"].to_list() == ["varies"]
