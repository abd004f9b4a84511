"""The runtime of one training process: the per-iteration hook, the cut, start and exit.

Where things happen, and why there:

* **after `optimizer.step()`** (a step post-hook): the iteration count, the control
  poll (rank 0), the barrier's meta all-reduce, periodic-checkpoint scheduling and
  the status file — once per optimizer step, in the same program order on every rank;
* **before the next batch is taken** (the loader wrapper): the cut itself — the plan
  broadcast, the checkpoint, the acks, the stop. By then the script has finished the
  iteration (`scheduler.step()`, `zero_grad()`, its logging), so a checkpoint holds
  the state a resumed job must start the next iteration from. Without a wrapped
  loader the cut is served in the step hook.

With N logical ranks on M < N processes (or in the deterministic mode) a `Slicer`
(virtual.py) time-slices the logical ranks through the loader and the optimizer; an
iteration then ends with the real step of its last slice.

Periodic checkpoints need no request: every rank knows the iteration, so at
`iteration % interval == 0` each drains its meta all-reduce — nothing in flight —
and cuts. A request (control file on rank 0, `request_barrier()` on any rank) goes
through the two-phase barrier and is cut within two iterations.
"""

from __future__ import annotations

import atexit
import logging
import math
import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from loom.runtime import rng, store
from loom.runtime.barrier import Barrier, BarrierInvariantError
from loom.runtime.checkpoint import (
    Checkpointer,
    LogicalState,
    Restored,
    SaveResult,
    training_state,
)
from loom.runtime.config import RESUME_AUTO, RESUME_LATEST, RESUME_NONE, RuntimeConfig
from loom.runtime.control import ControlChannel, Request
from loom.runtime.data import DataPosition, ResumableLoader, shardable
from loom.runtime.errors import (
    CheckpointError,
    LoomRuntimeError,
    RuntimeUsageError,
)
from loom.runtime.gradients import (
    SQUASH_RTOL,
    Gradients,
    SquashCheck,
    pin_bucket_layout,
)
from loom.runtime.spike import SpikeGuard
from loom.runtime.virtual import (
    Slicer,
    fingerprints,
    layout_of,
    logical_ranks_of,
    logical_streams,
)

__all__ = ["Plan", "Runtime", "find_dp_group", "logical_ranks_of"]

log = logging.getLogger("loom.runtime")
STOPPING_ACTIONS = ("stop", "migrate", "resize")


@dataclass(frozen=True)
class Plan:
    """What every rank does at a cut (decided by rank 0, broadcast)."""

    checkpoint: bool
    stop: bool


def find_dp_group(model: torch.nn.Module) -> Any:
    """DDP's process group if the model is DDP-wrapped, else the default group (None: no torch.distributed)."""
    if not (dist.is_available() and dist.is_initialized()):
        if int(os.environ.get("WORLD_SIZE", "1") or 1) > 1:
            raise RuntimeUsageError(
                f"WORLD_SIZE is {os.environ['WORLD_SIZE']} but torch.distributed is not initialised: "
                "call torch.distributed.init_process_group() before loom.runtime.wrap()")
        return None
    group = model.process_group if isinstance(model, DistributedDataParallel) else None
    group = group or dist.group.WORLD
    if dist.get_world_size(group) != dist.get_world_size():
        raise RuntimeUsageError(
            f"the data-parallel group has {dist.get_world_size(group)} of the job's "
            f"{dist.get_world_size()} processes; model-parallel jobs are not supported yet")
    return group


class Runtime:
    """The runtime inside one training process (see `loom.runtime.wrap`)."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, loader: Any,
                 lr_scheduler: Any = None, *, config: RuntimeConfig | None = None) -> None:
        self.config = config or RuntimeConfig.from_env()
        self.model, self.optimizer, self.scheduler = model, optimizer, lr_scheduler
        self.group = find_dp_group(model)
        self.processes = dist.get_world_size(self.group) if self.group is not None else 1
        self.rank = dist.get_rank(self.group) if self.group is not None else 0
        self.logical_world = self.config.logical_world or self.processes
        self.layout = layout_of(self.processes, self.logical_world)
        self.logical_ranks = self.layout[self.rank]
        self.virtual = self.logical_world != self.processes
        self.deterministic = self.config.deterministic
        self._check_virtualisation(model, loader)
        self.barrier = Barrier(self.group)
        self._steps = 0  # optimizer steps of the job: completed iterations
        self.cuts: list[int] = []  # iterations at which this process cut (tests, events)
        self.closed = False
        self.state = "starting"
        self.checkpointer: Checkpointer | None = None
        self.channel = ControlChannel(self.config.job_dir, self.config.job_id) if self.rank == 0 else None
        self._requests: list[Request] = []
        self._cut_due = False
        self._forced = False
        self._runtime_call = False  # the runtime's own optimizer calls (DCP state dicts)
        self._loss: Any = None
        self._failure: str | None = None
        self._last_poll = 0.0
        self._meter = (time.monotonic(), 0)
        self._rates = (0.0, 0.0)
        self._status_at = 0.0
        self._ckpt_group = dist.new_group(backend="gloo") if self.group is not None else None
        self.loader = None if loader is None else ResumableLoader(
            loader, logical_ranks=self.logical_ranks, logical_world=self.logical_world,
            on_fetch=self._on_fetch, on_epoch_end=self._on_epoch_end)
        self._hook = optimizer.register_step_post_hook(self._on_step)
        rule = self.config.spike  # loss-spike rollback needs the loader: it skips the offending batches
        self.spike = SpikeGuard(self, rule) if rule.enabled and self.loader is not None else None
        self.slicer = self._virtualise(model, optimizer, lr_scheduler)

    # --- world-size virtualisation (virtual.py, gradients.py) -----------------------------------
    def _check_virtualisation(self, model: torch.nn.Module, loader: Any) -> None:
        """Refuse, on every process alike, what time-slicing or the deterministic mode cannot drive."""
        what = (f"world-size virtualisation ({self.logical_world} logical ranks on {self.processes} "
                f"process{'es' if self.processes != 1 else ''})") if self.virtual else "the deterministic mode"
        if self.virtual and (loader is None or not shardable(loader)):
            raise RuntimeUsageError(
                f"{what} needs the data loader passed to wrap(), and one Loom can shard by logical rank "
                "(a DataLoader over a map-style dataset with a DistributedSampler, RandomSampler or "
                "SequentialSampler): the loader drives the time-slicing")
        if ((self.virtual or self.deterministic) and self.processes > 1
                and not isinstance(model, DistributedDataParallel)):
            raise RuntimeUsageError(
                f"{what} needs the model wrapped in DistributedDataParallel: the runtime takes over "
                "the gradient reduction of the logical ranks, which it cannot do for a script's own")

    def _virtualise(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                    scheduler: Any) -> Slicer | None:
        """Give each logical rank its own RNG streams; time-slice them if this job needs it."""
        if self.deterministic:
            torch.use_deterministic_algorithms(True)
        elif pin_bucket_layout(model, self.processes) is False and self.rank == 0:
            log.warning("loom runtime: DDP's gradients fill more than one bucket: after a restart its first "
                        "iteration sums them in another order, so a resumed run matches an uninterrupted one "
                        "to rounding, not bit for bit (LOOM_DETERMINISTIC=1 makes it exact)")
        if self.logical_world == 1:
            return None
        bases = self._agree_on_seeds()
        streams = logical_streams(bases, self.logical_ranks, self.barrier.device)
        if not (self.virtual or self.deterministic):
            rng.restore(streams[self.logical_ranks[0]])
            return None
        gradients = Gradients(model, optimizer, self.group, self.layout, self.rank,
                              deterministic=self.deterministic, checks=self.config.squash_checks,
                              device=self.barrier.device)
        return Slicer(self.logical_ranks, streams, self.barrier.device, model=model, optimizer=optimizer,
                      scheduler=scheduler, gradients=gradients, on_check=self._on_squash_check)

    def _agree_on_seeds(self) -> dict[str, int]:
        """Rank 0's stream fingerprints (the bases of every logical rank's streams) and shuffle seed."""
        seed = self.loader.sampler.seed if self.loader is not None and self.loader.sampler else None
        agreed = [fingerprints(rng.capture(self.barrier.device)), seed]
        if self._ckpt_group is not None:
            dist.broadcast_object_list(agreed, src=dist.get_global_rank(self.group, 0), group=self._ckpt_group)
        if agreed[1] is not None:
            self.loader.set_seed(agreed[1])
        return agreed[0]

    def _on_squash_check(self, check: SquashCheck) -> None:
        """Every process, at the step of a validated iteration: log the comparison and the verdict."""
        iteration = self._steps + 1
        diff = check.relative_difference if math.isfinite(check.relative_difference) else None
        self._event("squash_check", iteration=iteration, relative_difference=diff, tolerance=SQUASH_RTOL,
                    ok=check.ok)
        if not check.ok:
            if self.rank == 0:
                log.warning("loom runtime: the squashed gradient differs from the unsquashed one by %s "
                            "(relative, tolerance %g) at iteration %d: squashing disabled", diff,
                            SQUASH_RTOL, iteration)
            self._event("squash_disabled", iteration=iteration, relative_difference=diff,
                        tolerance=SQUASH_RTOL, reason="the squashed gradient differs from the unsquashed "
                        "one; every logical rank's gradient is now reduced separately, in rank order")
        elif check.remaining == 0:
            self._event("squash_enabled", iteration=iteration)
        self._status(force=True)

    @property
    def squash(self) -> str:
        """none (no time-slicing) | validating | on | disabled | off (the deterministic mode)."""
        return self.slicer.gradients.state if self.slicer is not None else "none"

    @property
    def iteration(self) -> int:
        """Completed iterations as the running slice's logical rank sees them (+1 after its deferred step)."""
        return self._steps + (self.slicer.ahead if self.slicer is not None else 0)

    @property
    def logical_rank(self) -> int:
        """The logical rank whose slice is running (the process's only one without virtualisation)."""
        return self.slicer.rank if self.slicer is not None else self.logical_ranks[0]

    @contextmanager
    def _runtime_calls(self) -> Iterator[None]:
        """DCP's state-dict helpers may call optimizer.step()/zero_grad(): not the script's iteration."""
        self._runtime_call = True
        if self.slicer is not None:
            self.slicer.internal = True
        try:
            yield
        finally:
            self._runtime_call = False
            if self.slicer is not None:
                self.slicer.internal = False

    # --- start ----------------------------------------------------------------------------------
    def start(self) -> None:
        """Check the checkpoint directory everywhere, resume if asked, and report `running`."""
        self._status(force=True)
        info, next_seq = self._agree_on_start()
        self.checkpointer = Checkpointer(
            self.config.checkpoints, mode=self.config.checkpoint_mode, keep=self.config.checkpoint_keep,
            job_id=self.config.job_id, group=self._ckpt_group, rank=self.rank,
            processes=self.processes, logical_world=self.logical_world, next_seq=next_seq)
        if self.spike is not None:  # older checkpoints belong to another timeline: never rolled back to
            self.spike.origin_seq = info.seq if info is not None else next_seq
        if info is not None:
            try:
                self._resume(info)
            except LoomRuntimeError as exc:  # every rank: DCP's load fails collectively
                self._fail(exc)
                raise
        self._event("started", processes=self.processes, logical_world=self.logical_world,
                    layout=self.layout, deterministic=self.deterministic, squash=self.squash,
                    resumed_from=str(info.path) if info else None, iteration=self._steps,
                    host=socket.gethostname(), pid=os.getpid())
        self._set_state("running")
        atexit.register(self._at_exit)

    def _agree_on_start(self) -> tuple[store.CheckpointInfo | None, int]:
        """Every rank checks the directory, rank 0 picks the checkpoint; all see every problem."""
        problem: BaseException | None = None
        decision: tuple[store.CheckpointInfo | None, int] = (None, 1)
        try:
            store.prepare_dir(self.config.checkpoints, explicit=self.config.checkpoint_dir_explicit)
            if self.rank == 0:
                decision = self._choose_checkpoint()
        except LoomRuntimeError as exc:
            problem = exc
        except OSError as exc:  # e.g. the directory vanished while being scanned
            problem = CheckpointError(f"cannot use the checkpoint directory ({exc})",
                                      source=str(self.config.checkpoints))
        gathered = [(problem, decision)]
        if self._ckpt_group is not None:
            gathered = [None] * self.processes
            dist.all_gather_object(gathered, (problem, decision), group=self._ckpt_group)
        for other, _ in gathered:
            if other is not None:
                self._fail(other)
                raise other
        return gathered[0][1]

    def _choose_checkpoint(self) -> tuple[store.CheckpointInfo | None, int]:
        directory, resume = self.config.checkpoints, self.config.resume
        info = None
        if resume in (RESUME_AUTO, RESUME_LATEST):
            info = store.latest_complete(directory)
            if info is None and resume == RESUME_LATEST:
                raise CheckpointError("LOOM_RESUME=latest but the directory holds no complete "
                                      "checkpoint", source=str(directory))
        elif resume == RESUME_NONE:
            if store.complete(directory):
                log.warning("loom runtime: LOOM_RESUME=none: starting afresh although %s holds "
                            "checkpoints (they are kept until keep-last-%d rotates them out)",
                            directory, self.config.checkpoint_keep)
        else:
            info = store.validate(Path(resume))
        store.remove_partials(directory)
        return info, store.next_seq(directory)

    def _resume(self, info: store.CheckpointInfo) -> None:
        if info.logical_world != self.logical_world:
            log.warning("loom runtime: resuming a checkpoint of %d logical ranks with %d: data is "
                        "redistributed by its global position and the run is not bit-identical "
                        "to an uninterrupted one", info.logical_world, self.logical_world)
        restored = self._restore(info, data=True)
        if self.spike is not None:
            self.spike.load(restored.spike)
        self._event("resumed", checkpoint=str(info.path), iteration=self._steps)

    def _restore(self, info: store.CheckpointInfo, *, data: bool) -> Restored:
        """Model, optimizer, scheduler, iteration and RNG streams from `info`; data positions if `data`
        (a loss-spike rollback keeps them: spike.py)."""
        with self._runtime_calls():
            restored = self.checkpointer.load(info, self.model, self.optimizer, self.scheduler,
                                              self.logical_ranks)
        self._steps = self.barrier.iteration = restored.iteration
        self._meter = (time.monotonic(), self._steps)
        if data and self.loader is not None:
            self.loader.load_ranks({r: restored.logical[r].data for r in self.logical_ranks})
        streams = {r: restored.logical[r].rng for r in self.logical_ranks if r in restored.own_rng}
        if self.slicer is not None:  # last: nothing may draw after this
            self.slicer.load_streams(streams)
        elif streams:
            rng.restore(streams[self.logical_ranks[0]])
        return restored

    # --- per iteration --------------------------------------------------------------------------
    def _on_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self._runtime_call or self.closed:
            return
        if self._cut_due:  # a second step with no batch fetched in between: cut here
            self._serve_cut()
        self._steps += 1
        if self.spike is not None:
            self.spike.stepped()
        self._poll_control()
        interval = self.config.checkpoint_interval
        if interval and self._steps % interval == 0:
            self.barrier.drain()
            self._cut_due = self._forced = True
        elif self.barrier.step(self._steps):
            self._cut_due = True
        if self._cut_due and self.loader is None:
            self._serve_cut()
        self._status()

    def _on_fetch(self) -> int | None:
        """Before every batch: the cut if one is due, then the logical rank whose batch it is."""
        if self.closed:
            return None
        if self.spike is not None:  # first: a spike's iteration is never checkpointed
            self.spike.check()
        if self._cut_due:
            self._serve_cut()
        return self.slicer.next_rank() if self.slicer is not None else None

    def _on_epoch_end(self) -> None:
        """A point every rank reaches together: let the in-flight save and meta all-reduce finish."""
        if self.closed:
            return
        self.barrier.drain()
        if self.checkpointer is not None:
            self.checkpointer.wait()

    def _poll_control(self) -> None:
        if self.channel is None:
            return
        now = time.monotonic()
        if now - self._last_poll < self.config.control_poll_s:
            return
        self._last_poll = now
        for request in self.channel.poll(self._steps):
            problem = self._check_request(request)
            if problem is not None:
                self.channel.ack(request.seq, "failed", reason=problem, iteration=self._steps,
                                 action=request.action)
                self._event("request_rejected", seq=request.seq, action=request.action, reason=problem)
                continue
            self._event("request", seq=request.seq, action=request.action, args=request.args)
            self._requests.append(request)
            self.barrier.request()

    def _check_request(self, request: Request) -> str | None:
        if request.action != "resize":
            return None
        processes = request.args.get("processes")
        if not isinstance(processes, int) or isinstance(processes, bool) or processes < 1:
            return f"resize needs args {{'processes': M}} with M a whole number >= 1, got {processes!r}"
        if processes > self.logical_world:
            return (f"cannot resize to {processes} processes: the job has {self.logical_world} "
                    "logical ranks (at most one process per logical rank)")
        return None

    # --- the cut --------------------------------------------------------------------------------
    def _serve_cut(self) -> None:
        self._cut_due = False
        forced, self._forced = self._forced, False
        if self.barrier.in_flight():
            raise BarrierInvariantError(f"cut at iteration {self._steps} with a collective in flight")
        served, self._requests = self._requests, []
        plan = self._broadcast_plan(forced, served)
        self.barrier.reset()
        self.cuts.append(self._steps)
        self._event("cut", iteration=self._steps, periodic=forced,
                    requests=[r.seq for r in served], checkpoint=plan.checkpoint, stop=plan.stop)
        if not plan.checkpoint:
            return
        self._set_state("stopping" if plan.stop else "checkpointing")
        result = self.checkpointer.save(self._state_dict(), self._steps, block=plan.stop,
                                        on_done=lambda r: self._on_saved(r, served, plan.stop))
        if plan.stop and self._agree(result.error is None and (self.rank != 0 or result.info is not None)):
            self._stop(served, result)
        self._set_state("running")
        if plan.stop and self.channel is not None:  # not stopped: say so once the job runs again
            error = result.error or "another process's part failed"
            for request in (r for r in served if r.action in STOPPING_ACTIONS):
                self.channel.ack(request.seq, "failed", reason=f"checkpoint failed: {error}; the job keeps running",
                                 iteration=result.iteration, action=request.action)

    def _broadcast_plan(self, forced: bool, served: list[Request]) -> Plan:
        return Plan(*self.barrier.broadcast_plan(forced or bool(served),
                                                 any(r.action in STOPPING_ACTIONS for r in served)))

    def _agree(self, ok: bool) -> bool:
        """True on every rank iff it is true on every rank (a stop must be unanimous)."""
        return self.barrier.unanimous(ok)

    def _state_dict(self) -> dict[str, Any]:
        positions = self.loader.states() if self.loader is not None else {}
        streams = (self.slicer.streams() if self.slicer is not None
                   else {r: rng.capture(self.barrier.device) for r in self.logical_ranks})
        logical = {r: LogicalState(streams[r], positions.get(r, DataPosition())) for r in self.logical_ranks}
        with self._runtime_calls():
            return training_state(self.model, self.optimizer, self.scheduler, iteration=self._steps,
                                  logical_world=self.logical_world, logical=logical,
                                  spike=self.spike.state() if self.spike is not None else None)

    def _on_saved(self, result: SaveResult, served: list[Request], stopping: bool) -> None:
        """Rank 0, on the saving thread once the checkpoint is durable (or failed): log and ack."""
        if self.channel is None:
            return
        if result.error is not None:
            self._event("checkpoint_failed", iteration=result.iteration, error=result.error)
            log.error("loom runtime: checkpoint at iteration %d failed: %s", result.iteration, result.error)
        else:
            self._event("checkpoint", path=str(result.path), iteration=result.iteration,
                        bytes=result.info.bytes, stall_s=round(result.stall_s, 6),
                        seconds=round(time.monotonic() - result.started, 6))
        for request in served:
            if request.action in STOPPING_ACTIONS:
                continue  # acked by _stop once the job is stopped, or by _serve_cut once it runs again
            self._ack_after_save(request, result, stopping)

    def _ack_after_save(self, request: Request, result: SaveResult, stopping: bool) -> None:
        if result.error is None:
            self.channel.ack(request.seq, "done", checkpoint=str(result.path),
                             iteration=result.iteration, action=request.action)
        else:
            keeps = "; the job keeps running" if stopping else ""
            self.channel.ack(request.seq, "failed", reason=f"checkpoint failed: {result.error}{keeps}",
                             iteration=result.iteration, action=request.action)

    def _stop(self, served: list[Request], result: SaveResult) -> None:
        """Every rank: the checkpoint is durable; report, answer, exit with status 0."""
        self._close("stopped")
        stops = [r for r in served if r.action in STOPPING_ACTIONS]  # empty except on rank 0
        if self.channel is not None and stops:
            for request in stops:
                self.channel.ack(request.seq, "done", checkpoint=str(result.path),
                                 iteration=result.iteration, action=request.action)
            self._event("stopped", action=stops[0].action, args=stops[0].args,
                        checkpoint=str(result.path), iteration=self._steps)
        raise SystemExit(0)

    # --- status, events, exit -------------------------------------------------------------------
    def report(self, loss: Any = None) -> None:
        if loss is not None:
            self._loss = loss.detach() if isinstance(loss, torch.Tensor) else loss
            if self.spike is not None:
                self.spike.note(self.logical_rank, self._loss)

    def request_barrier(self) -> None:
        """Ask for a cut from this rank (as a control request does on rank 0)."""
        self.barrier.request()

    def close(self) -> None:
        """End the runtime as `finished` now instead of at exit (a process that trains twice)."""
        self._close("failed" if self._failure else "finished")

    def _set_state(self, state: str) -> None:
        if state != self.state:
            self.state = state
            self._status(force=True)

    def _status(self, force: bool = False) -> None:
        if self.channel is None:
            return
        now = time.monotonic()
        if not force and now - self._status_at < self.config.status_interval_s:
            return
        self._status_at = now
        self.channel.write_status(self.status(), background=not force)  # state changes: written at once

    def status(self) -> dict[str, Any]:
        """The status.json content (rank 0 writes it)."""
        now, (then, start_it) = time.monotonic(), self._meter
        if now > then and self._steps > start_it:
            its = (self._steps - start_it) / (now - then)
            batch = self.loader.state().batch_size if self.loader is not None else 0
            self._rates = (its, its * batch * self.logical_world)
            self._meter = (now, self._steps)
        last = self.checkpointer.last if self.checkpointer is not None else None
        status = {"job_id": self.config.job_id, "state": self.state, "iteration": self._steps,
                  "logical_world": self.logical_world, "processes": self.processes,
                  "iterations_per_s": round(self._rates[0], 6), "samples_per_s": round(self._rates[1], 6),
                  "loss": _float_or_none(self._loss), "last_checkpoint": str(last.path) if last else None,
                  "deterministic": self.deterministic, "squash": self.squash, "updated": time.time(),
                  **(self.spike.status() if self.spike is not None else {"rollbacks": 0, "last_rollback": None})}
        if self._failure:
            status["error"] = self._failure
        return status

    def _event(self, kind: str, **fields: Any) -> None:
        if self.channel is not None:
            self.channel.event(kind, **fields)

    def _fail(self, exc: BaseException) -> None:
        self._failure = f"{type(exc).__name__}: {exc}"
        self._close("failed")

    def _close(self, final_state: str) -> None:
        """Leave the loop for good: no more hooks, no save or collective in flight."""
        if self.closed:
            return
        self.closed = True
        self._hook.remove()
        if self.slicer is not None:
            self.slicer.close()
        atexit.unregister(self._at_exit)
        try:
            if final_state != "failed":  # after a failure a peer may be gone: never wait on it
                if self.checkpointer is not None:
                    self.checkpointer.wait()
                # even after the script's destroy_process_group(): a pending meta all-reduce
                # can still be waited for, and must be before the interpreter finalises
                if not self.barrier.settle():
                    log.warning("loom runtime: a collective still held the barrier's tensors at exit")
        finally:
            self.state = final_state
            if self.channel is not None:
                self.channel.write_status(self.status())
                if final_state != "stopped":
                    self._answer_unserved(final_state)
                    self._event(final_state, iteration=self._steps, error=self._failure)
            if self._ckpt_group is not None and dist.is_initialized() and final_state != "failed":
                dist.destroy_process_group(self._ckpt_group)
                self._ckpt_group = None

    def _answer_unserved(self, final_state: str) -> None:
        pending = self._requests + (self.channel.poll(self._steps) if self.channel else [])
        for request in pending:
            self.channel.ack(request.seq, "failed", iteration=self._steps, action=request.action,
                             reason=f"the job {final_state} before the request was served")
        self._requests = []

    def note_failure(self, exc: BaseException) -> None:
        """Called for an exception the script did not catch: the job is `failed`."""
        if not self.closed:
            self._failure = f"{type(exc).__name__}: {exc}"

    def _at_exit(self) -> None:
        try:
            self.close()
        except Exception as exc:  # noqa: BLE001 - at exit, report instead of raising
            log.error("loom runtime: could not finish cleanly: %s", exc)


def _float_or_none(value: Any) -> float | None:
    if value is None:
        return None
    try:
        return float(value.item() if isinstance(value, torch.Tensor) else value)
    except (TypeError, ValueError, RuntimeError):
        return None
