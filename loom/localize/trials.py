"""Randomised localisation trials (the accuracy figure of the tests and of bench/localize.py).

A trial draws 2..12 nodes and 1..3 faulty ones (at most n-1), sometimes both nodes of one
round-1 pair, with kinds drawn from hang, crash, wrong and slow — except that `slow` is
drawn only when at least two nodes stay healthy: a slow node is visible only against a
healthy pair's time, and pairwise tests cannot clear the lone healthy node of a slow
neighbour (docs/RELIABILITY.md). Exact means the verdict names exactly the injected nodes,
with nothing undetermined.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from loom.localize.api import localize
from loom.localize.cluster import TAG_PREFIX, AgentHub
from loom.localize.model import FAULT_KINDS, Localisation


@dataclass(frozen=True)
class Trial:
    nodes: tuple[str, ...]
    faults: dict[str, str]


@dataclass(frozen=True)
class TrialResult:
    trial: Trial
    result: Localisation
    wall_s: float

    @property
    def exact(self) -> bool:
        return set(self.result.faulty) == set(self.trial.faults) and not self.result.undetermined


def random_trial(rng: random.Random, min_nodes: int = 2, max_nodes: int = 12) -> Trial:
    n = rng.randint(min_nodes, max_nodes)
    nodes = tuple(f"n{i}" for i in range(n))
    k = rng.randint(1, min(3, n - 1))
    chosen: list[str] = []
    if k >= 2 and rng.random() < 0.5:  # both nodes of one round-1 pair
        first = 2 * rng.randrange(n // 2)
        chosen = [nodes[first], nodes[first + 1]]
    rest = [x for x in nodes if x not in chosen]
    chosen += rng.sample(rest, k - len(chosen))
    kinds = FAULT_KINDS if n - k >= 2 else tuple(x for x in FAULT_KINDS if x != "slow")
    return Trial(nodes, {x: rng.choice(kinds) for x in sorted(chosen, key=nodes.index)})


def run_trials(count: int, seed: int, *, timeout_s: float = 2.0, tensor_bytes: int = 1 << 16,
               on_result: Callable[[TrialResult], None] | None = None) -> list[TrialResult]:
    """`count` pairwise localisations of random trials (seeded: the same trials every run)."""
    rng = random.Random(seed)
    results = []
    with AgentHub() as hub:  # one torch import for all trials; agents are forked afresh for each
        for _ in range(count):
            trial = random_trial(rng)
            start = time.monotonic()
            result = localize(trial.nodes, trial.faults, timeout_s=timeout_s, tensor_bytes=tensor_bytes, hub=hub)
            results.append(TrialResult(trial, result, time.monotonic() - start))
            if on_result is not None:
                on_result(results[-1])
    return results


def leftover_processes(owner_pid: int, role: str = "") -> list[int]:
    """Live processes (not zombies) of localisations started by `owner_pid` — there should be none.
    `role`: only those started as `agent` (by a launcher) or as `hub` (with its store and forked agents)."""
    marker = f"{TAG_PREFIX}-{owner_pid}-".encode()
    wanted = f"\0{role}\0".encode() if role else b""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            if marker in cmdline and wanted in cmdline:
                found.append(int(entry.name))
        except OSError:
            continue
    return found
