"""The training-script API: `wrap`, `current`, `report`, the resumable loader, configuration errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import torch
import torch._dynamo  # DDP imports it lazily (seconds): once here, not in every forked job
import torch.distributed as dist
from torch.utils.data import (
    DataLoader,
    DistributedSampler,
    IterableDataset,
    TensorDataset,
)

import loom.runtime
from loom.runtime.config import RuntimeConfig
from loom.runtime.control import ControlClient
from loom.runtime.data import DataPosition, ResumableLoader, shard_indices
from loom.runtime.errors import RuntimeConfigError, RuntimeUsageError
from loom.runtime.testing import read_losses, run_local, tiny_job


@pytest.fixture
def loom_env(tmp_path, monkeypatch):
    """A standalone (no torch.distributed) runtime environment in this process."""
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("LOOM_RUNTIME_DIR", str(tmp_path / "rt"))
    monkeypatch.setenv("LOOM_JOB_ID", "solo")
    monkeypatch.setenv("LOOM_CONTROL_POLL_S", "0")
    yield tmp_path
    runtime = loom.runtime._current
    if runtime is not None and not runtime.closed:
        runtime.close()


def _objects():
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(TensorDataset(torch.randn(8, 4)), batch_size=2)
    return model, optimizer, loader


def test_current_and_report_before_wrap_say_what_to_do(monkeypatch):
    monkeypatch.setattr(loom.runtime, "_current", None)
    with pytest.raises(RuntimeUsageError, match=r"never called .*loom\.runtime\.wrap\(model, optimizer, loader\)"):
        loom.runtime.current()
    with pytest.raises(RuntimeUsageError, match="never called"):
        loom.runtime.report(loss=1.0)


def test_wrap_rejects_wrong_arguments_by_name(loom_env):
    model, optimizer, loader = _objects()
    with pytest.raises(RuntimeUsageError, match="model must be a torch.nn.Module, got str"):
        loom.runtime.wrap("model", optimizer, loader)
    with pytest.raises(RuntimeUsageError, match="optimizer must be a torch.optim.Optimizer, got dict"):
        loom.runtime.wrap(model, {}, loader)
    with pytest.raises(RuntimeUsageError, match="loader must be iterable, got int"):
        loom.runtime.wrap(model, optimizer, 3)
    other = torch.optim.SGD(torch.nn.Linear(1, 1).parameters(), lr=1)
    with pytest.raises(RuntimeUsageError, match="drives another optimizer"):
        loom.runtime.wrap(model, optimizer, loader, lr_scheduler=torch.optim.lr_scheduler.StepLR(other, 1))
    loom.runtime.wrap(model, optimizer, loader)
    with pytest.raises(RuntimeUsageError, match="already called"):
        loom.runtime.wrap(model, optimizer, loader)


@pytest.mark.parametrize("name,value,message", [
    ("LOOM_CHECKPOINT_INTERVAL", "often", "'often' is not a whole number >= 0"),
    ("LOOM_LOGICAL_WORLD", "0", "'0' is not a whole number >= 1"),
    ("LOOM_CHECKPOINT_MODE", "fast", "'fast' is not one of sync, async"),
    ("LOOM_JOB_ID", "a/b", "not a plain name"),
    ("LOOM_CONTROL_POLL_S", "-1", "number of seconds"),
    ("LOOM_DETERMINISTIC", "perhaps", "'perhaps' is not 1 or 0"),
    ("LOOM_SQUASH_CHECKS", "-1", "'-1' is not a whole number >= 0"),
])
def test_bad_environment_values_name_the_variable(name, value, message):
    with pytest.raises(RuntimeConfigError, match=f"environment variable {name}: .*{message}"):
        RuntimeConfig.from_env({name: value})


def test_defaults_without_loom_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = RuntimeConfig.from_env({})
    assert config.job_id == "local" and config.job_dir == tmp_path / ".loom" / "local"
    assert config.checkpoints == tmp_path / ".loom" / "local" / "checkpoints"
    assert (config.checkpoint_interval, config.checkpoint_mode, config.resume) == (0, "sync", "auto")
    assert RuntimeConfig.from_env({"LOOM_RESUME": "ck/x"}).resume == str(tmp_path / "ck" / "x")


def test_single_process_script_stops_and_resumes_bit_identically(loom_env):
    """Plain `python script.py` (no process group): the same protocol, world size 1."""
    tmp = loom_env
    tiny_job(str(tmp / "ref"), 2)
    loom.runtime.current().close()
    reference = read_losses(str(tmp / "ref.0"))
    os.environ["LOOM_JOB_ID"] = "cut"
    stopper = threading.Thread(target=_stop_after, args=(tmp / "cut.0", 9, tmp / "rt", "cut"))
    stopper.start()
    with pytest.raises(SystemExit) as stopped:
        tiny_job(str(tmp / "cut"), 2, 0.01)
    stopper.join()
    assert stopped.value.code == 0
    tiny_job(str(tmp / "cut"), 2)
    loom.runtime.current().close()
    assert read_losses(str(tmp / "cut.0")) == reference
    assert ControlClient(tmp / "rt", "cut").status()["state"] == "finished"


def _stop_after(log: Path, lines: int, runtime_dir: Path, job: str) -> None:
    while not (log.exists() and len(log.read_text().splitlines()) >= lines):
        time.sleep(0.002)
    client = ControlClient(runtime_dir, job)
    client.wait_ack(client.request("stop"), timeout_s=30)


def barrier_from_rank_one(out: str) -> None:
    """Rank 1 asks for the barrier at iteration 3: every rank cuts at the same iteration."""
    dist.init_process_group("gloo")
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(TensorDataset(torch.randn(64, 4)), batch_size=2)
    model, optimizer, loader = loom.runtime.wrap(model, optimizer, loader)
    runtime = loom.runtime.current()
    for (x,) in loader:
        model(x).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
        if runtime.iteration == 3 and dist.get_rank() == 1:
            runtime.request_barrier()
    Path(f"{out}.{dist.get_rank()}").write_text(json.dumps(runtime.cuts))
    dist.destroy_process_group()


def test_a_barrier_requested_on_any_rank_cuts_every_rank_together(tmp_path):
    env = {"LOOM_RUNTIME_DIR": str(tmp_path / "rt"), "LOOM_JOB_ID": "b"}
    results = run_local(barrier_from_rank_one, 2, env, args=(str(tmp_path / "cuts"),))
    assert [r.exitcode for r in results] == [0, 0]
    cuts = [json.loads(Path(f"{tmp_path / 'cuts'}.{r}").read_text()) for r in range(2)]
    assert cuts[0] == cuts[1] and len(cuts[0]) == 1 and 4 <= cuts[0][0] <= 5


def test_fewer_logical_ranks_than_processes_is_refused(tmp_path):
    message = "1 logical ranks on 2 processes: a process needs at least one logical rank"
    env = {"LOOM_RUNTIME_DIR": str(tmp_path / "rt"), "LOOM_JOB_ID": "w", "LOOM_LOGICAL_WORLD": "1"}
    results = run_local(tiny_job, 2, env, args=(str(tmp_path / "log"), 1))
    assert [r.exitcode for r in results] == [1, 1]
    assert all(message in r.error and "LOOM_LOGICAL_WORLD" in r.error for r in results)
    assert ControlClient(tmp_path / "rt", "w").status()["state"] == "failed"


@pytest.mark.parametrize("n,world,shuffle,drop_last", [(10, 3, True, False), (10, 3, False, True),
                                                        (7, 2, True, False), (12, 4, True, True)])
def test_shards_match_distributed_sampler(n, world, shuffle, drop_last):
    dataset = list(range(n))
    for rank in range(world):
        sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=shuffle, seed=5,
                                     drop_last=drop_last)
        sampler.set_epoch(2)
        assert shard_indices(n, epoch=2, offset=0, world=world, rank=rank, shuffle=shuffle, seed=5,
                             drop_last=drop_last) == list(sampler)


def test_resumed_segments_continue_the_same_order_or_redistribute_it():
    n, world, batch = 23, 2, 3
    full = [shard_indices(n, epoch=1, offset=0, world=world, rank=r, shuffle=True, seed=9,
                          drop_last=False) for r in range(world)]
    position = DataPosition(epoch=1, offset=0, batches=2, world=world, batch_size=batch, seed=9)
    for rank in range(world):  # same world: exactly the rest of each rank's shard
        rest = shard_indices(n, epoch=1, offset=position.consumed(), world=world, rank=rank,
                             shuffle=True, seed=9, drop_last=False)
        assert rest == full[rank][2 * batch:]
    order = shard_indices(n, epoch=1, offset=0, world=1, rank=0, shuffle=True, seed=9, drop_last=False)
    taken = sorted(i for shard in full for i in shard[: 2 * batch])
    assert taken == sorted(order[: position.consumed()])  # the consumed samples are a prefix
    for new_world in (1, 3, 5):  # another world: the rest of the order once each, plus padding
        rest = [i for r in range(new_world) for i in shard_indices(
            n, epoch=1, offset=position.consumed(), world=new_world, rank=r, shuffle=True, seed=9,
            drop_last=False)]
        pad = -(n - position.consumed()) % new_world
        assert sorted(rest) == sorted(order[position.consumed():] + order[:pad])


def test_loader_skips_finished_epochs_and_replays_unshardable_ones():
    loader = ResumableLoader(DataLoader(TensorDataset(torch.arange(8)), batch_size=2, shuffle=True),
                             logical_rank=0, logical_world=1)
    assert len(loader) == 4 and loader.dataset is not None  # attributes pass through
    first = [[int(v) for (b,) in loader for v in b] for _ in range(3)]
    loader.load(DataPosition(epoch=2, batches=1, world=1, batch_size=2, seed=loader.sampler.seed))
    again = [[int(v) for (b,) in loader for v in b] for _ in range(3)]
    assert again == [[], [], first[2][2:]]

    class Stream(IterableDataset):
        def __iter__(self):
            return iter(range(6))

    stream = ResumableLoader(DataLoader(Stream(), batch_size=2), logical_rank=0, logical_world=1)
    assert stream.sampler is None
    stream.load(DataPosition(epoch=0, batches=2, world=1, batch_size=2, resharded=False))
    assert [b.tolist() for b in stream] == [[4, 5]] and stream.state().batches == 3
    with pytest.raises(RuntimeUsageError, match="cannot be resharded"):
        stream.load(DataPosition(epoch=0, batches=2, world=2, batch_size=2, resharded=False))


SCRIPT = '''
import sys, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
import loom.runtime

dist.init_process_group("gloo")
torch.manual_seed(0)
model = DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Dropout(0.2), torch.nn.Linear(8, 1)))
optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
data = torch.utils.data.TensorDataset(torch.randn(64, 8, generator=torch.Generator().manual_seed(1)))
loader = torch.utils.data.DataLoader(data, batch_size=4, shuffle=True)

model, optimizer, loader = loom.runtime.wrap(model, optimizer, loader)   # the one-line change

with open(f"{sys.argv[1]}.{dist.get_rank()}", "a") as log:
    for epoch in range(2):
        for (x,) in loader:
            loss = model(x).pow(2).mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            print(loss.item().hex(), file=log, flush=True)
            if dist.get_rank() == 0 and sys.argv[2] == "stop" and sum(1 for _ in open(log.name)) == 5:
                from loom.runtime import ControlClient
                import os
                ControlClient(os.environ["LOOM_RUNTIME_DIR"], os.environ["LOOM_JOB_ID"]).request("stop")
dist.destroy_process_group()
'''


@pytest.mark.slow
def test_a_plain_script_under_torchrun_stops_and_resumes_bit_identically(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(SCRIPT))

    def torchrun(job: str, log: str, mode: str) -> None:
        env = {**os.environ, "LOOM_RUNTIME_DIR": str(tmp_path / "rt"), "LOOM_JOB_ID": job,
               "LOOM_CONTROL_POLL_S": "0"}
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
               str(script), str(tmp_path / log), mode]
        done = subprocess.run(cmd, check=False, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]

    torchrun("ref", "ref", "run")
    torchrun("job", "cut", "stop")
    assert ControlClient(tmp_path / "rt", "job").status()["state"] == "stopped"
    torchrun("job", "cut", "run")
    for rank in range(2):
        assert Path(f"{tmp_path / 'cut'}.{rank}").read_text() == Path(f"{tmp_path / 'ref'}.{rank}").read_text()
