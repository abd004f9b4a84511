"""What a run's files do not hold but its config fixes: the job specs it simulated and the node
failures it injected, rebuilt from `manifest.json` for the report.

The run directory records every decision and job, but not the inputs behind them: a job's
priority (which sets its SLA tier) and the node failures (a failure stops jobs without any
decision). Both are deterministic given the config and seed, so they are rebuilt here the way
`loom.run.prepare` builds them — trace, `limit_jobs`, failures over that trace, recorded failures
dropped, load scaling. When the trace or cluster cannot be read any more (the run was copied to
another machine), the answer is None and the report says what it could not show.
"""

from __future__ import annotations

from typing import Any

from loom.errors import LoomInputError
from loom.report.data import RunData, run_topology
from loom.workload.job import FinalStatus, JobSpec


def config(run: RunData) -> dict[str, Any]:
    return run.manifest.get("config") or {}


def policy_name(run: RunData) -> str:
    policy = config(run).get("policy")
    return str(policy.get("name", "")) if isinstance(policy, dict) else str(policy or "")


def policy_params(run: RunData) -> dict[str, Any]:
    policy = config(run).get("policy")
    return dict(policy.get("params") or {}) if isinstance(policy, dict) else {}


def has_injected_failures(run: RunData) -> bool:
    """True when the config injects node or job failures."""
    cfg = config(run)
    return bool(cfg.get("failures") or cfg.get("failures_from") or cfg.get("job_failures"))


def _trace_specs(run: RunData) -> list[JobSpec] | None:
    """The trace's jobs after `limit_jobs` (what node failures are generated over); cached."""
    if "trace_specs" not in run.cache:
        from loom.workload.loaders import load_trace

        cfg = config(run)
        try:
            specs = list(load_trace(cfg["trace"]))
        except (KeyError, LoomInputError, OSError):
            specs = None
        limit = cfg.get("limit_jobs")
        if specs is not None and limit and len(specs) > limit:
            specs = specs[:limit]
        run.cache["trace_specs"] = specs
    return run.cache["trace_specs"]


def simulated_specs(run: RunData) -> dict[str, JobSpec] | None:
    """Job id → the spec the run simulated (recorded failures dropped, load scaling applied)."""
    specs = _trace_specs(run)
    if specs is None:
        return None
    from loom.workload.scaling import scale_load

    cfg = config(run)
    if cfg.get("failures_from") and cfg.get("recorded_failures", "drop") == "drop":
        specs = [s for s in specs if s.final_status is not FinalStatus.FAILED]
    load, repeat = float(cfg.get("load", 1.0) or 1.0), int(cfg.get("repeat", 1) or 1)
    if load != 1.0 or repeat != 1:
        specs = scale_load(specs, load, repeat)
    return {s.job_id: s for s in specs}


def node_failures(run: RunData) -> list[tuple[str, float, float]] | None:
    """(node, failed at, repair after s; inf = never back) of every failure the config injects;
    [] when it injects none, None when they cannot be rebuilt. Injected *job* failures of the
    infrastructure kind also take a node down; they depend on the run's progress and are not here."""
    if "node_failures" in run.cache:
        return run.cache["node_failures"]
    cfg = config(run)
    out: list[tuple[str, float, float]] | None = [
        (str(f["node"]), float(f["at"]), float(f.get("repair_after", float("inf")) or float("inf")))
        for f in cfg.get("failures") or []]
    if cfg.get("failures_from"):
        out = _generated_failures(run, cfg, out)
    run.cache["node_failures"] = out
    return out


def _generated_failures(run: RunData, cfg: dict[str, Any],
                        given: list[tuple[str, float, float]]) -> list[tuple[str, float, float]] | None:
    from loom.run import failures_over

    topology, specs = run_topology(run), _trace_specs(run)
    if topology is None or specs is None:
        return None
    try:
        faults = failures_over(cfg["failures_from"], topology, specs, int(cfg.get("seed", 0) or 0))
    except (LoomInputError, OSError):
        return None
    return given + [(f.node, float(f.at), float(f.repair_after)) for f in faults.failures]
