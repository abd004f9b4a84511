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
