"""Automatic recovery of a real training job, end to end (issue 20): a 4-process `loom run` job
of the example GPT on 4 emulated nodes; one node breaks mid-run (its rank freezes inside a
collective); the hang watchdog kills the job, the core's recovery pipeline diagnoses the log
(infrastructure: a collective hang), localises the faulty node with pairwise all-gather tests,
cordons it and restarts the job on the hot spare in its rank slot, from its last checkpoint.
The loss curve is the uninterrupted run's, bit for bit (deterministic mode)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from loom.core.decisions import Diagnose, Localize, Resume
from loom.core.events import FaultsLocalized, JobDiagnosed, JobFailed
from loom.core.jobs import JobState
from loom.core.recovery import RecoveryConfig
from loom.core.scheduler import DRAINED
from loom.service.backends.inventory import emulated
from loom.service.backends.local import LocalBackend
from loom.service.backends.runs import current_workdir
from loom.service.clock import WallClock
from loom.service.engine import LiveEngine
from loom.service.specs import LaunchSpec
from loom.service.testing import job_processes, loss_curve
from loom.workload.job import JobSpec

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "jobs" / "gpt_train.py"
ITERS = 20
JOB_ARGS = ["--iters", str(ITERS), "--layers", "1", "--d-model", "32"]
HANG_S = 30.0  # longer than 4 processes take to start on a busy 2-core machine
S = JobState


@pytest.mark.slow
def test_a_job_on_a_node_that_breaks_is_diagnosed_localised_and_restarted_on_a_spare(tmp_path):
    base = tmp_path / "baseline"
    baseline = subprocess.Popen(
        [sys.executable, "-m", "loom.cli.main", "run", "--runtime-dir", str(base / "rt"), "--job-id", "base",
         "--workdir", str(base / "w"), "--nproc", "1", "--logical-world", "4", "--deterministic",
         str(EXAMPLE), "--", *JOB_ARGS], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    clock = WallClock()
    backend = LocalBackend(emulated(5, 1), root=tmp_path / "root", clock=clock, poll_s=0.05, grace_s=20.0,
                           hang_s=HANG_S)
    events: list = []
    decisions: list = []
    recovery = RecoveryConfig(detection_s=0.0, diagnosis_s=0.0, localisation_round_s=0.0, spares_per_minipod=1,
                              max_failures=3)
    engine = LiveEngine(backend, "fcfs", "first-fit", clock=clock, round_interval=0.5, recovery=recovery,
                        on_event=events.append, on_decision=lambda d, t, at: decisions.append((at, d)))
    engine.start()
    try:
        spec = JobSpec("gpt", clock.now(), 4, 60.0, iterations=ITERS)
        env = (("LOOM_CHECKPOINT_INTERVAL", "4"), ("LOOM_DETERMINISTIC", "1"))
        engine.submit(spec, LaunchSpec("gpt", (str(EXAMPLE), *JOB_ARGS, "--step-delay", "0.3"), None, 60.0,
                                       env)).result(timeout=10)
        names = list(engine.core.topology.node_names)
        job = engine.core.jobs["gpt"]
        engine.run_until(lambda: job.state is S.RUNNING, timeout=120)
        first = job.allocation.nodes
        assert names[4] not in [names[n] for n in first]  # the hot spare is kept out of ordinary starts

        log = current_workdir(backend.layout, "gpt") / "loss.jsonl"
        engine.run_until(lambda: log.exists() and len(log.read_text().splitlines()) >= 9, timeout=180)
        broken = first[2]  # rank 2's node
        broke_at = clock.now()
        backend.make_faulty(names[broken], "hang")

        engine.run_until(lambda: job.state is S.FINISHED, timeout=600)
        out, _ = baseline.communicate(timeout=300)
        assert baseline.returncode == 0, out

        failed = [e for e in events if isinstance(e, JobFailed)]
        assert len(failed) == 1 and failed[0].diagnose and "hung" in failed[0].cause
        diagnosed = [e for e in events if isinstance(e, JobDiagnosed)]
        assert [(d.category, d.recoverable) for d in diagnosed] == [("infrastructure", True)]
        found = [e for e in events if isinstance(e, FaultsLocalized)]
        assert len(found) == 1 and found[0].faulty == (broken,), found[0].summary
        kinds = [type(d) for _, d in decisions]
        assert kinds.index(Diagnose) < kinds.index(Localize) < kinds.index(Resume)

        # cordoned; the spare took the broken node's rank slot; the other ranks stayed where they were
        assert engine.core.ctx.state.reserved_by[broken] == DRAINED
        assert job.allocation.nodes == tuple(4 if n == broken else n for n in first)
        restarted_at = next(at for at, d in decisions if isinstance(d, Resume))
        assert restarted_at - broke_at < HANG_S + 120  # detected, diagnosed, localised and restarted
        assert job.failures == 1 and job.diagnosis.startswith("infrastructure/NCCLTimeout")

        ran = loss_curve(log)
        assert ran == loss_curve(base / "w" / "loss.jsonl")  # from the restored checkpoint on, the same curve
        assert sorted(ran) == list(range(1, ITERS + 1))
        assert not backend.running()
        assert job_processes(backend.layout.runtime()) == []  # the hung incarnation's workers too
    finally:
        baseline.kill()
        engine.stop()
        backend.close()
        clock.close()


SPIKY = '''
import time
import torch
from torch.utils.data import DataLoader, TensorDataset
import loom.runtime

g = torch.Generator().manual_seed(7)
x = torch.randn(40 * 8, 8, generator=g)
y = x @ torch.randn(8, 1, generator=g)
x[24 * 8:25 * 8] *= 1e3  # iteration 25's batch is poisoned
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
loader = DataLoader(TensorDataset(x, y), batch_size=8, shuffle=False)
model, optimizer, loader = loom.runtime.wrap(model, optimizer, loader)
for xb, yb in loader:
    loss = torch.nn.functional.mse_loss(model(xb), yb)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    loom.runtime.report(loss=loss)
    time.sleep(0.05)
'''


@pytest.mark.slow
def test_a_loss_spike_rollback_in_a_live_job_is_recorded_with_its_reason(tmp_path):
    from loom.core.events import JobRestarted

    script = tmp_path / "spiky.py"
    script.write_text(SPIKY)
    clock = WallClock()
    backend = LocalBackend(emulated(1, 1), root=tmp_path / "root", clock=clock, poll_s=0.05, hang_s=0.0)
    events: list = []
    engine = LiveEngine(backend, "fcfs", "first-fit", clock=clock, round_interval=0.5, on_event=events.append)
    engine.start()
    try:
        engine.submit(JobSpec("spiky", clock.now(), 1, 40.0, iterations=40),
                      LaunchSpec("spiky", (str(script),), None, 40.0,
                                 (("LOOM_CHECKPOINT_INTERVAL", "5"), ("LOOM_SPIKE", "on")))
                      ).result(timeout=10)
        job = engine.core.jobs["spiky"]
        engine.run_until(lambda: job.state is S.FINISHED, timeout=240)
        restarted = [e for e in events if isinstance(e, JobRestarted)]
        assert len(restarted) == 1 and restarted[0].cause.startswith("loss spike: loss ")
        assert "iteration 25" in restarted[0].cause and "rolled back to the checkpoint of iteration 20" \
            in restarted[0].cause
        assert restarted[0].progress == pytest.approx(20.0)  # 20 of 40 iterations of a 40 s job
        seen = [t.event for t in engine.core.record.transitions_of("spiky")]
        assert any(e.startswith("restarted in place: loss spike:") for e in seen)
        assert job.failures == 1
    finally:
        engine.stop()
        backend.close()
        clock.close()
