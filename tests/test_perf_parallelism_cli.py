"""`loom estimate` / `loom plan` with issue 22's knobs: --cp, --ep, --experts, --top-k,
--capacity-factor, --precision fp8, --distributed-optimizer (through typer's runner)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from loom.cli.main import app
from loom.core.plan import ParallelPlan
from loom.perf import preset
from loom.perf.estimator import default_estimator
from loom.perf.inputs import Hardware, TrainingJob

runner = CliRunner()
MIXTRAL_64 = ["--gpu-type", "H100", "--gpus", "64", "--model", "mixtral-8x7b", "--global-batch", "256"]
LLAMA3_16 = ["--gpu-type", "H100", "--gpus", "16", "--model", "llama3-8b", "--global-batch", "64"]


def _json(args: list[str]) -> tuple[int, dict]:
    res = runner.invoke(app, args)
    assert "Traceback" not in res.output, res.output
    return res.exit_code, json.loads(res.stdout)


def test_estimate_cp_ep_fp8_and_capacity_factor_match_the_library():
    args = ["estimate", *MIXTRAL_64, "--tp", "2", "--pp", "2", "--cp", "2", "--ep", "8", "--micro-batch", "1",
            "--zero", "1", "--recompute", "selective", "--precision", "fp8", "--capacity-factor", "1.25", "--json"]
    code, out = _json(args)
    assert code == 0 and out["plan"]["cp"] == 2 and out["plan"]["ep"] == 8 and out["plan"]["dp"] == 8
    job = TrainingJob(preset("mixtral-8x7b"), 256, precision="fp8", capacity_factor=1.25)
    plan = ParallelPlan(dp=8, tp=2, pp=2, micro_batch=1, zero_stage=1, recompute="selective", cp=2, ep=8)
    assert out["iteration_s"] == default_estimator().estimate(job, Hardware("H100"), plan).iteration_s
    assert {"cp_comm", "ep_comm"} <= set(out["breakdown_s"]) and out["breakdown_s"]["ep_comm"] > 0


def test_plan_auto_searches_cp_for_long_sequences_and_ep_for_moe():
    code, out = _json(["estimate", *LLAMA3_16, "--plan", "auto", "--tp", "2", "--zero", "1", "--json"])
    assert code == 0 and {"cp", "ep"} <= set(out["searched"])
    mixtral_16 = ["--gpu-type", "H100", "--gpus", "16", "--model", "mixtral-8x7b", "--global-batch", "64"]
    code, out = _json(["plan", *mixtral_16, "--tp", "2", "--pp", "1", "--zero", "1", "--no-cells", "--top", "3",
                       "--json"])
    assert code == 0 and out["plans"] and all(p["plan"]["ep"] > 1 for p in out["plans"])  # every expert: no fit


def test_custom_moe_model_from_experts_and_top_k():
    args = ["estimate", "--gpu-type", "H100", "--gpus", "8", "--global-batch", "64", "--layers", "8", "--hidden",
            "1024", "--heads", "16", "--seq", "2048", "--vocab", "32000", "--experts", "8", "--top-k", "2",
            "--ep", "4", "--json"]
    code, out = _json(args)
    assert code == 0 and out["plan"]["ep"] == 4 and out["plan"]["dp"] == 8


def test_distributed_optimizer_is_zero_1():
    base = ["estimate", *LLAMA3_16, "--tp", "2", "--micro-batch", "1", "--recompute", "full", "--json"]
    _, with_alias = _json([*base, "--distributed-optimizer"])
    _, zero_1 = _json([*base, "--zero", "1"])
    assert with_alias["plan"]["zero"] == 1 and with_alias["iteration_s"] == zero_1["iteration_s"]
    res = runner.invoke(app, [*base, "--distributed-optimizer", "--zero", "2"])
    assert res.exit_code == 2 and "--distributed-optimizer" in res.output and "Traceback" not in res.output


@pytest.mark.parametrize(("extra", "needle"), [
    (["--cp", "3"], "field 'cp'"),
    (["--ep", "3"], "field 'ep'"),
    (["--capacity-factor", "0.5"], "--capacity-factor"),
])
def test_bad_cp_ep_and_capacity_factor_are_one_line_naming_the_flag(extra, needle):
    res = runner.invoke(app, ["estimate", *MIXTRAL_64, *extra])
    assert res.exit_code == 2 and needle in res.output and "nearest" in res.output or "capacity" in needle
    assert "Traceback" not in res.output


def test_overlap_tp_flag_matches_the_library():
    base = ["estimate", *LLAMA3_16, "--tp", "8", "--micro-batch", "1", "--zero", "1", "--recompute", "none", "--json"]
    _, plain = _json(base)
    _, overlapped = _json([*base, "--overlap-tp"])
    job = TrainingJob(preset("llama3-8b"), 64, overlap_tp=True)
    plan = ParallelPlan(dp=2, tp=8, micro_batch=1, zero_stage=1)
    assert overlapped["iteration_s"] == default_estimator().estimate(job, Hardware("H100"), plan).iteration_s
    assert overlapped["breakdown_s"]["tp_comm"] < plain["breakdown_s"]["tp_comm"]
