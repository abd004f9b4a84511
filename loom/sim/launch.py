"""Modelled launches: how long a job takes to come up and how often it fails to.

In a real cluster a start is not instant: the container starts, the image is
pulled, the model checkpoint and the dataset are loaded. Acme (§4, Fig. 13)
measures more than a minute of model loading and data preprocessing before an
evaluation trial does any inference — 29.5% of the trial. The simulator's
backend holds a launching job's GPUs for its class's latency (the job is
STARTING, making no progress), then reports it started — or, with
`failure_probability`, that the launch failed (the core puts the job back at
the head of the queue).

Zero latency and no failures (the default, for trace replays) reproduce the
instant starts of every earlier result exactly.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from dataclasses import dataclass, field

from loom.errors import LoomInputError
from loom.workload.job import JobClass, JobSpec

CLASSES = tuple(c.value for c in JobClass)
# Acme: >1 min of model load and preprocessing before an evaluation trial's inference (Fig. 13);
# the other classes load a checkpoint of the same models, so the same minute is their floor.
PROFILES: dict[str, dict[str, float]] = {
    "none": {},
    "acme": {c: 60.0 for c in CLASSES},
}


@dataclass(frozen=True)
class LaunchModel:
    """Launch latency per job class (seconds; classes not named take `default_s`) and the
    probability that a launch fails. `profile` fills `latency_s` from a named preset.

    Failures are drawn from the model's own random stream, in launch order: give each
    simulation its own model (a model reused by a second run goes on with the stream)."""

    latency_s: Mapping[str, float] = field(default_factory=dict)
    default_s: float = 0.0
    failure_probability: float = 0.0
    profile: str | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.latency_s, Mapping):
            raise LoomInputError(f"must be a mapping of job class to seconds, got {self.latency_s!r}",
                                 field="launch.latency_s")
        if self.profile is not None:
            if not isinstance(self.profile, str) or self.profile not in PROFILES:
                raise LoomInputError(f"must be one of {', '.join(PROFILES)}, got {self.profile!r}",
                                     field="launch.profile")
            object.__setattr__(self, "latency_s", {**PROFILES[self.profile], **dict(self.latency_s)})
        for name, value in self.latency_s.items():
            if name not in CLASSES:
                raise LoomInputError(f"unknown job class {name!r} (known: {', '.join(CLASSES)})",
                                     field=f"launch.latency_s.{name}")
            _check_seconds(value, f"launch.latency_s.{name}")
        _check_seconds(self.default_s, "launch.default_s")
        p = self.failure_probability
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= p < 1.0:
            raise LoomInputError(f"must be a number in [0, 1), got {p!r}", field="launch.failure_probability")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise LoomInputError(f"must be an integer, got {self.seed!r}", field="launch.seed")
        object.__setattr__(self, "_rng", random.Random(self.seed))

    @property
    def instant(self) -> bool:
        return not self.failure_probability and not self.default_s and not any(self.latency_s.values())

    def latency(self, spec: JobSpec) -> float:
        return float(self.latency_s.get(spec.job_class.value, self.default_s))

    def fails(self) -> bool:
        """Draw whether the next launch fails (deterministic for a seed and launch order)."""
        return bool(self.failure_probability) and self._rng.random() < self.failure_probability  # type: ignore[attr-defined]


def _check_seconds(value: object, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise LoomInputError(f"must be a finite number of seconds ≥ 0, got {value!r}", field=name)
