"""Build a simulation from a config, run it, write its outputs.

Outputs in `outputs.dir`: `summary.json`, `jobs.parquet` (per-job records),
`decisions.jsonl` (every decision with its reason), `manifest.json`
(Loom version, git commit, the resolved config, seed, timings) and
`report.html` (plots and tables, see `loom report`). A run removes the files an
earlier run left in the directory that it does not rewrite itself, so the
directory only ever holds one run; `claim_out_dir` is the check a command makes
before replacing a run (`loom simulate` refuses without `--force`).

Jobs of the trace that are not simulated are counted by reason (`Dropped`,
`summary.json` → `dropped`), and so are the jobs rejected on submission
(`rejected_reasons`): no job goes missing silently.
"""

from __future__ import annotations

import atexit
import gc
import inspect
import json
import platform
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import loom
from loom.config import Component, SimConfig, config_to_dict
from loom.core.protocols import PLACERS, POLICIES, SPEED_MODELS
from loom.core.record import RunRecord
from loom.errors import LoomInputError
from loom.hardware.clusters import load_cluster
from loom.registry import Registry
from loom.report.columns import JobTable
from loom.report.decision_log import decision_frame
from loom.report.metrics import job_records, summary
from loom.report.sanity import sanity_warnings
from loom.sim.engine import Simulation, SimulationResult
from loom.workload.job import FinalStatus
from loom.workload.loaders import load_trace
from loom.workload.scaling import scale_load

if TYPE_CHECKING:
    from loom.workload.faults import NodeFailure

# every file a run may write into its directory (`error.txt`: an experiment's failed point)
RUN_FILES = ("summary.json", "jobs.parquet", "decisions.jsonl", "manifest.json", "report.html", "error.txt")
# reasons a trace job is not simulated (beside the trace format's own, e.g. "cpu-only")
DROP_RECORDED_FAILED = "recorded as failed"
DROP_LIMIT = "beyond limit_jobs"


@dataclass(frozen=True)
class Dropped:
    """Jobs of the trace the run does not simulate: the trace's size and reason → count."""

    trace_jobs: int
    reasons: dict[str, int] = field(default_factory=dict)

    @property
    def count(self) -> int:
        return sum(self.reasons.values())

    def as_dict(self) -> dict[str, Any]:
        return {"count": self.count, "reasons": dict(self.reasons)}


@dataclass
class RunOutputs:
    result: SimulationResult
    summary: dict[str, Any]
    out_dir: Path
    files: list[str] = field(default_factory=list)  # the files this run wrote, in writing order
    dropped: Dropped = Dropped(0)


@dataclass(frozen=True)
class PreviousRun:
    """What an earlier run left in a directory: its files (of `RUN_FILES`) and its policy if known."""

    path: Path
    files: list[str]
    policy: str | None

    def describe(self) -> str:
        policy = f"policy {self.policy}: " if self.policy else ""
        return f"{policy}{', '.join(self.files)}"


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
    return prepare(config)[0]


def prepare(config: SimConfig) -> tuple[Simulation, Dropped]:
    """The simulation of `config` and the trace's jobs it leaves out, by reason."""
    topology = load_cluster(config.cluster)
    specs = load_trace(config.trace)
    reasons = Counter(getattr(specs, "skipped", {}))  # rows the trace format skips (CPU-only, never ran)
    trace_jobs = len(specs) + sum(reasons.values())
    if config.limit_jobs and len(specs) > config.limit_jobs:
        reasons[DROP_LIMIT] += len(specs) - config.limit_jobs
        specs = specs[: config.limit_jobs]
    failures: list[NodeFailure] = []
    if config.failures:
        from loom.workload.faults import NodeFailure

        failures = [NodeFailure(f.node, f.at, f.repair_after) for f in config.failures]
    if config.failures_from:
        failures += failures_over(config.failures_from, topology, specs, config.seed).failures
        if config.recorded_failures == "drop":  # they already end at their recorded failure
            kept = [s for s in specs if s.final_status is not FinalStatus.FAILED]
            reasons[DROP_RECORDED_FAILED] += len(specs) - len(kept)
            specs = kept
    if config.load != 1.0 or config.repeat != 1:  # after the drops: they apply to the trace as recorded
        specs = scale_load(specs, config.load, config.repeat)
    dropped = Dropped(trace_jobs, {k: v for k, v in reasons.items() if v})
    return _simulation(config, topology, specs, failures), dropped


def _simulation(config: SimConfig, topology: Any, specs: list[Any], failures: list[NodeFailure]) -> Simulation:
    on_by_failures = {} if (config.failures_from or config.job_failures) else None
    interruptions = recovery = launch = None  # each feature's module is loaded only when the run uses it
    if config.interruptions is not None or on_by_failures is not None:
        from loom.perf.interruptions import InterruptionCosts, InterruptionModel

        interruptions = InterruptionModel(_section(InterruptionCosts, config.interruptions, on_by_failures,
                                                   "interruptions"))
    if config.recovery is not None or on_by_failures is not None:
        from loom.core.recovery import RecoveryConfig

        recovery = _section(RecoveryConfig, config.recovery, on_by_failures, "recovery")
    if (params := launch_params(config)) is not None:
        from loom.sim.launch import LaunchModel

        launch = _section(LaunchModel, params, None, "launch")
    return Simulation(
        topology,
        specs,
        build(POLICIES, config.policy, config.seed, "policy"),
        build(PLACERS, config.placer, config.seed, "placer"),
        build(SPEED_MODELS, config.speed_model, config.seed, "speed_model"),
        round_interval=config.round_interval_s,
        failures=failures,
        log_decisions=config.outputs.decision_log,
        interruptions=interruptions,
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


def run(config: SimConfig, progress_factory: Callable[[Simulation], Callable[[float], None]] | None = None,
        on_stage: Callable[[str], None] | None = None) -> RunOutputs:
    """Simulate `config` and write its outputs; `on_stage(text)` is told when writing starts
    (e.g. "writing report.html…") so a command can say what it waits for.

    The manifest's `timing` has the wall seconds of each phase: `load_s` (cluster, trace,
    `Simulation`), `sim_s` (the event loop), `records_s` (summary, sanity checks and the record
    files), `report_s` (report.html; 0 without it) and `total_s`."""
    started = datetime.now(UTC)
    t0 = time.perf_counter()
    with _long_lived() as settled:
        sim, dropped = prepare(config)
        settled()  # the trace and the simulation live until the run is written
        setup_s = time.perf_counter() - t0
        result = sim.run(progress_factory(sim) if progress_factory else None)
        sim.release()  # what only the loop needed; the result keeps the rest
        del sim
        settled()  # the run's jobs, decisions and record live on
        sim_end = time.perf_counter()
        table = JobTable(result)  # every job's fields, read once for the summary, the checks and the records
        stats = run_summary(config, result, dropped, table)
        stats["setup_wall_s"] = setup_s
        stage = on_stage or (lambda text: None)
        stage("writing outputs…")
        out = Path(config.outputs.dir)
        planned = planned_files(config)
        _make_dir(out)
        _remove_stale(out, planned)
        writes = BackgroundWrites()  # jobs.parquet and decisions.jsonl, written while the run goes on
        try:
            files, frames = _write_records(config, out, result, stats, table, writes)
            del table
            manifest = _manifest(config, result, started, planned)
            if "report.html" not in planned:
                writes.wait()  # nothing left to do meanwhile
            records_end = time.perf_counter()
            timing = {"load_s": setup_s, "sim_s": sim_end - t0 - setup_s, "records_s": records_end - sim_end,
                      "report_s": 0.0}
            manifest["wall_s"] = records_end - t0
            manifest["timing"] = {**timing, "total_s": manifest["wall_s"]}
            _write_manifest(out, manifest)
            files.append("manifest.json")
            if "report.html" in planned:
                from loom.report.html import (
                    write_report,  # matplotlib: imported only when a report is wanted
                )

                stage("writing report.html…")
                write_report(out, data=_report_data(out, frames, manifest))
                del frames
                files.append("report.html")
                writes.wait()
                done = time.perf_counter()
                manifest["timing"] = {**timing, "report_s": done - records_end, "total_s": done - t0}
                _write_manifest(out, manifest)  # again, with the report's time
        finally:
            writes.wait(quiet=True)  # on an error: the files under way are complete before it propagates
    return RunOutputs(result, stats, out, files, dropped)


class BackgroundWrites:
    """Record files written on worker threads while the run goes on (the next frame, the manifest,
    the report): polars writes a frame with the GIL released, so where a core is free the writing
    costs the run next to nothing. `wait` returns once every file is complete."""

    def __init__(self) -> None:
        self._threads: list[threading.Thread] = []
        self._errors: list[BaseException] = []

    def submit(self, write: Callable[..., Any], *args: Any) -> None:
        def work() -> None:
            try:
                write(*args)
            except BaseException as exc:  # noqa: BLE001 - re-raised by `wait` on the run's thread
                self._errors.append(exc)

        thread = threading.Thread(target=work, name="loom-records", daemon=True)
        thread.start()
        self._threads.append(thread)

    def wait(self, quiet: bool = False) -> None:
        """Until every write is done; then the first failure is raised (unless `quiet`)."""
        for thread in self._threads:
            thread.join()
        self._threads.clear()
        if self._errors and not quiet:
            raise self._errors[0]


def _write_manifest(out: Path, manifest: dict[str, Any]) -> None:
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")


@contextmanager
def _long_lived() -> Iterator[Callable[[], None]]:
    """Keep the garbage collector off what a run keeps until it is written. The trace's specs,
    the jobs and the run record are millions of objects that live to the end, and every
    collection that walks them finds nothing (a 100k-job run spent ~0.7 s collecting). The
    collector is off until the first `settled()` (loading a trace makes objects, no garbage);
    each `settled()` freezes what exists at that point (`gc.freeze`: out of the collector's
    generations) and turns the collector back on. Leaving the block unfreezes it all, so what
    the run leaves behind is collected as usual once dropped (and so is anything a caller had
    frozen itself: `gc.unfreeze` has no finer grain)."""
    enabled = gc.isenabled()
    gc.disable()
    gc.freeze()

    def settled() -> None:
        gc.freeze()
        if enabled:
            gc.enable()

    try:
        yield settled
    finally:
        gc.unfreeze()
        if enabled:
            gc.enable()


_EXIT_HOOK: list[bool] = []


def exit_without_collecting(keep: Any = None) -> None:
    """For a command that exits after its run: skip the interpreter's final garbage collection
    (a simulation holds itself in reference cycles; collecting a 100k-job run at exit takes
    0.5–1.4 s). `gc.freeze` at exit makes that collection pass over everything and the OS takes
    the memory back; objects in reference cycles are then not finalised at exit (the run's files
    are closed by then). Registered once per process.

    `keep` (e.g. the run's outputs) is held until exit, in a reference cycle that the freeze
    leaves alone: tearing down a 100k-job result object by object takes ~0.1 s, which a process
    about to end need not spend. Only the last object passed is held."""
    if not _EXIT_HOOK:
        atexit.register(gc.freeze)
        _EXIT_HOOK.append(True)
        _KEPT.append(_KEPT)  # the cycle: the list holds itself
    del _KEPT[1:]
    if keep is not None:
        _KEPT.append(keep)


_KEPT: list[Any] = []


def run_summary(config: SimConfig, result: SimulationResult, dropped: Dropped,
                table: JobTable | None = None) -> dict[str, Any]:
    """`summary.json`: the metrics, the policy's counters, and the jobs dropped or rejected, by reason."""
    table = table if table is not None else JobTable(result)
    stats: dict[str, Any] = summary(result, table)
    stats.update(_policy_stats(result.record))
    if config.policy.name == "quota":  # per-VC fairness of a quota run, from the config's entitlements
        from loom.report.fairness import fairness_index, vc_fairness
        from loom.workload.quotas import quota_entitlements

        ent = quota_entitlements(config.policy.params)
        rows = vc_fairness(result, ent.quotas, default_quota=ent.default_quota, is_best_effort=ent.is_best_effort)
        stats["quota_jain_index"] = fairness_index(rows)
        stats["quota_per_vc"] = rows
    stats["trace_jobs"] = dropped.trace_jobs
    stats["dropped"] = dropped.as_dict()
    stats["rejected_reasons"] = rejected_reasons(result.rejected.values())
    if config.load != 1.0 or config.repeat != 1:
        stats["load_scaling"] = {"load": config.load, "repeat": config.repeat}
    stats["warnings"] = [w.as_dict() for w in sanity_warnings(result, stats, table=table)]
    return stats


def rejected_reasons(reasons: Any) -> dict[str, int]:
    """Rejection reasons grouped by kind (their details, e.g. GPU counts, differ), most frequent first."""
    return dict(Counter(rejection_kind(r) for r in reasons).most_common())


def rejection_kind(reason: str) -> str:
    """'asks for 300 GPUs; the cluster has at most 64 …' → 'larger than the cluster'; else the text before ':'."""
    if reason.startswith("asks for "):
        return "larger than the cluster"
    head = reason.split(":", 1)[0].split(";", 1)[0].strip()
    return "".join("N" if c.isdigit() else c for c in head) or "unknown"


def planned_files(config: SimConfig) -> list[str]:
    """The files a run of `config` writes, in writing order."""
    out = config.outputs
    files = ["summary.json"]
    files += ["jobs.parquet"] if out.job_records else []
    files += ["decisions.jsonl"] if out.decision_log else []
    files += ["manifest.json"]
    files += ["report.html"] if out.report and out.job_records else []
    return files


@dataclass
class WrittenRecords:
    """What `_write_records` wrote, as it holds it: the report of the run is made from these
    instead of reading the files back (the same data: the files are written from them)."""

    summary_text: str
    jobs: Any = None  # polars DataFrame of jobs.parquet (None: not written)
    decisions: Any = None  # polars DataFrame of decisions.jsonl (None: not written)


def _write_records(config: SimConfig, out: Path, result: SimulationResult, stats: dict[str, Any],
                   table: JobTable | None = None, writes: BackgroundWrites | None = None
                   ) -> tuple[list[str], WrittenRecords]:
    """summary.json, jobs.parquet, decisions.jsonl; the frames are written by `writes` when given
    (complete once it has waited), else here."""
    text = json.dumps(stats, indent=2) + "\n"
    (out / "summary.json").write_text(text)
    files, written = ["summary.json"], WrittenRecords(text)
    write = writes.submit if writes is not None else (lambda fn, *args: fn(*args))
    if config.outputs.job_records:
        written.jobs = job_records(result, table)
        write(written.jobs.write_parquet, out / "jobs.parquet")
        files.append("jobs.parquet")
    if config.outputs.decision_log:
        written.decisions = decision_frame(result.decisions, result.topology)
        write(written.decisions.write_ndjson, out / "decisions.jsonl")
        files.append("decisions.jsonl")
    return files, written


def _report_data(out: Path, written: WrittenRecords, manifest: dict[str, Any]) -> Any:
    """The run as `loom.report.data.load_run(out)` would read it back from the files just written."""
    from loom.report.data import RunData

    decisions = written.decisions if written.decisions is not None and written.decisions.height else None
    return RunData(out, json.loads(written.summary_text), json.loads(json.dumps(manifest)), written.jobs, decisions)


def _manifest(config: SimConfig, result: SimulationResult, started: datetime, planned: list[str]) -> dict[str, Any]:
    return {
        "loom_version": loom.version(),
        "git_commit": git_commit(),
        "started_utc": started.isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "machine": platform.platform(),
        "seed": config.seed,
        "config": config_to_dict(config),
        "cluster": {"name": result.topology.name, "nodes": result.topology.num_nodes,
                    "gpus": result.topology.total_gpus},
        "outputs": planned,
    }


# ------------------------------------------------------------------ the output directory
def claim_out_dir(out: Path, *, replace: bool) -> PreviousRun | None:
    """Check that a run can write to `out` before simulating: a file (or a path through one) is
    refused, and so is a directory holding an earlier run unless `replace`. Returns that run
    (None: there was none); `run` removes its files that the new run does not rewrite."""
    out = Path(out)
    blocker = next((p for p in (out, *out.parents) if p.exists() and not p.is_dir()), None)
    if blocker is not None:
        what = "is an existing file" if blocker == out else f"goes through the existing file {blocker}"
        raise LoomInputError(f"the output directory {what}, not a directory; pick another with --out DIR",
                             source=str(out))
    previous = previous_run(out)
    if previous is not None and not replace:
        raise LoomInputError(f"already holds a run ({previous.describe()}); pass --out DIR to keep both "
                             "or --force to replace it", source=str(out))
    return previous


def previous_run(out: Path) -> PreviousRun | None:
    """The run files (of `RUN_FILES`) in `out`, with the policy its manifest names (None: no run there)."""
    files = [name for name in RUN_FILES if (out / name).is_file()] if out.is_dir() else []
    if not files:
        return None
    try:
        policy = json.loads((out / "manifest.json").read_text())["config"]["policy"]["name"]
    except (OSError, ValueError, KeyError, TypeError):
        policy = None
    return PreviousRun(out, files, policy if isinstance(policy, str) else None)


def _make_dir(out: Path) -> None:
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise LoomInputError(f"cannot create the output directory: {exc.strerror or exc}", source=str(out)) from None


def _remove_stale(out: Path, planned: list[str]) -> None:
    """Remove an earlier run's files that this run does not rewrite (e.g. report.html under --no-report)."""
    for name in RUN_FILES:
        if name not in planned and (out / name).is_file():
            (out / name).unlink()


def git_commit() -> str | None:
    repo = Path(loom.__file__).resolve().parents[1]
    try:
        proc = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=5, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout.strip() or None if proc.returncode == 0 else None
