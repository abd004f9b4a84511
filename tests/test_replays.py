"""Real traces replayed end to end on their clusters (slow tier)."""

import polars as pl
import pytest
from typer.testing import CliRunner

from loom.cli.main import app
from loom.workload.loaders import load_trace


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["fcfs", "easy"])
def test_alibaba_v2023_honours_gpu_type_constraints(tmp_path, policy):
    out = tmp_path / policy
    res = CliRunner().invoke(app, ["simulate", "--trace", "alibaba-v2023", "--cluster", "alibaba-v2023",
                                   "--policy", policy, "--out", str(out), "-q", "--no-report"])
    assert res.exit_code == 0, res.output
    jobs = pl.read_parquet(out / "jobs.parquet")
    assert jobs.filter(pl.col("state") != "finished").height == 0
    allowed = {s.job_id: s.gpu_types for s in load_trace("alibaba-v2023") if s.gpu_types}
    assert len(allowed) > 1000
    placed = dict(zip(jobs["job_id"], jobs["gpu_type"]))
    assert all(placed[job_id] in types for job_id, types in allowed.items())


@pytest.mark.slow
@pytest.mark.parametrize("trace", ["arena-philly", "arena-pai", "arena-venus"])
@pytest.mark.parametrize("policy", ["fcfs", "easy"])
def test_crius_arena_traces_replay_with_estimated_durations(tmp_path, trace, policy):
    """Arena traces give iterations, not durations: the estimator speed model
    derives them, and every job runs on the GPU type it asked for."""
    out = tmp_path / f"{trace}-{policy}"
    res = CliRunner().invoke(app, ["simulate", "--trace", trace, "--cluster", "arena-1280", "--policy", policy,
                                   "--speed-model", "estimator", "--out", str(out), "-q", "--no-report"])
    assert res.exit_code == 0, res.output
    jobs = pl.read_parquet(out / "jobs.parquet")
    specs = {s.job_id: s for s in load_trace(trace)}
    assert jobs.height == len(specs) and set(jobs["state"]) == {"finished"}
    assert all(gpu_type == specs[job_id].gpu_type for job_id, gpu_type in zip(jobs["job_id"], jobs["gpu_type"]))
    run_s = dict(zip(jobs["job_id"], jobs["run_s"]))
    assert all(run_s[j] > 0 for j in specs)


@pytest.mark.slow
def test_seren_scale_workload_with_estimator_driven_speeds(tmp_path):
    """A generated Acme-Seren workload replays on acme-seren with every job
    priced by the estimator (trace models by size)."""
    from loom.workload.generate import generate, write_csv

    trace = tmp_path / "seren.csv"
    write_csv(generate("acme-seren", 3.0, 1), trace)
    config = tmp_path / "seren.yaml"
    config.write_text(f"trace: csv:{trace}\ncluster: acme-seren\npolicy: easy\nplacer: best-fit\n"
                      "speed_model: {name: estimator, params: {trace_models: by-size}}\n"
                      f"outputs: {{dir: {tmp_path / 'out'}, report: false}}\n")
    res = CliRunner().invoke(app, ["simulate", "-c", str(config), "-q"])
    assert res.exit_code == 0, res.output
    jobs = pl.read_parquet(tmp_path / "out" / "jobs.parquet")
    assert jobs.height > 9000 and set(jobs["state"]) == {"finished"}
