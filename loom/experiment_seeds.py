"""Seeds in an experiment: mean ± 95% confidence interval over the seeds of each grid point,
or, honestly, that the seed changed nothing.

The seed of a run (`SimConfig.seed`) reaches only what draws on it: seeded components
(a policy, placer or speed model whose constructor takes `seed`, e.g. random-fit
placement), node failures (`failures_from`), injected job failures (`job_failures`) and
launch failures (`launch.failure_probability`). `seed_uses` lists those of a config;
`seed_groups` groups the runs that differ only in their seed and checks their results
(wall-clock timings aside) for being identical, so a grid of seeds over a deterministic
configuration is reported once, not as identical rows.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from loom.config import SimConfig
from loom.experiment import Experiment, RunResult, grid_columns

SEED_KEY = "seed"
NO_SEED_EFFECT = ("seed has no effect in this configuration (no failures, no generated workload, "
                  "deterministic placement)")
SEED_METRICS = ("avg_jct_s", "p50_jct_s", "p99_jct_s", "avg_queue_s", "makespan_s", "gpu_utilization",
                "finished", "failed")
_WALL_CLOCK = re.compile(r"wall|_ms_|per_s$")  # timings of the machine, not results of the simulation


@dataclass
class SeedGroup:
    """The runs that differ only in their seed: per metric the mean and the 95% CI half-width
    (t-distribution; None when the results are identical or only one run succeeded)."""

    values: dict[str, Any]  # the grid values other than the seed
    seeds: list[Any]  # of the successful runs
    uses: list[str]  # what in these runs draws on the seed (empty: nothing)
    identical: bool  # whether the successful runs gave the same results
    stats: dict[str, tuple[float, float | None]]

    @property
    def effect(self) -> str:
        """'varies'; 'none' (nothing draws on the seed); 'identical' (something does, results
        equal anyway); 'single' (fewer than two successful runs)."""
        if len(self.seeds) < 2:
            return "single"
        return "varies" if not self.identical else ("identical" if self.uses else "none")


def seed_uses(config: SimConfig) -> list[str]:
    """What in a run draws on its `seed`: seeded components (e.g. random-fit placement),
    node failures, injected job failures, launch failures. Empty: the seed changes nothing."""
    import inspect

    from loom.core.protocols import PLACERS, POLICIES, SPEED_MODELS

    uses = [f"{fld} {comp.name}" for fld, registry in (("policy", POLICIES), ("placer", PLACERS),
                                                        ("speed_model", SPEED_MODELS))
            if "seed" in inspect.signature(registry.get((comp := getattr(config, fld)).name)).parameters
            and "seed" not in comp.params]
    if config.failures_from and config.failures_from.lower() != "none":
        uses.append(f"node failures ({config.failures_from})")
    if config.job_failures:
        uses.append(f"job failures ({config.job_failures})")
    if config.launch and config.launch.get("failure_probability") and "seed" not in config.launch:
        uses.append("launch failures")
    return uses


def mean_ci(values: list[float], level: float = 0.95) -> tuple[float, float | None]:
    """Mean and the half-width of its `level` confidence interval (Student's t; None for n < 2)."""
    from scipy.stats import t

    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return mean, None
    sd = (sum((v - mean) ** 2 for v in values) / (n - 1)) ** 0.5
    return mean, float(t.ppf((1 + level) / 2, n - 1)) * sd / n**0.5


def seed_groups(experiment: Experiment, results: list[RunResult]) -> list[SeedGroup]:
    """One group per combination of the other grid values, when the grid varies the seed
    (≥ 2 values); [] otherwise. Only successful runs count."""
    axis = next((a for a in experiment.axes if a.key == SEED_KEY), None)
    if axis is None or len(axis.values) < 2:
        return []
    configs = {p.name: p.config for p in experiment.points}
    groups: dict[str, list[RunResult]] = {}
    for r in results:
        groups.setdefault(json.dumps({k: v for k, v in r.values.items() if k != SEED_KEY}, default=str), []).append(r)
    return [_seed_group(runs, configs) for runs in groups.values()]


def _seed_group(runs: list[RunResult], configs: dict[str, SimConfig | None]) -> SeedGroup:
    ok = [r for r in runs if r.ok]
    config = next((configs[r.name] for r in runs if configs.get(r.name) is not None), None)
    results = {json.dumps({k: v for k, v in r.summary.items() if not _WALL_CLOCK.search(k)}, default=str)
               for r in ok}
    identical = len(results) <= 1
    stats = {m: mean_ci([float(r.summary[m]) for r in (ok[:1] if identical else ok)]) for m in SEED_METRICS
             if ok and all(isinstance(r.summary.get(m), (int, float)) for r in ok)}
    return SeedGroup({k: v for k, v in runs[0].values.items() if k != SEED_KEY}, [r.values[SEED_KEY] for r in ok],
                     seed_uses(config) if config is not None else [], identical, stats)


def seed_rows(groups: list[SeedGroup]) -> list[dict[str, Any]]:
    """`summary_seeds.csv`: per group its grid values, n, the seed's effect, and per metric
    the mean and 95% CI half-width."""
    rows = []
    for g in groups:
        row: dict[str, Any] = {**grid_columns(g.values), "n": len(g.seeds), "seed_effect": g.effect,
                               "seed_uses": "; ".join(g.uses)}
        for m, (mean, half) in g.stats.items():
            row[f"{m}_mean"], row[f"{m}_ci95"] = mean, half
        rows.append(row)
    return rows
