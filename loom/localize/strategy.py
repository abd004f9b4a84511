"""Which groups to test, round after round, and what the outcomes prove.

`pairwise` is Acme's two-round test (seed paper §6): round 1 splits the nodes into
pairs (one group of three when the count is odd) and all-gathers in each; the members of a
failed group are suspects. Round 2 pairs every suspect with a node that passed round 1;
a test passes only if all its members are healthy, so with a healthy partner a failure
convicts the suspect. What the two rounds alone leave open:

* more suspects than healthy nodes — round 2 runs in sub-rounds (2a, 2b, …), each pairing
  at most one suspect with each healthy node; suspects cleared earlier join the partners;
* no group passed in round 1 (e.g. two faulty nodes in a four-node cluster) — cross-pairing
  rounds re-pair the suspects into pairs not yet tested until one passes, giving healthy
  partners; if none ever passes, at most one node is healthy and pairwise tests cannot tell
  which: the verdict then rests on direct evidence (a crashed or silent agent, or the node a
  peer received wrong data from) and says so, leaving the rest `undetermined`.

`all-pairs` is the naive baseline: every pair once (n(n-1)/2 tests) in round-robin rounds
of disjoint pairs; a node is faulty when every one of its tests failed (exact whenever two
healthy nodes exist; if no test passed at all, nothing is concluded).
"""

from __future__ import annotations

import string
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from loom.localize.cluster import Cluster
from loom.localize.judge import SlowJudge, outcome
from loom.localize.model import GroupTest, Round

Progress = Callable[[str], None]


@dataclass(frozen=True)
class Verdict:
    rounds: tuple[Round, ...]
    faulty: tuple[str, ...]
    suspects_round1: tuple[str, ...]
    undetermined: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()


@dataclass
class Runner:
    """Runs rounds on the cluster and keeps them, judged, in order."""

    cluster: Cluster
    judge: SlowJudge
    progress: Progress
    rounds: list[Round] = field(default_factory=list)

    def run(self, name: str, groups: Sequence[tuple[str, ...]], note: str = "") -> Round:
        self.progress(f"{name}: {len(groups)} group{'s' if len(groups) != 1 else ''} testing")
        start = time.monotonic()
        raw = self.cluster.run_round(groups)
        timeout = self.cluster.timeout_s
        tests = [outcome(g, answers, timeout) for g, answers in zip(groups, raw)]
        rnd = Round(name, tuple(self.judge.judge(tests)), time.monotonic() - start, note)
        self.rounds.append(rnd)
        return rnd

    def tests(self) -> list[GroupTest]:
        return [g for r in self.rounds for g in r.groups]


def first_round_groups(nodes: Sequence[str]) -> list[tuple[str, ...]]:
    """Pairs in order; with an odd count the last group has three nodes."""
    groups = [tuple(nodes[i:i + 2]) for i in range(0, len(nodes) - 1, 2)]
    if len(nodes) % 2:
        groups[-1] = (*groups[-1], nodes[-1])
    return groups


def pairwise(runner: Runner, nodes: tuple[str, ...]) -> Verdict:
    r1 = runner.run("round 1", first_round_groups(nodes))
    order = {n: i for i, n in enumerate(nodes)}
    suspects = sorted({m for g in r1.groups if g.outcome != "pass" for m in g.members}, key=order.__getitem__)
    healthy = [m for g in r1.groups if g.outcome == "pass" for m in g.members]
    if suspects and not healthy:
        healthy = _cross_pair(runner, suspects, order)
    remaining = [s for s in suspects if s not in healthy]
    if remaining and not healthy:
        return _evidence_verdict(runner, nodes, tuple(suspects), remaining)
    faulty = _second_round(runner, remaining, healthy, order)
    return Verdict(tuple(runner.rounds), tuple(sorted(faulty, key=order.__getitem__)), tuple(suspects))


def _cross_pair(runner: Runner, suspects: list[str], order: dict[str, int]) -> list[str]:
    """Re-pair suspects into untested pairs until one passes: its nodes are healthy partners."""
    tested = {frozenset(g.members) for g in runner.tests() if len(g.members) == 2}
    healthy: list[str] = []
    step = 0
    while not healthy:
        pairs = _untested_matching(suspects, tested)
        if not pairs:
            break
        step += 1
        rnd = runner.run(f"cross-pairing {step}", pairs, "no group passed: re-pairing suspects")
        tested |= {frozenset(p) for p in pairs}
        healthy = sorted({m for g in rnd.groups if g.outcome == "pass" for m in g.members},
                         key=order.__getitem__)
    return healthy


def _untested_matching(nodes: list[str], tested: set[frozenset[str]]) -> list[tuple[str, str]]:
    """Disjoint pairs not tested before (greedy, in node order)."""
    free = list(nodes)
    pairs: list[tuple[str, str]] = []
    while free:
        u = free.pop(0)
        v = next((w for w in free if frozenset((u, w)) not in tested), None)
        if v is not None:
            free.remove(v)
            pairs.append((u, v))
    return pairs


def _second_round(runner: Runner, remaining: list[str], healthy: list[str], order: dict[str, int]) -> list[str]:
    """Each suspect with a distinct healthy node; sub-rounds while suspects outnumber partners."""
    partners = list(healthy)
    faulty: list[str] = []
    subrounds = -(-len(remaining) // len(partners)) if remaining else 0
    letters = iter(string.ascii_lowercase)
    while remaining:
        batch, remaining = remaining[:len(partners)], remaining[len(partners):]
        name = "round 2" if subrounds == 1 else f"round 2{next(letters, '+')}"
        note = "" if subrounds == 1 else f"{len(batch)} suspects, {len(partners)} healthy partners"
        rnd = runner.run(name, list(zip(batch, partners)), note)
        for suspect, group in zip(batch, rnd.groups):
            if group.outcome == "pass":
                partners.append(suspect)
            else:
                faulty.append(suspect)
    return faulty


def _evidence_verdict(runner: Runner, nodes: tuple[str, ...], suspects: tuple[str, ...],
                      remaining: list[str]) -> Verdict:
    """No healthy node to test against: convict only on direct evidence; say what stays open."""
    order = {n: i for i, n in enumerate(nodes)}
    failed = [g for g in runner.tests() if g.outcome != "pass"]
    blamed = {b for g in failed for b in g.blamed}
    faulty = sorted(blamed & set(remaining), key=order.__getitem__)
    explained = [s for s in remaining if s not in blamed
                 and all(blamed & set(g.members) for g in failed if s in g.members)]
    undetermined = [s for s in remaining if s not in blamed and s not in explained]
    note = ("no healthy node found: every test failed, so no suspect could be tested against a healthy "
            "partner; faulty only on direct evidence (crash, no answer, wrong data named by a peer)")
    if explained:
        note += f"; {', '.join(explained)} presumed healthy (each failure explained by a faulty peer)"
    if undetermined:
        note += f"; cannot tell whether {', '.join(undetermined)} are faulty"
    return Verdict(tuple(runner.rounds), tuple(faulty), suspects, tuple(undetermined), (note,))


# ------------------------------------------------------------------ naive baseline
def round_robin(nodes: Sequence[str]) -> list[list[tuple[str, str]]]:
    """The circle method: n-1 rounds (n even) of disjoint pairs covering every pair once."""
    ring: list[str | None] = list(nodes) + ([None] if len(nodes) % 2 else [])
    rounds = []
    for _ in range(len(ring) - 1):
        half = len(ring) // 2
        pairs = [(ring[i], ring[-1 - i]) for i in range(half)]
        rounds.append([(a, b) for a, b in pairs if a is not None and b is not None])
        ring = [ring[0], ring[-1], *ring[1:-1]]
    return rounds


def all_pairs(runner: Runner, nodes: tuple[str, ...]) -> Verdict:
    for i, pairs in enumerate(round_robin(nodes), 1):
        runner.run(f"all-pairs {i}", pairs)
    tests = runner.tests()
    first = runner.rounds[0].groups
    suspects = tuple(n for n in nodes if any(n in g.members and g.outcome != "pass" for g in first))
    if not any(g.outcome == "pass" for g in tests):
        note = "no test passed: with at most one healthy node all-pairs cannot tell which"
        return Verdict(tuple(runner.rounds), (), suspects, nodes, (note,))
    faulty = tuple(n for n in nodes if all(g.outcome != "pass" for g in tests if n in g.members))
    return Verdict(tuple(runner.rounds), faulty, suspects)


METHODS: dict[str, Callable[[Runner, tuple[str, ...]], Verdict]] = {"pairwise": pairwise, "all-pairs": all_pairs}
