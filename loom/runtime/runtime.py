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

Periodic checkpoints need no request: every rank knows the iteration, so at
`iteration % interval == 0` each drains its meta all-reduce — nothing in flight —
and cuts. A request (control file on rank 0, `request_barrier()` on any rank) goes
through the two-phase barrier and is cut within two iterations.
"""

from __future__ import annotations

import atexit
import logging
import os
import socket
import time
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
    SaveResult,
    training_state,
)
from loom.runtime.config import RESUME_AUTO, RESUME_LATEST, RESUME_NONE, RuntimeConfig
from loom.runtime.control import ControlChannel, Request
from loom.runtime.data import DataPosition, ResumableLoader
from loom.runtime.errors import (
    CheckpointError,
    LoomRuntimeError,
    RuntimeConfigError,
    RuntimeUsageError,
)

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


def logical_ranks_of(process: int, processes: int, logical_world: int) -> list[int]:
    """The logical ranks process `process` hosts: a contiguous block of N / M."""
    if logical_world < processes:
        raise RuntimeConfigError(
            f"{logical_world} logical ranks on {processes} processes: a process needs at least one "
            "logical rank (resize to at most the logical world size)",
            source="environment variable LOOM_LOGICAL_WORLD")
    if logical_world != processes:
        raise RuntimeConfigError(
            f"{logical_world} logical ranks on {processes} processes needs world-size "
            "virtualisation (time-slicing), which is not implemented yet; set LOOM_LOGICAL_WORLD "
            f"to {processes}", source="environment variable LOOM_LOGICAL_WORLD")
    per = logical_world // processes
    return list(range(process * per, (process + 1) * per))


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
        self.logical_ranks = logical_ranks_of(self.rank, self.processes, self.logical_world)
        self.barrier = Barrier(self.group)
        self.iteration = 0
        self.cuts: list[int] = []  # iterations at which this process cut (tests, events)
        self.closed = False
        self.state = "starting"
        self.checkpointer: Checkpointer | None = None
        self.channel = ControlChannel(self.config.job_dir, self.config.job_id) if self.rank == 0 else None
        self._requests: list[Request] = []
        self._cut_due = False
        self._forced = False
        self._restoring = False
        self._loss: Any = None
        self._failure: str | None = None
        self._last_poll = 0.0
        self._meter = (time.monotonic(), 0)
        self._rates = (0.0, 0.0)
        self._status_at = 0.0
        self._ckpt_group = dist.new_group(backend="gloo") if self.group is not None else None
        self.loader = None if loader is None else ResumableLoader(
            loader, logical_rank=self.logical_ranks[0], logical_world=self.logical_world,
            on_fetch=self._on_fetch, on_epoch_end=self._on_epoch_end)
        self._hook = optimizer.register_step_post_hook(self._on_step)

    # --- start ----------------------------------------------------------------------------------
    def start(self) -> None:
        """Check the checkpoint directory everywhere, resume if asked, and report `running`."""
        self._status(force=True)
        info, next_seq = self._agree_on_start()
        self.checkpointer = Checkpointer(
            self.config.checkpoints, mode=self.config.checkpoint_mode, keep=self.config.checkpoint_keep,
            job_id=self.config.job_id, group=self._ckpt_group, rank=self.rank,
            processes=self.processes, logical_world=self.logical_world, next_seq=next_seq)
        if info is not None:
            try:
                self._resume(info)
            except LoomRuntimeError as exc:  # every rank: DCP's load fails collectively
                self._fail(exc)
                raise
        self._event("started", processes=self.processes, logical_world=self.logical_world,
                    resumed_from=str(info.path) if info else None, iteration=self.iteration,
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
        self._restoring = True
        try:
            restored = self.checkpointer.load(info, self.model, self.optimizer, self.scheduler,
                                              self.logical_ranks)
        finally:
            self._restoring = False
        self.iteration = self.barrier.iteration = restored.iteration
        self._meter = (time.monotonic(), self.iteration)
        own = self.logical_ranks[0]
        if self.loader is not None:
            self.loader.load(restored.logical[own].data)
        if own in restored.own_rng:
            rng.restore(restored.logical[own].rng)  # last: nothing may draw after this
        self._event("resumed", checkpoint=str(info.path), iteration=self.iteration)

    # --- per iteration --------------------------------------------------------------------------
    def _on_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self._restoring or self.closed:
            return
        if self._cut_due:  # a second step with no batch fetched in between: cut here
            self._serve_cut()
        self.iteration += 1
        self._poll_control()
        interval = self.config.checkpoint_interval
        if interval and self.iteration % interval == 0:
            self.barrier.drain()
            self._cut_due = self._forced = True
        elif self.barrier.step(self.iteration):
            self._cut_due = True
        if self._cut_due and self.loader is None:
            self._serve_cut()
        self._status()

    def _on_fetch(self) -> None:
        if self._cut_due and not self.closed:
            self._serve_cut()

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
        for request in self.channel.poll(self.iteration):
            problem = self._check_request(request)
            if problem is not None:
                self.channel.ack(request.seq, "failed", reason=problem, iteration=self.iteration,
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
            raise BarrierInvariantError(f"cut at iteration {self.iteration} with a collective in flight")
        served, self._requests = self._requests, []
        plan = self._broadcast_plan(forced, served)
        self.barrier.reset()
        self.cuts.append(self.iteration)
        self._event("cut", iteration=self.iteration, periodic=forced,
                    requests=[r.seq for r in served], checkpoint=plan.checkpoint, stop=plan.stop)
        if not plan.checkpoint:
            return
        self._set_state("stopping" if plan.stop else "checkpointing")
        result = self.checkpointer.save(self._state_dict(), self.iteration, block=plan.stop,
                                        on_done=lambda r: self._on_saved(r, served, plan.stop))
        if plan.stop and self._agree(result.error is None and (self.rank != 0 or result.info is not None)):
            self._stop(served, result)
        self._set_state("running")

    def _broadcast_plan(self, forced: bool, served: list[Request]) -> Plan:
        flags = torch.tensor([int(forced or bool(served)),
                              int(any(r.action in STOPPING_ACTIONS for r in served))],
                             dtype=torch.int32, device=self.barrier.device)
        if self.group is not None:
            dist.broadcast(flags, src=dist.get_global_rank(self.group, 0), group=self.group)
        checkpoint, stop = (bool(v) for v in flags.tolist())
        return Plan(checkpoint, stop)

    def _agree(self, ok: bool) -> bool:
        """True on every rank iff it is true on every rank (a stop must be unanimous)."""
        if self.group is None:
            return ok
        flag = torch.tensor([int(not ok)], dtype=torch.int32, device=self.barrier.device)
        dist.all_reduce(flag, op=dist.ReduceOp.SUM, group=self.group)
        return int(flag.item()) == 0

    def _state_dict(self) -> dict[str, Any]:
        position = self.loader.state() if self.loader is not None else None
        logical = {r: LogicalState(rng.capture(self.barrier.device), position or DataPosition())
                   for r in self.logical_ranks}
        return training_state(self.model, self.optimizer, self.scheduler, iteration=self.iteration,
                              logical_world=self.logical_world, logical=logical)

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
            if request.action in STOPPING_ACTIONS and result.error is None:
                continue  # acked by _stop once the job is stopped
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
                        checkpoint=str(result.path), iteration=self.iteration)
        raise SystemExit(0)

    # --- status, events, exit -------------------------------------------------------------------
    def report(self, loss: Any = None) -> None:
        if loss is not None:
            self._loss = loss.detach() if isinstance(loss, torch.Tensor) else loss

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
        self.channel.write_status(self.status())

    def status(self) -> dict[str, Any]:
        """The status.json content (rank 0 writes it)."""
        now, (then, start_it) = time.monotonic(), self._meter
        if now > then and self.iteration > start_it:
            its = (self.iteration - start_it) / (now - then)
            batch = self.loader.state().batch_size if self.loader is not None else 0
            self._rates = (its, its * batch * self.logical_world)
            self._meter = (now, self.iteration)
        last = self.checkpointer.last if self.checkpointer is not None else None
        status = {"job_id": self.config.job_id, "state": self.state, "iteration": self.iteration,
                  "logical_world": self.logical_world, "processes": self.processes,
                  "iterations_per_s": round(self._rates[0], 6), "samples_per_s": round(self._rates[1], 6),
                  "loss": _float_or_none(self._loss), "last_checkpoint": str(last.path) if last else None,
                  "updated": time.time()}
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
        atexit.unregister(self._at_exit)
        try:
            if final_state != "failed":  # after a failure a peer may be gone: never wait on it
                if self.checkpointer is not None:
                    self.checkpointer.wait()
                if dist.is_initialized():
                    self.barrier.drain()
        finally:
            self.state = final_state
            if self.channel is not None:
                self.channel.write_status(self.status())
                if final_state != "stopped":
                    self._answer_unserved(final_state)
                    self._event(final_state, iteration=self.iteration, error=self._failure)
            if self._ckpt_group is not None and dist.is_initialized() and final_state != "failed":
                dist.destroy_process_group(self._ckpt_group)
                self._ckpt_group = None

    def _answer_unserved(self, final_state: str) -> None:
        pending = self._requests + (self.channel.poll(self.iteration) if self.channel else [])
        for request in pending:
            self.channel.ack(request.seq, "failed", iteration=self.iteration, action=request.action,
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
