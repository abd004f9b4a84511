"""`loom run` and `loom control`: options, bad input, the supervisor's restarts, working-directory tracking.

The supervisor tests replace torchrun by a fake incarnation that plays the
runtime's part of the control channel (acks, status), so they run in
milliseconds; tests/test_runtime_migrate.py runs the real thing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from loom.cli.main import app
from loom.errors import LoomInputError
from loom.runtime import workdir as wd
from loom.runtime.launch import (
    Incarnation,
    LaunchSpec,
    Supervisor,
    acks,
    agent_command,
    job_env,
    validated,
    write_json_atomic,
)

CONTRACT_ENV = ("LOOM_JOB_ID", "LOOM_RUNTIME_DIR", "LOOM_LOGICAL_WORLD", "LOOM_CHECKPOINT_DIR",
                "LOOM_CHECKPOINT_INTERVAL", "LOOM_CHECKPOINT_MODE", "LOOM_RESUME", "LOOM_WORKDIR")


def loom(*argv: str) -> subprocess.CompletedProcess[str]:
    """`loom` in a real process (slow on a busy machine: it imports torch)."""
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "loom.cli.main", *argv], capture_output=True, text=True,
                          env=env, timeout=300, check=False)


def loom_here(*argv: str) -> subprocess.CompletedProcess[str]:
    """`loom` in this process (CliRunner), as a CompletedProcess."""
    res = CliRunner().invoke(app, list(argv), terminal_width=200)
    return subprocess.CompletedProcess(argv, res.exit_code, res.stdout, res.stderr)


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "train.py"
    path.write_text("print('hello')\n")
    return path


def test_help_documents_the_control_channel() -> None:
    out = CliRunner().invoke(app, ["run", "--help"], terminal_width=120).output
    for text in ("control/requests/SEQ.json", "control/acks/SEQ.json", "status.json", "events.jsonl",
                 "checkpoint", "stop", "migrate", "resize", "--logical-world", "--checkpoint-mode",
                 "LOOM_RESUME", "finished"):
        assert text in out, text


def test_defaults_fill_in_the_contract(script: Path, tmp_path: Path) -> None:
    spec = validated(LaunchSpec(script=script, runtime_dir=tmp_path / "rt", nproc=2, workdir=tmp_path / "w"))
    assert spec.logical_world == 2 and spec.job_id.startswith("train-")
    assert spec.ckpt_dir == tmp_path / "rt" / spec.job_id / "checkpoints"
    env = job_env(spec, _inc(spec), base={})
    assert set(CONTRACT_ENV) <= set(env)
    assert env["LOOM_LOGICAL_WORLD"] == "2" and env["LOOM_CHECKPOINT_MODE"] == "sync" and env["LOOM_RESUME"] == ""
    assert env["LOOM_WORKDIR"] == str(tmp_path / "w") and env["LOOM_CHECKPOINT_INTERVAL"] == "0"
    assert env["MKL_CBWR"] == "AUTO,STRICT"  # bit-identical resumes on CPU
    assert job_env(spec, _inc(spec), base={"MKL_CBWR": "COMPATIBLE"})["MKL_CBWR"] == "COMPATIBLE"


def test_deterministic_mode_reaches_every_process(script: Path, tmp_path: Path) -> None:
    spec = validated(LaunchSpec(script=script, runtime_dir=tmp_path / "rt", nproc=1, logical_world=2,
                                deterministic=True))
    env = job_env(spec, _inc(spec), base={})
    assert env["LOOM_DETERMINISTIC"] == "1" and env["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    plain = validated(LaunchSpec(script=script, runtime_dir=tmp_path / "rt", nproc=1))
    assert "LOOM_DETERMINISTIC" not in job_env(plain, _inc(plain), base={})
    help_text = CliRunner().invoke(app, ["run", "--help"], terminal_width=120).output
    assert "--deterministic" in help_text and "LOOM_DETERMINISTIC" in help_text


def test_the_agent_is_torchrun_on_loopback(script: Path, tmp_path: Path) -> None:
    spec = validated(LaunchSpec(script=script, script_args=("--iters", "3"), job_id="j", runtime_dir=tmp_path,
                                nproc=3, logical_world=6))
    cmd = agent_command(spec, _inc(spec), 29999)
    assert cmd[1:3] == ["-m", "loom.runtime.launch"]
    assert ["--nproc-per-node", "3"] == cmd[cmd.index("--nproc-per-node"):][:2]
    assert "127.0.0.1:29999" in cmd and cmd[-3:] == [str(script), "--iters", "3"]


@pytest.mark.parametrize(("argv", "message"), [
    (["--nproc", "3", "--logical-world", "2"], "3 processes for 2 logical ranks: cannot run (or resize to) more"),
    (["--nproc", "0"], "0 processes: a job needs at least one"),
    (["--checkpoint-mode", "lazy"], "unknown checkpoint mode 'lazy': use sync or async"),
    (["--checkpoint-interval", "-5"], "-5 is negative"),
    (["--resume", "/nonexistent/ckpt"], "checkpoint /nonexistent/ckpt does not exist"),
    (["--resume", "latest"], "--resume latest: no complete checkpoint in"),
    (["--job-id", "../escape"], "'../escape' is not a job id"),
    (["--checkpoint-dir", "/nonexistent/ckpt"], "checkpoint directory /nonexistent/ckpt does not exist"),
])
def test_bad_run_options_give_one_line(argv: list[str], message: str, script: Path, tmp_path: Path) -> None:
    res = loom_here("run", "--runtime-dir", str(tmp_path / "rt"), *argv, str(script))
    _one_error_line(res, message)
    assert not (tmp_path / "rt").exists()  # nothing started, nothing created


def test_a_partial_checkpoint_is_refused(script: Path, tmp_path: Path) -> None:
    partial = tmp_path / "ckpt-000001-it00000010.partial"
    partial.mkdir()
    res = loom_here("run", "--runtime-dir", str(tmp_path / "rt"), "--resume", str(partial), str(script))
    _one_error_line(res, "checkpoint is partial (never committed")


def test_missing_script_gives_one_line_from_a_real_process(tmp_path: Path) -> None:
    _one_error_line(loom("run", "--runtime-dir", str(tmp_path), str(tmp_path / "nope.py")),
                    f"training script {tmp_path / 'nope.py'} does not exist")


def test_control_request_for_an_unknown_job(tmp_path: Path) -> None:
    (tmp_path / "gpt-1").mkdir()
    _one_error_line(loom_here("control", "stop", "gpt-2", "--runtime-dir", str(tmp_path)),
                    "unknown job 'gpt-2'")


@pytest.mark.parametrize(("argv", "message"), [
    (["resize", "j", "--processes", "3"], "3 processes for 2 logical ranks"),
    (["resize", "j"], "resize needs --processes M"),
    (["stop", "j", "--workdir", "/tmp/x"], "only migrate takes a working directory"),
    (["halt", "j"], "unknown action 'halt'"),
])
def test_bad_control_requests_are_refused_before_sending(argv: list[str], message: str, tmp_path: Path) -> None:
    (tmp_path / "j" / "control" / "requests").mkdir(parents=True)
    write_json_atomic(tmp_path / "j" / "status.json", {"job_id": "j", "state": "running", "logical_world": 2})
    _one_error_line(loom_here("control", *argv, "--runtime-dir", str(tmp_path)), message)
    assert not list((tmp_path / "j" / "control" / "requests").iterdir())


def _one_error_line(res: subprocess.CompletedProcess[str], message: str) -> None:
    assert res.returncode == 2, res.stderr
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), res.stderr
    assert message in lines[0] and "Traceback" not in res.stderr + res.stdout


# --- the supervisor, with a fake torchrun --------------------------------------------------------------

Playbook = Callable[[int, Path, dict[str, str]], int]  # incarnation number, workdir, env -> exit code


class FakeRun(Supervisor):
    """A supervisor whose incarnations are Python callables playing the job and its runtime."""

    def __init__(self, spec: LaunchSpec, incarnations: list[Playbook]) -> None:
        super().__init__(spec, log=open(os.devnull, "w"))  # noqa: SIM115 - lives as long as the test
        self.incarnations = incarnations
        self.started: list[dict[str, str]] = []

    def run_agent(self, cmd: list[str], cwd: Path, env: dict[str, str]) -> int:
        self.started.append({**env, "cwd": str(cwd), "nproc": cmd[cmd.index("--nproc-per-node") + 1]})
        return self.incarnations[len(self.started) - 1](len(self.started) - 1, cwd, env)


def _runtime_stops(action: str, args: dict[str, object], job_dir: Path, seq: int = 1) -> None:
    """What the scheduler and the runtime write: a request, its `done` ack, state "stopped"."""
    write_json_atomic(job_dir / "control" / "requests" / f"{seq:08d}.json",
                      {"seq": seq, "action": action, "args": args, "time": 0.0})
    write_json_atomic(job_dir / "control" / "acks" / f"{seq:08d}.json",
                      {"seq": seq, "status": "done", "reason": "", "checkpoint": "ckpt-7", "iteration": 7})
    write_json_atomic(job_dir / "status.json", {"job_id": job_dir.name, "state": "stopped", "iteration": 7})


def _finishes(_n: int, cwd: Path, env: dict[str, str]) -> int:
    job_dir = Path(env["LOOM_RUNTIME_DIR"]) / env["LOOM_JOB_ID"]
    write_json_atomic(job_dir / "status.json", {"job_id": env["LOOM_JOB_ID"], "state": "finished"})
    (cwd / "loss.jsonl").open("a").write('{"iteration": 8}\n')
    return 0


@pytest.fixture
def spec(script: Path, tmp_path: Path) -> LaunchSpec:
    (tmp_path / "node-a" / "ckpt").mkdir(parents=True)
    return validated(LaunchSpec(script=script, job_id="j", runtime_dir=tmp_path / "rt", nproc=2, logical_world=4,
                                workdir=tmp_path / "node-a", checkpoint_dir=tmp_path / "node-a" / "ckpt"))


def test_migrate_restarts_in_the_new_workdir_with_the_files(spec: LaunchSpec, tmp_path: Path) -> None:
    target = tmp_path / "node-b"

    def before(_n: int, cwd: Path, env: dict[str, str]) -> int:
        (cwd / "loss.jsonl").write_text('{"iteration": 0}\n')
        (cwd / "logs").mkdir()
        (cwd / "logs" / "notes.bin").write_bytes(bytes(range(256)))
        (cwd / "ckpt" / "big").write_text("stays on shared storage")
        _runtime_stops("migrate", {"workdir": str(target)}, spec.job_dir)
        return 0

    sup = FakeRun(spec, [before, _finishes])
    assert sup.run() == 0
    first, second = sup.started
    assert first["LOOM_RESUME"] == "" and second["LOOM_RESUME"] == "latest"
    assert second["cwd"] == second["LOOM_WORKDIR"] == str(target) and second["nproc"] == "2"
    assert second["LOOM_LOGICAL_WORLD"] == "4" and second["LOOM_CHECKPOINT_DIR"] == str(spec.ckpt_dir)
    assert (target / "logs" / "notes.bin").read_bytes() == bytes(range(256))
    assert (target / "loss.jsonl").read_text() == '{"iteration": 0}\n{"iteration": 8}\n'
    assert not (target / "ckpt").exists()  # the checkpoint directory never travels
    launcher = json.loads((spec.job_dir / "launcher.json").read_text())
    assert launcher["workdir"] == str(target) and launcher["incarnation"] == 1 and launcher["exit_code"] == 0
    events = [json.loads(line)["event"] for line in (spec.job_dir / "events.jsonl").read_text().splitlines()]
    assert events == ["launch", "exit", "files_moved", "restart", "launch", "exit"]


def test_migrate_without_a_workdir_gets_one_under_the_job(spec: LaunchSpec) -> None:
    sup = FakeRun(spec, [lambda n, cwd, env: _runtime_stops("migrate", {}, spec.job_dir) or 0, _finishes])
    assert sup.run() == 0
    assert sup.started[1]["cwd"] == str(spec.job_dir / "workdirs" / "1")


def test_resize_restarts_at_the_new_size_keeping_the_logical_world(spec: LaunchSpec) -> None:
    sup = FakeRun(spec, [lambda n, cwd, env: _runtime_stops("resize", {"processes": 3}, spec.job_dir) or 0,
                         _finishes])
    assert sup.run() == 0
    assert [s["nproc"] for s in sup.started] == ["2", "3"]
    assert sup.started[1]["LOOM_LOGICAL_WORLD"] == "4" and sup.started[1]["cwd"] == str(spec.workdir)


def test_resize_beyond_the_logical_world_leaves_the_job_stopped(spec: LaunchSpec) -> None:
    sup = FakeRun(spec, [lambda n, cwd, env: _runtime_stops("resize", {"processes": 5}, spec.job_dir) or 0])
    sup.log = out = _Capture()
    assert sup.run() == 1 and len(sup.started) == 1
    assert "cannot resize job j: 5 processes for 4 logical ranks" in out.text and "--resume latest" in out.text
    assert json.loads((spec.job_dir / "status.json").read_text())["state"] == "failed"


def test_migrate_into_a_non_empty_directory_is_refused(spec: LaunchSpec, tmp_path: Path) -> None:
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "x").write_text("someone else's")
    sup = FakeRun(spec, [lambda n, cwd, env: _runtime_stops("migrate", {"workdir": str(tmp_path / "busy")},
                                                            spec.job_dir) or 0])
    sup.log = out = _Capture()
    assert sup.run() == 1
    assert "is not empty (migration never overwrites files)" in out.text
    assert (tmp_path / "busy" / "x").read_text() == "someone else's"


def test_stop_ends_with_zero_and_the_job_failing_keeps_its_code(spec: LaunchSpec) -> None:
    assert FakeRun(spec, [lambda n, cwd, env: _runtime_stops("stop", {}, spec.job_dir) or 0]).run() == 0
    assert FakeRun(spec, [lambda n, cwd, env: 7]).run() == 7
    assert json.loads((spec.job_dir / "status.json").read_text())["state"] == "failed"


def test_sigterm_during_a_migration_starts_nothing_more(spec: LaunchSpec) -> None:
    def stops_then_signal(_n: int, cwd: Path, env: dict[str, str]) -> int:
        _runtime_stops("migrate", {}, spec.job_dir)
        sup._forward(15, None)  # SIGTERM arrives while torchrun has already exited
        return 0

    sup = FakeRun(spec, [stops_then_signal, _finishes])
    assert sup.run() == 143 and len(sup.started) == 1


def test_requests_left_when_the_job_ends_are_answered_failed(spec: LaunchSpec) -> None:
    def ignores(_n: int, cwd: Path, env: dict[str, str]) -> int:
        write_json_atomic(spec.job_dir / "control" / "requests" / "00000003.json",
                          {"seq": 3, "action": "checkpoint", "args": {}, "time": 0.0})
        return _finishes(_n, cwd, env)

    assert FakeRun(spec, [ignores]).run() == 0
    ack = acks(spec.job_dir)[3]
    assert ack["status"] == "failed" and "ended before handling" in ack["reason"]


def test_a_second_launcher_for_a_live_job_is_refused(spec: LaunchSpec) -> None:
    spec.job_dir.mkdir(parents=True)
    write_json_atomic(spec.job_dir / "launcher.json", {"pid": os.getppid(), "ended": None})
    with pytest.raises(LoomInputError, match="job j is already running"):
        FakeRun(spec, [_finishes]).run()


class _Capture:
    def __init__(self) -> None:
        self.text = ""

    def write(self, text: str) -> None:
        self.text += text

    def flush(self) -> None:
        pass


def _inc(spec: LaunchSpec) -> Incarnation:
    return Incarnation(0, spec.workdir, spec.nproc, spec.resume)


# --- the working directory ----------------------------------------------------------------------------


def test_snapshot_sees_what_an_incarnation_wrote(tmp_path: Path) -> None:
    (tmp_path / "keep").write_text("a")
    (tmp_path / "edit").write_text("b")
    (tmp_path / "gone").write_text("c")
    (tmp_path / "ckpt").mkdir()
    before = wd.snapshot(tmp_path, [tmp_path / "ckpt"])
    (tmp_path / "edit").write_text("B")
    (tmp_path / "gone").unlink()
    (tmp_path / "new").write_text("d")
    (tmp_path / "ckpt" / "shard").write_text("e")
    after = wd.snapshot(tmp_path, [tmp_path / "ckpt"])
    assert wd.written(before, after) == {"created": ["new"], "modified": ["edit"], "deleted": ["gone"]}


def test_transfer_copies_links_and_empty_dirs_and_verifies(tmp_path: Path) -> None:
    src = tmp_path / "a"
    (src / "empty").mkdir(parents=True)
    (src / "data.txt").write_text("x" * 5000)
    (src / "link").symlink_to("data.txt")
    moved = wd.transfer(src, tmp_path / "b")
    assert set(moved) == {"data.txt", "link"}
    assert (tmp_path / "b" / "empty").is_dir() and os.readlink(tmp_path / "b" / "link") == "data.txt"
    assert {k: v.sha256 for k, v in wd.snapshot(tmp_path / "b").items()} == {k: v.sha256 for k, v in moved.items()}


@pytest.mark.parametrize("where", ["same", "inside"])
def test_transfer_refuses_the_source_itself(where: str, tmp_path: Path) -> None:
    dst = tmp_path if where == "same" else tmp_path / "sub"
    with pytest.raises(LoomInputError, match="the current one"):
        wd.transfer(tmp_path, dst)


def test_a_script_that_never_calls_the_runtime_is_named(tmp_path: Path, spec: LaunchSpec) -> None:
    sup = FakeRun(spec, [lambda n, cwd, env: 0])
    sup.log = out = _Capture()
    assert sup.run() == 0
    assert "train.py never called loom.runtime.wrap" in out.text


@pytest.mark.slow
def test_torchrun_reports_the_failing_ranks_own_exit_code(tmp_path: Path) -> None:
    job = tmp_path / "fail.py"
    job.write_text(textwrap.dedent("""
        import os, sys, time
        open(f"rank{os.environ['RANK']}-of-{os.environ['WORLD_SIZE']}", "w").write(os.environ["LOOM_JOB_ID"])
        if os.environ["RANK"] == "1":
            deadline = time.time() + 30  # fail only once rank 0 has started, or torchrun may stop it first
            while not os.path.exists("rank0-of-2") and time.time() < deadline:
                time.sleep(0.05)
            sys.exit(3)
        time.sleep(60)
    """))
    res = loom("run", "--runtime-dir", str(tmp_path / "rt"), "--job-id", "f", "--nproc", "2",
               "--workdir", str(tmp_path / "w"), str(job))
    assert res.returncode == 3, res.stderr
    assert "rank 1 exited with code 3" in res.stderr
    assert (tmp_path / "w" / "rank0-of-2").read_text() == "f" and (tmp_path / "w" / "rank1-of-2").exists()
    assert json.loads((tmp_path / "rt" / "f" / "status.json").read_text())["state"] == "failed"
