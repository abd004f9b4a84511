"""`loom plan`: one shape, one time in both tables; nothing fits → one line and a fix.
Also `loom predict eval`'s progress on stderr."""

from __future__ import annotations

import io
import json
import random

import pytest
from rich.console import Console
from typer.testing import CliRunner

from loom.cli.main import app

runner = CliRunner()

H100_13B = ["--gpu-type", "H100", "--gpus", "64", "--model", "llama2-13b", "--global-batch", "512"]  # README
V100_70B = ["--gpu-type", "V100", "--gpus", "8", "--model", "llama2-70b", "--global-batch", "64"]
KNOBS = ("dp", "tp", "pp", "micro_batch", "vpp", "zero", "recompute")


def _plan_json(*args: str) -> tuple[int, dict]:
    res = runner.invoke(app, ["plan", *args, "--json"])
    return res.exit_code, json.loads(res.stdout)


def _estimate(args: list[str], plan: dict) -> dict:
    """`loom estimate` of exactly this plan (every knob pinned)."""
    flags = [f"--{k.replace('_', '-')}" for k in KNOBS]
    pinned = [x for flag, k in zip(flags, KNOBS) for x in (flag, str(plan[k]))]
    res = runner.invoke(app, ["estimate", *args, *pinned, "--json"])
    return json.loads(res.stdout)


@pytest.fixture(scope="module")
def readme_plan() -> dict:
    code, out = _plan_json(*H100_13B, "--top", "5")
    assert code == 0
    return out


def _cell(out: dict, gpus: int, stages: int) -> dict:
    return next(c for c in out["cells"] if (c["gpus"], c["stages"]) == (gpus, stages))


# ------------------------------------------------------------------ one shape, one time
def test_same_plan_same_time_in_both_tables(readme_plan):
    by_plan = {json.dumps(p["plan"], sort_keys=True): p["iteration_s"] for p in readme_plan["plans"]}
    tuned = [c["tuned"] for c in readme_plan["cells"] if c["tuned"]]
    shared = [t for t in tuned if json.dumps(t["plan"], sort_keys=True) in by_plan]
    assert shared  # the 64-GPU data-parallel Cell's tuned plan is the plan table's best
    for t in shared:
        assert t["iteration_s"] == by_plan[json.dumps(t["plan"], sort_keys=True)]


def test_the_64_gpu_dp_cell_differs_only_by_its_sampled_knobs(readme_plan):
    best, cell = readme_plan["plans"][0], _cell(readme_plan, 64, 1)
    assert cell["tuned"]["plan"] == best["plan"] and cell["tuned"]["iteration_s"] == best["iteration_s"]
    sampled = cell["estimate"]
    assert sampled["plan"]["zero"] == 1 and sampled["plan"]["recompute"] == "full"  # the grid sample's knobs
    assert sampled["iteration_s"] > best["iteration_s"]
    # each number is its own plan's: `loom estimate` of either plan gives it exactly
    assert _estimate(H100_13B, sampled["plan"])["iteration_s"] == sampled["iteration_s"]
    assert _estimate(H100_13B, best["plan"])["iteration_s"] == best["iteration_s"]


@pytest.mark.parametrize("gpus, stages", [(64, 2), (128, 4), (32, 1)])
def test_tuned_cell_is_plan_with_pp_fixed(readme_plan, gpus, stages):
    code, out = _plan_json(*H100_13B[:2], "--gpus", str(gpus), *H100_13B[4:], "--pp", str(stages), "--top", "1",
                           "--no-cells")
    assert code == 0
    tuned = _cell(readme_plan, gpus, stages)["tuned"]
    assert (tuned["plan"], tuned["iteration_s"]) == (out["plans"][0]["plan"], out["plans"][0]["iteration_s"])


def test_tables_label_sampled_and_tuned_numbers(readme_plan):
    res = runner.invoke(app, ["plan", *H100_13B, "--top", "5"])
    assert res.exit_code == 0
    text = res.stdout
    assert "tuned plan" in text and "sampled" in text and "Crius grid sample" in text
    best = readme_plan["plans"][0]["iteration_s"]
    row = next(line for line in text.splitlines() if line.startswith("64×1 "))
    cell = _cell(readme_plan, 64, 1)
    assert f"{cell['estimate']['iteration_s']:.3f}" in row and f"{best:.3f}" in row and "full" in row
    first = next(line for line in text.splitlines() if line.startswith("│ 1 "))
    assert f"{best:.3f}" in first
    for c in readme_plan["cells"]:  # every Cell row shows the JSON's numbers
        line = next(x for x in text.splitlines() if x.startswith(f"{c['gpus']}×{c['stages']} "))
        assert f"{c['estimate']['iteration_s']:.3f}" in line
        assert (f"{c['tuned']['iteration_s']:.3f}" if c["tuned"] else "unequal stages") in line


# ------------------------------------------------------------------ nothing fits
def test_nothing_fits_prints_one_line_and_the_fewest_gpus_that_fit():
    res = runner.invoke(app, ["plan", *V100_70B])
    assert res.exit_code == 1
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert len(lines) <= 3, res.output
    assert "Crius Cells" not in res.output and not set("┏┃│─") & set(res.output)
    assert "0 feasible" in res.output and "out of memory" in res.output
    # 40 = dp2·tp4·pp5: sequence parallelism (default since issue 22) splits the norm/dropout activations
    # over tp, so llama2-70b fits on V100s with fewer GPUs than the 64 of the old memory model
    assert "smallest change that fits: --gpus 40" in res.output
    more = [*V100_70B[:2], "--gpus", "64", *V100_70B[4:]]
    assert runner.invoke(app, ["plan", *more, "--top", "1", "--no-cells"]).exit_code == 0  # the fix fits
    fewer = [*V100_70B[:2], "--gpus", "32", *V100_70B[4:]]
    assert runner.invoke(app, ["plan", *fewer, "--top", "1", "--no-cells"]).exit_code == 1


def test_nothing_fits_with_pinned_knobs_suggests_unpinning_the_fewest():
    args = ["--gpu-type", "A100-80GB", "--gpus", "8", "--model", "llama2-13b", "--global-batch", "64", "--tp", "1",
            "--pp", "1"]
    res = runner.invoke(app, ["plan", *args, "--zero", "0"])
    assert res.exit_code == 1 and "smallest change that fits: without --zero 0" in res.output
    assert runner.invoke(app, ["plan", *args, "--top", "1", "--no-cells"]).exit_code == 0


def test_nothing_fits_json_has_the_fix_and_no_cells():
    code, out = _plan_json(*V100_70B)
    assert code == 1 and out["plans"] == [] and "cells" not in out
    assert out["fix"]["change"] == "--gpus 40" and out["fix"]["plan"]["feasible"] is True


# ------------------------------------------------------------------ predict eval progress
def test_predict_eval_reports_its_phases_on_stderr(tmp_path, monkeypatch):
    import loom.cli.predict as cli

    rng = random.Random(1)
    rows, t = ["job_id,submit_time,gpus,duration,user,vc,job_class,final_status"], 0.0
    for i in range(200):
        t += rng.expovariate(1 / 600)
        u = rng.randrange(6)
        rows.append(f"j{i},{t:.0f},{1 + u % 3},{300 * 2 ** (u * 0.7) * rng.lognormvariate(0, 0.3):.0f},u{u},"
                    f"vc{u % 2},sft,completed")
    csv = tmp_path / "t.csv"
    csv.write_text("\n".join(rows) + "\n")
    stderr = io.StringIO()
    monkeypatch.setattr(cli, "err_console", Console(file=stderr, force_terminal=True, width=120))
    res = runner.invoke(app, ["predict", "eval", "--trace", f"csv:{csv}", "--bags", "2"])
    assert res.exit_code == 0, res.output
    shown = stderr.getvalue()
    for phase in ("loading trace", "gbm-classify: building features of", "gbm-classify: training 2 classify bag(s)",
                  "gbm-classify: predicting", "baseline: fitting", "baseline: predicting"):
        assert phase in shown, phase
    assert "training" not in res.stdout and "RMSE" in res.stdout  # progress stays off stdout
