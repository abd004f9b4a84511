"""`loom estimate` and `loom plan` through typer's runner."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from loom.cli.main import app

runner = CliRunner()

GPT3_64 = ["--gpu-type", "A100-80GB", "--gpus", "64", "--model", "gpt3-175b", "--global-batch", "512"]
LLAMA7_8 = ["--gpu-type", "A100-80GB", "--gpus", "8", "--model", "llama2-7b", "--global-batch", "64"]
KEYS = {"iteration_s", "tokens_per_s", "tflops_per_gpu", "mfu", "memory_gib_per_gpu", "feasible", "reason", "plan"}


def _json(args: list[str]) -> tuple[int, dict]:
    res = runner.invoke(app, args)
    return res.exit_code, json.loads(res.stdout)


def test_estimate_json_has_required_keys():
    code, out = _json(["estimate", *LLAMA7_8, "--tp", "2", "--micro-batch", "2", "--zero", "1",
                       "--recompute", "none", "--json"])
    assert code == 0
    assert KEYS <= set(out)
    assert out["feasible"] is True and out["reason"] == ""
    assert out["plan"] == {"dp": 4, "tp": 2, "pp": 1, "micro_batch": 2, "vpp": 1, "zero": 1, "zero_shard": 0,
                           "recompute": "none", "cp": 1, "ep": 1}
    assert out["searched"] == []
    assert out["iteration_s"] > 0 and 0 < out["mfu"] < 1


def test_plan_auto_finds_feasible_plan():
    code, out = _json(["estimate", *GPT3_64, "--plan", "auto", "--json"])
    assert code == 0 and out["feasible"] is True
    plan = out["plan"]
    assert plan["dp"] * plan["tp"] * plan["pp"] == 64
    assert {"tp", "pp", "dp", "micro_batch"} <= set(out["searched"])


def test_omitted_micro_batch_is_searched_and_reported():
    code, out = _json(["estimate", *LLAMA7_8, "--tp", "2", "--zero", "1", "--recompute", "none", "--json"])
    assert code == 0 and out["searched"] == ["micro_batch"]
    assert out["plan"]["micro_batch"] >= 1 and out["plan"]["tp"] == 2 and out["plan"]["dp"] == 4
    res = runner.invoke(app, ["estimate", *LLAMA7_8, "--tp", "2", "--zero", "1", "--recompute", "none"])
    assert res.exit_code == 0
    assert f"{out['plan']['micro_batch']} (searched)" in res.stdout and "breakdown" in res.stdout


V100_70B = ["estimate", "--gpu-type", "V100", "--gpus", "8", "--model", "llama2-70b", "--global-batch", "64",
            "--tp", "8"]


@pytest.mark.parametrize("extra", [[], ["--micro-batch", "1", "--zero", "1", "--recompute", "full"]])
def test_infeasible_exits_1_with_reason(extra):
    res = runner.invoke(app, [*V100_70B, *extra])
    assert res.exit_code == 1
    assert "out of memory" in res.output and "Traceback" not in res.output
    code, out = _json([*V100_70B, *extra, "--json"])
    assert code == 1 and out["feasible"] is False and "out of memory" in out["reason"]


@pytest.mark.parametrize("args, field", [
    (["--gpu-type", "A100-80GB", "--gpus", "40", "--model", "gpt3-175b", "--global-batch", "512", "--tp", "5"], "tp"),
    ([*GPT3_64, "--tp", "5"], "tp"),
    ([*GPT3_64, "--tp", "8", "--pp", "7"], "tp"),
    (["--gpu-type", "A100-80GB", "--gpus", "56", "--model", "gpt3-175b", "--global-batch", "512", "--tp", "8",
      "--pp", "7", "--pipeline-split", "even"], "pp"),
    (["--gpu-type", "A100-80GB", "--gpus", "97", "--model", "gpt3-175b", "--global-batch", "97", "--pp", "97"], "pp"),
    ([*LLAMA7_8, "--global-batch", "63"], "global_batch"),
])
def test_invalid_plan_names_the_field(args, field):
    res = runner.invoke(app, ["estimate", *args])
    assert res.exit_code == 2
    assert f"field '{field}'" in res.output and "Traceback" not in res.output


def test_gpt3_on_7_stages_is_accepted_with_the_uneven_split():
    """Issue 22: 96 layers on pp=7 (was refused) splits 13, 14×5, 13; the table shows it too."""
    args = ["--gpu-type", "A100-80GB", "--gpus", "56", "--model", "gpt3-175b", "--global-batch", "512", "--tp", "8",
            "--pp", "7", "--micro-batch", "1", "--recompute", "full", "--zero", "1"]
    code, out = _json(["estimate", *args, "--json"])
    assert code in (0, 1) and out["plan"]["pp"] == 7 and out["stage_layers"] == [13, 14, 14, 14, 14, 14, 13]
    res = runner.invoke(app, ["estimate", *args])
    assert "13, 14×5, 13" in res.output and "Traceback" not in res.output


def test_unknown_gpu_type_is_a_clear_error():
    res = runner.invoke(app, ["estimate", *LLAMA7_8, "--gpu-type", "B999"])
    assert res.exit_code == 2
    assert "unknown GPU type 'B999'" in res.output and "A100-80GB" in res.output
    assert "Traceback" not in res.output


@pytest.mark.parametrize("args, expected", [
    (["--model", "llama2-7b", "--layers", "4"], "--layers"),
    (["--layers", "4", "--hidden", "1024"], "missing --heads, --seq, --vocab"),
    ([], "--model"),
    (["--model", "llama-7b"], "llama2-7b"),
])
def test_model_flag_errors(args, expected):
    res = runner.invoke(app, ["estimate", "--gpu-type", "A100-80GB", "--gpus", "8", "--global-batch", "64", *args])
    assert res.exit_code == 2
    assert expected in res.output and "Traceback" not in res.output


CUSTOM = ["--gpu-type", "H100", "--gpus", "8", "--global-batch", "32", "--layers", "8", "--hidden", "1024",
          "--heads", "16", "--seq", "2048", "--vocab", "32000"]


def test_custom_model_flags():
    code, out = _json(["estimate", *CUSTOM, "--micro-batch", "2", "--zero", "0", "--recompute", "none", "--json"])
    assert code == 0 and out["feasible"] is True and out["plan"]["dp"] == 8
    code, wider = _json(["estimate", *CUSTOM, "--ffn-hidden", "8192", "--micro-batch", "2", "--zero", "0",
                         "--recompute", "none", "--json"])
    assert code == 0 and wider["iteration_s"] > out["iteration_s"]


def test_plan_json_lists_plans_sorted():
    code, out = _json(["plan", *GPT3_64, "--top", "4", "--json"])
    assert code == 0
    assert out["considered"] >= out["feasible"] >= len(out["plans"]) == 4
    times = [p["iteration_s"] for p in out["plans"]]
    assert times == sorted(times)
    assert all(p["feasible"] and p["plan"]["dp"] * p["plan"]["tp"] * p["plan"]["pp"] == 64 for p in out["plans"])


def test_plan_table_and_nothing_fits():
    res = runner.invoke(app, ["plan", *LLAMA7_8, "--top", "3"])
    assert res.exit_code == 0
    assert "plans considered" in res.stdout and "recompute=" in res.stdout
    res = runner.invoke(app, ["plan", "--gpu-type", "V100", "--gpus", "8", "--model", "llama2-70b",
                              "--global-batch", "64"])
    assert res.exit_code == 1 and "out of memory" in res.output and "0 feasible" in res.output


def test_plan_lists_crius_cells_for_half_same_and_double_gpus():
    res = CliRunner().invoke(app, ["plan", "--gpu-type", "A100-80GB", "--gpus", "8", "--model", "megatron-1.7b",
                                   "--global-batch", "64", "--top", "2", "--json"])
    assert res.exit_code == 0, res.output
    cells = json.loads(res.output)["cells"]
    assert {c["gpus"] for c in cells} == {4, 8, 16}
    assert all(sum(c["stage_gpus"]) == c["gpus"] for c in cells)
    feasible = [c for c in cells if c["estimate"]]
    rates = [c["estimate"]["tokens_per_s"] for c in feasible]
    assert rates == sorted(rates, reverse=True)
