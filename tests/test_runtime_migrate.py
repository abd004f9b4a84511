"""The example GPT job under `loom run` on 2 processes (gloo): stop and resume, migrate, resize.

Every test drives the job the way the scheduler will: `loom run` in a subprocess
and requests through `loom.runtime.control.ControlClient` (or `loom control`).
The losses rank 0 logs to `loss.jsonl` in the job's working directory are
compared bit for bit (JSON keeps a float's exact value) with an uninterrupted run.
Each test starts torch several times, hence `slow`.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import Result
from typer.testing import CliRunner

from loom.cli.main import app

# imported now (with torch), not while a job runs
from loom.runtime.control import ControlClient

pytestmark = pytest.mark.slow

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "jobs" / "gpt_train.py"
ITERS = 24
JOB_ARGS = ["--iters", str(ITERS), "--layers", "1", "--d-model", "32"]


def loom_run(rt: Path, job: str, workdir: Path, *options: str, delay: float = 0.0) -> subprocess.Popen[str]:
    """`loom run` of the example on 2 processes, in the background."""
    argv = [sys.executable, "-m", "loom.cli.main", "run", "--runtime-dir", str(rt), "--job-id", job,
            "--nproc", "2", "--workdir", str(workdir), *options, str(EXAMPLE), "--", *JOB_ARGS,
            "--step-delay", str(delay)]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def finish(proc: subprocess.Popen[str], timeout: float = 240) -> int:
    out, _ = proc.communicate(timeout=timeout)
    finish.output = out  # type: ignore[attr-defined]  # shown by the assertions below
    return proc.returncode


def losses(path: Path) -> dict[int, float]:
    """Iteration -> loss from a loss log; an iteration logged twice must have logged the same loss."""
    out: dict[int, float] = {}
    for line in path.read_text().splitlines():
        row = json.loads(line)
        assert out.setdefault(row["iteration"], row["loss"]) == row["loss"], f"iteration {row['iteration']} twice"
    return out


def logged(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def wait_until(check: Callable[[], bool], proc: subprocess.Popen[str], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert proc.poll() is None, f"the job ended early:\n{proc.communicate()[0]}"
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


@pytest.fixture(scope="module")
def baseline(tmp_path_factory: pytest.TempPathFactory) -> dict[int, float]:
    """The losses of the uninterrupted run."""
    tmp = tmp_path_factory.mktemp("baseline")
    proc = loom_run(tmp / "rt", "base", tmp / "w")
    assert finish(proc) == 0, finish.output  # type: ignore[attr-defined]
    curve = losses(tmp / "w" / "loss.jsonl")
    assert sorted(curve) == list(range(1, ITERS + 1))
    return curve


def loom_control(*argv: str) -> Result:
    """`loom control` in this process (a new one would spend seconds importing torch while the job runs)."""
    return CliRunner().invoke(app, ["control", *argv, "--timeout", "120"])


def client(rt: Path, job: str) -> ControlClient:
    return ControlClient(rt, job)


@pytest.mark.parametrize("seed", [1, 2])
def test_stop_then_resume_is_bit_identical(baseline: dict[int, float], tmp_path: Path, seed: int) -> None:
    cut = random.Random(seed).randint(2, ITERS - 12)  # 12 iterations (3 s and more) to stop before the end
    rt, work = tmp_path / "rt", tmp_path / "w"
    proc = loom_run(rt, "gpt", work, delay=0.25)
    wait_until(lambda: logged(work / "loss.jsonl") >= cut, proc)
    jobs = client(rt, "gpt")
    ack = jobs.wait_ack(jobs.request("stop"), timeout_s=120)
    assert ack["status"] == "done" and ack["checkpoint"], ack
    assert finish(proc) == 0, finish.output  # type: ignore[attr-defined]
    assert jobs.status()["state"] == "stopped"
    stopped_at = logged(work / "loss.jsonl")
    assert stopped_at < ITERS, "the job finished before the stop request"

    resumed = loom_run(rt, "gpt", work, "--resume", "latest")
    assert finish(resumed) == 0, finish.output  # type: ignore[attr-defined]
    assert losses(work / "loss.jsonl") == baseline
    assert jobs.status()["state"] == "finished"


def test_migrate_moves_the_files_and_continues_bit_identically(baseline: dict[int, float], tmp_path: Path) -> None:
    rt, node_a, node_b = tmp_path / "rt", tmp_path / "node-a", tmp_path / "node-b"
    (node_a / "inputs").mkdir(parents=True)
    (node_a / "inputs" / "notes.bin").write_bytes(os.urandom(3000))
    proc = loom_run(rt, "gpt", node_a, delay=0.2)
    wait_until(lambda: logged(node_a / "loss.jsonl") >= 3, proc)
    asked = loom_control("checkpoint", "gpt", "--runtime-dir", str(rt))  # a checkpoint on the way, job goes on
    assert asked.exit_code == 0 and json.loads(asked.stdout)["checkpoint"], asked.output
    jobs = client(rt, "gpt")
    ack = jobs.wait_ack(jobs.request("migrate", workdir=str(node_b)), timeout_s=120)
    assert ack["status"] == "done", ack
    assert finish(proc) == 0, finish.output  # type: ignore[attr-defined]

    before = (node_a / "loss.jsonl").read_text()  # the old node's copy, as the job left it
    assert 0 < len(before.splitlines()) < ITERS
    assert (node_b / "loss.jsonl").read_text().startswith(before)
    assert (node_b / "inputs" / "notes.bin").read_bytes() == (node_a / "inputs" / "notes.bin").read_bytes()
    assert losses(node_b / "loss.jsonl") == baseline
    launcher = json.loads((rt / "gpt" / "launcher.json").read_text())
    assert launcher["workdir"] == str(node_b) and launcher["incarnation"] == 1
    assert jobs.status()["state"] == "finished"


@pytest.fixture(scope="module")
def deterministic_baseline(tmp_path_factory: pytest.TempPathFactory) -> dict[int, float]:
    """Logical rank 0's losses, uninterrupted, 2 logical ranks on 2 processes, deterministic mode."""
    tmp = tmp_path_factory.mktemp("det-baseline")
    proc = loom_run(tmp / "rt", "base", tmp / "w", "--logical-world", "2", "--deterministic")
    assert finish(proc) == 0, finish.output  # type: ignore[attr-defined]
    return losses(tmp / "w" / "loss.jsonl")


def test_resize_to_one_process_and_back_is_bit_identical_in_deterministic_mode(
        deterministic_baseline: dict[int, float], tmp_path: Path) -> None:
    rt, work = tmp_path / "rt", tmp_path / "w"
    proc = loom_run(rt, "gpt", work, "--logical-world", "2", "--deterministic", delay=0.15)
    wait_until(lambda: logged(work / "loss.jsonl") >= 4, proc)
    ask = loom_control("resize", "gpt", "--processes", "1", "--runtime-dir", str(rt))
    assert ask.exit_code == 0 and json.loads(ask.stdout)["status"] == "done", ask.output
    first = json.loads(ask.stdout)["iteration"]
    wait_until(lambda: logged(work / "loss.jsonl") >= first + 4, proc)  # both logical ranks on one process
    back = client(rt, "gpt").wait_ack(client(rt, "gpt").request("resize", processes=2), timeout_s=120)
    assert back["status"] == "done" and first < back["iteration"] < ITERS, back
    assert finish(proc) == 0, finish.output  # type: ignore[attr-defined]
    launcher = json.loads((rt / "gpt" / "launcher.json").read_text())
    assert launcher["processes"] == 2 and launcher["logical_world"] == 2 and launcher["incarnation"] == 2
    assert launcher["deterministic"] is True
    started = [e for e in client(rt, "gpt").events() if e["event"] == "started"]
    assert [e["layout"] for e in started] == [[[0], [1]], [[0, 1]], [[0], [1]]]
    assert losses(work / "loss.jsonl") == deterministic_baseline  # bit for bit, across both resizes
    assert sorted(deterministic_baseline) == list(range(1, ITERS + 1))
