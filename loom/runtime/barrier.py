"""Singularity's distributed barrier: a consistent cut with no collective in flight.

A job can only be checkpointed where every rank has finished the same collectives;
a rank that stops after iteration n while another stops after n + 1 deadlocks.
Ranks cannot agree on that point out of band without a new failure path, so the
barrier rides on the job's own communicator (Singularity §4.3):

* every iteration boundary each rank issues an **asynchronous SUM all-reduce of two
  integers** `(need, ack)` on the data-parallel group, after waiting on the previous
  one's handle — the same program order on every rank, so no deadlock;
* `need` is 1 on a rank that received a barrier request;
* a rank that sees `Σneed > 0` enters **phase 2**: it sends `ack = 1`, and every
  collective it issues from then on is synchronous;
* when `Σack == world size` the barrier is **taken** at that iteration boundary.

All ranks read the same sums from the same meta all-reduce, so they enter phase 2 at
the same boundary and take the barrier together, one boundary after the request was
sent: within two iterations of the request. The phase-2 meta all-reduce is
synchronous, and on an in-order backend (NCCL) its completion implies that every
collective issued before it has completed; collectives issued through `collective`
are tracked and, on gloo (which completes them on a thread pool), waited for at the
cut. So at the cut nothing is in flight, and `step` checks it.

The meta tensor lives on the group's device (CUDA for NCCL), and results are read
only after `wait()`, so the protocol is the same on every backend.

The runtime's other control collectives (the cut's plan broadcast, the unanimous
vote on a stop) go through the barrier too, on persistent tensors, so that `settle`
can tell when no collective holds any of them. That matters at exit: since
torch 2.10 a tensor's Python object is kept alive while C++ holds the tensor, so a
gloo worker thread that drops the last reference to a finished `Work` takes the
GIL; if the interpreter is already finalising, Python ends that thread in the
middle of a C++ destructor and the process dies with "terminate called without an
active exception". A process leaves the loop only after `settle`.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist


class BarrierInvariantError(RuntimeError):
    """The barrier was about to be taken with a collective in flight (a bug, not user input)."""


@dataclass(frozen=True)
class MetaRecord:
    """One meta all-reduce as this rank saw it (kept when `record=True`, for tests and logs)."""

    iteration: int
    need: int
    ack: int
    sum_need: int
    sum_ack: int
    synchronous: bool
    completed_on_return: bool  # a synchronous one must be complete when `step` returns


def group_device(group: Any) -> torch.device:
    """The device a collective on `group` takes tensors on: its accelerator if it has one."""
    if group is None:
        return torch.device("cpu")
    backend = str(dist.get_backend(group)).lower()  # "gloo", "nccl" or "cpu:gloo,cuda:nccl"
    if ":" in backend:
        types = [pair.split(":")[0] for pair in backend.split(",")]
    else:
        types = [d for d, b in dist.Backend.default_device_backend_map.items() if b == backend]
    accel = next((t for t in types if t not in ("cpu", "mps")), None)
    if accel is None:  # gloo, mpi, ...: host tensors
        return torch.device("cpu")
    return torch.device(accel, torch.get_device_module(accel).current_device())


class Barrier:
    """The two-phase barrier of one process on its data-parallel group."""

    def __init__(self, group: Any = None, *, record: bool = False) -> None:
        self.group = group
        self.world = dist.get_world_size(group) if group is not None else 1
        self.device = group_device(group)
        self._buf = torch.zeros(2, dtype=torch.int32, device=self.device)  # (need, ack)
        self._plan = torch.zeros(2, dtype=torch.int32, device=self.device)  # (checkpoint, stop)
        self._vote = torch.zeros(1, dtype=torch.int32, device=self.device)  # processes that object
        self._sums = torch.zeros(2, dtype=torch.float64, device=self.device)  # e.g. (loss sum, count)
        self._buffers = (self._buf, self._plan, self._vote, self._sums)
        self._unheld = self._refcounts()  # no collective holds them yet
        self._pending: Any = None  # the in-flight meta all-reduce: (work, iteration, need, ack)
        self._outstanding: list[Any] = []  # async collectives issued through `collective`
        self._need = False
        self.phase2 = False
        self.iteration = 0  # the last boundary passed
        self.requested_at: int | None = None
        self.taken_at: int | None = None
        self.records: list[MetaRecord] | None = [] if record else None

    # --- requests and state -------------------------------------------------------------------
    def request(self) -> None:
        """Ask for the barrier (safe from any thread); it is taken within two iterations."""
        if not self._need:
            self.requested_at = self.iteration
        self._need = True

    @property
    def requested(self) -> bool:
        return self._need

    def in_flight(self) -> int:
        """Collectives issued here that have not completed (the meta all-reduce included)."""
        self._outstanding = [w for w in self._outstanding if not w.is_completed()]
        return len(self._outstanding) + (self._pending is not None)

    def reset(self) -> None:
        """Back to phase 1 once the cut has been served."""
        self._need = False
        self.phase2 = False
        self.requested_at = None
        self.taken_at = None

    # --- the protocol -------------------------------------------------------------------------
    def step(self, iteration: int) -> bool:
        """Run the barrier at the boundary after `iteration`; True when it is taken here."""
        self.iteration = iteration
        if self._pending is not None:
            self._finish_pending()
        need, ack = int(self._need), int(self.phase2)
        if not self.phase2:
            self._pending = (self._issue(need, ack), iteration, need, ack)
            return False
        _, sum_ack = self._complete(self._issue(need, ack), iteration, need, ack, True)
        if sum_ack < self.world:
            return False
        self._settle_outstanding()
        if self.in_flight():
            raise BarrierInvariantError(
                f"barrier taken at iteration {iteration} with {self.in_flight()} collective(s) in flight")
        self.taken_at = iteration
        return True

    def _settle_outstanding(self) -> None:
        """Phase-1 collectives issued before the synchronous meta all-reduce are complete by now
        on an in-order backend (NCCL runs a communicator's collectives in issue order); gloo
        completes them on a thread pool, so wait for them here — the same cut on both."""
        for work in self._outstanding:
            work.wait()
        self._outstanding = []

    def drain(self) -> None:
        """Wait for the in-flight meta all-reduce (at a deterministic cut or at exit)."""
        if self._pending is not None:
            self._finish_pending()
        self._settle_outstanding()

    def settle(self, timeout_s: float = 60.0) -> bool:
        """Drain, then wait (GIL released) until no gloo worker still holds one of the barrier's
        tensors; True when settled. Call before the process may exit (see the module doc)."""
        self.drain()
        deadline = time.monotonic() + timeout_s
        while self._refcounts() != self._unheld:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.001)
        return True

    def _refcounts(self) -> list[int]:
        return [sys.getrefcount(tensor) for tensor in self._buffers]

    # --- the runtime's other control collectives (synchronous) ---------------------------------
    def broadcast_plan(self, checkpoint: bool, stop: bool) -> tuple[bool, bool]:
        """Rank 0's decision at a cut, on every rank."""
        self._plan.copy_(torch.tensor([int(checkpoint), int(stop)], dtype=torch.int32))
        if self.group is not None:
            dist.broadcast(self._plan, src=dist.get_global_rank(self.group, 0), group=self.group)
        checkpoint, stop = (bool(v) for v in self._plan.tolist())
        return checkpoint, stop

    def unanimous(self, ok: bool) -> bool:
        """True on every rank iff `ok` is true on every rank."""
        self._vote.fill_(int(not ok))
        if self.group is not None:
            dist.all_reduce(self._vote, op=dist.ReduceOp.SUM, group=self.group)
        return int(self._vote.item()) == 0

    def sum_over_ranks(self, first: float, second: float) -> tuple[float, float]:
        """Two float64 sums over the group (the loss-spike guard's mean loss)."""
        self._sums.copy_(torch.tensor([first, second], dtype=torch.float64))
        if self.group is not None:
            dist.all_reduce(self._sums, op=dist.ReduceOp.SUM, group=self.group)
        first, second = self._sums.tolist()
        return first, second

    def collective(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Issue a collective: asynchronous in phase 1 (tracked), synchronous in phase 2."""
        work = fn(*args, async_op=True, **kwargs)
        if self.phase2:
            work.wait()
            if not work.is_completed():
                raise BarrierInvariantError("a phase-2 collective returned before completing")
        else:
            self._outstanding.append(work)
        return work

    # --- the meta all-reduce ------------------------------------------------------------------
    def _issue(self, need: int, ack: int) -> Any:
        self._buf.copy_(torch.tensor([need, ack], dtype=torch.int32))
        if self.group is None:
            return None
        return dist.all_reduce(self._buf, op=dist.ReduceOp.SUM, group=self.group, async_op=True)

    def _finish_pending(self) -> None:
        work, iteration, need, ack = self._pending
        self._pending = None
        sum_need, _ = self._complete(work, iteration, need, ack, False)
        if sum_need > 0:
            self.phase2 = True

    def _complete(self, work: Any, iteration: int, need: int, ack: int,
                  synchronous: bool) -> tuple[int, int]:
        if work is not None:
            work.wait()
        sum_need, sum_ack = (int(v) for v in self._buf.tolist())  # a host read: the values are final
        done = work is None or work.is_completed()
        if synchronous and not done:
            raise BarrierInvariantError(f"phase-2 meta all-reduce at iteration {iteration} not complete")
        if self.records is not None:
            self.records.append(MetaRecord(iteration, need, ack, sum_need, sum_ack, synchronous, done))
        return sum_need, sum_ack
