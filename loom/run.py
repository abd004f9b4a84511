"""Build a simulation from a config, run it, write its outputs.

Outputs in `outputs.dir`: `summary.json`, `jobs.parquet` (per-job records),
`decisions.jsonl` (every decision with its reason), `manifest.json`
(Loom version, git commit, the resolved config, seed, timings) and
`report.html` (plots and tables, see `loom report`).
"""

from __future__ import annotations

import inspect
import json
import platform
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, fields
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import loom
from loom.config import Component, SimConfig, config_to_dict
from loom.core.protocols import PLACERS, POLICIES, SPEED_MODELS
from loom.core.record import RunRecord
from loom.core.recovery import RecoveryConfig
from loom.errors import LoomInputError
from loom.hardware.clusters import load_cluster
from loom.perf.interruptions import InterruptionCosts, InterruptionModel
from loom.registry import Registry
from loom.report.decision_log import write_decision_log
from loom.report.metrics import job_records, summary
from loom.sim.engine import Simulation, SimulationResult
from loom.sim.launch import LaunchModel
from loom.workload.faults import NodeFailure
from loom.workload.job import FinalStatus
from loom.workload.loaders import load_trace


@dataclass
class RunOutputs:
    result: SimulationResult
    summary: dict[str, Any]
    out_dir: Path


def build(registry: Registry[type], component: Component, seed: int, field: str) -> Any:
    """Instantiate a registered component; a `seed` parameter is filled from the config."""
    factory = registry.get(component.name)
    params = dict(component.params)
    accepted = inspect.signature(factory).parameters
    if "seed" in accepted and "seed" not in params:
        params["seed"] = seed
    unknown = [k for k in params if k not in accepted and not any(
        p.kind is inspect.Parameter.VAR_KEYWORD for p in accepted.values())]
    if unknown:
        raise LoomInputError(f"{component.name} does not take parameter(s) {', '.join(unknown)} "
                             f"(takes: {', '.join(accepted) or 'none'})", field=f"{field}.params")
    return factory(**params)


def _policy_stats(record: RunRecord) -> dict[str, Any]:
    """Counters the policy kept (e.g. reservation violations), from the run record, prefixed by its name."""
    return {f"{record.policy_name}_{key}": value for key, value in record.policy_stats.items()}


def build_simulation(config: SimConfig) -> Simulation:
    topology = load_cluster(config.cluster)
    specs = load_trace(config.trace)
    if config.limit_jobs:
        specs = specs[: config.limit_jobs]
    failures = [NodeFailure(f.node, f.at, f.repair_after) for f in config.failures]
    on_by_failures = {} if (config.failures_from or config.job_failures) else None
    interruptions = _section(InterruptionCosts, config.interruptions, on_by_failures, "interruptions")
    recovery = _section(RecoveryConfig, config.recovery, on_by_failures, "recovery")
    launch = _section(LaunchModel, launch_params(config), None, "launch")
    if config.failures_from:
        failures += failures_over(config.failures_from, topology, specs, config.seed).failures
        if config.recorded_failures == "drop":  # they already end at their recorded failure
            specs = [s for s in specs if s.final_status is not FinalStatus.FAILED]
    return Simulation(
        topology,
        specs,
        build(POLICIES, config.policy, config.seed, "policy"),
        build(PLACERS, config.placer, config.seed, "placer"),
        build(SPEED_MODELS, config.speed_model, config.seed, "speed_model"),
        round_interval=config.round_interval_s,
        failures=failures,
        log_decisions=config.outputs.decision_log,
        interruptions=InterruptionModel(interruptions) if interruptions is not None else None,
        recovery=recovery,
        job_failures=job_failure_plans(config.job_failures, specs, config.seed),
        launch=launch,
    )


def launch_params(config: SimConfig) -> dict[str, Any] | None:
    """The `launch:` section with the run's seed unless it names its own (None: instant launches)."""
    if config.launch is None:
        return None
    return {"seed": config.seed, **config.launch}


def job_failure_plans(kind: str | None, specs: list[Any], seed: int) -> Any:
    """Failure plans for the trace's jobs from the Acme taxonomy (None: no injected failures)."""
    if kind is None:
        return None
    from loom.workload.job_failures import AcmeFailureModel, sample_failures

    models = {"acme": AcmeFailureModel, "acme-log": AcmeFailureModel.log_sample}
    if kind not in models:
        raise LoomInputError(f"must be one of {', '.join(models)}, got {kind!r}", field="job_failures")
    return sample_failures(specs, models[kind](), seed)


def _section(kind: type, given: dict[str, Any] | None, default: dict[str, Any] | None, field: str) -> Any:
    """Build a settings dataclass from its config section (None: the feature is off)."""
    params = given if given is not None else default
    if params is None:
        return None
    known = {f.name for f in fields(kind)}
    unknown = sorted(set(params) - known)
    if unknown:
        raise LoomInputError(f"unknown setting(s) {', '.join(unknown)} (known: {', '.join(sorted(known))})",
                             field=field)
    try:
        return kind(**params)
    except LoomInputError as exc:
        name = exc.field or ""
        raise LoomInputError(exc.message, field=name if name.startswith(field) else f"{field}.{name}") from None


def failures_over(source: str, topology: Any, specs: list[Any], seed: int) -> Any:
    """Node failures from `source` over the trace's span (first submission to the last
    submission plus the longest recorded run, or 30 days when runs are not recorded)."""
    from loom.workload.faults import parse_failures

    start = min((s.submit_time for s in specs), default=0.0)
    last = max((s.submit_time for s in specs), default=0.0)
    longest = max((s.duration or 0.0 for s in specs), default=0.0)
    end = last + (longest if longest > 0 else 30 * 86400.0)
    return parse_failures(source, topology, start, max(end, start + 1.0), seed)


def run(config: SimConfig, progress_factory: Callable[[Simulation], Callable[[float], None]] | None = None
        ) -> RunOutputs:
    started = datetime.now(UTC)
    t0 = time.perf_counter()
    sim = build_simulation(config)
    setup_s = time.perf_counter() - t0
    result = sim.run(progress_factory(sim) if progress_factory else None)
    stats = summary(result)
    stats.update(_policy_stats(result.record))
    if config.policy.name == "quota":  # per-VC fairness of a quota run, from the config's entitlements
        from loom.report.fairness import fairness_index, vc_fairness
        from loom.workload.quotas import quota_entitlements

        ent = quota_entitlements(config.policy.params)
        rows = vc_fairness(result, ent.quotas, default_quota=ent.default_quota, is_best_effort=ent.is_best_effort)
        stats["quota_jain_index"] = fairness_index(rows)
        stats["quota_per_vc"] = rows
    stats["setup_wall_s"] = setup_s
    out = Path(config.outputs.dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(stats, indent=2) + "\n")
    if config.outputs.job_records:
        job_records(result).write_parquet(out / "jobs.parquet")
    if config.outputs.decision_log:
        write_decision_log(result.decisions, result.topology, out / "decisions.jsonl")
    manifest = {
        "loom_version": loom.__version__,
        "git_commit": git_commit(),
        "started_utc": started.isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "machine": platform.platform(),
        "seed": config.seed,
        "config": config_to_dict(config),
        "cluster": {"name": result.topology.name, "nodes": result.topology.num_nodes,
                    "gpus": result.topology.total_gpus},
        "wall_s": time.perf_counter() - t0,
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    if config.outputs.report and config.outputs.job_records:
        from loom.report.html import (
            write_report,  # matplotlib: imported only when a report is wanted
        )

        write_report(out)
    return RunOutputs(result, stats, out)


def git_commit() -> str | None:
    repo = Path(loom.__file__).resolve().parents[1]
    try:
        proc = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=5, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout.strip() or None if proc.returncode == 0 else None
