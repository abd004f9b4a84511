"""World-size virtualisation: N logical ranks time-sliced on M ≤ N processes.

Jobs run as forked gloo process sets (`loom.runtime.testing`); `tiny_job` logs one
file per logical rank, so runs on different process counts compare rank by rank.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
import torch
import torch._dynamo  # DDP imports it lazily (seconds): once here, not in every forked job
import torch.distributed as dist
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

import loom.runtime
from loom.runtime.control import ControlClient
from loom.runtime.errors import RuntimeConfigError
from loom.runtime.testing import (
    LocalJob,
    read_losses,
    run_local,
    squash_fault,
    tiny_job,
)
from loom.runtime.virtual import layout_of, logical_ranks_of

# Squashed (non-deterministic) runs against the unvirtualised one: the largest relative
# difference of any logged loss. Measured at most 2.2e-7 on these jobs (18-36 iterations)
# and 1.6e-7 on the example GPT (24 iterations); the bound leaves room for longer runs.
LOSS_RTOL = 1e-5


def job_env(tmp_path: Path, job: str, logical: int, deterministic: bool = False, **extra: str) -> dict[str, str]:
    return {"LOOM_RUNTIME_DIR": str(tmp_path / "rt"), "LOOM_JOB_ID": job, "LOOM_CONTROL_POLL_S": "0",
            "LOOM_LOGICAL_WORLD": str(logical), "LOOM_DETERMINISTIC": "1" if deterministic else "0", **extra}


def ok(results) -> None:
    assert [r.exitcode for r in results] == [0] * len(results), results


def run_job(tmp_path: Path, job: str, processes: int, logical: int, deterministic: bool = False,
            fn=tiny_job, epochs: int = 3) -> list[list[tuple[int, int, str]]]:
    """Run `fn` to the end; every logical rank's log."""
    log = str(tmp_path / job)
    ok(run_local(fn, processes, job_env(tmp_path, job, logical, deterministic), args=(log, epochs)))
    return [read_losses(f"{log}.{r}") for r in range(logical)]


def relative_difference(a: list[list[tuple]], b: list[list[tuple]]) -> float:
    worst = 0.0
    for run_a, run_b in zip(a, b, strict=True):
        assert [row[:2] for row in run_a] == [row[:2] for row in run_b]  # the same iterations and epochs
        for (_, _, x), (_, _, y) in zip(run_a, run_b):
            x, y = float.fromhex(x), float.fromhex(y)
            worst = max(worst, abs(x - y) / abs(y))
    return worst


def events(tmp_path: Path, job: str) -> list[dict]:
    return ControlClient(tmp_path / "rt", job).events()


def status(tmp_path: Path, job: str) -> dict:
    return ControlClient(tmp_path / "rt", job).status()


# --- placement ------------------------------------------------------------------------------------


def test_logical_ranks_are_contiguous_blocks_of_nearly_equal_size():
    assert layout_of(2, 4) == [[0, 1], [2, 3]]
    assert layout_of(2, 3) == [[0], [1, 2]]
    assert layout_of(3, 8) == [[0, 1], [2, 3, 4], [5, 6, 7]]
    assert layout_of(1, 3) == [[0, 1, 2]] and layout_of(3, 3) == [[0], [1], [2]]
    with pytest.raises(RuntimeConfigError, match="2 logical ranks on 3 processes: a process needs at least one"):
        logical_ranks_of(0, 3, 2)


def test_each_logical_rank_gets_streams_of_its_own_derived_per_generator():
    import random

    from loom.runtime import rng
    from loom.runtime.virtual import fingerprints, logical_streams

    def streams_after(python_seed: int) -> dict[int, torch.Tensor]:
        torch.manual_seed(7)
        random.seed(python_seed)  # as if never seeded: differs from run to run
        streams = logical_streams(fingerprints(rng.capture()), [0, 1, 2], torch.device("cpu"))
        draws = {}
        for rank, stream in streams.items():
            rng.restore(stream)
            draws[rank] = torch.rand(3)
        return draws

    state = rng.capture()
    try:
        first, second = streams_after(1), streams_after(2)
    finally:
        rng.restore(state)
    assert all(torch.equal(first[r], second[r]) for r in range(3))  # torch's streams: torch's seed only
    assert not torch.equal(first[0], first[1]) and not torch.equal(first[1], first[2])


# --- how the training loop sees slices ------------------------------------------------------------


def slices_job(out: str, _epochs: int = 1) -> None:
    """Three logical ranks on one process (no torch.distributed): record what the loop sees."""
    torch.manual_seed(0)
    model = torch.nn.Linear(2, 1, bias=False)
    start = model.weight.detach().clone()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)  # stateless: DCP steps it at checkpoints
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    xs = torch.arange(12.0).view(6, 2)
    loader = DataLoader(TensorDataset(xs), batch_size=1)  # sequential: logical rank l takes l, l+3
    model, optimizer, loader = loom.runtime.wrap(model, optimizer, loader, lr_scheduler=scheduler)
    runtime = loom.runtime.current()
    seen = []
    for (x,) in loader:
        row = {"rank": runtime.logical_rank, "sample": int(x[0, 0]) // 2, "before": runtime.iteration,
               "draw": torch.rand(1).item(), "weight": model.weight.tolist()}
        model(x).sum().backward()
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()  # after the step: ignored while deferred gradients are held
        seen.append({**row, "after": runtime.iteration, "lr": scheduler.get_last_lr()[0],
                     "stepped": model.weight.tolist() != row["weight"]})
    torch.save({"seen": seen, "start": start, "end": model.weight.detach().clone(), "xs": xs,
                "cuts": runtime.cuts}, out)


def test_the_loop_runs_a_slice_per_logical_rank_and_steps_once(tmp_path):
    env = job_env(tmp_path, "slices", 3, LOOM_CHECKPOINT_INTERVAL="1")
    ok(run_local(slices_job, 1, env, args=(str(tmp_path / "out"),)))
    out = torch.load(tmp_path / "out")
    seen = out["seen"]
    assert [s["rank"] for s in seen] == [0, 1, 2, 0, 1, 2]
    assert [s["sample"] for s in seen] == [0, 1, 2, 3, 4, 5]  # each rank its own shard
    assert [(s["before"], s["after"]) for s in seen] == [(0, 1)] * 3 + [(1, 2)] * 3
    assert [s["stepped"] for s in seen] == [False, False, True] * 2  # one update per iteration
    assert [s["lr"] for s in seen] == [0.1, 0.1, 0.05, 0.05, 0.05, 0.025]  # the scheduler: once per iteration
    assert out["cuts"] == [1, 2]  # checkpoints at both iterations; DCP's own steps counted no iteration
    draws = [s["draw"] for s in seen]
    assert len(set(draws)) == 6  # each logical rank its own stream
    xs = out["xs"]  # d(sum w.x)/dw = x: the update is lr x the mean over the three logical ranks
    expected = out["start"] - 0.1 * xs[0:3].mean(0) - 0.05 * xs[3:6].mean(0)
    assert torch.allclose(out["end"], expected.unsqueeze(0), rtol=0, atol=1e-6)


# --- deterministic mode: bit-identical at any process count ---------------------------------------


@pytest.mark.parametrize("logical,processes", [(2, (1, 2)), (3, (2, 3))])
def test_deterministic_losses_are_bit_identical_at_any_process_count(tmp_path, logical, processes):
    runs = [run_job(tmp_path, f"m{m}", m, logical, deterministic=True) for m in processes]
    assert all(len(log) == 3 * 96 // (4 * logical) for log in runs[0])
    assert runs[0] == runs[1]  # every float of every logical rank
    for m in processes:
        state = status(tmp_path, f"m{m}")
        assert state["deterministic"] is True and state["squash"] == "off"
        assert state["processes"] == m and state["logical_world"] == logical


# --- squashing: within tolerance, validated, disabled when wrong ----------------------------------


def test_squashed_losses_stay_within_the_stated_tolerance(tmp_path):
    reference = run_job(tmp_path, "m4", 4, 4)
    assert status(tmp_path, "m4")["squash"] == "none"  # one logical rank per process: nothing to squash
    for m in (1, 2):
        assert relative_difference(run_job(tmp_path, f"m{m}", m, 4), reference) <= LOSS_RTOL
        checks = [e for e in events(tmp_path, f"m{m}") if e["event"].startswith("squash")]
        assert [e["event"] for e in checks] == ["squash_check"] * 3 + ["squash_enabled"]
        assert all(e["ok"] and e["relative_difference"] < 1e-6 for e in checks[:3])
        assert status(tmp_path, f"m{m}")["squash"] == "on"


def faulty_squash(out: str, epochs: int) -> None:
    squash_fault(1.5)  # a squash that gets the gradient scale wrong
    tiny_job(out, epochs)


def test_a_wrong_squash_is_detected_and_the_unsquashed_path_takes_over(tmp_path):
    faulty = run_job(tmp_path, "bad", 2, 4, fn=faulty_squash)
    disabled = [e for e in events(tmp_path, "bad") if e["event"] == "squash_disabled"]
    assert len(disabled) == 1 and disabled[0]["iteration"] == 1
    assert disabled[0]["relative_difference"] == pytest.approx(0.5)
    assert status(tmp_path, "bad")["squash"] == "disabled"
    # from the first iteration on, the update is the unsquashed one: the deterministic mode's
    assert faulty == run_job(tmp_path, "det", 2, 4, deterministic=True)


# --- resize: the checkpoint carries each logical rank's position and RNG streams ------------------


def masked_job(out: str, epochs: int, sleep_s: float = 0.0) -> None:
    """tiny_job, also logging each logical rank's dropout mask per iteration (`<out>.mask.<rank>`)."""
    def record(module: torch.nn.Module, _inputs: tuple, output: torch.Tensor) -> None:
        if isinstance(module, torch.nn.Dropout) and module.training:
            runtime = loom.runtime.current()
            bits = "".join("1" if v else "0" for v in (output != 0).flatten().tolist())
            with open(f"{out}.mask.{runtime.logical_rank}", "a") as handle:
                handle.write(f"{runtime.iteration + 1} {int(bits, 2):x}\n")

    torch.nn.modules.module.register_module_forward_hook(record)
    tiny_job(out, epochs, sleep_s)


def wait_for_lines(path: str, count: int, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not (os.path.exists(path) and len(Path(path).read_text().splitlines()) >= count):
        assert time.monotonic() < deadline, f"{path} never reached {count} lines"
        time.sleep(0.005)


def resize_at(tmp_path: Path, env: dict, processes: int, log: str, at: int, to: int) -> int:
    """Run (or resume) the job on `processes` and resize it to `to` once logical rank 0 logged `at`."""
    job = LocalJob(masked_job, processes, env, args=(log, 3, 0.03)).start()
    wait_for_lines(f"{log}.0", at)
    client = ControlClient(tmp_path / "rt", env["LOOM_JOB_ID"])
    ack = client.wait_ack(client.request("resize", processes=to), timeout_s=60)
    ok(job.join(60))
    assert ack["status"] == "done" and client.status()["state"] == "stopped"
    return ack["iteration"]


def logs(log: str, logical: int) -> tuple[list, list]:
    masks = [Path(f"{log}.mask.{r}").read_text().splitlines() for r in range(logical)]
    return [read_losses(f"{log}.{r}") for r in range(logical)], masks


@pytest.mark.parametrize("deterministic", [True, False])
def test_resize_2_to_1_to_2_keeps_every_logical_rank_exact(tmp_path, deterministic):
    ref_log, log = str(tmp_path / "ref"), str(tmp_path / "job")
    ok(run_local(masked_job, 2, job_env(tmp_path, "ref", 4, deterministic), args=(ref_log, 3)))
    env = job_env(tmp_path, "job", 4, deterministic)
    first = resize_at(tmp_path, env, 2, log, 4, to=1)
    second = resize_at(tmp_path, {**env, "LOOM_RESUME": "latest"}, 1, log, first + 4, to=2)
    ok(run_local(masked_job, 2, {**env, "LOOM_RESUME": "latest"}, args=(log, 3)))
    assert first < second < 18  # 18 iterations: 3 epochs of 96 samples, 4 logical ranks of 4

    (ref_losses, ref_masks), (losses, masks) = logs(ref_log, 4), logs(log, 4)
    assert masks == ref_masks  # every logical rank's RNG stream, across both resizes
    assert all(len(set(row)) == 4 for row in zip(*(m for m in ref_masks)))  # and they differ by rank
    if deterministic:
        assert losses == ref_losses
    else:
        assert relative_difference(losses, ref_losses) <= LOSS_RTOL
    resumed = [e for e in events(tmp_path, "job") if e["event"] == "started"]
    assert [e["processes"] for e in resumed] == [2, 1, 2]
    assert resumed[1]["layout"] == [[0, 1, 2, 3]] and resumed[2]["layout"] == [[0, 1], [2, 3]]


# --- what virtualisation cannot drive: one clear error on every process ---------------------------


class Stream(IterableDataset):
    def __iter__(self):
        return iter(torch.randn(8, 4))


def unshardable_job(out: str, _epochs: int) -> None:
    model = torch.nn.Linear(4, 1)
    loom.runtime.wrap(model, torch.optim.SGD(model.parameters(), lr=0.1), DataLoader(Stream(), batch_size=2))


def plain_model_job(out: str, _epochs: int) -> None:
    dist.init_process_group("gloo")
    model = torch.nn.Linear(4, 1)
    loader = DataLoader(TensorDataset(torch.randn(8, 4)), batch_size=2)
    loom.runtime.wrap(model, torch.optim.SGD(model.parameters(), lr=0.1), loader)


@pytest.mark.parametrize("fn,processes,env,message", [
    (unshardable_job, 1, {"LOOM_LOGICAL_WORLD": "2"}, ("world-size virtualisation (2 logical ranks on 1 "
     "process) needs the data loader passed to wrap(), and one Loom can shard by logical rank")),
    (plain_model_job, 2, {"LOOM_LOGICAL_WORLD": "4"}, "needs the model wrapped in DistributedDataParallel"),
    (plain_model_job, 2, {"LOOM_DETERMINISTIC": "1"}, ("the deterministic mode needs the model wrapped in "
     "DistributedDataParallel")),
])
def test_what_virtualisation_cannot_drive_is_refused_by_name(tmp_path, fn, processes, env, message):
    env = {"LOOM_RUNTIME_DIR": str(tmp_path / "rt"), "LOOM_JOB_ID": "bad", **env}
    results = run_local(fn, processes, env, args=(str(tmp_path / "log"), 1))
    # every process fails by itself; as under torchrun, the first failure kills the others
    assert all(r.exitcode == 1 and message in r.error or r.exitcode < 0 for r in results), results
    assert any(r.exitcode == 1 for r in results)
    if processes == 1:
        assert message in json.loads((tmp_path / "rt" / "bad" / "status.json").read_text())["error"]
