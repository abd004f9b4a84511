"""Content-hash deduplication of data-parallel replicas in a DCP checkpoint.

What DCP does by default (torch 2.13, measured in tests/test_runtime_checkpoint.py):
`DefaultSavePlanner` keeps **one copy of every key written by several ranks**, chosen
by name alone (`dedup_save_plans`, the copy goes to the rank with the least planned
bytes). For the replicated state of pure data parallelism that is the right result —
bytes written ≈ one replica, not world × replica — but it never looks at the bytes:
a key whose values differ between ranks silently keeps one rank's value, and every
rank loads that value back.

`ContentDedupSavePlanner` keeps DCP's assignment and adds Singularity's rule (§4.6:
"a worker uploads a buffer only if no other worker uploaded the same content"):
every rank hashes the content of each item it would write; the coordinator keeps one
copy only where the hashes agree and **refuses the checkpoint** where replicas differ
(a silent pick would make the resumed job differ from the one that was stopped).
Per-rank state therefore lives under per-logical-rank keys (see checkpoint.py).

Hashing runs in the planning step: in async mode on the background thread, over the
staged CPU copy, so it does not stall the training loop.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
from typing import Any

import torch
from torch.distributed.checkpoint import DefaultSavePlanner
from torch.distributed.checkpoint.planner import SavePlan


class ReplicaMismatch(RuntimeError):
    """Ranks hold different contents under one key of the replicated state."""


@dataclasses.dataclass(frozen=True)
class _Tagged:
    """A local plan's planner data plus the content hash of each item."""

    inner: Any
    hashes: dict[str, str]


def content_hash(value: Any) -> str:
    """A digest of a tensor's bytes (with dtype and shape) or of a serialised object."""
    digest = hashlib.blake2b(digest_size=16)
    if isinstance(value, torch.Tensor):
        flat = value.detach().reshape(-1).contiguous().cpu()
        digest.update(f"{flat.dtype}{tuple(value.shape)}".encode())
        digest.update(flat.view(torch.uint8).numpy().data)
    else:
        buffer = io.BytesIO()
        torch.save(value, buffer)
        digest.update(buffer.getvalue())
    return digest.hexdigest()


class ContentDedupSavePlanner(DefaultSavePlanner):
    """DCP's default planner, with replica deduplication checked by content hash."""

    def create_local_plan(self) -> SavePlan:
        plan = super().create_local_plan()
        hashes = {}
        for item in plan.items:
            hashes[_key(item.index)] = content_hash(self.lookup_object(item.index))
        self.plan = dataclasses.replace(plan, planner_data=_Tagged(plan.planner_data, hashes))
        return self.plan

    def create_global_plan(self, all_plans: list[SavePlan]) -> tuple[list[SavePlan], Any]:
        _check_replicas(all_plans)
        plain = [dataclasses.replace(p, planner_data=_untag(p.planner_data)) for p in all_plans]
        return super().create_global_plan(plain)

    def finish_plan(self, new_plan: SavePlan) -> SavePlan:
        return super().finish_plan(dataclasses.replace(new_plan, planner_data=_untag(new_plan.planner_data)))


def _key(index: Any) -> str:
    return f"{index.fqn}@{tuple(index.offset) if index.offset is not None else ()}"


def _untag(data: Any) -> Any:
    return data.inner if isinstance(data, _Tagged) else data


def _check_replicas(all_plans: list[SavePlan]) -> None:
    seen: dict[str, tuple[str, int]] = {}
    for rank, plan in enumerate(all_plans):
        hashes = plan.planner_data.hashes if isinstance(plan.planner_data, _Tagged) else {}
        for key, digest in hashes.items():
            first = seen.setdefault(key, (digest, rank))
            if first[0] != digest:
                raise ReplicaMismatch(
                    f"ranks {first[1]} and {rank} hold different contents under "
                    f"'{key.split('@')[0]}': the data-parallel replicas have diverged, "
                    "so no single copy can be checkpointed")
