"""Recovery of jobs hit by node failures (Acme §6.1, Arnold Appendix B).

Part of the core: driven by backend events (`JobFailed` naming the nodes it
blames, `NodeDown`, `NodeUp`) and the core's timers, it acts through the
core's decisions, so the simulator and the live service run it unchanged
(the simulator prices the pipeline's steps; a live backend carries them out).

Pipeline for every job running on a node that fails (a backend that names
the node), priced by the core's timer:

1. **Detect** (`detection_s`: the job's processes die, heartbeats stop),
   **diagnose** (`diagnosis_s`: log rules, then retrieval over past failures),
   **localise** the faulty node (`localisation_rounds` × `localisation_round_s`:
   two rounds of pairwise all-gather tests — pairs first, suspects re-paired
   with healthy nodes). Meanwhile the job holds its surviving nodes (idle).
2. **Replace** each failed node (`loom.placement.replacement`): `topology`
   keeps the job's alignment (same leaf / minipod as the failed node),
   `naive` takes the first free node of the type; `policy` releases the
   survivors at once and leaves the job to the scheduling policy.
3. **Restart** from the last checkpoint on survivors + replacements (a
   `Resume`; its cost and the work lost are priced by the interruption model
   when the simulation has one). With no replacement the survivors are
   released and the job goes to the *front* of the queue.

**Live pipeline** (a backend that does not know why a job died reports
`JobFailed(diagnose=True)`): the steps are real and the backend carries them
out as decisions. `Diagnose` → `JobDiagnosed`: a script or framework error is
not retried (the job ends FAILED with its diagnosis); an infrastructure error
with no node to blame → `Localize` on the job's nodes → `FaultsLocalized`: the
faulty nodes are cordoned (drained: nothing new lands there) and replaced as
above; no faulty node → the job restarts on its own nodes. A step the backend
could not carry out is skipped (a failed diagnosis counts as infrastructure).

**Hot spares** (`spares_per_minipod` = k): the k last nodes of every minipod
are held back; only preemptible jobs may run there (they are preempted when a
spare is needed). A spare taken for a recovery joins the job for good, and the
failed node it replaced becomes a spare when repaired, so each minipod keeps
k spares.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING

import numpy as np

from loom.core.decisions import Diagnose, Localize, Preempt, Resume
from loom.core.events import FaultsLocalized, JobDiagnosed
from loom.core.jobs import Job, JobState
from loom.core.record import NodeEventRecord
from loom.errors import LoomInputError
from loom.hardware.state import DRAINED, NO_RESERVATION, Allocation
from loom.placement.replacement import replacements

if TYPE_CHECKING:
    from loom.core.scheduler import Scheduler
    from loom.hardware.topology import Topology

SPARES = 1 << 30  # reservation id of the hot spares
REPLACEMENTS = ("topology", "naive", "policy")


@dataclass(frozen=True)
class RecoveryConfig:
    detection_s: float = 60.0
    diagnosis_s: float = 120.0
    localisation_round_s: float = 60.0
    localisation_rounds: int = 2
    replacement: str = "topology"
    spares_per_minipod: int = 0
    max_failures: int = 0  # a job that failed more often than this is not recovered again (0: no limit)

    def __post_init__(self) -> None:
        if self.replacement not in REPLACEMENTS:
            raise LoomInputError(f"must be one of {', '.join(REPLACEMENTS)}, got {self.replacement!r}",
                                 field="recovery.replacement")
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "replacement":
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not np.isfinite(value) or value < 0:
                raise LoomInputError(f"must be a finite number ≥ 0, got {value!r}", field=f"recovery.{f.name}")
        for name in ("spares_per_minipod", "localisation_rounds", "max_failures"):
            if not isinstance(getattr(self, name), int):
                raise LoomInputError("must be an integer", field=f"recovery.{name}")

    @property
    def delay_s(self) -> float:
        return self.detection_s + self.diagnosis_s + self.localisation_rounds * self.localisation_round_s


@dataclass
class RecoveryRecord:
    """One job's recovery from one failure, for reports."""

    job_id: str
    failed_at: float
    failed_nodes: tuple[str, ...]
    minipods_before: int
    restarted_at: float | None = None  # None: handed back to the policy
    minipods_after: int | None = None
    replaced: tuple[tuple[str, str], ...] = ()  # (failed node, replacement)
    used_spares: int = 0
    held_gpu_s: float = 0.0  # surviving GPUs held idle while it recovered
    diagnosis: str | None = None  # live pipeline: category/error type: root cause


@dataclass
class _Waiting:
    job: Job
    keep: Allocation | None  # surviving nodes, held while it recovers
    lost: dict[int, int]  # failed node → GPUs it held
    order: tuple[int, ...] = ()  # the job's nodes before the failure, in rank order
    record: RecoveryRecord = field(repr=False, default=None)  # type: ignore[assignment]
    step: str | None = None  # live pipeline: the answer it waits for (diagnose | localize)


class Recovery:
    def __init__(self, config: RecoveryConfig, core: Scheduler) -> None:
        self.config = config
        self.core = core
        self.ctx = core.ctx
        self.topology = core.topology
        self.waiting: dict[int, _Waiting] = {}
        self.records: list[RecoveryRecord] = []
        self.spares: set[int] = set()
        self._refill: set[int] = set()  # failed nodes that become spares when repaired
        if config.spares_per_minipod:
            self._choose_spares(config.spares_per_minipod)

    # -- spares -------------------------------------------------------------------
    def _choose_spares(self, per_minipod: int) -> None:
        pods = self.topology.switch_of[self.topology.minipod_tier]
        for pod in np.unique(pods).tolist():
            self.spares.update(np.flatnonzero(pods == pod)[-per_minipod:].tolist())
        self.ctx.state.reserve(sorted(self.spares), SPARES)
        self.ctx.spare_reservation = SPARES

    def _take_spare(self, node: int, failed: int) -> None:
        """`node` joins a job for good; the `failed` node it replaces becomes a spare once repaired."""
        self.spares.discard(node)
        self.ctx.state.reserve([node], NO_RESERVATION)
        self._refill.add(failed)
        self.node_repaired(failed)

    def node_repaired(self, node: int) -> None:
        """A repaired node whose place a spare took becomes a spare (when nothing runs on it)."""
        state = self.ctx.state
        if node in self._refill and not state.failed[node] and state.reserved_by[node] != DRAINED \
                and state.free[node] == self.topology.node_gpus[node]:
            self._refill.discard(node)
            self.spares.add(node)
            state.reserve([node], SPARES)

    # -- failures -----------------------------------------------------------------
    def node_down(self, node: int) -> None:
        """Recovering jobs lose their survivors on `node` (its running jobs were failed before)."""
        for wait in self.waiting.values():
            if wait.keep is not None and node in wait.keep.nodes:
                self._drop_survivor(wait, node)

    def _drop_survivor(self, wait: _Waiting, node: int) -> None:
        keep = wait.keep
        assert keep is not None
        i = keep.nodes.index(node)
        self.ctx.state.release(Allocation((node,), (keep.gpus[i],)))
        wait.lost[node] = keep.gpus[i]
        rest = [(n, g) for n, g in zip(keep.nodes, keep.gpus) if n != node]
        wait.keep = Allocation(tuple(n for n, _ in rest), tuple(g for _, g in rest)) if rest else None
        if wait.keep is None:
            self.ctx.held.pop(wait.job.job_id, None)
        else:
            self.ctx.held[wait.job.job_id] = wait.keep
        wait.record.failed_nodes += (self.topology.node_names[node],)

    def job_failed(self, job: Job, nodes: tuple[int, ...], now: float, cause: str, diagnose: bool = False) -> None:
        """`job` (already off its GPUs) lost `nodes`: hold its survivors while the pipeline runs
        (`diagnose`: the backend does not know why; the live pipeline's steps find out)."""
        alloc = job.allocation
        assert alloc is not None
        if self.config.max_failures and job.failures > self.config.max_failures:
            why = f"JobFailed: {cause}; failed {job.failures} times (recovery.max_failures {self.config.max_failures})"
            self.core._end(job, JobState.FAILED, why, now)
            job.reason = why
            return
        self.core._to(job, JobState.RECOVERING, f"JobFailed: {cause}", now)
        lost = {n: g for n, g in zip(alloc.nodes, alloc.gpus) if n in nodes}
        rest = [(n, g) for n, g in zip(alloc.nodes, alloc.gpus) if n not in lost]
        keep = None
        if rest and self.config.replacement != "policy":
            keep = Allocation(tuple(n for n, _ in rest), tuple(g for _, g in rest))
            self.ctx.state.allocate(keep)
            self.ctx.held[job.job_id] = keep
        names = self.topology.node_names
        record = RecoveryRecord(job.job_id, now, tuple(names[n] for n in lost), self._spread(alloc.nodes))
        self.records.append(record)
        wait = self.waiting[job.key] = _Waiting(job, keep, lost, alloc.nodes, record)
        if diagnose:
            wait.step = "diagnose"
            self.core.issue([Diagnose(job.job_id, f"it failed ({cause}): find the root cause in its logs")], now)
        else:
            self.core.backend.set_timer(now + self.config.delay_s, ("recover", job.key))

    # -- the live pipeline's steps ----------------------------------------------------
    def step_done(self, job: Job, ev: JobDiagnosed | FaultsLocalized) -> bool:
        """A step's answer; False if the job is not waiting for it (stale)."""
        wait = self.waiting.get(job.key)
        expected = "diagnose" if isinstance(ev, JobDiagnosed) else "localize"
        if wait is None or wait.step != expected:
            return False
        if isinstance(ev, JobDiagnosed):
            self._diagnosed(wait, ev)
        else:
            self._localized(wait, ev.faulty, ev.summary, ev.at)
        return True

    def step_failed(self, job: Job, step: Diagnose | Localize, why: str, now: float) -> None:
        """The backend could not carry out a step: go on without its answer."""
        wait = self.waiting.get(job.key)
        if wait is None or wait.step != ("diagnose" if isinstance(step, Diagnose) else "localize"):
            return
        if isinstance(step, Diagnose):
            self._diagnosed(wait, JobDiagnosed(job.job_id, now, "infrastructure", "Unknown", True,
                                               f"no diagnosis ({why})"))
        else:
            self._localized(wait, (), f"no localisation ({why})", now)

    def _diagnosed(self, wait: _Waiting, ev: JobDiagnosed) -> None:
        job = wait.job
        job.diagnosis = wait.record.diagnosis = (f"{ev.category}/{ev.error_type}"
                                                 + (f": {ev.summary}" if ev.summary else ""))
        if not ev.recoverable:
            self.forget(job, ev.at)
            why = f"diagnosed {job.diagnosis}; not retried" + (f" ({ev.mitigation})" if ev.mitigation else "")
            self.core._end(job, JobState.FAILED, why, ev.at)
            job.reason = why
            return
        if ev.category == "infrastructure" and not wait.lost:
            wait.step = "localize"
            nodes = wait.order
            self.core.issue([Localize(job.job_id, nodes, f"diagnosed {ev.category}/{ev.error_type}: test its "
                                                         f"{len(nodes)} node(s) for faulty ones")], ev.at)
            return
        wait.step = None
        self.ready(job.key, ev.at)

    def _localized(self, wait: _Waiting, faulty: tuple[int, ...], summary: str, now: float) -> None:
        """Cordon the job's faulty nodes (drained: nothing new lands there), then restart without them."""
        gpus = dict(zip(wait.order, wait.job.allocation.gpus))  # type: ignore[union-attr]
        names = self.topology.node_names
        for node in sorted(set(faulty) & set(wait.order)):
            if wait.keep is not None and node in wait.keep.nodes:
                self._drop_survivor(wait, node)
            elif node not in wait.lost:
                wait.lost[node] = gpus[node]
                wait.record.failed_nodes += (names[node],)
            self._cordon(node, now, f"found faulty while recovering {wait.job.job_id}" + (f": {summary}" if summary else ""))
        wait.step = None
        self.ready(wait.job.key, now)

    def _cordon(self, node: int, now: float, why: str) -> None:
        self.core.record.node_events.append(NodeEventRecord(now, self.topology.node_names[node], "drained", why))
        self.ctx.state.reserve([node], DRAINED)

    def hand_back_all(self, now: float) -> None:
        """The inventory changed under the pipelines: every recovering job goes back to the queue."""
        for wait in list(self.waiting.values()):
            self.forget(wait.job, now)
            self._requeue_first(wait.job, now)

    def on_inventory(self, topology: Topology) -> None:
        """Hot spares are chosen again on the new tree (indices of the old one mean nothing now)."""
        self.topology = topology
        self.spares, self._refill = set(), set()
        if self.config.spares_per_minipod:
            self._choose_spares(self.config.spares_per_minipod)

    def forget(self, job: Job, now: float) -> None:
        """A recovering job was cancelled: give back its survivors, stop its pipeline."""
        wait = self.waiting.pop(job.key, None)
        if wait is not None and wait.keep is not None:
            self.ctx.state.release(wait.keep)
            self.ctx.held.pop(job.job_id, None)
            wait.record.held_gpu_s = wait.keep.total * (now - wait.record.failed_at)

    def _spread(self, nodes: tuple[int, ...]) -> int:
        return len(set(self.topology.switch_of[self.topology.minipod_tier, list(nodes)].tolist()))

    # -- restart --------------------------------------------------------------------
    def ready(self, key: int, now: float) -> None:
        """The pipeline finished for job `key`: restart it on replacements or hand it back."""
        wait = self.waiting.pop(key, None)
        if wait is None:
            return
        job, keep = wait.job, wait.keep
        chosen = None
        if self.config.replacement != "policy":
            chosen = replacements(self.ctx.state, keep.nodes if keep else (), wait.lost, self.config.replacement,
                                  frozenset(self.spares), self._spare_load())
        if keep is not None:
            self.ctx.state.release(keep)
            del self.ctx.held[job.job_id]
            wait.record.held_gpu_s = keep.total * (now - wait.record.failed_at)
        if chosen is None:
            self._requeue_first(job, now)
            return
        squatters = [j for j in list(self.ctx.running.values())
                     if set(j.allocation.nodes) & set(chosen.values())]  # type: ignore[union-attr]
        self.core.issue([Preempt(j.job_id, f"recovery of {job.job_id}: its hot spare is needed")
                         for j in squatters], now)
        for failed, new in chosen.items():
            if new in self.spares:
                self._take_spare(new, failed)
                wait.record.used_spares += 1
        # each replacement takes its failed node's place: ranks keep their positions
        held = dict(zip(keep.nodes, keep.gpus)) if keep else {}
        order = [n for n in wait.order if n in held or n in chosen]
        alloc = Allocation(tuple(chosen.get(n, n) for n in order),
                           tuple(held[n] if n in held else wait.lost[n] for n in order))
        names = self.topology.node_names
        wait.record.replaced = tuple((names[f], names[chosen[f]]) for f in sorted(wait.lost))
        wait.record.restarted_at = now
        wait.record.minipods_after = self._spread(alloc.nodes)
        swaps = ", ".join(f"{a}→{b}" for a, b in wait.record.replaced)
        how = f"{self.config.replacement} replacement {swaps}" if swaps else "on its own nodes (none found faulty)"
        self.core.issue([Resume(job.job_id, alloc, f"recovered after {now - wait.record.failed_at:.0f}s: {how}",
                                job.plan)], now)

    def _spare_load(self) -> dict[int, int]:
        """GPUs preemptible jobs hold on spare nodes (they give them up for a recovery)."""
        load: dict[int, int] = {}
        for job in self.ctx.running.values():
            for n, g in zip(job.allocation.nodes, job.allocation.gpus):  # type: ignore[union-attr]
                if n in self.spares:
                    load[n] = load.get(n, 0) + g
        return load

    def _requeue_first(self, job: Job, now: float) -> None:
        self.core._to(job, JobState.SUSPENDED, "recovery handed it back to the policy", now)
        self.core._requeue_first(job)
