"""Crius's admission by rescaling: which freeing moves cover a job's GPU deficit.

A freeing move is (value lost, GPUs freed, job, new option): shrink a running job
to its next lower Cell or move it to another type with free GPUs. Two covers are
tried for every blocked job (`loom.policies.crius`, step 3) and the better kept:
the greedy one (cheapest value lost per GPU freed first, ≤ `depth` moves) and the
cheapest single move that frees enough on its own — the greedy order can miss a
move that is dear per GPU but alone sufficient.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

Move = tuple[float, int, Any, Any]  # (value lost, GPUs freed, Job, Option)


def greedy_cover(moves: list[Move], deficit: int, free: Mapping[str, int], type_of: Mapping[str, str],
                 depth: int) -> list[Move] | None:
    """Moves (sorted cheapest per GPU first) taken in order until `deficit` GPUs are freed, or
    None past `depth` moves; a move to another type uses that type's free GPUs (`free`), so
    two moves cannot share them. `type_of`: a job id's current GPU type."""
    chosen: list[Move] = []
    freed, other = 0, dict(free)
    for m in moves:
        new = m[3]
        if new.gpu_type != type_of[m[2].job_id]:
            if other[new.gpu_type] < new.gpus:
                continue
            other[new.gpu_type] -= new.gpus
        chosen.append(m)
        freed += m[1]
        if freed >= deficit:
            return chosen
        if len(chosen) >= depth:
            return None
    return None


def single_cover(moves: list[Move], deficit: int) -> list[Move] | None:
    """The cheapest single move that frees `deficit` GPUs on its own (None: none does)."""
    covering = [m for m in moves if m[1] >= deficit]
    return [min(covering, key=lambda m: m[0])] if covering else None


__all__ = ["Move", "greedy_cover", "single_cover"]
