"""Prices the simulator's interruptions with `loom.perf.interruptions` and keeps
each job's checkpoint clock, so lost work and overheads are exact.

Rules (the simulated backend applies them to every policy's decisions alike):

* A **fresh start** pays nothing extra. A **resume** after a preemption pays the
  preemption's save (barrier, dump, upload — charged when the job comes back,
  since the simulator frees the GPUs at once) plus the load (download, restore,
  rendezvous) where it resumes. A resume after a **failure** pays only the load:
  it restarts from its last periodic checkpoint. A **migrate** or **resize**
  pays save-where-it-was plus load-where-it-goes; the policy's own `pause_s` is
  then ignored (the cost model is the authority).
* **Periodic checkpoints** every `checkpoint_interval_s` of progress stall the
  job for `checkpoint_stall_s` (sync: snapshot + upload; async: snapshot), so
  it progresses at 1 / slowdown of its speed-model rate.
* **Time-slicing**: a job that runs without a plan of its own on fewer GPUs than
  it asked for keeps its logical world size and pays `time_slice_overhead` on
  top of the N× slowdown the speed model already gives.
* **Unplanned failure**: the work since the last *durable* checkpoint is lost —
  with async checkpoints the newest one counts only once its upload finished.
"""

from __future__ import annotations

from dataclasses import dataclass

from loom.core.jobs import Job
from loom.hardware.state import Allocation
from loom.perf.interruptions import InterruptionModel, JobShape, Phases


@dataclass
class JobClock:
    """Where a job is in its checkpoint cycle on its current allocation."""

    progress_from: float  # wall time the job starts progressing (after its pause)
    period_s: float  # wall seconds per checkpoint cycle: interval + stall
    persist_s: float  # upload time of one checkpoint (async: in the background)
    owed: Phases | None = None  # a preemption's save, charged at resume


@dataclass
class InterruptionTotals:
    """GPU-seconds the run spent on interruptions, by cause."""

    paused_gpu_s: float = 0.0  # save / load / rendezvous of preempt, migrate, resize, restart
    checkpoint_gpu_s: float = 0.0  # periodic checkpoint stalls
    lost_gpu_s: float = 0.0  # progress redone after failures
    time_slice_gpu_s: float = 0.0  # overhead of squeezed ranks beyond the N× slowdown


class Interruptions:
    def __init__(self, model: InterruptionModel) -> None:
        self.model = model
        self.clocks: dict[int, JobClock] = {}
        self.owed: dict[int, Phases] = {}
        self.totals = InterruptionTotals()
        self.pauses: dict[int, list[tuple[float, str, Phases]]] = {}  # job key → (time, primitive, phases)

    def shape(self, job: Job, allocation: Allocation) -> JobShape:
        return self.model.shape(job.spec, allocation.total, len(allocation.nodes), job.plan)

    # -- when a job gets GPUs ------------------------------------------------------
    def on_run(self, job: Job, allocation: Allocation, now: float, primitive: str,
               before: Allocation | None = None) -> tuple[float, float]:
        """(pause seconds, rate divisor) for `job` starting to run on `allocation`.

        `primitive`: start | resume | restart (after a failure) | migrate | resize."""
        after = self.shape(job, allocation)
        if primitive == "start":
            phases = Phases()
        elif primitive in ("migrate", "resize"):
            assert before is not None
            phases = self.model.migrate(self.shape(job, before), after)
        else:
            phases = self.model.load(after)
            owed = self.owed.pop(job.key, None)
            if owed is not None and primitive == "resume":
                phases = owed + phases
        stall = self.model.checkpoint_stall_s(after)
        interval = self.model.costs.checkpoint_interval_s
        slowdown = (interval + stall) / interval
        divisor = slowdown * self._time_slice(job, allocation)
        self.clocks[job.key] = JobClock(now + phases.total_s, interval + stall, self.model.persist_s(after))
        if phases.total_s > 0:
            self.pauses.setdefault(job.key, []).append((now, primitive, phases))
            self.totals.paused_gpu_s += phases.total_s * allocation.total
        return phases.total_s, divisor

    def _time_slice(self, job: Job, allocation: Allocation) -> float:
        if job.plan is not None or allocation.total >= job.spec.gpus:
            return 1.0
        return 1.0 + self.model.costs.time_slice_overhead

    # -- when a job stops ------------------------------------------------------------
    def on_preempt(self, job: Job, allocation: Allocation, now: float, ran_s: float) -> None:
        self._account(job, allocation, now, ran_s)
        self.owed[job.key] = self.model.save(self.shape(job, allocation))
        self.clocks.pop(job.key, None)

    def on_stop(self, job: Job, allocation: Allocation, now: float, ran_s: float) -> None:
        """A finish, or the old allocation of a migrate/resize: account its run."""
        self._account(job, allocation, now, ran_s)
        self.clocks.pop(job.key, None)

    def on_failure(self, job: Job, allocation: Allocation, now: float, ran_s: float) -> float:
        """Wall seconds of progress lost (since the last durable checkpoint); the caller
        turns them into work at the job's rate."""
        self._account(job, allocation, now, ran_s)
        clock = self.clocks.pop(job.key, None)
        self.owed.pop(job.key, None)
        if clock is None or now <= clock.progress_from:
            return 0.0
        elapsed = now - clock.progress_from
        cycles, into = divmod(elapsed, clock.period_s)
        lost = into
        if self.model.costs.checkpoint_mode == "async" and cycles >= 1 and into < clock.persist_s:
            lost += clock.period_s  # the newest checkpoint was still uploading
        lost = min(lost, elapsed)
        self.totals.lost_gpu_s += lost * allocation.total
        return lost

    def _account(self, job: Job, allocation: Allocation, now: float, ran_s: float) -> None:
        """Checkpoint-stall GPU-seconds of the last `ran_s` seconds on `allocation`."""
        clock = self.clocks.get(job.key)
        if clock is None or ran_s <= 0:
            return
        progressing = max(0.0, min(ran_s, now - clock.progress_from))
        interval = self.model.costs.checkpoint_interval_s
        stall_share = (clock.period_s - interval) / clock.period_s
        self.totals.checkpoint_gpu_s += progressing * stall_share * allocation.total
