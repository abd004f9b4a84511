"""Consistent DCP checkpoints: bit-identical resume, durability, dedup, resharding, errors.

Jobs are `loom.runtime.testing.tiny_job` (a DDP script with the one-line opt-in) run
as forked gloo process sets; stops go through `ControlClient` like a scheduler's.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
import time
from pathlib import Path

import pytest
import torch
import torch._dynamo  # DDP imports it lazily (seconds): once here, not in every forked job
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from loom.runtime import store
from loom.runtime.control import ControlClient
from loom.runtime.dedup import ContentDedupSavePlanner
from loom.runtime.errors import (
    CheckpointError,
    CorruptCheckpointError,
    PartialCheckpointError,
)
from loom.runtime.testing import LocalJob, read_losses, run_local, tiny_job


def job_env(tmp_path: Path, job: str, **extra: str) -> dict[str, str]:
    return {"LOOM_RUNTIME_DIR": str(tmp_path / "rt"), "LOOM_JOB_ID": job,
            "LOOM_CONTROL_POLL_S": "0", **extra}


def ok(results) -> None:
    assert [r.exitcode for r in results] == [0] * len(results), results


def wait_for_lines(path: str, count: int, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if os.path.exists(path) and len(Path(path).read_text().splitlines()) >= count:
            return
        time.sleep(0.005)
    raise AssertionError(f"{path} never reached {count} lines")


def stop_at(tmp_path: Path, job_id: str, env: dict, log: str, at: int, sleep_s: float = 0.02,
            processes: int = 2) -> dict:
    """Run a job and stop it through the control channel once rank 0 logged `at` iterations."""
    job = LocalJob(tiny_job, processes, env, args=(log, 3, sleep_s)).start()
    wait_for_lines(f"{log}.0", at)
    client = ControlClient(tmp_path / "rt", job_id)
    ack = client.wait_ack(client.request("stop"), timeout_s=60)
    ok(job.join(60))
    assert client.status()["state"] == "stopped"
    assert store.validate(Path(ack["checkpoint"])).iteration == ack["iteration"]
    return ack


def reference(tmp_path: Path, processes: int = 2) -> list[list]:
    log = str(tmp_path / "ref")
    ok(run_local(tiny_job, processes, job_env(tmp_path, "ref"), args=(log, 3)))
    return [read_losses(f"{log}.{r}") for r in range(processes)]


@pytest.mark.parametrize("processes,mode", [(2, "sync"), (2, "async"), (3, "async")])
def test_stopped_and_resumed_three_times_is_bit_identical(tmp_path, processes, mode):
    iterations = 3 * 96 // (processes * 4)  # tiny_job: 3 epochs of 96 samples, batch 4
    expected = reference(tmp_path, processes)
    assert [i for i, _, _ in expected[0]] == list(range(1, iterations + 1))
    env = job_env(tmp_path, "job", LOOM_CHECKPOINT_MODE=mode, LOOM_CHECKPOINT_INTERVAL="5")
    log = str(tmp_path / "cut")
    cuts = sorted(random.Random(f"cuts-{processes}-{mode}").sample(range(3, iterations - 10), 3))
    acks = [stop_at(tmp_path, "job", env, log, at, processes=processes) for at in cuts]
    ok(run_local(tiny_job, processes, env, args=(log, 3)))
    for rank in range(processes):
        assert read_losses(f"{log}.{rank}") == expected[rank]  # every float exactly, epochs aligned
    stopped_at = [a["iteration"] for a in acks]
    assert stopped_at == sorted(set(stopped_at)) and all(s >= at for s, at in zip(stopped_at, cuts))
    assert all(a["status"] == "done" for a in acks)
    assert ControlClient(tmp_path / "rt", "job").status()["state"] == "finished"


def crash_in_commit_at(at_iteration: int):
    """A tiny_job whose rank 0 dies while DCP finishes the checkpoint of `at_iteration`."""
    def job(log: str) -> None:
        import loom.runtime
        original = dcp.FileSystemWriter.finish

        def finish(self, metadata, results):
            if dist.get_rank() == 0 and loom.runtime.current().iteration == at_iteration:
                os._exit(9)
            return original(self, metadata, results)

        dcp.FileSystemWriter.finish = finish
        tiny_job(log, 3)
    return job


def test_a_save_killed_midway_is_never_loaded(tmp_path):
    expected = reference(tmp_path)
    env = job_env(tmp_path, "job", LOOM_CHECKPOINT_MODE="sync", LOOM_CHECKPOINT_INTERVAL="5")
    log = str(tmp_path / "crash")
    results = run_local(crash_in_commit_at(10), 2, env, args=(log,))
    assert results[0].exitcode == 9
    ckpts = tmp_path / "rt" / "job" / "checkpoints"
    partial = [p for p in ckpts.iterdir() if p.name.endswith(".partial")]
    assert len(partial) == 1 and "it00000010" in partial[0].name
    with pytest.raises(PartialCheckpointError, match="partial"):
        store.validate(partial[0])
    assert store.latest_complete(ckpts).iteration == 5
    ok(run_local(tiny_job, 2, env, args=(str(tmp_path / "after"), 3)))  # auto-resumes from 5
    after = read_losses(str(tmp_path / "after") + ".0")
    assert after[0][0] == 6 and after == expected[0][5:]
    assert not any(p.name.endswith(".partial") for p in ckpts.iterdir())


def test_removed_commit_marker_and_corruption_are_skipped_or_named(tmp_path, caplog):
    env = job_env(tmp_path, "job", LOOM_CHECKPOINT_MODE="sync", LOOM_CHECKPOINT_INTERVAL="4",
                  LOOM_CHECKPOINT_KEEP="5")
    ok(run_local(tiny_job, 2, env, args=(str(tmp_path / "a"), 1)))  # 12 iterations: 3 checkpoints
    ckpts = tmp_path / "rt" / "job" / "checkpoints"
    infos = store.complete(ckpts)
    assert [i.iteration for i in infos] == [4, 8, 12]
    (infos[-1].path / store.COMMIT).unlink()  # the newest loses its commit marker
    data = next(p for p in infos[-2].path.iterdir() if p.suffix == ".distcp" and p.stat().st_size)
    data.write_bytes(data.read_bytes()[:-7])  # the next one is truncated
    with caplog.at_level("WARNING", logger="loom.runtime"):
        assert store.latest_complete(ckpts).iteration == 4
    assert "partial" in caplog.text and "corrupt" in caplog.text and data.name in caplog.text
    with pytest.raises(CorruptCheckpointError, match=f"{infos[-2].path}.*{data.name}"):
        store.validate(infos[-2].path)
    (infos[0].path / ".metadata").write_bytes(b"not a pickle")
    with pytest.raises(CorruptCheckpointError, match="metadata"):
        store.validate(infos[0].path)
    results = run_local(tiny_job, 2, {**env, "LOOM_RESUME": str(infos[-2].path)},
                        args=(str(tmp_path / "b"), 1))
    assert [r.exitcode for r in results] == [1, 1]
    assert all("corrupt" in r.error and str(infos[-2].path) in r.error for r in results)
    status = ControlClient(tmp_path / "rt", "job").status()
    assert status["state"] == "failed" and "corrupt" in status["error"]


def test_missing_and_unwritable_checkpoint_dirs_are_named(tmp_path):
    missing = tmp_path / "nowhere"
    env = job_env(tmp_path, "job", LOOM_CHECKPOINT_DIR=str(missing))
    results = run_local(tiny_job, 2, env, args=(str(tmp_path / "log"), 1))
    assert [r.exitcode for r in results] == [1, 1]
    assert all("does not exist" in r.error and str(missing) in r.error for r in results)
    not_dir = tmp_path / "file"
    not_dir.write_text("x")
    with pytest.raises(CheckpointError, match="not a directory"):
        store.prepare_dir(not_dir, explicit=True)
    assert "not writable" in _prepare_read_only_dir()


def _prepare_read_only_dir() -> str:
    """prepare_dir on a mode-555 directory, as an unprivileged user (root ignores the mode)."""
    base = Path(tempfile.mkdtemp(prefix="loom-ro-"))
    try:
        target = base / "ckpt"
        target.mkdir()
        os.chmod(base, 0o755)
        os.chmod(target, 0o555)
        reader, writer = os.pipe()
        pid = os.fork()
        if pid == 0:
            message = "no error"
            try:
                if os.geteuid() == 0:
                    os.setgid(65534)
                    os.setuid(65534)
                store.prepare_dir(target, explicit=True)
            except CheckpointError as exc:
                message = str(exc)
            os.write(writer, message.encode())
            os._exit(0)
        os.close(writer)
        os.waitpid(pid, 0)
        return os.read(reader, 4096).decode()
    finally:
        os.chmod(base / "ckpt", 0o755)
        shutil.rmtree(base)


def replicas(directory: str, layout: str) -> None:
    """Save a 256 KiB tensor both ranks hold: under one key (`dcp-default` planner or `loom`'s),
    under a key per rank (`per-rank`), or with Loom's planner plus a key whose value differs
    between the ranks (`diverged`)."""
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    state = {"w": torch.randn(256, 256)}
    if layout == "per-rank":
        state = {f"w{rank}": state["w"]}
    if layout == "diverged":
        state["r"] = torch.full((4,), float(rank))
    planner = None if layout == "dcp-default" else ContentDedupSavePlanner()
    try:
        dcp.save(state, storage_writer=dcp.FileSystemWriter(directory), planner=planner)
    except BaseException as exc:  # noqa: BLE001 - CheckpointException is a BaseException
        Path(directory, f"error.{rank}").write_text(str(exc))
    dist.destroy_process_group()


def diverged_default(directory: str) -> None:
    """DCP's default planner with a key whose value differs per rank: what each rank loads back."""
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    dcp.save({"r": torch.full((4,), float(rank))}, storage_writer=dcp.FileSystemWriter(directory))
    back = {"r": torch.zeros(4)}
    dcp.load(back, storage_reader=dcp.FileSystemReader(directory))
    Path(directory, f"loaded.{rank}").write_text(str(back["r"][0].item()))
    dist.destroy_process_group()


def _distcp_bytes(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.glob("*.distcp"))


def test_replicas_are_written_once_and_diverged_replicas_refused(tmp_path):
    sizes = {}
    for layout in ("per-rank", "dcp-default", "loom"):
        ok(run_local(replicas, 2, args=(str(tmp_path / layout), layout)))
        sizes[layout] = _distcp_bytes(tmp_path / layout)
    replica = 256 * 256 * 4
    assert sizes["per-rank"] >= 2 * replica  # every rank its own copy: DP degree x the state
    assert replica <= sizes["loom"] < 1.1 * replica  # dedup: one copy, ~2x fewer bytes
    assert sizes["dcp-default"] == sizes["loom"]  # DCP's default already keeps one copy by name
    ok(run_local(diverged_default, 2, args=(str(tmp_path / "default-diverged"),)))
    loaded = {Path(tmp_path / "default-diverged", f"loaded.{r}").read_text() for r in range(2)}
    assert len(loaded) == 1, "DCP's default keeps one rank's value and every rank loads it"
    ok(run_local(replicas, 2, args=(str(tmp_path / "diverged"), "diverged")))
    errors = [Path(tmp_path / "diverged", f"error.{r}").read_text() for r in range(2)]
    assert all("different contents under 'r'" in e for e in errors)


def resume_probe(out: str) -> None:
    """Build tiny_job's objects, wrap (resuming), dump what was restored, exit."""
    import loom.runtime

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(123)  # different from tiny_job: anything not restored would show
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Sequential(
        torch.nn.Linear(8, 16), torch.nn.Dropout(0.1), torch.nn.ReLU(), torch.nn.Linear(16, 1)))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=5, gamma=0.9)
    g = torch.Generator().manual_seed(1)
    dataset = torch.utils.data.TensorDataset(torch.arange(96).float().unsqueeze(1).expand(96, 8),
                                             torch.randn(96, 1, generator=g))
    loader = torch.utils.data.DataLoader(dataset, batch_size=4, shuffle=True)
    model, optimizer, loader = loom.runtime.wrap(model, optimizer, loader, lr_scheduler=scheduler)
    runtime = loom.runtime.current()
    epochs = [[int(v) for x, _ in loader for v in x[:, 0]] for _ in range(2)]  # the rest of the epoch, then one more
    torch.save({"params": [p.detach().clone() for p in model.parameters()],
                "step": [float(s["step"]) for s in optimizer.state.values()],
                "lr": scheduler.get_last_lr(), "iteration": runtime.iteration,
                "logical_world": runtime.logical_world, "epochs": epochs}, f"{out}.{rank}")
    dist.destroy_process_group()


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")  # the test reads the checkpoint alone
@pytest.mark.parametrize("processes", [1, 3])
def test_resume_on_another_process_count_reshards(tmp_path, processes):
    env = job_env(tmp_path, "job", LOOM_CHECKPOINT_MODE="sync")
    ack = stop_at(tmp_path, "job", env, str(tmp_path / "log"), 5, sleep_s=0.05)
    ckpt = Path(ack["checkpoint"])
    ok(run_local(resume_probe, processes, env, args=(str(tmp_path / "probe"),)))
    probes = [torch.load(f"{tmp_path / 'probe'}.{r}") for r in range(processes)]
    saved = _saved_model(ckpt)
    for probe in probes:
        assert probe["iteration"] == ack["iteration"] and probe["logical_world"] == processes
        assert all(torch.equal(a, b) for a, b in zip(probe["params"], saved))
        assert probe["step"] == [float(ack["iteration"])] * 4
    per_epoch = 96 // 2 // 4  # batches per rank per epoch before the stop
    consumed = ack["iteration"] * 4 * 2  # samples of epoch 0 both ranks took
    assert ack["iteration"] < per_epoch
    rest = sorted(i for probe in probes for batch in [probe["epochs"][0]] for i in batch)
    order = torch.randperm(96, generator=torch.Generator().manual_seed(_seed(ckpt))).tolist()
    padded = (order[consumed:] + order)[: -(-(96 - consumed) // processes) * processes]
    assert rest == sorted(padded), "the rest of the epoch: no sample lost or repeated"


def _saved_model(ckpt: Path) -> list[torch.Tensor]:
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Dropout(0.1), torch.nn.ReLU(),
                                torch.nn.Linear(16, 1))
    state = {"model": model.state_dict()}
    dcp.load(state, storage_reader=dcp.FileSystemReader(str(ckpt)), no_dist=True)
    return [state["model"][k] for k in ("0.weight", "0.bias", "3.weight", "3.bias")]


def _seed(ckpt: Path) -> int:
    import pickle

    state = {"logical": {"0": b""}}
    dcp.load(state, storage_reader=dcp.FileSystemReader(str(ckpt)), no_dist=True)
    return pickle.loads(state["logical"]["0"])["data"]["seed"]


def test_retention_keeps_the_newest_and_never_the_only_one(tmp_path):
    env = job_env(tmp_path, "job", LOOM_CHECKPOINT_MODE="async", LOOM_CHECKPOINT_INTERVAL="3",
                  LOOM_CHECKPOINT_KEEP="2")
    ok(run_local(tiny_job, 2, env, args=(str(tmp_path / "log"), 1)))
    ckpts = tmp_path / "rt" / "job" / "checkpoints"
    assert [i.iteration for i in store.complete(ckpts)] == [9, 12]
    assert sorted(p.name for p in ckpts.iterdir()) == [i.path.name for i in store.complete(ckpts)]
    marker = json.loads((store.complete(ckpts)[-1].path / store.COMMIT).read_text())
    assert marker["logical_world"] == 2 and marker["processes"] == 2 and ".metadata" in marker["files"]
    newest = store.complete(ckpts)[-1].path
    assert newest not in store.retain(ckpts, keep=0)  # keep is at least 1
    assert [i.path for i in store.complete(ckpts)] == [newest]
