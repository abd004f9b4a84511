"""README.md's "A short tour", run command by command (slow tier), and `loom experiment --json`.

The tour's commands are listed here, verbatim, in README order; `test_tour_commands_are_in_the_readme`
keeps this list and README.md from drifting apart. The slow test runs each one in a fresh temporary
working directory with small additions (`--limit`, `-q`, a trimmed copy of an experiment YAML, a
temporary plan cache) so that the whole tour stays within a few minutes on 2 cores.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"

# README.md, "Install": the Philly replay the tour's `loom report` / `loom compare` read back.
INTRO = "loom simulate --trace philly --cluster philly --policy fcfs --placer best-fit --out runs/philly-fcfs"

# README.md, "## A short tour", in order (continuation lines joined, comments dropped).
TOUR = [
    "loom clusters list",
    "loom clusters show arnold-ii",
    "loom plugins",
    "loom simulate --policy easy --out runs/philly-easy",
    "loom simulate --config examples/philly-easy.yaml --policy sjf --out runs/philly-sjf",
    "loom simulate --config examples/philly-easy.yaml --force",
    "loom simulate --trace philly --limit 1000 --json -q > philly-1000.json",
    "loom simulate --trace rfold:my.csv --cluster arnold-i --limit 1000",
    "loom simulate --trace alibaba-v2023 --cluster alibaba-v2023 --policy easy --out runs/ali",
    "loom report runs/philly-fcfs",
    "loom compare runs/philly-fcfs runs/philly-easy --out cmp.png",
    "loom traces stats philly-vc --json",
    "loom simulate --trace arena-philly --cluster arena-1280 --policy easy --speed-model estimator --out runs/arena",
    "loom simulate --trace arena-philly --cluster arena-1280 --policy crius --speed-model estimator --out runs/crius",
    "loom experiment examples/arena-crius.yaml --workers 2",
    "loom experiment examples/arena-crius.yaml --plan-cache ~/.cache/loom/plans.sqlite",
    "loom estimate --gpu-type A100-80GB --gpus 1024 --model gpt3-175b --global-batch 1536 --plan auto",
    "loom plan --gpu-type H100 --gpus 64 --model llama2-13b --global-batch 512 --top 5",
    "loom place --cluster arnold-ii --dp 24 --tp 4 --pp 8 --alpha 0.3 --occupancy 0.5 --plot place.png",
    "loom workload generate --profile acme-kalos --days 7 --seed 0 --out kalos.csv --validate",
    ("loom simulate --trace csv:kalos.csv --cluster acme-kalos --policy priority --failures infinitehbd "
     "--checkpoint async --checkpoint-interval 30m --recovery topology --spares 1 --out runs/faults"),
    ("loom simulate --trace csv:kalos.csv --cluster acme-kalos --failures infinitehbd "
     "--recorded-failures keep --out runs/faults-keep"),
    "loom simulate --trace csv:kalos.csv --cluster acme-kalos --policy sla --out runs/sla",
    "loom predict eval --trace philly-vc",
    "loom experiment examples/experiment.yaml --workers 2",
    "loom traces list",
    "loom simulate --trace alibaba-v2023 --cluster alibaba-v2023 --load 20 --out runs/ali-x20",
]

SIM_FAST = ["--limit", "500", "-q"]
# What the test adds to a tour command, and the files (relative to the working directory) it must leave.
EXTRA: dict[str, list[str]] = {INTRO: SIM_FAST, TOUR[3]: SIM_FAST, TOUR[4]: SIM_FAST, TOUR[5]: SIM_FAST,
                               TOUR[7]: ["-q", "--out", "runs/my"], TOUR[8]: SIM_FAST, TOUR[12]: ["--limit", "100", "-q"],
                               TOUR[13]: ["--limit", "100", "-q"], TOUR[20]: SIM_FAST, TOUR[21]: SIM_FAST,
                               TOUR[22]: SIM_FAST, TOUR[23]: ["--bags", "1"],
                               TOUR[26]: SIM_FAST}
RUN_FILES = ["summary.json", "jobs.parquet", "manifest.json"]
EXPECT: dict[str, list[str]] = {
    INTRO: [f"runs/philly-fcfs/{f}" for f in RUN_FILES],
    TOUR[3]: [f"runs/philly-easy/{f}" for f in RUN_FILES],
    TOUR[4]: [f"runs/philly-sjf/{f}" for f in RUN_FILES],
    TOUR[5]: [f"runs/philly-easy/{f}" for f in RUN_FILES],
    TOUR[6]: ["philly-1000.json"],
    TOUR[7]: ["runs/my/summary.json"],
    TOUR[8]: ["runs/ali/summary.json"],
    TOUR[9]: ["runs/philly-fcfs/report.html"],
    TOUR[10]: ["cmp.png"],
    TOUR[12]: ["runs/arena/summary.json"],
    TOUR[13]: ["runs/crius/summary.json"],
    TOUR[14]: ["exp-arena/experiment.json", "exp-arena/summary.csv", "exp-arena/comparison.html"],
    TOUR[15]: ["exp-arena-cached/experiment.json", "plans.sqlite"],
    TOUR[18]: ["place.png"],
    TOUR[19]: ["kalos.csv"],
    TOUR[20]: ["runs/faults/summary.json"],
    TOUR[21]: ["runs/faults-keep/summary.json"],
    TOUR[22]: ["runs/sla/summary.json"],
    TOUR[24]: ["exp/experiment.json", "exp/summary.csv", "exp/summary_seeds.csv"],
    TOUR[26]: ["runs/ali-x20/summary.json"],
}

RFOLD_TRACE = """#job id,arrival time (sec),topology,shape,size,duration (sec)
0,0.0,CLOS,8,8,100.0
1,10.0,CLOS,8+8,16,50.0
2,10.0,CLOS,1,1,20.0
3,20.0,CLOS,8,8,30.0
"""


def readme_tour_commands() -> list[str]:
    """The `loom …` lines of README.md (continuations joined, `# comments` dropped)."""
    text = README.read_text().replace("\\\n", " ")
    commands = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("loom "):
            line = line.split("  #")[0].split(" # ")[0]
            commands.append(re.sub(r"\s+", " ", line).strip())
    return commands


def test_tour_commands_are_in_the_readme():
    found = readme_tour_commands()
    for cmd in [INTRO, *TOUR]:
        assert cmd in found, f"README.md no longer has: {cmd}"


def _trimmed_experiment(src: Path, dst: Path, out_dir: str, limit: int, grid: dict | None = None) -> None:
    data = yaml.safe_load(src.read_text())
    data["limit_jobs"] = limit
    data.setdefault("outputs", {})["dir"] = out_dir
    if grid:
        data["grid"].update(grid)
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_text(yaml.safe_dump(data, sort_keys=False))


def _argv(cmd: str, work: Path) -> tuple[list[str], str | None]:
    """The command as arguments (+ the test's additions) and the file its `>` redirects to."""
    redirect = None
    if " > " in cmd:
        cmd, redirect = (s.strip() for s in cmd.split(" > "))
    argv = shlex.split(cmd)
    argv = [str(work / "plans.sqlite") if a == "~/.cache/loom/plans.sqlite" else a for a in argv]
    if argv[1] == "experiment":
        argv[2] = str(work / argv[2])  # the trimmed copy written by the test
    return argv + EXTRA.get(cmd if redirect is None else f"{cmd} > {redirect}", []), redirect


@pytest.mark.slow
def test_readme_tour(tmp_path):
    work = tmp_path
    (work / "my.csv").write_text(RFOLD_TRACE)
    examples = work / "examples"
    examples.mkdir()
    (examples / "philly-easy.yaml").write_text((ROOT / "examples/philly-easy.yaml").read_text())
    # The tour's experiments, trimmed: few jobs per run, a fresh --out-equivalent under the temp dir.
    _trimmed_experiment(ROOT / "examples/arena-crius.yaml", examples / "arena-crius.yaml", "exp-arena", 20,
                        {"traces": ["arena-philly", "arena-pai"], "policies": ["fcfs", "crius", "gavel"]})
    # the --plan-cache run goes to its own directory (a second experiment, not a rerun of the first)
    _trimmed_experiment(ROOT / "examples/arena-crius.yaml", work / "examples-cached/arena-crius.yaml",
                        "exp-arena-cached", 20, {"traces": ["arena-philly"], "policies": ["crius"]})
    _trimmed_experiment(ROOT / "examples/experiment.yaml", examples / "experiment.yaml", "exp", 200,
                        {"seeds": [1, 2]})
    env = {**os.environ, "LOOM_TRACES": os.environ.get("LOOM_TRACES", str(ROOT.parent / "shared" / "traces"))}
    loom = [str(Path(sys.executable).with_name("loom"))]  # the installed console script
    if not Path(loom[0]).is_file():
        loom = [shutil.which("loom") or "loom"]
    timings = {}
    for cmd in [INTRO, *TOUR]:
        argv, redirect = _argv(cmd, work)
        if cmd == TOUR[15]:
            argv[2] = str(work / "examples-cached/arena-crius.yaml")
        if cmd == TOUR[19]:
            argv[argv.index("--days") + 1] = "1"  # a day of Kalos jobs is plenty for the runs that read it
        if cmd == TOUR[5]:  # "refused without" --force: runs/philly-easy exists from the `--policy easy` run
            refused = subprocess.run(loom + [a for a in argv[1:] if a != "--force"], cwd=work, env=env,
                                     capture_output=True, text=True, timeout=120, check=False)
            assert refused.returncode != 0 and "Traceback" not in refused.stdout + refused.stderr, refused
        t0 = time.perf_counter()
        proc = subprocess.run(loom + argv[1:], cwd=work, env=env, capture_output=True, text=True, timeout=300,
                              check=False)
        timings[cmd] = time.perf_counter() - t0
        output = proc.stdout + proc.stderr
        assert proc.returncode == 0, f"{' '.join(argv)} exited {proc.returncode}:\n{output[-3000:]}"
        assert "Traceback" not in output, f"{' '.join(argv)}:\n{output[-3000:]}"
        if redirect:
            (work / redirect).write_text(proc.stdout)
            assert json.loads(proc.stdout)["jobs"] > 0
        if "--json" in argv and not redirect:
            json.loads(proc.stdout)
        for rel in EXPECT.get(cmd, []):
            assert (work / rel).is_file(), f"{' '.join(argv)} did not write {rel}"
    slowest = sorted(timings.items(), key=lambda kv: -kv[1])[:5]
    print("slowest tour commands:", *(f"{t:5.1f} s  {c}" for c, t in slowest), sep="\n")


# ------------------------------------------------------------------ loom experiment --json
def test_experiment_json_prints_only_the_summary_on_stdout(tmp_path):
    from loom.cli.main import app

    trace = tmp_path / "t.csv"
    trace.write_text(RFOLD_TRACE)
    spec = {"trace": f"rfold:{trace}", "cluster": "arnold-i", "outputs": {"report": False},
            "grid": {"policies": ["fcfs", "easy"]}}
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["experiment", str(path), "--out", str(out), "--workers", "1",
                                                      "--json"])
    assert result.exit_code == 0, result.stdout + result.stderr
    data = json.loads(result.stdout)  # nothing but the JSON on stdout
    assert data == json.loads((out / "experiment.json").read_text())
    assert [r["status"] for r in data["runs"]] == ["ok", "ok"] and data["errors"] == []
    assert "runs" in result.stderr or "experiment" in result.stderr  # the progress and table went to stderr


def test_experiment_dry_run_json_prints_the_grid(tmp_path):
    from loom.cli.main import app

    trace = tmp_path / "t.csv"
    trace.write_text(RFOLD_TRACE)
    spec = {"trace": f"rfold:{trace}", "cluster": "arnold-i", "grid": {"policies": ["fcfs", "easy"]}}
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    result = CliRunner().invoke(app, ["experiment", str(path), "--out", str(tmp_path / "out"), "--dry-run", "--json"])
    assert result.exit_code == 0, result.stdout + result.stderr
    data = json.loads(result.stdout)
    assert [r["valid"] for r in data["runs"]] == [True, True] and len(data["runs"]) == 2
    assert not (tmp_path / "out").exists()  # a dry run runs nothing
