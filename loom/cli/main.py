"""`loom` — simulate, inspect clusters and list plugins.

User mistakes (bad files, unknown names, invalid flags) print one clear line
and exit with status 2; they never show a traceback.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from loom.cli import experiment as experiment_cli
from loom.cli import perf as perf_cli
from loom.cli import place as place_cli
from loom.cli import predict as predict_cli
from loom.cli import report as report_cli
from loom.cli import traces as traces_cli
from loom.cli import workload as workload_cli
from loom.cli.common import use_plan_cache
from loom.cli.errors import err_console, user_errors

app = typer.Typer(help="Loom: an LLM-aware GPU cluster scheduler and simulator.", no_args_is_help=True,
                  pretty_exceptions_enable=False)
clusters_app = typer.Typer(help="List and inspect clusters.", no_args_is_help=True)
app.add_typer(clusters_app, name="clusters")
app.add_typer(traces_cli.app, name="traces")
report_cli.register(app)
perf_cli.register(app)
place_cli.register(app)
workload_cli.register(app)
experiment_cli.register(app)
predict_cli.register(app)
console = Console()


@app.command()
@user_errors
def simulate(
    config: Path = typer.Option(None, "--config", "-c", help="YAML config; flags below override its fields."),
    trace: str = typer.Option(None, help="Trace: a name (philly) or FORMAT:PATH (rfold:FILE)."),
    cluster: str = typer.Option(None, help="Cluster: a name (see `loom clusters list`) or FORMAT:PATH."),
    policy: str = typer.Option(None, help="Scheduling policy (see `loom plugins`)."),
    placer: str = typer.Option(None, help="Placer (see `loom plugins`)."),
    speed_model: str = typer.Option(None, help="Speed model: trace (recorded durations) or estimator "
                                    "(time from model, batch and iterations; for Crius/Arena traces)."),
    seed: int = typer.Option(None, help="Random seed (default 0)."),
    out: Path = typer.Option(None, "--out", "-o", help="Output directory (default runs/latest)."),
    limit: int = typer.Option(None, help="Simulate only the first N jobs of the trace."),
    round_interval: float = typer.Option(None, help="Also run a scheduling round every S seconds."),
    decision_log: bool = typer.Option(None, "--decision-log/--no-decision-log", help="Write decisions.jsonl."),
    report: bool = typer.Option(None, "--report/--no-report", help="Write report.html."),
    failures: str = typer.Option(None, help="Node failures: infinitehbd (the real fault trace), rate:R "
                                 "(per node per day) or a fault-trace JSON; turns on checkpoints and recovery."),
    job_failures: str = typer.Option(None, help="Job-level failures from the Acme taxonomy: acme or acme-log "
                                     "(only into jobs the trace did not record as failed)."),
    checkpoint: str = typer.Option(None, help="Periodic checkpoints: async or sync (prices interruptions)."),
    checkpoint_interval: str = typer.Option(None, help="Checkpoint interval, e.g. 30m, 1h, 900 (seconds)."),
    recovery: str = typer.Option(None, help="Replacement of failed nodes: topology, naive or policy."),
    spares: int = typer.Option(None, help="Hot spare nodes per minipod (only preemptible jobs run there)."),
    launch: str = typer.Option(None, "--launch", metavar="PROFILE", help="Modelled launches: acme (60 s of model "
                               "and data loading per start, Acme Fig. 13; sets launch.profile) or none (instant "
                               "launches, the default; turns the config's launch section off)."),
    plan_cache: Path = typer.Option(None, "--plan-cache", help="SQLite file keeping plan searches' answers "
                                    "across runs (the LOOM_PLAN_CACHE variable does the same)."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar."),
) -> None:
    """Replay a trace on a cluster with a policy and a placer; write metrics to --out."""
    from loom.config import load_config
    from loom.errors import LoomInputError
    from loom.run import run

    use_plan_cache(plan_cache)
    if launch is not None:
        from loom.sim.launch import PROFILES

        if launch not in PROFILES:
            raise LoomInputError(f"unknown launch profile '{launch}' (known: {', '.join(PROFILES)})", field="--launch")

    cfg = load_config(config, {
        "trace": trace, "cluster": cluster, "policy": policy, "placer": placer, "speed_model": speed_model, "seed": seed,
        "outputs.dir": str(out) if out else None, "limit_jobs": limit, "round_interval_s": round_interval,
        "outputs.decision_log": decision_log, "outputs.report": report, "failures_from": failures, "job_failures": job_failures,
        "interruptions.checkpoint_mode": checkpoint,
        "interruptions.checkpoint_interval_s": parse_duration(checkpoint_interval, "--checkpoint-interval"),
        "recovery.replacement": recovery, "recovery.spares_per_minipod": spares,
        **({"launch": "none"} if launch == "none" else {"launch.profile": launch}),
    })
    if quiet:
        outputs = run(cfg)
    else:
        with Progress(TextColumn("[bold]simulating"), BarColumn(), TextColumn("{task.percentage:>3.0f}% of trace span"),
                      TimeElapsedColumn(), console=err_console, transient=True) as bar:
            task = bar.add_task("sim", total=1.0)

            def factory(sim: Any) -> Callable[[float], None]:
                first = sim.jobs[0].spec.submit_time if sim.jobs else 0.0
                span = max(1.0, (sim.jobs[-1].spec.submit_time - first) if sim.jobs else 1.0)
                return lambda now: bar.update(task, completed=min(1.0, (now - first) / span))

            outputs = run(cfg, factory)
    _print_summary(outputs.summary, outputs.out_dir)
    if (note := _rejections(outputs.result)) is not None:
        err_console.print(f"[yellow]{note}[/]")


def _rejections(result: Any) -> str | None:
    """A line naming the most frequent reason jobs were rejected (None: none were), so a run
    whose jobs could not be priced or placed says why without opening jobs.parquet."""
    from collections import Counter

    from loom.core.jobs import JobState

    rejected = [job.reason for job in result.jobs if job.state is JobState.REJECTED]
    if not rejected:
        return None
    kinds = Counter(reason.split(":", 1)[0] for reason in rejected)  # reasons differ in their details
    kind, count = kinds.most_common(1)[0]
    example = next(reason for reason in rejected if reason.split(":", 1)[0] == kind)
    return f"{len(rejected):,} job(s) rejected; {count:,} of them like this one: {example}"


def parse_duration(text: str | None, flag: str) -> float | None:
    """Seconds from '90', '90s', '30m', '2h' or '1d' (None stays None)."""
    from loom.errors import LoomInputError

    if text is None:
        return None
    units = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
    raw = text.strip().lower()
    scale = units.get(raw[-1:], None)
    number = raw[:-1] if scale is not None else raw
    try:
        value = float(number) * (scale or 1.0)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise LoomInputError(f"'{text}' is not a positive duration (e.g. 900, 30m, 2h, 1d)", field=flag)
    return value


def _print_summary(stats: dict[str, Any], out_dir: Path) -> None:
    table = Table(title="summary", show_header=False)
    for key in ("jobs", "finished", "rejected", "unfinished", "avg_jct_s", "p50_jct_s", "p99_jct_s",
                "avg_queue_s", "p99_queue_s", "makespan_s", "gpu_utilization", "preemptions",
                "sim_wall_s", "events_per_s", "decision_ms_median", "decision_ms_p99", "failed", "goodput_fraction",
                "gpu_hours_lost_to_failures", "gpu_hours_checkpointing", "recoveries", "recovery_s_median",
                "avg_setup_s", "launch_failures"):
        if key not in stats or stats[key] is None:
            continue
        value = stats[key]
        table.add_row(key, f"{value:,.3f}" if isinstance(value, float) else f"{value:,}")
    console.print(table)
    written = [p.name for p in sorted(out_dir.iterdir()) if p.is_file()]
    console.print(f"outputs in [bold]{out_dir}[/]: {', '.join(written)}")


@clusters_app.command("list")
@user_errors
def clusters_list() -> None:
    """Named clusters with their size."""
    from loom.hardware.clusters import CLUSTERS, load_cluster

    table = Table("name", "nodes", "GPUs", "GPU types", "description")
    for name in CLUSTERS.names():
        topo = load_cluster(name)
        table.add_row(name, str(topo.num_nodes), str(topo.total_gpus), ", ".join(topo.gpu_types), topo.description)
    console.print(table)


@clusters_app.command("show")
@user_errors
def clusters_show(name: str = typer.Argument(..., help="A cluster name or FORMAT:PATH."),
                  as_json: bool = typer.Option(False, "--json", help="Machine-readable output.")) -> None:
    """Tiers (with bandwidth, latency, oversubscription), switches and GPUs of one cluster."""
    from loom.hardware.clusters import load_cluster
    from loom.hardware.describe import describe

    info = describe(load_cluster(name))
    if as_json:
        console.print_json(json.dumps(info))
        return
    console.print(f"[bold]{info['name']}[/]: {info['nodes']} nodes, {info['gpus']} GPUs — {info['description']}")
    tiers = Table("tier", "switches", "bandwidth Gb/s", "latency µs", "oversubscription", "nodes per switch")
    for tier in info["tiers"]:
        tiers.add_row(tier["name"], str(tier["switches"]), f"{tier['bandwidth_gbps']:g}", f"{tier['latency_us']:g}",
                      f"{tier['oversubscription']:g}:1", tier["nodes_per_switch"])
    console.print(tiers)
    types = Table("GPU type", "nodes", "GPUs")
    for gpu, (nodes, gpus) in info["gpu_types"].items():
        types.add_row(gpu, str(nodes), str(gpus))
    console.print(types)


@app.command()
def plugins() -> None:
    """Registered policies, placers, speed models, trace formats, clusters and cluster formats."""
    from loom.core.protocols import PLACERS, POLICIES, SPEED_MODELS
    from loom.hardware.clusters import CLUSTERS, IMPORTERS
    from loom.workload.loaders import LOADERS

    table = Table("kind", "names", "entry-point group")
    for reg in (POLICIES, PLACERS, SPEED_MODELS, LOADERS, CLUSTERS, IMPORTERS):
        table.add_row(reg.kind, ", ".join(reg.names()), reg.group)
    console.print(table)


if __name__ == "__main__":  # pragma: no cover
    app()
