"""Loss-spike rollback: the detector's rule, its configuration, and real training jobs that roll back.

The jobs are forked gloo process sets (`loom.runtime.testing`) training a small regression
on a fixed, unshuffled dataset in which the batches of chosen iterations are poisoned
(inputs x 1000, or NaN). The reference for a rollback is the same job on a dataset without
the batches the rollback skips: from the checkpoint on it must compute the same losses and
end with the same parameters, bit for bit.
"""

from __future__ import annotations

import json
import math
import os
import random
from pathlib import Path

import pytest
import torch
import torch._dynamo  # DDP imports it lazily (seconds): once here, not in every forked job
from torch.utils.data import DataLoader, TensorDataset

from loom.errors import LoomInputError
from loom.runtime import store
from loom.runtime.config import RuntimeConfig, SpikeRule, spike_env, spike_rule
from loom.runtime.control import ControlClient
from loom.runtime.errors import RuntimeConfigError
from loom.runtime.launch import Incarnation, LaunchSpec, job_env, validated
from loom.runtime.spike import SpikeDetector, rollback_candidates
from loom.runtime.testing import run_local

BATCH = 4  # samples per logical rank per iteration
ITERATIONS = 40  # of the unpoisoned dataset


# --- the rule -------------------------------------------------------------------------------------


def feed(detector: SpikeDetector, losses) -> list:
    return [detector.observe(i, x) for i, x in enumerate(losses, 1)]


def test_a_flat_loss_does_not_flag_rounding_noise_but_flags_a_real_rise():
    detector = SpikeDetector(SpikeRule())
    assert not any(v.spike for v in feed(detector, [2.0] * 20))  # MAD 0
    assert not detector.observe(21, 2.0 + 1e-6).spike  # within the 10% floor
    verdict = detector.observe(22, 2.5)
    assert verdict.spike and verdict.z == math.inf and verdict.mad == 0
    assert verdict.reason == ("loss 2.5 at iteration 22 rose 0.5 above the median 2 of the last 21, whose MAD "
                              "is 0, more than the floor 0.2 (LOOM_SPIKE_REL 0.1 x |median|, at least "
                              "LOOM_SPIKE_ABS 0.001)")


def test_robust_z_score_against_the_window():
    rng = random.Random(3)
    detector = SpikeDetector(SpikeRule(z=6, window=32))
    losses = [2.31 + rng.gauss(0, 0.05) for _ in range(40)]
    assert not any(v.spike for v in feed(detector, losses))
    median = sorted(detector.history)[15:17]
    quiet = detector.observe(41, 2.31 + 0.1)  # about 2 sigma: healthy, joins the window
    assert not quiet.spike and len(detector.history) == 32
    spike = detector.observe(42, 9.81)
    sigma = 1.4826 * spike.mad
    assert spike.spike and spike.z == pytest.approx((9.81 - spike.median) / sigma)
    assert min(median) <= spike.median + 1e-12 and spike.z > 100
    assert spike.reason.startswith(f"loss 9.81 at iteration 42 is {spike.z:.3g} robust z-scores above the median "
                                   f"{spike.median:.4g} of the last 32 (threshold 6)")
    assert 9.81 not in detector.history  # a spike never enters the window


def test_the_floor_binds_when_the_spread_is_tiny():
    detector = SpikeDetector(SpikeRule(rel=0.5))
    feed(detector, [1.0, 1.001] * 10)
    verdict = detector.observe(21, 1.3)  # thousands of z-scores, below 50% of the median
    assert not verdict.spike and verdict.z > 100
    verdict = detector.observe(22, 1.6)
    assert verdict.spike and "also exceeds the floor 0.5" in verdict.reason


def test_nan_and_inf_are_spikes_even_without_history_and_a_short_history_judges_nothing():
    detector = SpikeDetector(SpikeRule(min_history=5))
    assert detector.observe(1, float("nan")).spike
    assert detector.observe(2, float("inf")).reason == "loss inf at iteration 2 is not finite"
    assert not any(v.spike for v in feed(detector, [1.0, 1.0, 1.0, 1.0, 50.0]))  # 4 healthy: too few
    assert detector.observe(7, 500.0).spike
    restored = SpikeDetector(SpikeRule(min_history=5))
    restored.load(detector.state())
    assert list(restored.history) == list(detector.history) == [1.0, 1.0, 1.0, 1.0, 50.0]


def test_only_this_timelines_checkpoints_from_before_the_spike_are_candidates():
    def info(seq: int, iteration: int) -> store.CheckpointInfo:
        return store.CheckpointInfo(Path(f"c{seq}"), seq, iteration, 2, 2, 1, 0.0)

    old_timeline = [info(1, 10), info(2, 30), info(3, 40)]  # e.g. before a resume from seq 1
    ours = [info(4, 15), info(5, 20), info(6, 25)]
    picks = rollback_candidates(old_timeline + ours, spike_iteration=25, origin_seq=4)
    assert [c.seq for c in picks] == [5, 4]  # never iteration 25 itself, never seq 2 (iteration 30 < 40)
    assert rollback_candidates(old_timeline + ours, spike_iteration=15, origin_seq=4) == []


# --- configuration --------------------------------------------------------------------------------


def test_configuration_from_the_environment_and_loom_run():
    assert RuntimeConfig.from_env({}).spike == SpikeRule()
    rule = spike_rule({"LOOM_SPIKE_Z": "4.5", "LOOM_SPIKE_WINDOW": "64", "LOOM_SPIKE_SKIP": "100",
                       "LOOM_SPIKE_MAX_ROLLBACKS": "5", "LOOM_SPIKE_PERIOD": "200", "LOOM_SPIKE_REL": "0",
                       "LOOM_SPIKE_ABS": "0.01", "LOOM_SPIKE_MIN_HISTORY": "8"})
    assert (rule.z, rule.window, rule.skip, rule.max_rollbacks, rule.period, rule.rel, rule.abs,
            rule.min_history) == (4.5, 64, 100, 5, 200, 0.0, 0.01, 8)
    assert not spike_rule({"LOOM_SPIKE": "off"}).enabled
    assert spike_env("z=8, skip=10,max_rollbacks=2") == {
        "LOOM_SPIKE": "on", "LOOM_SPIKE_Z": "8", "LOOM_SPIKE_SKIP": "10", "LOOM_SPIKE_MAX_ROLLBACKS": "2"}
    assert spike_env("off") == {"LOOM_SPIKE": "off"} and spike_env("") == {}


@pytest.mark.parametrize("name,value,message", [
    ("LOOM_SPIKE", "maybe", "'maybe' is not 1 or 0"),
    ("LOOM_SPIKE_Z", "0", "'0' is not a number > 0"),
    ("LOOM_SPIKE_REL", "-1", "'-1' is not a number >= 0"),
    ("LOOM_SPIKE_WINDOW", "2", "'2' is not a whole number >= 3"),
    ("LOOM_SPIKE_SKIP", "a few", "not a whole number >= 0"),
    ("LOOM_SPIKE_MIN_HISTORY", "40", "exceeds the window of 32 losses"),
])
def test_bad_values_name_the_variable(name, value, message):
    with pytest.raises(RuntimeConfigError, match=f"environment variable {name}: .*{message}"):
        RuntimeConfig.from_env({name: value})


def test_loom_run_spike_option(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("")
    spec = validated(LaunchSpec(script=script, runtime_dir=tmp_path / "rt", spike="z=8,skip=3"))
    env = job_env(spec, Incarnation(0, tmp_path, 1, ""), base={})
    assert (env["LOOM_SPIKE"], env["LOOM_SPIKE_Z"], env["LOOM_SPIKE_SKIP"]) == ("on", "8", "3")
    plain = validated(LaunchSpec(script=script, runtime_dir=tmp_path / "rt"))
    assert not any(k.startswith("LOOM_SPIKE") for k in job_env(plain, Incarnation(0, tmp_path, 1, ""), base={}))
    with pytest.raises(LoomInputError, match="field '--spike': window: '2' is not a whole number >= 3"):
        validated(LaunchSpec(script=script, runtime_dir=tmp_path / "rt", spike="window=2"))
    with pytest.raises(LoomInputError, match="'speed=2' is not KEY=VALUE"):
        validated(LaunchSpec(script=script, runtime_dir=tmp_path / "rt", spike="speed=2"))


def test_the_loader_skips_batches_of_the_current_epoch_only():
    from loom.runtime.data import ResumableLoader

    loader = ResumableLoader(DataLoader(TensorDataset(torch.arange(12.0)), batch_size=2), logical_world=1)
    epoch = iter(loader)
    assert next(epoch)[0].tolist() == [0.0, 1.0]
    assert loader.skip(2) == 2 and loader.state().batches == 3
    assert next(epoch)[0].tolist() == [6.0, 7.0]
    assert loader.skip(5) == 2 and loader.state().batches == 6  # the epoch had two batches left
    assert list(epoch) == []
    assert [b[0].tolist() for b in loader][:1] == [[0.0, 1.0]]  # the next epoch is whole


# --- real training jobs ---------------------------------------------------------------------------


def spike_job(out: str, poison: tuple[int, ...] = (), drop: tuple[int, ...] = (), poison_from: int = 0,
              nan: bool = False, poison_rank: int | None = None) -> None:
    """A DDP regression over a fixed, unshuffled dataset; iteration i of an uninterrupted run takes
    samples [(i-1)·G, i·G) with G = BATCH × logical ranks. The batches of the iterations in `poison`
    (and from `poison_from` on) have their inputs x 1000 (NaN with `nan`; only logical rank
    `poison_rank`'s samples if given); those in `drop` are removed
    from the dataset. Logs `iteration loss.hex()` per logical rank; the process of logical rank 0
    saves the final parameters to `<out>.pt`."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    import loom.runtime

    distributed = "RANK" in os.environ
    if distributed:
        dist.init_process_group("gloo")
    logical = int(os.environ.get("LOOM_LOGICAL_WORLD") or os.environ.get("WORLD_SIZE") or 1)
    per_iteration = BATCH * logical
    g = torch.Generator().manual_seed(7)
    x = torch.randn(ITERATIONS * per_iteration, 8, generator=g)
    y = x @ torch.randn(8, 1, generator=g) + 0.01 * torch.randn(len(x), 1, generator=g)
    bad = set(poison) | set(range(poison_from, ITERATIONS + 1) if poison_from else ())
    first, step = (0, 1) if poison_rank is None else (poison_rank, logical)  # rank r: every N-th sample
    for it in bad:
        x[(it - 1) * per_iteration + first:it * per_iteration:step] *= float("nan") if nan else 1e3
    keep = [i for i in range(len(x)) if i // per_iteration + 1 not in drop]
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Dropout(0.1), torch.nn.ReLU(),
                                torch.nn.Linear(16, 1))
    model = DistributedDataParallel(model) if distributed else model
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=5, gamma=0.9)
    loader = DataLoader(TensorDataset(x[keep], y[keep]), batch_size=BATCH, shuffle=False)
    model, optimizer, loader = loom.runtime.wrap(model, optimizer, loader, lr_scheduler=scheduler)
    runtime = loom.runtime.current()
    logs = {r: open(f"{out}.{r}", "a") for r in runtime.logical_ranks}  # noqa: SIM115 - closed below
    for xb, yb in loader:
        loss = torch.nn.functional.mse_loss(model(xb), yb)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()
        logs[runtime.logical_rank].write(f"{runtime.iteration} {loss.item().hex()}\n")
        loom.runtime.report(loss=loss)
    for log in logs.values():
        log.close()
    if 0 in runtime.logical_ranks:
        torch.save({k: v.clone() for k, v in model.state_dict().items()}, f"{out}.pt")
    if distributed:
        dist.destroy_process_group()


def env_of(tmp_path: Path, job: str, **extra: str) -> dict[str, str]:
    return {"LOOM_RUNTIME_DIR": str(tmp_path / "rt"), "LOOM_JOB_ID": job, "LOOM_CONTROL_POLL_S": "0", "LOOM_SPIKE": "on",
            "LOOM_CHECKPOINT_INTERVAL": "5", "LOOM_CHECKPOINT_KEEP": "100", **extra}


def ok(results) -> None:
    assert [r.exitcode for r in results] == [0] * len(results), results


def losses(out: str, rank: int) -> list[tuple[int, str]]:
    with open(f"{out}.{rank}") as handle:
        return [(int(i), loss) for i, loss in (line.split() for line in handle)]


def events(tmp_path: Path, job: str, kind: str) -> list[dict]:
    return [e for e in ControlClient(tmp_path / "rt", job).events() if e["event"] == kind]


def same_parameters(a: str, b: str) -> bool:
    pa, pb = torch.load(f"{a}.pt"), torch.load(f"{b}.pt")
    return pa.keys() == pb.keys() and all(torch.equal(pa[k], pb[k]) for k in pa)


def run_pair(tmp_path: Path, processes: int, poison: int, skip: int, poison_rank: int | None = None,
             **extra: str) -> tuple[str, str, dict]:
    """The poisoned job and its reference (the rollback's skipped batches removed from the data)."""
    spiky, clean = str(tmp_path / "spiky"), str(tmp_path / "clean")
    ok(run_local(spike_job, processes, env_of(tmp_path, "spiky", LOOM_SPIKE_SKIP=str(skip), **extra),
                 args=(spiky, (poison,), (), 0, False, poison_rank)))
    [rollback] = events(tmp_path, "spiky", "rollback")
    dropped = tuple(range(rollback["to_iteration"] + 1, poison + skip + 1))
    ok(run_local(spike_job, processes, env_of(tmp_path, "clean", **extra), args=(clean, (), dropped)))
    assert events(tmp_path, "clean", "rollback") == events(tmp_path, "clean", "loss_spike") == []
    return spiky, clean, rollback


def assert_continues_like_the_reference(spiky: str, clean: str, ranks: int, poison: int, to: int,
                                        poisoned: tuple[int, ...]) -> None:
    """Up to the checkpoint the same; the spike's timeline; then, from the checkpoint on, the reference's."""
    for rank in range(ranks):
        got, want = losses(spiky, rank), losses(clean, rank)
        assert got[:to] == want[:to]
        assert [i for i, _ in got[to:poison]] == list(range(to + 1, poison + 1))  # the abandoned timeline
        rise = float.fromhex(got[poison - 1][1]) / float.fromhex(want[to - 1][1])
        assert rise > 1e3 if rank in poisoned else rise < 10
        assert got[poison:] == want[to:] and len(want) > to + 5
    assert same_parameters(spiky, clean)


@pytest.mark.parametrize("poison,skip,to,rank", [(23, 2, 20, None), (25, 0, 20, 1)])
def test_rollback_to_the_checkpoint_before_the_spike_skips_its_batches(tmp_path, poison, skip, to, rank):
    """2 gloo processes. At 25 the spike's own iteration is a periodic checkpoint's: it is never saved;
    and only rank 1's batch is poisoned: rank 0 rolls back as well, at the same iteration."""
    spiky, clean, rollback = run_pair(tmp_path, 2, poison, skip, rank)
    assert_continues_like_the_reference(spiky, clean, 2, poison, to, (0, 1) if rank is None else (rank,))
    skipped = list(range(to + 1, poison + skip + 1))
    assert rollback["iteration"] == poison and rollback["to_iteration"] == to
    assert rollback["skipped_batches"] == skipped and rollback["skip"] == skip
    assert store.validate(Path(rollback["checkpoint"])).iteration == to
    assert rollback["loss"] > 1e3 * rollback["median"] and rollback["z"] > rollback["threshold"] == 6
    assert rollback["window"] == poison - 1 and rollback["rollbacks"] == 1  # every earlier loss was healthy
    assert rollback["reason"].startswith(f"loss {rollback['loss']:.4g} at iteration {poison} is ")
    assert rollback["reason"].endswith(f"rolled back to the checkpoint of iteration {to} and skipped the "
                                       f"{len(skipped)} batches of iterations {to + 1}-{poison + skip}")
    status = ControlClient(tmp_path / "rt", "spiky").status()
    assert status["state"] == "finished" and status["rollbacks"] == 1
    assert status["last_rollback"]["to_iteration"] == to and status["last_rollback"]["event"] == "rollback"
    saved = events(tmp_path, "spiky", "checkpoint")
    before = [e["iteration"] for e in saved if e["time"] < rollback["time"]]
    assert before == list(range(5, poison, 5))  # the spike's iteration is never checkpointed
    after = [e["iteration"] for e in saved if e["time"] > rollback["time"]]
    if poison % 5 == 0:  # the periodic cut at the spike's boundary saves the restored state instead
        assert after[0] == to
    assert after[-1] == len(losses(clean, 0)) // 5 * 5


def test_rollback_with_time_sliced_logical_ranks(tmp_path):
    """One process hosting both logical ranks (deterministic mode): each rank's streams and shard roll back."""
    spiky, clean, rollback = run_pair(tmp_path, 1, 23, 1, 1, LOOM_LOGICAL_WORLD="2", LOOM_DETERMINISTIC="1")
    assert rollback["to_iteration"] == 20 and rollback["skipped_batches"] == [21, 22, 23, 24]
    assert_continues_like_the_reference(spiky, clean, 2, 23, 20, (1,))  # the second slice's loss counts


def test_persistent_spikes_fail_the_job_after_the_allowed_rollbacks(tmp_path):
    out = str(tmp_path / "bad")
    results = run_local(spike_job, 2, env_of(tmp_path, "bad", LOOM_SPIKE_MAX_ROLLBACKS="2"),
                        args=(out, (), (), 23))
    assert [r.exitcode for r in results] == [1, 1]
    assert all(r.error.startswith("LossSpikeError: loss spikes persist after 2 rollbacks") for r in results)
    rollbacks = events(tmp_path, "bad", "rollback")
    assert [(e["iteration"], e["to_iteration"], e["skipped_batches"]) for e in rollbacks] == [
        (23, 20, [21, 22, 23]), (21, 20, [21])]  # the next batch (24's) spikes too
    [gave_up] = events(tmp_path, "bad", "loss_spike")
    assert gave_up["action"] == "fail" and gave_up["iteration"] == 21
    status = ControlClient(tmp_path / "rt", "bad").status()
    assert status["state"] == "failed" and "loss spikes persist after 2 rollbacks" in status["error"]
    assert status["rollbacks"] == 2 and status["last_rollback"]["action"] == "fail"


def test_without_a_checkpoint_a_spike_is_logged_and_a_nan_fails(tmp_path):
    out = str(tmp_path / "nock")
    ok(run_local(spike_job, 2, env_of(tmp_path, "nock", LOOM_CHECKPOINT_INTERVAL="0"), args=(out, (23,))))
    [spike] = events(tmp_path, "nock", "loss_spike")
    assert spike["action"] == "continue" and spike["iteration"] == 23
    assert "no complete checkpoint before iteration 23" in spike["reason"]
    assert len(losses(out, 0)) == ITERATIONS  # nothing skipped
    results = run_local(spike_job, 2, env_of(tmp_path, "nan", LOOM_CHECKPOINT_INTERVAL="0"),
                        args=(str(tmp_path / "nan"), (23,), (), 0, True))
    assert [r.exitcode for r in results] == [1, 1]
    assert "loss nan at iteration 23 is not finite, and there is no checkpoint" in results[0].error
    off = str(tmp_path / "off")
    ok(run_local(spike_job, 2, env_of(tmp_path, "off", LOOM_SPIKE="off"), args=(off, (23,))))
    assert events(tmp_path, "off", "loss_spike") == events(tmp_path, "off", "rollback") == []


def test_a_resumed_job_keeps_the_detectors_window(tmp_path):
    """The window travels in the checkpoint: a job stopped after a rollback and resumed still knows it."""
    out = str(tmp_path / "resumed")
    env = env_of(tmp_path, "resumed", LOOM_RESUME="none")
    ok(run_local(spike_job, 2, env, args=(out, (23,))))
    last = store.latest_complete(tmp_path / "rt" / "resumed" / "checkpoints")
    import pickle

    import torch.distributed.checkpoint as dcp
    state = {"loom": b""}
    dcp.load(state, storage_reader=dcp.FileSystemReader(str(last.path)), no_dist=True)
    spike = pickle.loads(state["loom"])["spike"]
    assert spike["rollbacks"] == 1 and len(spike["history"]) == 32 and max(spike["history"]) < 1e3
    assert json.dumps(spike)  # plain data
