"""What a localisation reports: faults, group tests, rounds and the verdict.

Plain frozen dataclasses with no torch and no processes, so the service's
recovery pipeline and the CLI can import, store and print a `Localisation`
cheaply; `reason()` is the sentence a person reads in `loom explain`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from loom.errors import LoomInputError

FAULT_KINDS = ("hang", "crash", "wrong", "slow")
FAULT_ENV = "LOOM_NODE_FAULT"  # an agent reads its node's fault here: hang, crash, wrong, slow or slow:SECONDS
OUTCOMES = ("pass", "fail", "slow")


@dataclass(frozen=True)
class Fault:
    """A fault injected into one emulated node.

    `hang`: the agent blocks after joining the group and never answers; `crash`: its
    process exits during the test; `wrong`: it contributes corrupted data; `slow`: it
    delays its contribution by `delay_s` (default: 0.75 × the test timeout, so the
    pair passes but takes far longer than the others).
    """

    kind: str
    delay_s: float | None = None

    def __post_init__(self) -> None:
        if self.kind not in FAULT_KINDS:
            raise LoomInputError(f"unknown fault kind '{self.kind}' (known: {', '.join(FAULT_KINDS)})",
                                 field="fault")
        if self.delay_s is not None and (self.kind != "slow" or not self.delay_s >= 0):
            raise LoomInputError(f"a delay applies only to 'slow' and must be ≥ 0 (got {self.spec()})",
                                 field="fault")

    @classmethod
    def parse(cls, text: str | Fault) -> Fault:
        """`hang`, `crash`, `wrong`, `slow` or `slow:SECONDS` (what LOOM_NODE_FAULT holds)."""
        if isinstance(text, Fault):
            return text
        kind, _, delay = text.strip().partition(":")
        if not delay:
            return cls(kind)
        try:
            return cls(kind, float(delay))
        except ValueError:
            raise LoomInputError(f"'{text}': the delay after ':' must be a number of seconds",
                                 field="fault") from None

    def spec(self) -> str:
        return self.kind if self.delay_s is None else f"{self.kind}:{self.delay_s:g}"


def parse_faults(faults: Mapping[str, str | Fault] | None, nodes: tuple[str, ...]) -> dict[str, Fault]:
    """Faults by node, every node checked against the set (a typo must not test a healthy cluster)."""
    parsed: dict[str, Fault] = {}
    for node, text in (faults or {}).items():
        if node not in nodes:
            raise LoomInputError(f"faulty node '{node}' is not one of the {len(nodes)} nodes "
                                 f"({_short(nodes)})", field="faults")
        parsed[node] = Fault.parse(text)
    return parsed


@dataclass(frozen=True)
class GroupTest:
    """One all-gather among `members` and what came of it.

    `outcome`: pass, fail (an error, a timeout, a crash, no answer or wrong data) or slow
    (correct, but far slower than the round's others: see `loom.localize.judge`).
    `blamed`: members the evidence itself names — the agent died, never answered while a
    peer did, or a peer received wrong data from it — used only when no healthy node is
    left to test against. `seconds`: the slowest member's time in the collective.
    """

    members: tuple[str, ...]
    outcome: str
    detail: str = ""
    seconds: float | None = None
    blamed: tuple[str, ...] = ()

    def describe(self) -> str:
        names = f"({', '.join(self.members)})"
        verb = {"pass": "passed", "fail": "failed", "slow": "slow"}[self.outcome]
        return f"{names} {verb}" + (f": {self.detail}" if self.detail and self.outcome != "pass" else "")


@dataclass(frozen=True)
class Round:
    """Groups tested concurrently (disjoint nodes), with a name saying why they were formed."""

    name: str
    groups: tuple[GroupTest, ...]
    seconds: float = 0.0
    note: str = ""


@dataclass(frozen=True)
class Localisation:
    """The verdict of a localisation over `nodes`.

    `faulty`: nodes found faulty. `undetermined`: suspects that could not be resolved
    (no healthy node to test them against); empty when the verdict is complete, which
    `conclusive` says. `seconds`: the rounds' wall time; `startup_seconds`: starting the
    agents (torch imports, forks), reported apart because it is not localisation.
    """

    nodes: tuple[str, ...]
    method: str
    faulty: tuple[str, ...]
    suspects_round1: tuple[str, ...]
    rounds: tuple[Round, ...]
    tests: int
    seconds: float
    startup_seconds: float = 0.0
    undetermined: tuple[str, ...] = ()
    notes: tuple[str, ...] = field(default=())

    @property
    def conclusive(self) -> bool:
        return not self.undetermined

    def reason(self) -> str:
        """E.g. "round 1: (n3, n4) failed: timeout after 5 s; round 2: (n3, n0) passed, (n4, n1)
        failed: n4 did not answer (hang) → faulty: n4"."""
        parts = [_round_text(r) for r in self.rounds]
        verdict = f"faulty: {', '.join(self.faulty)}" if self.faulty else "no faulty node"
        if self.undetermined:
            verdict += f"; undetermined: {', '.join(self.undetermined)}"
        notes = "".join(f" ({n})" for n in self.notes)
        return "; ".join(parts) + f" → {verdict}{notes}"

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["conclusive"] = self.conclusive
        out["reason"] = self.reason()
        return out


def _round_text(rnd: Round) -> str:
    bad = [g for g in rnd.groups if g.outcome != "pass"]
    if rnd.name == "round 1" and len(rnd.groups) > 2:
        shown = ", ".join(g.describe() for g in bad) if bad else "all passed"
        text = f"{len(rnd.groups)} groups, {shown}" if bad else f"{len(rnd.groups)} groups, all passed"
    else:
        text = ", ".join(g.describe() for g in rnd.groups)
    return f"{rnd.name}: {text}" + (f" ({rnd.note})" if rnd.note else "")


def _short(names: tuple[str, ...], limit: int = 6) -> str:
    return ", ".join(names) if len(names) <= limit else f"{', '.join(names[:limit])}, …"
