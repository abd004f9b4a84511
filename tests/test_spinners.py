"""Every `loom` command that can take seconds shows what it is doing on a terminal's stderr
(`loom.cli.common.busy`), and nothing at all on a pipe — so `--json` output stays clean."""

from __future__ import annotations

import io

import pytest
from rich.console import Console
from typer.testing import CliRunner

from loom.cli import errors
from loom.cli.main import app

runner = CliRunner()
JOBS = "job_id,submit_time,gpus,duration\na,0,8,500\nb,10,8,300\nc,20,8,400\n"


@pytest.fixture
def run_dir(tmp_path):
    trace = tmp_path / "jobs.csv"
    trace.write_text(JOBS)
    out = tmp_path / "run"
    res = runner.invoke(app, ["simulate", "--trace", f"csv:{trace}", "--cluster", "arnold-i", "--no-report",
                              "-q", "--out", str(out)])
    assert res.exit_code == 0, res.output
    return out


def commands(tmp_path, run_dir):
    trace = tmp_path / "jobs.csv"
    return {
        "report": (["report", str(run_dir)], "writing the report of"),
        "compare": (["compare", str(run_dir), str(run_dir), "--out", str(tmp_path / "cmp.png")], "plotting the comparison"),
        "traces stats": (["traces", "stats", f"csv:{trace}"], "reading csv:"),
        "traces validate": (["traces", "validate", str(trace)], "reading csv:"),
        "plan": (["plan", "--model", "megatron-1.7b", "--gpu-type", "A100-80GB", "--gpus", "8", "--global-batch", "64",
                  "--no-cells"], "searching plans on 8 GPUs"),
        "estimate": (["estimate", "--model", "megatron-1.7b", "--gpu-type", "A100-80GB", "--gpus", "8",
                      "--global-batch", "64"], "searching plans on 8 GPUs"),
        "place": (["place", "--cluster", "arnold-i", "--dp", "2", "--tp", "8", "--pp", "2"], "placing dp2·tp8·pp2"),
        "workload generate": (["workload", "generate", "-p", "acme-seren", "-d", "0.05", "-o",
                               str(tmp_path / "gen.csv")], "generating 0.05 days of"),
    }


@pytest.mark.parametrize("name", ["report", "compare", "traces stats", "traces validate", "plan", "estimate", "place",
                                  "workload generate"])
def test_a_terminal_sees_what_a_slow_command_is_doing(name, tmp_path, run_dir, monkeypatch):
    args, said = commands(tmp_path, run_dir)[name]
    screen = io.StringIO()
    monkeypatch.setattr(errors, "err_console", Console(file=screen, force_terminal=True, width=160))
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    assert said in screen.getvalue()


@pytest.mark.parametrize("name", ["report", "traces stats", "plan"])
def test_a_pipe_sees_no_spinner(name, tmp_path, run_dir):
    args, said = commands(tmp_path, run_dir)[name]
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    assert said not in res.output
