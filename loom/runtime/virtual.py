"""World-size virtualisation: N logical data-parallel ranks time-sliced on M ≤ N processes.

A job keeps its logical world size N across resizes (Singularity §5). Process `p`
hosts a contiguous block of logical ranks (`logical_ranks_of`) and runs them one
after another inside each iteration — a **slice** per logical rank — driven by the
wrapped loader and the optimizer, so the training loop stays as written:

* each fetch from the loader starts the next slice once the current one has called
  `optimizer.step()`: the batch is the slice's logical rank's (its own shard and
  position), and that rank's RNG streams are swapped in (the previous rank's are
  saved) before the batch is read, so augmentation and dropout draw from them;
* `optimizer.step()` in every slice but the last is **deferred**: it returns without
  touching the parameters, the slice's gradient is kept (accumulated, or kept apart
  on the unsquashed path); in the last slice the process's gradients are reduced to
  the logical world's mean and the step runs once ("squashing");
* `optimizer.zero_grad()` is ignored while deferred gradients are held (between the
  first deferred step and the real one), so they survive the next slice's call;
* the LR scheduler given to `wrap` steps only in the last slice: once per iteration;
* `current().iteration` is what the slice's logical rank would see on a process of
  its own: the completed iterations, plus one after its (possibly deferred) step;
  `current().logical_rank` is the slice's logical rank.

Several batches per step (gradient accumulation in the script) stay in one slice:
the slice ends with the step, not with a fixed number of batches.
"""

from __future__ import annotations

import hashlib
import pickle
import random
import types
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch.nn.parallel import DistributedDataParallel

from loom.runtime import rng
from loom.runtime.errors import RuntimeConfigError, RuntimeUsageError
from loom.runtime.gradients import Gradients, SquashCheck


def logical_ranks_of(process: int, processes: int, logical_world: int) -> list[int]:
    """The logical ranks process `process` hosts: a contiguous block, sizes differing by at most one."""
    if logical_world < processes:
        raise RuntimeConfigError(
            f"{logical_world} logical ranks on {processes} processes: a process needs at least one "
            "logical rank (resize to at most the logical world size)",
            source="environment variable LOOM_LOGICAL_WORLD")
    return list(range(process * logical_world // processes, (process + 1) * logical_world // processes))


def layout_of(processes: int, logical_world: int) -> list[list[int]]:
    """The logical ranks of every process, in process order."""
    return [logical_ranks_of(p, processes, logical_world) for p in range(processes)]


# --- per-logical-rank RNG streams ----------------------------------------------------------------

def fingerprints(state: dict[str, Any]) -> dict[str, int]:
    """A 63-bit digest of each captured stream: the same seeding gives the same numbers.

    Per stream, so that one the script never seeded (Python's `random`, seeded from the OS
    at start) cannot change the others' derived streams from one run to the next.
    """
    out = {}
    for key, value in state.items():
        if isinstance(value, torch.Tensor):
            value = value.cpu().numpy().tobytes()
        elif key == "accelerator":
            value = (value[0], value[1].cpu().numpy().tobytes())
        out[key] = _digest(pickle.dumps(value, protocol=4))
    return out


def logical_streams(bases: dict[str, int], ranks: list[int], device: torch.device) -> dict[int, dict[str, Any]]:
    """Each logical rank's own streams, each seeded from (its base, rank): the same on any process count.

    Leaves the global streams seeded for the last rank of `ranks`; callers install the one they run.
    """
    streams = {}
    for rank in ranks:
        seed = {key: _digest(f"{base}:{rank}".encode()) for key, base in bases.items()}
        random.seed(seed["python"])
        np.random.seed(seed["numpy"] % 2**32)
        torch.manual_seed(seed["torch"])  # every accelerator's generator too
        if "accelerator" in seed and device.type != "cpu":
            torch.get_device_module(device.type).manual_seed(seed["accelerator"])
        streams[rank] = rng.capture(device)
    return streams


def _digest(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little") >> 1


# --- the slicer ----------------------------------------------------------------------------------

class Slicer:
    """Time-slices the logical ranks of one process through the optimizer, scheduler and loader."""

    def __init__(self, ranks: list[int], streams: dict[int, dict[str, Any]], device: torch.device, *,
                 model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any,
                 gradients: Gradients, on_check: Callable[[SquashCheck], None]) -> None:
        self.ranks, self.device, self.gradients = ranks, device, gradients
        self._ddp = model if isinstance(model, DistributedDataParallel) else None
        self._on_check = on_check
        self.index = 0  # the running slice
        self.stepped = False  # the running slice has called optimizer.step()
        self.pending = False  # deferred gradients are held: zero_grad() is ignored
        self.internal = False  # the runtime's own optimizer calls (DCP state dicts) pass through
        self._streams = dict(streams)
        self.active = ranks[0]
        rng.restore(self._streams.pop(self.active))
        self._patched: list[tuple[Any, str, Any]] = []
        self._patch(optimizer, "step", self._step)
        self._patch(optimizer, "zero_grad", self._zero_grad)
        if scheduler is not None:
            self._patch_class(scheduler, "step", self._scheduler_step)
        self._begin()

    @property
    def rank(self) -> int:
        """The logical rank of the running slice."""
        return self.ranks[self.index]

    @property
    def last(self) -> bool:
        return self.index == len(self.ranks) - 1

    @property
    def ahead(self) -> int:
        """1 while a slice has made its deferred step (its iteration is complete for it)."""
        return int(self.stepped and not self.last)

    def next_rank(self) -> int:
        """Called before every batch: the logical rank whose batch it is (the next once stepped)."""
        if self.stepped:
            self.index = 0 if self.last else self.index + 1
            self.stepped = False
            self._begin()
        return self.rank

    def streams(self) -> dict[int, dict[str, Any]]:
        """Every hosted logical rank's RNG streams as they are now (snapshots), for a checkpoint."""
        out = {r: s for r, s in self._streams.items()}
        out[self.active] = rng.capture(self.device)
        return out

    def load_streams(self, states: dict[int, dict[str, Any]]) -> None:
        """Replace the streams of the ranks in `states` (a resume); the first rank's is installed."""
        current = self.streams()
        current.update(states)
        self.active = self.ranks[self.index]
        rng.restore(current.pop(self.active))  # last: nothing may draw after this
        self._streams = current

    def close(self) -> None:
        """Put the script's optimizer and scheduler methods back; DDP syncs every backward again."""
        for owner, name, saved in reversed(self._patched):
            if name == "__class__":
                owner.__class__ = saved
            elif saved is None:
                owner.__dict__.pop(name, None)
            else:
                setattr(owner, name, saved)
        self._patched = []
        self.gradients.close()

    # --- slices ---------------------------------------------------------------------------------
    def _begin(self) -> None:
        rank = self.rank
        if rank != self.active:
            self._streams[self.active] = rng.capture(self.device)
            rng.restore(self._streams.pop(rank))
            self.active = rank
        self.gradients.begin_slice(rank)
        if self._ddp is not None:
            self._ddp.require_backward_grad_sync = self.gradients.ddp_sync(self.last)

    def _step(self, real: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if self.internal:
            return real(*args, **kwargs)
        self.stepped = True
        if not self.last:
            if (args[0] if args else kwargs.get("closure")) is not None:
                raise RuntimeUsageError("optimizer.step(closure) cannot be time-sliced: with several "
                                        "logical ranks per process the step of all but the last is deferred")
            self.gradients.keep(self.rank)
            self.pending = True
            return None
        check = self.gradients.finish(self.rank)
        self.pending = False
        if check is not None:
            self._on_check(check)
        return real(*args, **kwargs)

    def _zero_grad(self, real: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if self.pending and not self.internal:
            return None
        return real(*args, **kwargs)

    def _scheduler_step(self, real: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if not self.last and not self.internal:
            return None
        return real(*args, **kwargs)

    def _patch(self, owner: Any, name: str, wrapper: Callable[..., Any]) -> None:
        """Wrap `owner.name` by an instance attribute, keeping marks such as LR schedulers' own."""
        saved = owner.__dict__.get(name)
        real = getattr(owner, name)

        def method(_self: Any, *args: Any, **kwargs: Any) -> Any:
            return wrapper(real, *args, **kwargs)

        for mark in ("_wrapped_by_lr_sched",):
            if hasattr(real, mark):
                setattr(method, mark, getattr(real, mark))
        setattr(owner, name, types.MethodType(method, owner))
        self._patched.append((owner, name, saved))

    def _patch_class(self, owner: Any, name: str, wrapper: Callable[..., Any]) -> None:
        """Wrap a method through a subclass: an LR scheduler's `state_dict()` is its `__dict__`,
        so an instance attribute would end up in every checkpoint."""
        cls = type(owner)
        real = getattr(cls, name)

        def method(self: Any, *args: Any, **kwargs: Any) -> Any:
            return wrapper(types.MethodType(real, self), *args, **kwargs)

        owner.__class__ = type(cls.__name__, (cls,), {name: method, "__module__": cls.__module__})
        self._patched.append((owner, "__class__", cls))
