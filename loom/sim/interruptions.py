"""Prices the simulator's interruptions with `loom.perf.interruptions` and keeps
each job's checkpoint timeline, so lost work and overheads are exact.

Rules (the simulated backend applies them to every policy's decisions alike):

* A **fresh start** pays nothing extra. A **resume** after a preemption pays the
  preemption's save (barrier, dump, upload — charged when the job comes back,
  since the simulator frees the GPUs at once) plus the load (download, restore,
  rendezvous) where it resumes. A resume after a **failure** pays only the load:
  it restarts from its last periodic checkpoint. A **migrate** or **resize**
  pays save-where-it-was plus load-where-it-goes; the policy's own `pause_s` is
  then ignored (the cost model is the authority).
* **Periodic checkpoints**: after every `checkpoint_interval_s` of progress the
  job stalls for `checkpoint_stall_s` (sync: snapshot + upload; async:
  snapshot); none at the very end, so jobs shorter than the interval never
  checkpoint. On a run segment the timeline is

      pause | interval | stall | interval | stall | … | last partial interval

  and the stalls still ahead are charged up front as work and refunded when
  the segment ends early (preemption, migration, failure).
* **Time-slicing**: a job that runs without a plan of its own on fewer GPUs than
  it asked for keeps its logical world size and pays `time_slice_overhead` on
  top of the N× slowdown the speed model already gives.
* **Unplanned failure**: the progress since the last *durable* checkpoint is
  lost (a checkpoint cut off by the failure does not count; with async
  checkpoints the newest one counts only once its upload has finished).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from loom.core.jobs import Job
from loom.hardware.state import Allocation
from loom.perf.interruptions import InterruptionModel, JobShape, Phases


@dataclass
class Segment:
    """A job's checkpoint timeline on its current allocation."""

    progress_from: float  # wall time the pause ends and progress starts
    stall_s: float  # one periodic checkpoint's stall
    checkpoints: int  # stalls charged for this segment
    persist_s: float  # upload of one checkpoint (in the background when async)
    gpus: int


@dataclass
class InterruptionTotals:
    """GPU-seconds the run spent on interruptions, by cause."""

    paused_gpu_s: float = 0.0  # save / load / rendezvous of preempt, migrate, resize, restart
    checkpoint_gpu_s: float = 0.0  # periodic checkpoint stalls
    lost_gpu_s: float = 0.0  # progress redone after failures


class Interruptions:
    def __init__(self, model: InterruptionModel) -> None:
        self.model = model
        self.interval = model.costs.checkpoint_interval_s
        self.segments: dict[int, Segment] = {}
        self.owed: dict[int, Phases] = {}
        self.totals = InterruptionTotals()

    def shape(self, job: Job, allocation: Allocation) -> JobShape:
        return self.model.shape(job.spec, allocation.total, len(allocation.nodes), job.plan)

    # -- when a job gets GPUs ------------------------------------------------------
    def on_run(self, job: Job, allocation: Allocation, now: float, primitive: str, rate: float,
               before: Allocation | None, hold_s: float, remaining: float) -> tuple[float, float]:
        """(extra wall seconds of no progress — pause plus checkpoint stalls ahead —, rate
        divisor) for `job` starting to run on `allocation` at speed-model `rate`.

        `primitive`: start | resume (after a preemption or a failure) | migrate | resize;
        `hold_s`: idle time on the GPUs before the primitive starts (a hang's watchdog wait);
        `remaining`: the job's work left (reference seconds)."""
        after = self.shape(job, allocation)
        if primitive == "start":
            phases = Phases()
        elif primitive in ("migrate", "resize"):
            assert before is not None
            phases = self.model.migrate(self.shape(job, before), after)
        else:
            phases = self.model.load(after)
            owed = self.owed.pop(job.key, None)
            if owed is not None:
                phases = owed + phases
        divisor = self._time_slice(job, allocation)
        progress_s = remaining * divisor / rate  # wall seconds of progress left
        checkpoints = max(0, math.ceil(progress_s / self.interval) - 1)
        stall = self.model.checkpoint_stall_s(after)
        pause = hold_s + phases.total_s
        self.segments[job.key] = Segment(now + pause, stall, checkpoints, self.model.persist_s(after),
                                         allocation.total)
        self.totals.paused_gpu_s += pause * allocation.total
        return pause + checkpoints * stall, divisor

    def _time_slice(self, job: Job, allocation: Allocation) -> float:
        if job.plan is not None or allocation.total >= job.spec.gpus:
            return 1.0
        return 1.0 + self.model.costs.time_slice_overhead

    # -- when a job's segment ends ----------------------------------------------------
    def end_segment(self, job: Job, now: float, cause: str, allocation: Allocation | None) -> float:
        """Close the segment at `now` (`cause`: finish | move | preempt | failure | terminate);
        returns the wall seconds of charged-but-not-spent time (pause and stalls not reached)
        minus, for a failure, the progress lost. The caller turns it into work at the job's
        rate: remaining −= rate × returned."""
        seg = self.segments.pop(job.key, None)
        if cause in ("failure", "terminate"):
            self.owed.pop(job.key, None)
        if seg is None:
            return 0.0
        unspent_pause = max(0.0, seg.progress_from - now)
        self.totals.paused_gpu_s -= unspent_pause * seg.gpus  # charged up front, never spent
        elapsed = max(0.0, now - seg.progress_from)
        period = self.interval + seg.stall_s
        cycles, into = divmod(elapsed, period)
        cycles = int(cycles)
        if cycles >= seg.checkpoints:  # past the last checkpoint: plain progress to the end
            cycles, into = seg.checkpoints, elapsed - seg.checkpoints * period
        stalled = cycles * seg.stall_s + (min(seg.stall_s, into - self.interval) if into > self.interval
                                          and cycles < seg.checkpoints else 0.0)
        self.totals.checkpoint_gpu_s += stalled * seg.gpus
        if cause == "preempt":
            self.owed[job.key] = self.model.save(self.shape(job, allocation))  # type: ignore[arg-type]
        refund = unspent_pause + seg.checkpoints * seg.stall_s - stalled
        if cause != "failure":
            return refund
        lost = self._lost(seg, cycles, into)
        self.totals.lost_gpu_s += lost * seg.gpus
        # the checkpoint stall interrupted by the failure is spent, but its progress is not saved
        return refund - lost

    def _lost(self, seg: Segment, cycles: int, into: float) -> float:
        """Wall seconds of progress since the last durable checkpoint."""
        lost = min(into, self.interval)
        if cycles >= 1 and self.model.costs.checkpoint_mode == "async" and into < seg.persist_s:
            lost += self.interval  # the newest checkpoint was still uploading
        return lost
