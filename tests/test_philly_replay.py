"""Full Philly replay through the CLI (the README's main job): every job finishes."""

import json

import pytest
from typer.testing import CliRunner

from loom.cli.main import app


@pytest.mark.slow
def test_full_philly_replay_fcfs_best_fit(tmp_path):
    out = tmp_path / "philly-fcfs"
    res = CliRunner().invoke(app, ["simulate", "--trace", "philly", "--cluster", "philly", "--policy", "fcfs",
                                   "--placer", "best-fit", "--out", str(out), "-q", "--no-decision-log"])
    assert res.exit_code == 0, res.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["jobs"] == summary["finished"] == 111_549
    # every GPU-second of the trace was served: load 0.47 of 2,490 GPUs over the span
    assert 0.4 < summary["gpu_utilization"] < 0.55
    assert summary["avg_queue_s"] > 0
