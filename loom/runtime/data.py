"""A resumable data loader: each logical rank's shard in a deterministic order, with its position.

A resumed job continues exactly at the next batch only if it knows which samples
were consumed and the order is reproducible. The wrapper rebuilds the script's
`DataLoader` around `ShardSampler` — DistributedSampler's order (a permutation seeded
by `seed + epoch`, padded, rank `r` taking every N-th sample), sharded by **logical**
rank — and counts the batches each logical rank has taken.

Why an epoch is a *segment*: with N ranks taking `r, r+N, …`, after `b` batches of
size `B` the consumed samples are exactly the prefix `order[:b·B·N]` of the epoch's
order. A resumed epoch therefore restarts as a segment at that global offset,
sharded over whatever logical world the job now has: the same samples in the same
order when N is unchanged, and no sample lost or repeated when N changed.

Epochs are counted by `iter()` calls (one per epoch in the usual `for epoch …: for
batch in loader` loop). A job resumed in epoch e gets empty iterators for epochs
0…e-1, so the script's own epoch counter lines up without edits; per-epoch code
outside the batch loop runs again for those empty epochs (keep it idempotent).

Loaders that cannot be rebuilt (an IterableDataset, a custom sampler or batch
sampler) are iterated as given; on resume the first `b` batches of the epoch are
read and discarded, which is exact only if their order is deterministic.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch.utils.data import (
    DataLoader,
    DistributedSampler,
    RandomSampler,
    Sampler,
    SequentialSampler,
)

from loom.runtime.errors import RuntimeUsageError

log = logging.getLogger("loom.runtime")


@dataclass(frozen=True)
class DataPosition:
    """Where one logical rank is: epoch, the segment's global start, batches taken in it."""

    epoch: int = 0
    offset: int = 0
    batches: int = 0
    world: int = 1
    batch_size: int = 1
    seed: int = 0
    resharded: bool = True  # False: a loader that is replayed, not resharded

    def consumed(self) -> int:
        """Samples of this epoch's global order taken by all logical ranks together."""
        return self.offset + self.batches * self.batch_size * self.world


def shard_indices(n: int, *, epoch: int, offset: int, world: int, rank: int, shuffle: bool,
                  seed: int, drop_last: bool) -> list[int]:
    """Rank `rank`'s samples of the segment of epoch `epoch` that starts at `offset`."""
    if shuffle:
        g = torch.Generator()
        g.manual_seed(seed + epoch)
        order = torch.randperm(n, generator=g).tolist()
    else:
        order = list(range(n))
    rest = order[offset:]
    if drop_last:
        rest = rest[: len(rest) - len(rest) % world]
    elif order:
        pad = (-len(rest)) % world
        rest += (order * math.ceil(pad / len(order)))[:pad] if pad else []
    return rest[rank::world]


class ShardSampler(Sampler[int]):
    """DistributedSampler's order for a logical rank, from a segment offset."""

    def __init__(self, n: int, *, world: int, rank: int, shuffle: bool, seed: int,
                 drop_last: bool) -> None:
        self.n, self.world, self.rank = n, world, rank
        self.shuffle, self.seed, self.drop_last = shuffle, seed, drop_last
        self.epoch = 0
        self.offset = 0

    def __iter__(self) -> Iterator[int]:
        return iter(shard_indices(self.n, epoch=self.epoch, offset=self.offset, world=self.world,
                                  rank=self.rank, shuffle=self.shuffle, seed=self.seed,
                                  drop_last=self.drop_last))

    def __len__(self) -> int:
        rest = self.n - min(self.offset, self.n)
        return rest // self.world if self.drop_last else math.ceil(rest / self.world)


class ResumableLoader:
    """Wraps the script's loader: shards by logical rank, counts batches, calls the runtime per fetch."""

    def __init__(self, loader: Any, *, logical_rank: int, logical_world: int,
                 on_fetch: Callable[[], None] = lambda: None,
                 on_epoch_end: Callable[[], None] = lambda: None) -> None:
        self.original = loader
        self._on_fetch, self._on_epoch_end = on_fetch, on_epoch_end
        self._epochs = 0  # iter() calls so far
        self._resume: DataPosition | None = None
        self._generator = torch.Generator()
        self.sampler = _shard_sampler(loader, logical_world, logical_rank)
        if self.sampler is not None:
            self._loader = _rebuild(loader, self.sampler, self._generator)
            size = loader.batch_size
        else:
            log.warning("loom runtime: the data loader (%s) cannot be resharded; on resume its "
                        "first batches are replayed and discarded", _describe(loader))
            self._loader, size = loader, getattr(loader, "batch_size", None) or 1
        seed = self.sampler.seed if self.sampler is not None else 0
        self.position = DataPosition(world=logical_world, batch_size=size, seed=seed,
                                     resharded=self.sampler is not None)

    # --- iteration ------------------------------------------------------------------------------
    def __iter__(self) -> Iterator[Any]:
        epoch, self._epochs = self._epochs, self._epochs + 1
        resume = self._resume
        if resume is not None and epoch < resume.epoch:
            return _Fetch(self, iter(()))  # an epoch finished before the checkpoint
        skip, offset = 0, 0
        if resume is not None and epoch == resume.epoch:
            self._resume = None
            offset, skip = self._resume_point(resume)
        self.position = replace(self.position, epoch=epoch, offset=offset, batches=0)
        if self.sampler is not None:
            self.sampler.epoch, self.sampler.offset = epoch, offset
            self._generator.manual_seed(self.sampler.seed * 1_000_003 + epoch)  # worker seeds
        inner = iter(self._loader)
        for _ in range(skip):
            next(inner, None)
        self.position = replace(self.position, batches=skip) if skip else self.position
        return _Fetch(self, inner)

    def __len__(self) -> int:
        return len(self._loader) if self.sampler is None else _full_len(self._loader, self.sampler)

    def __getattr__(self, name: str) -> Any:
        original = self.__dict__.get("original")
        if original is None:
            raise AttributeError(name)
        return getattr(original, name)

    def set_epoch(self, epoch: int) -> None:
        """Kept for scripts written for DistributedSampler; epochs are counted by `iter()`."""

    # --- checkpoint state -----------------------------------------------------------------------
    def state(self) -> DataPosition:
        return self.position

    def load(self, position: DataPosition) -> None:
        """Continue from `position` (taken with the same or another logical world)."""
        if not position.resharded and position.world != self.position.world:
            raise RuntimeUsageError(
                f"the data loader cannot be resharded, so the job cannot resume with "
                f"{self.position.world} logical ranks from a checkpoint taken with {position.world}")
        if self.sampler is not None:
            self.sampler.seed = position.seed
            self.position = replace(self.position, seed=position.seed)
        self._resume = position
        self._epochs = 0

    def _resume_point(self, position: DataPosition) -> tuple[int, int]:
        """(segment offset, batches to replay) of the epoch being resumed."""
        if self.sampler is None:
            return 0, position.batches
        return min(position.consumed(), self.sampler.n), 0

    def _advance(self) -> None:
        self.position = replace(self.position, batches=self.position.batches + 1)


class _Fetch:
    """One epoch's iterator: the runtime runs its boundary work before each batch is taken."""

    def __init__(self, owner: ResumableLoader, inner: Iterator[Any]) -> None:
        self._owner, self._inner = owner, inner

    def __iter__(self) -> _Fetch:
        return self

    def __next__(self) -> Any:
        try:
            self._owner._on_fetch()
        except StopIteration as exc:  # would silently end the script's epoch
            raise RuntimeError("loom runtime: StopIteration raised at an iteration boundary") from exc
        try:
            batch = next(self._inner)
        except StopIteration:
            self._owner._on_epoch_end()
            raise
        self._owner._advance()
        return batch


def _shard_sampler(loader: Any, world: int, rank: int) -> ShardSampler | None:
    """Our sampler standing in for the loader's, or None when it cannot be rebuilt."""
    if not isinstance(loader, DataLoader) or loader.batch_size is None:
        return None
    dataset, sampler = loader.dataset, loader.sampler
    if not hasattr(dataset, "__len__") or isinstance(dataset, torch.utils.data.IterableDataset):
        return None
    if isinstance(sampler, DistributedSampler):
        shuffle, seed, drop_last = sampler.shuffle, sampler.seed, sampler.drop_last
    elif isinstance(sampler, RandomSampler) and not sampler.replacement and sampler._num_samples is None:
        shuffle, seed, drop_last = True, _seed_of(sampler.generator), False
    elif isinstance(sampler, SequentialSampler):
        shuffle, seed, drop_last = False, 0, False
    else:
        return None
    return ShardSampler(len(dataset), world=world, rank=rank, shuffle=shuffle, seed=seed,
                        drop_last=drop_last)


def _seed_of(generator: torch.Generator | None) -> int:
    """The shuffle seed: the sampler's generator's, else one draw from torch's global stream."""
    if generator is not None:
        return int(generator.initial_seed()) % (2**31)
    return int(torch.empty((), dtype=torch.int64).random_().item()) % (2**31)


def _rebuild(loader: DataLoader, sampler: ShardSampler, generator: torch.Generator) -> DataLoader:
    kwargs: dict[str, Any] = {
        "batch_size": loader.batch_size, "sampler": sampler, "num_workers": loader.num_workers,
        "collate_fn": loader.collate_fn, "pin_memory": loader.pin_memory,
        "drop_last": loader.drop_last, "timeout": loader.timeout,
        "worker_init_fn": loader.worker_init_fn, "generator": generator,
        "multiprocessing_context": loader.multiprocessing_context,
        "persistent_workers": loader.persistent_workers,
        "pin_memory_device": loader.pin_memory_device}
    if loader.num_workers > 0:
        kwargs["prefetch_factor"] = loader.prefetch_factor
    if hasattr(loader, "in_order"):
        kwargs["in_order"] = loader.in_order
    return DataLoader(loader.dataset, **kwargs)


def _full_len(loader: DataLoader, sampler: ShardSampler) -> int:
    """Batches in a whole epoch for this rank (what schedulers sized by len(loader) expect)."""
    per_rank = sampler.n // sampler.world if sampler.drop_last else math.ceil(sampler.n / sampler.world)
    size = loader.batch_size or 1
    return per_rank // size if loader.drop_last else math.ceil(per_rank / size)


def _describe(loader: Any) -> str:
    if isinstance(loader, DataLoader):
        return f"DataLoader with {type(loader.sampler).__name__} over {type(loader.dataset).__name__}"
    return type(loader).__name__
