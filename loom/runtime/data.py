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

A process hosting several logical ranks (world-size virtualisation) keeps a shard,
a rebuilt loader and a position per logical rank, and serves the batch of the rank
the runtime names before each fetch.

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


@dataclass
class _Shard:
    """One logical rank's view of the loader: its sampler, the loader built on it, its position."""

    sampler: ShardSampler | None
    loader: Any
    generator: torch.Generator
    position: DataPosition


class ResumableLoader:
    """Wraps the script's loader: shards by logical rank, counts batches, calls the runtime per fetch.

    A process hosting several logical ranks (world-size virtualisation) holds a shard
    per rank; before each batch `on_fetch` names the rank whose batch it is (None: the
    first), so each rank advances through its own shard at its own position.
    """

    def __init__(self, loader: Any, *, logical_rank: int = 0, logical_world: int = 1,
                 logical_ranks: list[int] | None = None,
                 on_fetch: Callable[[], int | None] = lambda: None,
                 on_epoch_end: Callable[[], None] = lambda: None) -> None:
        self.original = loader
        self.ranks = list(logical_ranks) if logical_ranks else [logical_rank]
        self._on_fetch, self._on_epoch_end = on_fetch, on_epoch_end
        self._epochs = 0  # iter() calls so far
        self._resume: dict[int, DataPosition] | None = None
        self._fetch: _Fetch | None = None  # the epoch being iterated (a rollback skips batches of it)
        first = _make_shard(loader, logical_world, self.ranks[0], None)
        seed = first.sampler.seed if first.sampler is not None else None  # one shuffle seed for all
        self._shards = {r: first if r == self.ranks[0] else _make_shard(loader, logical_world, r, seed)
                        for r in self.ranks}
        if self.sampler is None:
            if len(self.ranks) > 1:
                raise RuntimeUsageError(
                    f"world-size virtualisation ({len(self.ranks)} logical ranks on this process) needs a "
                    f"loader Loom can shard by logical rank (a DataLoader over a map-style dataset with a "
                    f"DistributedSampler, RandomSampler or SequentialSampler), not a {_describe(loader)}")
            log.warning("loom runtime: the data loader (%s) cannot be resharded; on resume its "
                        "first batches are replayed and discarded", _describe(loader))

    @property
    def sampler(self) -> ShardSampler | None:
        """The first hosted logical rank's sampler (None: a loader iterated as given)."""
        return self._shards[self.ranks[0]].sampler

    @property
    def position(self) -> DataPosition:
        return self._shards[self.ranks[0]].position

    # --- iteration ------------------------------------------------------------------------------
    def __iter__(self) -> Iterator[Any]:
        epoch, self._epochs = self._epochs, self._epochs + 1
        resume = self._resume
        if resume is not None and epoch < resume[self.ranks[0]].epoch:
            return _Fetch(self, {r: iter(()) for r in self.ranks})  # an epoch finished before the checkpoint
        if resume is not None and epoch == resume[self.ranks[0]].epoch:
            self._resume = None
        else:
            resume = None
        self._fetch = _Fetch(self, {r: self._start(shard, epoch, resume[r] if resume else None)
                                    for r, shard in self._shards.items()})
        return self._fetch

    def _start(self, shard: _Shard, epoch: int, resume: DataPosition | None) -> Iterator[Any]:
        offset, skip = self._resume_point(shard, resume) if resume is not None else (0, 0)
        shard.position = replace(shard.position, epoch=epoch, offset=offset, batches=skip)
        if shard.sampler is not None:
            shard.sampler.epoch, shard.sampler.offset = epoch, offset
            shard.generator.manual_seed(shard.sampler.seed * 1_000_003 + epoch)  # worker seeds
        inner = iter(shard.loader)
        for _ in range(skip):
            next(inner, None)
        return inner

    def __len__(self) -> int:
        shard = self._shards[self.ranks[0]]
        return len(shard.loader) if shard.sampler is None else _full_len(shard.loader, shard.sampler)

    def __getattr__(self, name: str) -> Any:
        original = self.__dict__.get("original")
        if original is None:
            raise AttributeError(name)
        return getattr(original, name)

    def set_epoch(self, epoch: int) -> None:
        """Kept for scripts written for DistributedSampler; epochs are counted by `iter()`."""

    # --- checkpoint state -----------------------------------------------------------------------
    def state(self) -> DataPosition:
        """The first hosted logical rank's position."""
        return self.position

    def states(self) -> dict[int, DataPosition]:
        """Every hosted logical rank's position."""
        return {r: shard.position for r, shard in self._shards.items()}

    def load(self, position: DataPosition) -> None:
        """Continue every hosted rank from `position` (taken with the same or another logical world)."""
        self.load_ranks({r: position for r in self.ranks})

    def set_seed(self, seed: int) -> None:
        """Shuffle with `seed` (the processes of a job agree on rank 0's before the first epoch)."""
        for shard in self._shards.values():
            if shard.sampler is not None:
                shard.sampler.seed = seed
                shard.position = replace(shard.position, seed=seed)

    def load_ranks(self, positions: dict[int, DataPosition]) -> None:
        """Continue each hosted logical rank from its own position."""
        for rank, position in positions.items():
            shard = self._shards[rank]
            if not position.resharded and position.world != shard.position.world:
                raise RuntimeUsageError(
                    f"the data loader cannot be resharded, so the job cannot resume with "
                    f"{shard.position.world} logical ranks from a checkpoint taken with {position.world}")
            if shard.sampler is not None:
                shard.sampler.seed = position.seed
                shard.position = replace(shard.position, seed=position.seed)
        self._resume = {r: positions[r] for r in self.ranks}
        self._epochs = 0

    @staticmethod
    def _resume_point(shard: _Shard, position: DataPosition) -> tuple[int, int]:
        """(segment offset, batches to replay) of the epoch being resumed."""
        if shard.sampler is None:
            return 0, position.batches
        return min(position.consumed(), shard.sampler.n), 0

    def skip(self, batches: int) -> int:
        """Read and discard every hosted logical rank's next `batches` batches of the current epoch
        (a loss-spike rollback), advancing their positions; stops at the epoch's end. Returns the
        number the first hosted rank skipped."""
        if self._fetch is None or batches <= 0:
            return 0
        return min(self._fetch.discard(rank, batches) for rank in self.ranks)

    def _advance(self, rank: int) -> None:
        shard = self._shards[rank]
        shard.position = replace(shard.position, batches=shard.position.batches + 1)


class _Fetch:
    """One epoch's iterator: the runtime runs its boundary work, then names the slice, before each batch."""

    def __init__(self, owner: ResumableLoader, inners: dict[int, Iterator[Any]]) -> None:
        self._owner, self._inners = owner, inners

    def __iter__(self) -> _Fetch:
        return self

    def __next__(self) -> Any:
        owner = self._owner
        try:
            chosen = owner._on_fetch()
        except StopIteration as exc:  # would silently end the script's epoch
            raise RuntimeError("loom runtime: StopIteration raised at an iteration boundary") from exc
        rank = owner.ranks[0] if chosen is None else chosen
        try:
            batch = next(self._inners[rank])
        except StopIteration:
            if rank != owner.ranks[0]:
                raise RuntimeError(f"loom runtime: logical rank {rank} ran out of batches in the middle "
                                   "of an iteration (its shard is shorter than the first rank's)") from None
            owner._on_epoch_end()
            raise
        owner._advance(rank)
        return batch

    def discard(self, rank: int, batches: int) -> int:
        """Take and drop up to `batches` of `rank`'s batches; an exhausted shard stays exhausted."""
        for taken in range(batches):
            try:
                next(self._inners[rank])
            except StopIteration:
                self._inners[rank] = iter(())
                return taken
            self._owner._advance(rank)
        return batches


def shardable(loader: Any) -> bool:
    """Whether the runtime can rebuild `loader` around a per-logical-rank `ShardSampler`."""
    return _shard_sampler(loader, 1, 0, seed=0) is not None


def _make_shard(loader: Any, world: int, rank: int, seed: int | None) -> _Shard:
    generator = torch.Generator()
    sampler = _shard_sampler(loader, world, rank, seed)
    if sampler is not None:
        inner, size, seed = _rebuild(loader, sampler, generator), loader.batch_size, sampler.seed
    else:
        inner, size, seed = loader, getattr(loader, "batch_size", None) or 1, 0
    position = DataPosition(world=world, batch_size=size, seed=seed, resharded=sampler is not None)
    return _Shard(sampler, inner, generator, position)


def _shard_sampler(loader: Any, world: int, rank: int, seed: int | None = None) -> ShardSampler | None:
    """Our sampler standing in for the loader's, or None when it cannot be rebuilt."""
    if not isinstance(loader, DataLoader) or loader.batch_size is None:
        return None
    dataset, sampler = loader.dataset, loader.sampler
    if not hasattr(dataset, "__len__") or isinstance(dataset, torch.utils.data.IterableDataset):
        return None
    if isinstance(sampler, DistributedSampler):
        shuffle, seed, drop_last = sampler.shuffle, sampler.seed, sampler.drop_last
    elif isinstance(sampler, RandomSampler) and not sampler.replacement and sampler._num_samples is None:
        shuffle, drop_last = True, False
        seed = _seed_of(sampler.generator) if seed is None else seed
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
