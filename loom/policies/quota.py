"""Quota reservation with best-effort borrowing (Acme, NSDI'24): each virtual
cluster (VC) owns a guaranteed number of GPUs; best-effort jobs soak up idle
GPUs and give them back when an owner needs its quota.

Rules
-----
* **Which jobs are best-effort, and the quotas** (`quotas` or `quota_file`,
  exactly one; `default_quota`; `best_effort_classes`): the workload's
  entitlements, defined in `loom.workload.quotas` (shared with the fairness
  report). Quotas are counted in GPUs of any type and are not checked against
  the cluster size (oversubscribed quotas are allowed; a guarantee then only
  holds while capacity lasts).
* **Guaranteed jobs** of VC *v* start only while *v*'s guaranteed usage plus
  the job's GPUs stay within *v*'s quota. Within a VC they start in order
  (`order`: "fcfs" = submit order, "priority" = higher `spec.priority`
  first, then submit order) and the first one that cannot start blocks the
  later ones of its VC; VCs do not block each other. A guaranteed job larger
  than its VC's whole quota can never start: it stays pending (reported as
  unfinished).
* **Best-effort jobs** start on any free GPUs, in the same order but without
  blocking (one that does not fit is skipped). A VC's running best-effort jobs
  count against its own unused quota first, earliest started first; the rest
  are *borrowing* (they run on other VCs' idle quota). Borrowing is paused
  while some VC is owed its guarantee (a guaranteed job within quota waits for
  GPUs): quota with waiting owners is not idle.
* **Reclaiming.** A guaranteed job of VC *A* that is within quota but does
  not fit preempts best-effort jobs: first borrowing ones (of any VC, most
  recently started first), then *A*'s own best-effort jobs, taking victims
  until the job can be placed and then dropping any victim it turns out not
  to need. It starts in the same round, right after the preemptions (as the
  priority policy does); the engine's follow-up round then lets freed spare
  GPUs go to other jobs. Preempted jobs keep their progress and resume later.
  If even all candidates together would not make room, nothing is preempted.
"""

from __future__ import annotations

from collections.abc import Iterable

from loom.core.context import SchedulingContext
from loom.core.decisions import Decision
from loom.core.jobs import Job
from loom.core.protocols import POLICIES
from loom.core.round import RoundPlan
from loom.policies import params
from loom.workload.quotas import DEFAULT_BEST_EFFORT_CLASSES, quota_entitlements

ORDERS = ("fcfs", "priority")


def _recent_first(job: Job) -> tuple[float, int]:
    return (-(job.last_start or 0.0), -job.key)


def vc_label(vc: str | None) -> str:
    return "(none)" if vc is None else str(vc)


@POLICIES.register("quota")
class QuotaPolicy:
    name = "quota"

    def __init__(self, quotas: dict[str, int] | None = None, quota_file: str | None = None,
                 default_quota: int = 0, best_effort_classes: list[str] | tuple[str, ...] | None =
                 DEFAULT_BEST_EFFORT_CLASSES, order: str = "fcfs") -> None:
        self.entitlements = quota_entitlements({"quotas": quotas, "quota_file": quota_file,
                                                "default_quota": default_quota,
                                                "best_effort_classes": best_effort_classes})
        self.quotas = self.entitlements.quotas
        self.default_quota = self.entitlements.default_quota
        self.is_best_effort = self.entitlements.is_best_effort
        self.order = params.choice(order, "order", ORDERS)

    # ------------------------------------------------------------ queries
    def quota_of(self, vc: str | None) -> int:
        return self.entitlements.quota_of(vc)

    def _sort_key(self, job: Job) -> tuple[int, ...]:
        return (-job.spec.priority, job.key) if self.order == "priority" else (job.key,)

    def usage(self, running: Iterable[Job]) -> tuple[dict[str | None, int], dict[str | None, list[Job]]]:
        """Guaranteed GPUs in use per VC, and running best-effort jobs per VC (earliest started first)."""
        guaranteed: dict[str | None, int] = {}
        best_effort: dict[str | None, list[Job]] = {}
        for job in running:
            vc = job.spec.vc
            if self.is_best_effort(job.spec):
                best_effort.setdefault(vc, []).append(job)
            else:
                guaranteed[vc] = guaranteed.get(vc, 0) + job.allocation.total  # type: ignore[union-attr]
        for jobs in best_effort.values():
            jobs.sort(key=lambda j: (j.last_start or 0.0, j.key))
        return guaranteed, best_effort

    def borrowing(self, ctx: SchedulingContext, guaranteed: dict[str | None, int] | None = None,
                  best_effort: dict[str | None, list[Job]] | None = None) -> list[Job]:
        """Running best-effort jobs beyond their own VC's unused quota (earliest started fill it first)."""
        if guaranteed is None or best_effort is None:
            guaranteed, best_effort = self.usage(ctx.running.values())
        out = []
        for vc, jobs in best_effort.items():
            room = self.quota_of(vc) - guaranteed.get(vc, 0)
            used = 0
            for job in jobs:
                used += job.allocation.total  # type: ignore[union-attr]
                if used > room:
                    out.append(job)
        return out

    # ------------------------------------------------------------ round
    def schedule(self, ctx: SchedulingContext) -> list[Decision]:
        if not ctx.pending:
            return []
        plan = RoundPlan(ctx)
        guaranteed, best_effort = self.usage(ctx.running.values())
        waiting_g: list[Job] = []
        waiting_be: list[Job] = []
        for job in ctx.pending.values():
            (waiting_be if self.is_best_effort(job.spec) else waiting_g).append(job)
        waiting_g.sort(key=self._sort_key)
        waiting_be.sort(key=self._sort_key)

        blocked: set[str | None] = set()
        preempted: set[str] = set()
        owed = 0  # GPUs that guaranteed jobs within quota wait for
        for job in waiting_g:
            vc = job.spec.vc
            if vc in blocked:
                continue
            quota, used = self.quota_of(vc), guaranteed.get(vc, 0)
            if used + job.gpus > quota:
                blocked.add(vc)
                continue
            reason = (f"quota: vc {vc_label(vc)} uses {used}/{quota} guaranteed GPUs; "
                      f"start {job.job_id} ({job.gpus} GPUs)")
            if plan.try_start(job, reason) is None and not self._reclaim(ctx, plan, job, reason, guaranteed,
                                                                           best_effort, preempted):
                blocked.add(vc)
                owed += job.gpus
                continue
            guaranteed[vc] = used + job.gpus

        be_used = {vc: sum(j.allocation.total for j in jobs if j.job_id not in preempted)  # type: ignore[union-attr]
                   for vc, jobs in best_effort.items()}
        for job in waiting_be:
            free = plan.view.free_total
            if free == 0:
                break
            if job.gpus > free:
                continue
            vc = job.spec.vc
            quota, used = self.quota_of(vc), guaranteed.get(vc, 0) + be_used.get(vc, 0)
            borrows = used + job.gpus > quota
            if borrows and job.gpus > free - owed:
                continue
            if borrows:
                reason = (f"quota: best-effort {job.job_id} of vc {vc_label(vc)} borrows idle GPUs "
                          f"(vc {vc_label(vc)} at {used}/{quota}); start ({job.gpus} GPUs, borrowing)")
            else:
                reason = (f"quota: best-effort {job.job_id} of vc {vc_label(vc)} within its quota "
                          f"({used}/{quota} in use); start ({job.gpus} GPUs)")
            if plan.try_start(job, reason) is not None:
                be_used[vc] = be_used.get(vc, 0) + job.gpus
        return plan.decisions

    def _reclaim(self, ctx: SchedulingContext, plan: RoundPlan, job: Job, reason: str,
                 guaranteed: dict[str | None, int], best_effort: dict[str | None, list[Job]],
                 preempted: set[str]) -> bool:
        """Preempt best-effort jobs so `job` (within its VC's quota) fits; start it. False if impossible."""
        if not best_effort:
            return False
        vc = job.spec.vc
        live = {v: [j for j in jobs if j.job_id not in preempted] for v, jobs in best_effort.items()}
        borrowers = sorted(self.borrowing(ctx, guaranteed, live), key=_recent_first)
        taken = {j.job_id for j in borrowers}
        own = sorted((j for j in live.get(vc, []) if j.job_id not in taken), key=_recent_first)
        candidates = borrowers + own
        if not candidates or sum(c.allocation.total for c in candidates) + plan.view.free_total < job.gpus:  # type: ignore[union-attr]
            return False
        trial = plan.fork()
        chosen: list[Job] = []
        alloc = None
        for victim in candidates:
            trial.state.release(victim.allocation)  # type: ignore[arg-type]
            chosen.append(victim)
            alloc = trial.place(job)
            if alloc is not None:
                break
        if alloc is None:
            return False
        # keep running any victim the job turns out not to need (oldest-chosen first: most recent go)
        for victim in list(chosen[:-1]):
            rest = [c for c in chosen if c is not victim]
            check = plan.fork()
            for c in rest:
                check.state.release(c.allocation)  # type: ignore[arg-type]
            smaller = check.place(job)
            if smaller is not None:
                chosen, alloc = rest, smaller
        owner = vc_label(vc)
        for victim in chosen:
            victim_vc = victim.spec.vc
            if victim.job_id in taken:
                why = (f"quota: preempt best-effort {victim.job_id} of vc {vc_label(victim_vc)} "
                       f"borrowing vc {owner}'s quota for {job.job_id}")
            else:
                why = (f"quota: preempt best-effort {victim.job_id} of vc {owner} "
                       f"to free vc {owner}'s quota for {job.job_id}")
            plan.preempt(victim, why)
            preempted.add(victim.job_id)
        plan.start(job, alloc, f"{reason} after preempting {len(chosen)} best-effort job(s)")
        return True
