"""The control channel: requests, acks, status and events between a scheduler and a live job."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
import torch._dynamo  # noqa: F401 - DDP imports it lazily (seconds): once here, not in every forked job
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from loom.runtime import store
from loom.runtime.control import (
    ACTIONS,
    ControlChannel,
    ControlClient,
    write_json_atomic,
)
from loom.runtime.errors import (
    ControlError,
    ControlTimeout,
    RequestFailed,
    UnknownJobError,
)
from loom.runtime.testing import LocalJob, run_local, tiny_job

STATUS_FIELDS = {"job_id", "state", "iteration", "logical_world", "processes", "iterations_per_s",
                 "samples_per_s", "loss", "last_checkpoint", "updated"}


def job_env(tmp_path: Path, job: str = "job", **extra: str) -> dict[str, str]:
    return {"LOOM_RUNTIME_DIR": str(tmp_path / "rt"), "LOOM_JOB_ID": job,
            "LOOM_CONTROL_POLL_S": "0", **extra}


def start(tmp_path: Path, fn=tiny_job, epochs: int = 12, sleep_s: float = 0.03, **extra: str):
    """A running job and a client for it (returned once the job logged its first iteration)."""
    log = str(tmp_path / "log")
    job = LocalJob(fn, 2, job_env(tmp_path, **extra), args=(log, epochs, sleep_s)).start()
    deadline = time.monotonic() + 60
    while not (os.path.exists(f"{log}.0") and os.path.getsize(f"{log}.0")):
        assert time.monotonic() < deadline, "the job never started"
        time.sleep(0.005)
    return job, ControlClient(tmp_path / "rt", "job")


def test_unknown_job_or_runtime_dir_is_a_clear_error(tmp_path):
    with pytest.raises(UnknownJobError, match="runtime directory does not exist"):
        ControlClient(tmp_path / "missing", "job")
    (tmp_path / "rt" / "other").mkdir(parents=True)
    with pytest.raises(UnknownJobError, match=r"unknown job 'job': no directory .*rt/job"):
        ControlClient(tmp_path / "rt", "job")
    (tmp_path / "rt" / "job").mkdir()
    client = ControlClient(tmp_path / "rt", "job")
    with pytest.raises(ControlError, match="no status.json.*loom.runtime.wrap"):
        client.status()
    with pytest.raises(ControlTimeout, match="no answer to request 1 .*state: unknown"):
        client.wait_ack(client.request("stop"), timeout_s=0.2)
    with pytest.raises(ControlError, match="JSON"):
        client.request("resize", processes=object())


def test_requests_to_a_running_job_then_migrate(tmp_path):
    job, client = start(tmp_path)
    with pytest.raises(RequestFailed, match="unknown action 'explode'; known actions: checkpoint"):
        client.wait_ack(client.request("explode"), timeout_s=30)
    seq = client.request("checkpoint") + 1
    write_json_atomic(client.files.request(seq), {"seq": seq, "action": "stop", "args": [1]})
    with pytest.raises(RequestFailed, match="'args' must be a JSON object"):
        client.wait_ack(seq, timeout_s=30)
    ack = client.wait_ack(seq - 1, timeout_s=30)  # the checkpoint asked for just before
    assert ack["status"] == "done" and ack["action"] == "checkpoint" and ack["reason"] is None
    assert store.validate(Path(ack["checkpoint"])).iteration == ack["iteration"] > 0
    with pytest.raises(RequestFailed, match="cannot resize to 5 processes: the job has 2 logical"):
        client.wait_ack(client.request("resize", processes=5), timeout_s=30)
    with pytest.raises(RequestFailed, match="whole number"):
        client.wait_ack(client.request("resize", processes="two"), timeout_s=30)
    status = client.status()
    assert STATUS_FIELDS <= set(status) and status["state"] in ("running", "checkpointing")
    assert status["logical_world"] == status["processes"] == 2 and status["job_id"] == "job"
    migrate = client.wait_ack(client.request("migrate", to="node-b"), timeout_s=30)
    assert [r.exitcode for r in job.join(60)] == [0, 0]
    assert migrate["status"] == "done" and migrate["iteration"] > ack["iteration"]
    status = client.status()
    assert status["state"] == "stopped" and status["last_checkpoint"] == migrate["checkpoint"]
    assert status["iteration"] == migrate["iteration"] and isinstance(status["loss"], float)
    events = client.events()
    kinds = [e["event"] for e in events]
    assert kinds[0] == "started" and kinds[-1] == "stopped"
    assert events[-1]["action"] == "migrate" and events[-1]["args"] == {"to": "node-b"}
    assert kinds.count("request_rejected") == 4 and "checkpoint" in kinds


def test_resize_stops_at_a_durable_checkpoint_and_restart_continues(tmp_path):
    job, client = start(tmp_path, LOOM_CHECKPOINT_MODE="async", LOOM_CHECKPOINT_INTERVAL="2")
    ack = client.wait_ack(client.request("resize", processes=1), timeout_s=30)
    assert [r.exitcode for r in job.join(60)] == [0, 0]
    assert store.latest_complete(Path(ack["checkpoint"]).parent).path == Path(ack["checkpoint"])
    assert next(e for e in client.events() if e["event"] == "stopped")["args"] == {"processes": 1}
    results = run_local(tiny_job, 2, job_env(tmp_path), args=(str(tmp_path / "log"), 1))
    assert [r.exitcode for r in results] == [0, 0]  # one epoch fewer than was started: finishes
    resumed = [e for e in client.events() if e["event"] == "resumed"]
    assert resumed[-1]["checkpoint"] == ack["checkpoint"] and client.status()["state"] == "finished"


def failing_second_save(log: str, epochs: int, sleep_s: float) -> None:
    """tiny_job, except that rank 1 cannot write the second checkpoint (a full disk, say)."""
    original, calls = dcp.FileSystemWriter.write_data, []

    def write_data(self, plan, planner):
        calls.append(1)
        if dist.get_rank() == 1 and len(calls) == 2:
            raise OSError(28, "No space left on device")
        return original(self, plan, planner)

    dcp.FileSystemWriter.write_data = write_data
    tiny_job(log, epochs, sleep_s)


def test_a_failed_stop_checkpoint_keeps_the_job_and_the_last_checkpoint(tmp_path):
    job, client = start(tmp_path, failing_second_save, LOOM_CHECKPOINT_MODE="sync")
    first = client.wait_ack(client.request("checkpoint"), timeout_s=30)
    with pytest.raises(RequestFailed, match="checkpoint failed: rank 1: OSError.*No space left"):
        client.wait_ack(client.request("stop"), timeout_s=30)
    assert client.status()["state"] in ("running", "checkpointing")
    directory = Path(first["checkpoint"]).parent
    assert [i.path for i in store.complete(directory)] == [Path(first["checkpoint"])]
    assert not any(p.name.endswith(".partial") for p in directory.iterdir())
    stop = client.wait_ack(client.request("stop"), timeout_s=30)
    assert [r.exitcode for r in job.join(60)] == [0, 0]
    assert stop["iteration"] > first["iteration"]
    assert "checkpoint_failed" in [e["event"] for e in client.events()]


def test_requests_after_the_job_finished_time_out_naming_the_state(tmp_path):
    assert [r.exitcode for r in run_local(tiny_job, 2, job_env(tmp_path), args=(str(tmp_path / "l"), 1))] == [0, 0]
    client = ControlClient(tmp_path / "rt", "job")
    assert client.status()["state"] == "finished" and client.status()["iteration"] == 12
    with pytest.raises(ControlTimeout, match="state: finished"):
        client.wait_ack(client.request("checkpoint"), timeout_s=0.2)


def test_channel_answers_malformed_files_and_skips_answered_ones(tmp_path):
    channel = ControlChannel(tmp_path / "job", "job")
    client = ControlClient(tmp_path, "job")
    requests = channel.files.requests
    (requests / "00000001.json").write_text("{not json")
    (requests / "00000002.json").write_text(json.dumps({"seq": 7, "action": "stop"}))
    (requests / "00000003.json").write_text(json.dumps(["stop"]))
    (requests / "00000004.json").write_text(json.dumps({"seq": 4, "action": "stop", "time": "now"}))
    (requests / "notes.txt").write_text("ignored")
    good = client.request("checkpoint", reason="test")
    assert [(r.seq, r.action, r.args) for r in channel.poll(3)] == [(5, "checkpoint", {"reason": "test"})]
    assert good == 5 and channel.poll(4) == []
    reasons = {seq: client.ack(seq)["reason"] for seq in range(1, 5)}
    assert "not JSON" in reasons[1] and "file name says 2" in reasons[2]
    assert "not a JSON object" in reasons[3] and "'time' must be a number" in reasons[4]
    assert all(client.ack(seq)["status"] == "failed" and client.ack(seq)["iteration"] == 3
               for seq in range(1, 5))
    restarted = ControlChannel(tmp_path / "job", "job")  # a new incarnation of the job
    assert [r.seq for r in restarted.poll(0)] == [5]  # answered requests are not served again
    assert client.ack(5) is None and set(ACTIONS) == {"checkpoint", "stop", "migrate", "resize"}


def test_background_status_writes_never_replace_a_newer_status(tmp_path):
    channel = ControlChannel(tmp_path / "job", "job")
    for i in range(200):
        channel.write_status({"iteration": i}, background=True)
    channel.write_status({"iteration": 200, "state": "stopped"})  # a state change: written at once
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # whatever the writer thread still had in hand must not win
        time.sleep(0.05)
        assert json.loads(channel.files.status.read_text()) == {"iteration": 200, "state": "stopped"}
        if channel._status_pending is None:
            break
    for i in range(201, 260):
        channel.write_status({"iteration": i}, background=True)
    deadline = time.monotonic() + 10
    while json.loads(channel.files.status.read_text()) != {"iteration": 259}:
        assert time.monotonic() < deadline, "the newest background status was never written"
        time.sleep(0.02)
