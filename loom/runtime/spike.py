"""Loss-spike rollback: watch the job's loss, roll back to the last checkpoint before a spike, skip its batches.

Acme and large pretraining runs handle a sudden rise of the loss by restarting from an
earlier healthy checkpoint and skipping the data batches around the spike. Here the
runtime does it inside the running job, without a restart:

* **the loss** of iteration i is the mean of the losses the script passed to `report()`
  during iteration i, over every logical rank that reported one. Each process sums its
  own and a synchronous all-reduce of `(sum, count)` on the data-parallel group, before
  the next batch is taken, gives every process the same value — all-reduce results are
  identical on every rank — so every process runs the same detector on the same numbers
  and takes the same decision at the same iteration boundary, with no extra round;
* **the rule** (`SpikeDetector`, a robust z-score): over the last `window` healthy
  losses, with median m and MAD, a loss x is a spike when it is NaN or infinite, or when
  at least `min_history` healthy losses are known and
  `x - m > max(z * 1.4826 * MAD, rel * |m|, abs)`; spikes never enter the window;
* **the rollback** happens at the boundary right after the spike's iteration s, before
  anything else (a periodic checkpoint of iteration s, a request's cut): every rank
  loads the newest complete checkpoint of this run's timeline whose iteration is < s
  (the state before the spike's batch was applied; later ones, and those of other
  timelines, are never used), discards `skip` more batches of its shard, and goes on:
  the iteration counter is the checkpoint's, the data position is not rewound, so the
  batches of iterations c+1 … s and the `skip` after them are never trained on again;
* **limits**: more than `max_rollbacks` spikes within `period` iterations fail the job
  ("loss spikes persist after K rollbacks"); a spike with no checkpoint before it is
  logged and training goes on, unless the loss is not finite (the job fails).

Every detection is one event in events.jsonl — `rollback`, or `loss_spike` when there
was nothing to roll back to — with the rule's numbers and a one-line reason.
"""

from __future__ import annotations

import logging
import math
import statistics
from collections import deque
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from loom.runtime import store
from loom.runtime.config import SpikeRule
from loom.runtime.errors import LossSpikeError

if TYPE_CHECKING:
    from loom.runtime.runtime import Runtime

log = logging.getLogger("loom.runtime")
MAD_TO_SIGMA = 1.4826  # MAD of a normal distribution times this is its standard deviation


@dataclass(frozen=True)
class Verdict:
    """The detector's judgement of one iteration's loss."""

    iteration: int
    loss: float
    spike: bool
    median: float | None = None  # of the window (None: no history yet)
    mad: float | None = None
    z: float | None = None  # robust z-score (x - median) / (1.4826 MAD); inf when MAD is 0
    bound: float | None = None  # the rise above the median that counts: max(z·σ, rel·|m|, abs)
    history: int = 0  # healthy losses in the window
    reason: str | None = None  # why it is a spike (spikes only)


class SpikeDetector:
    """The documented rule over a window of healthy losses; pure Python, the same on every rank."""

    def __init__(self, rule: SpikeRule) -> None:
        self.rule = rule
        self.history: deque[float] = deque(maxlen=rule.window)

    def observe(self, iteration: int, loss: float) -> Verdict:
        """Judge `loss`; a healthy one joins the window, a spike never does."""
        rule, n = self.rule, len(self.history)
        if not math.isfinite(loss):
            return Verdict(iteration, loss, True, history=n,
                           reason=f"loss {loss} at iteration {iteration} is not finite")
        if n == 0:
            self.history.append(loss)
            return Verdict(iteration, loss, False)
        median = statistics.median(self.history)
        mad = statistics.median(abs(h - median) for h in self.history)
        sigma = MAD_TO_SIGMA * mad
        rise = loss - median
        z = rise / sigma if sigma > 0 else (math.inf if rise > 0 else 0.0)
        bound = max(rule.z * sigma, rule.rel * abs(median), rule.abs)
        spike = n >= rule.min_history and rise > bound
        verdict = Verdict(iteration, loss, spike, median, mad, z, bound, n,
                          _reason(iteration, loss, median, sigma, n, rule) if spike else None)
        if not spike:
            self.history.append(loss)
        return verdict

    def state(self) -> list[float]:
        return list(self.history)

    def load(self, history: list[float]) -> None:
        self.history = deque((float(h) for h in history), maxlen=self.rule.window)


def _reason(iteration: int, loss: float, median: float, sigma: float, n: int, rule: SpikeRule) -> str:
    """One line a person can check: the loss, how far above the window's median, against what."""
    rise, floor = loss - median, max(rule.rel * abs(median), rule.abs)
    head = f"loss {loss:.4g} at iteration {iteration}"
    tail = f"the median {median:.4g} of the last {n}"
    floors = f"LOOM_SPIKE_REL {rule.rel:g} x |median|, at least LOOM_SPIKE_ABS {rule.abs:g}"
    if sigma == 0:
        return f"{head} rose {rise:.3g} above {tail}, whose MAD is 0, more than the floor {floor:.3g} ({floors})"
    text = f"{head} is {rise / sigma:.3g} robust z-scores above {tail} (threshold {rule.z:g})"
    if floor > rule.z * sigma:  # the floor, not the z-score, was the binding condition
        text += f"; its rise {rise:.3g} also exceeds the floor {floor:.3g} ({floors})"
    return text


def rollback_candidates(checkpoints: list[store.CheckpointInfo], spike_iteration: int,
                        origin_seq: int) -> list[store.CheckpointInfo]:
    """Checkpoints a spike at `spike_iteration` may roll back to, best first.

    Only states from before the spike's batch was applied (iteration < spike_iteration) and
    only this timeline's (commit sequence >= `origin_seq`, the checkpoint the run started
    or last rolled back from): a checkpoint of an abandoned timeline — an older run's, or
    one left behind by a resume from an earlier checkpoint — may carry any iteration
    number. Newest commit first: within one timeline commits and iterations grow together.
    """
    fit = [c for c in checkpoints if c.seq >= origin_seq and c.iteration < spike_iteration]
    return sorted(fit, key=lambda c: c.seq, reverse=True)


class SpikeGuard:
    """The runtime's side of the rule: gathers each iteration's loss, agrees on it, responds to spikes."""

    def __init__(self, runtime: Runtime, rule: SpikeRule) -> None:
        self.rt, self.rule = runtime, rule
        self.detector = SpikeDetector(rule)
        self._losses: dict[int, Any] = {}  # logical rank -> its loss reported during this iteration
        self.due = False  # an iteration completed since the last check
        self.ran = 0  # iterations run by this timeline, undone ones included (the cap's clock)
        self.spikes: list[int] = []  # `ran` at each handled spike (the cap)
        self.rollbacks = 0
        self.last: dict[str, Any] | None = None  # the last rollback/loss_spike event's fields
        self.origin_seq = 1  # checkpoints with a smaller commit sequence belong to another timeline

    # --- hooks called by the runtime ------------------------------------------------------------
    def note(self, logical_rank: int, loss: Any) -> None:
        """`report(loss)`: the slice's loss for this iteration (the latest one counts)."""
        self._losses[logical_rank] = loss

    def stepped(self) -> None:
        """An iteration completed (the real optimizer step): check its loss before the next batch."""
        self.due = True
        self.ran += 1

    def check(self) -> None:
        """Every rank, before the next batch: agree on the iteration's loss; roll back on a spike."""
        if not self.due:
            return
        self.due = False
        loss = self._agreed_loss()
        if loss is None:
            return
        verdict = self.detector.observe(self.rt._steps, loss)
        if verdict.spike:
            self._respond(verdict)

    def state(self) -> dict[str, Any]:
        """Saved in every checkpoint, so a resumed job judges the next losses as an uninterrupted one."""
        return {"history": self.detector.state(), "ran": self.ran, "spikes": list(self.spikes),
                "rollbacks": self.rollbacks}

    def load(self, state: dict[str, Any] | None) -> None:
        if state:
            self.detector.load(state.get("history", []))
            self.ran, self.spikes = int(state.get("ran", 0)), list(state.get("spikes", []))
            self.rollbacks = int(state.get("rollbacks", 0))

    def status(self) -> dict[str, Any]:
        return {"rollbacks": self.rollbacks, "last_rollback": self.last}

    # --- agreeing on the loss -------------------------------------------------------------------
    def _agreed_loss(self) -> float | None:
        """The mean of every logical rank's reported loss (None: nobody reported one this iteration)."""
        device = self.rt.barrier.device
        total = 0.0
        for value in self._losses.values():
            tensor = value.detach() if isinstance(value, torch.Tensor) else torch.tensor(float(value))
            total += float(tensor.to(device=device, dtype=torch.float64).mean())
        count = len(self._losses)
        self._losses.clear()
        total, count = self.rt.barrier.sum_over_ranks(total, count)  # on the barrier's persistent tensor
        return total / count if count else None

    # --- responding -----------------------------------------------------------------------------
    def _respond(self, verdict: Verdict) -> None:
        rt = self.rt
        rt.barrier.drain()  # nothing in flight: DCP's load runs collectives
        rt.checkpointer.wait()  # a save in flight may be the checkpoint to roll back to
        self.spikes = [s for s in self.spikes if s > self.ran - self.rule.period]
        if len(self.spikes) >= self.rule.max_rollbacks:
            self._give_up(verdict)
        self.spikes.append(self.ran)
        target = self._agree_on_target(verdict.iteration)
        if target is None:
            self._no_checkpoint(verdict)
        else:
            self._rollback(verdict, target)
        rt._status(force=True)

    def _agree_on_target(self, spike_iteration: int) -> store.CheckpointInfo | None:
        """Rank 0 picks the newest complete checkpoint of this timeline before the spike; all load it."""
        choice: list[Any] = [self._target(spike_iteration) if self.rt.rank == 0 else None]
        if self.rt._ckpt_group is not None:
            dist.broadcast_object_list(choice, src=dist.get_global_rank(self.rt.group, 0),
                                       group=self.rt._ckpt_group)
        return choice[0]

    def _target(self, spike_iteration: int) -> store.CheckpointInfo | None:
        try:
            candidates = rollback_candidates(store.complete(self.rt.config.checkpoints), spike_iteration,
                                             self.origin_seq)
        except OSError as exc:
            log.warning("loom runtime: cannot list checkpoints for a rollback: %s", exc)
            return None
        for info in candidates:
            try:
                return store.validate(info.path)
            except store.CheckpointError as exc:
                log.warning("loom runtime: not rolling back to %s", exc)
        return None

    def _rollback(self, verdict: Verdict, target: store.CheckpointInfo) -> None:
        """Skip the extra batches (they may draw randomness), then restore everything the checkpoint holds."""
        rt = self.rt
        extra = rt.loader.skip(self.rule.skip)
        rt._restore(target, data=False)
        self.origin_seq = target.seq
        self.rollbacks += 1
        s, c = verdict.iteration, target.iteration
        skipped = list(range(c + 1, s + 1 + extra))
        fields = {**self._numbers(verdict), "to_iteration": c, "checkpoint": str(target.path),
                  "skipped_batches": skipped, "skip": self.rule.skip, "rollbacks": self.rollbacks,
                  "reason": f"{verdict.reason}; rolled back to the checkpoint of iteration {c} and skipped "
                            f"the {len(skipped)} batches of iterations {c + 1}-{s + extra}"}
        if rt.rank == 0:
            log.warning("loom runtime: loss spike: %s", fields["reason"])
        self._record("rollback", fields)

    def _no_checkpoint(self, verdict: Verdict) -> None:
        """Nothing to roll back to: a finite spike is logged and kept; a non-finite loss ends the job."""
        rt = self.rt
        if not math.isfinite(verdict.loss):
            self._record("loss_spike", {**self._numbers(verdict), "action": "fail", "reason": verdict.reason})
            self._fail(f"{verdict.reason}, and there is no checkpoint before it to roll back to "
                       "(set LOOM_CHECKPOINT_INTERVAL / loom run --checkpoint-interval)")
        reason = (f"{verdict.reason}; no complete checkpoint before iteration {verdict.iteration} to roll "
                  "back to: the update is kept and training goes on")
        if rt.rank == 0:
            log.warning("loom runtime: loss spike: %s", reason)
        self._record("loss_spike", {**self._numbers(verdict), "action": "continue", "reason": reason})

    def _give_up(self, verdict: Verdict) -> None:
        message = (f"loss spikes persist after {self.rollbacks} rollback{'s' if self.rollbacks != 1 else ''} "
                   f"({len(self.spikes) + 1} spikes within {self.rule.period} iterations, at most "
                   f"{self.rule.max_rollbacks} allowed: LOOM_SPIKE_MAX_ROLLBACKS): {verdict.reason}")
        self._record("loss_spike", {**self._numbers(verdict), "action": "fail", "reason": message})
        self._fail(message)

    def _fail(self, message: str) -> None:
        """Every rank decides alike, so every rank raises here: the job fails, nobody hangs."""
        error = LossSpikeError(message)
        self.rt._fail(error)
        raise error

    def _record(self, kind: str, fields: dict[str, Any]) -> None:
        self.last = {"event": kind, **fields}
        self.rt._event(kind, **fields)

    def _numbers(self, verdict: Verdict) -> dict[str, Any]:
        """The rule's numbers for an event (JSON: a non-finite value is given as a string)."""
        out = {k: v for k, v in asdict(verdict).items() if k not in ("spike", "reason")}
        out["window"] = out.pop("history")
        out["threshold"] = self.rule.z
        for key in ("loss", "z"):
            if out[key] is not None and not math.isfinite(out[key]):
                out[key] = str(out[key])
        return out
