"""Consistent checkpoints with torch.distributed.checkpoint (DCP), taken at the barrier.

What a checkpoint holds (DCP keys):

* `model.*`, `optim.*` — `get_state_dict(model, optimizer)`: FQN-keyed, so DDP's
  `module.` prefix does not matter and DCP can reshard on load;
* `scheduler` — the LR scheduler's state, `loom` — iteration and logical world;
* `logical.<r>` — per **logical** rank: its RNG streams and data position, under a
  key of its own so DCP's name-based dedup never merges two ranks' values and a
  process can load the logical ranks it now hosts, whichever process saved them.

Saving: `sync` runs `dcp.save`; `async` runs `dcp.async_save` — the loop stalls only
while the state is staged to CPU memory, persisting runs on a background thread on
a dedicated gloo group (never the training group, whose collectives it would
interleave with). At most one save is in flight; the next save, a stop and the end
of an epoch wait for it. Replicas are written once (dedup.py). Commit rule: store.py.
"""

from __future__ import annotations

import logging
import pickle
import shutil
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from loom.runtime import store
from loom.runtime.data import DataPosition
from loom.runtime.dedup import ContentDedupSavePlanner
from loom.runtime.errors import CheckpointError, CorruptCheckpointError

log = logging.getLogger("loom.runtime")


@dataclass(frozen=True)
class LogicalState:
    """What belongs to one logical rank rather than to the replicated model."""

    rng: dict[str, Any]
    data: DataPosition


@dataclass(frozen=True)
class Restored:
    """What a loaded checkpoint says beyond the model and optimizer, which are set in place."""

    info: store.CheckpointInfo
    iteration: int
    logical: dict[int, LogicalState]  # the logical ranks this process loaded
    own_rng: frozenset[int]  # logical ranks whose RNG streams were in the checkpoint
    spike: dict[str, Any] | None = None  # the loss-spike detector's state (spike.py), if saved


@dataclass
class SaveResult:
    """One save: filled in when it finishes (on the background thread in async mode)."""

    seq: int
    iteration: int
    partial: Path
    started: float = field(default_factory=time.monotonic)
    stall_s: float = 0.0
    info: store.CheckpointInfo | None = None
    error: str | None = None
    done: threading.Event = field(default_factory=threading.Event)

    @property
    def path(self) -> Path | None:
        return self.info.path if self.info else None


def _blob(value: Any) -> bytes:
    return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)


def training_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any, *,
                   iteration: int, logical_world: int, logical: dict[int, LogicalState],
                   spike: dict[str, Any] | None = None) -> dict[str, Any]:
    """The DCP state dict of a cut (blobs are snapshots: later training cannot change them)."""
    model_sd, optim_sd = get_state_dict(model, optimizer)
    state: dict[str, Any] = {
        "model": model_sd, "optim": optim_sd,
        "loom": _blob({"format": store.FORMAT, "iteration": iteration, "logical_world": logical_world,
                       "spike": spike}),
        "logical": {str(r): _blob({"rng": s.rng, "data": asdict(s.data)}) for r, s in logical.items()},
    }
    if scheduler is not None:
        state["scheduler"] = _blob(scheduler.state_dict())
    return state


class Checkpointer:
    """Saves and loads one job's checkpoints in one directory."""

    def __init__(self, directory: Path, *, mode: str, keep: int, job_id: str, group: Any,
                 rank: int, processes: int, logical_world: int, next_seq: int) -> None:
        self.directory, self.mode, self.keep, self.job_id = directory, mode, keep, job_id
        self.group, self.rank, self.processes = group, rank, processes
        self.logical_world = logical_world
        self._seq = next_seq
        self._pending: SaveResult | None = None
        self.last: store.CheckpointInfo | None = None
        if group is None:  # a single process by design: DCP's warning about it is noise
            warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable",
                                    category=UserWarning)

    # --- saving ---------------------------------------------------------------------------------
    def save(self, state: dict[str, Any], iteration: int, *, block: bool,
             on_done: Callable[[SaveResult], None] = lambda r: None) -> SaveResult:
        """Start a checkpoint of `state` (blocking until durable if `block` or in sync mode)."""
        self.wait()
        name = store.checkpoint_name(self._seq, iteration) + store.PARTIAL
        result = SaveResult(self._seq, iteration, self.directory / name)
        self._seq += 1
        kwargs = {"storage_writer": dcp.FileSystemWriter(str(result.partial)),
                  "planner": ContentDedupSavePlanner(), "process_group": self.group,
                  "no_dist": self.group is None}
        if block or self.mode == "sync":
            self._save_sync(state, kwargs, result, on_done)
        else:
            self._save_async(state, kwargs, result, on_done)
        return result

    def _save_sync(self, state: dict[str, Any], kwargs: dict[str, Any], result: SaveResult,
                   on_done: Callable[[SaveResult], None]) -> None:
        try:
            dcp.save(state, **kwargs)
        except (CheckpointException, Exception) as exc:  # noqa: BLE001 - CheckpointException is a BaseException
            result.error = _describe_failure(exc)
        result.stall_s = time.monotonic() - result.started
        self._finish(result, on_done)

    def _save_async(self, state: dict[str, Any], kwargs: dict[str, Any], result: SaveResult,
                    on_done: Callable[[SaveResult], None]) -> None:
        try:
            future = dcp.async_save(state, **kwargs)  # returns once the state is staged
        except (CheckpointException, Exception) as exc:  # noqa: BLE001
            result.error = _describe_failure(exc)
            self._finish(result, on_done)
            return
        result.stall_s = time.monotonic() - result.started
        self._pending = result
        future.add_done_callback(lambda f: self._finish(result, on_done, f))

    def wait(self) -> SaveResult | None:
        """Wait for the save in flight, if any (it is then durable, or failed)."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.done.wait()
        return pending

    @property
    def in_flight(self) -> bool:
        return self._pending is not None and not self._pending.done.is_set()

    def _finish(self, result: SaveResult, on_done: Callable[[SaveResult], None],
                future: Any = None) -> None:
        """Commit (rank 0) once every rank has written; runs on the saving thread."""
        try:
            if future is not None and result.error is None:
                exc = future.exception()
                result.error = _describe_failure(exc) if exc is not None else None
            if result.error is None and self.rank == 0:
                result.info = self._commit(result)
            elif result.error is not None and self.rank == 0:
                shutil.rmtree(result.partial, ignore_errors=True)
        except (OSError, CheckpointError) as exc:
            result.error = f"committing {result.partial} failed: {exc}"
        finally:
            if result.info is not None:
                self.last = result.info
            try:
                on_done(result)
            finally:
                result.done.set()

    def _commit(self, result: SaveResult) -> store.CheckpointInfo:
        final = store.commit(result.partial, seq=result.seq, iteration=result.iteration,
                             logical_world=self.logical_world, processes=self.processes,
                             job_id=self.job_id, extra={"stall_s": round(result.stall_s, 6)})
        info = store.validate(final, read_metadata=False)
        try:
            for old in store.retain(self.directory, self.keep):
                log.info("loom runtime: removed old checkpoint %s (keeping the newest %d)", old, self.keep)
        except OSError as exc:  # the new checkpoint is durable; an old one merely stays
            log.warning("loom runtime: could not remove old checkpoints in %s: %s", self.directory, exc)
        return info

    # --- loading --------------------------------------------------------------------------------
    def load(self, info: store.CheckpointInfo, model: torch.nn.Module,
             optimizer: torch.optim.Optimizer, scheduler: Any,
             logical_ranks: list[int]) -> Restored:
        """Restore model, optimizer and scheduler in place; return the per-logical-rank state."""
        sources = {r: (r if r < info.logical_world else 0) for r in logical_ranks}
        model_sd, optim_sd = get_state_dict(model, optimizer)
        state: dict[str, Any] = {"model": model_sd, "optim": optim_sd, "loom": b"",
                                 "logical": {str(s): b"" for s in sorted(set(sources.values()))}}
        has_scheduler = self._has_key(info.path, "scheduler")
        if scheduler is not None and has_scheduler:
            state["scheduler"] = b""
        try:
            dcp.load(state, storage_reader=dcp.FileSystemReader(str(info.path)),
                     process_group=self.group, no_dist=self.group is None)
            set_state_dict(model, optimizer, model_state_dict=model_sd, optim_state_dict=optim_sd)
            meta = pickle.loads(state["loom"])
            if scheduler is not None and has_scheduler:
                scheduler.load_state_dict(pickle.loads(state["scheduler"]))
            loaded = {s: pickle.loads(state["logical"][str(s)]) for s in set(sources.values())}
        except (CheckpointException, Exception) as exc:  # noqa: BLE001
            raise CorruptCheckpointError(f"checkpoint does not load: {_describe_failure(exc)}",
                                         source=str(info.path)) from None
        if scheduler is not None and not has_scheduler:
            log.warning("loom runtime: %s has no LR scheduler state; the scheduler starts afresh",
                        info.path)
        logical = {r: LogicalState(loaded[s]["rng"], DataPosition(**loaded[s]["data"]))
                   for r, s in sources.items()}
        own = frozenset(r for r, s in sources.items() if r == s)
        self.last = info
        return Restored(info, int(meta["iteration"]), logical, own, meta.get("spike"))

    @staticmethod
    def _has_key(path: Path, key: str) -> bool:
        metadata = dcp.FileSystemReader(str(path)).read_metadata()
        return any(fqn == key or fqn.startswith(key + ".") for fqn in metadata.state_dict_metadata)


def _describe_failure(exc: BaseException) -> str:
    """One line per failing rank instead of DCP's concatenated tracebacks."""
    failures = getattr(exc, "failures", None)
    if isinstance(exc, CheckpointException) and failures:
        parts = []
        for rank, pair in sorted(failures.items()):
            inner = pair[0] if isinstance(pair, tuple) else pair
            parts.append(f"rank {rank}: {type(inner).__name__}: {inner}")
        return "; ".join(parts)
    return f"{type(exc).__name__}: {exc}"
