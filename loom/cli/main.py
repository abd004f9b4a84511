"""`loom` — simulate, inspect clusters and list plugins.

User mistakes (bad files, unknown names, invalid flags) print one clear line
and exit with status 2; they never show a traceback.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.table import Table

from loom.cli import diagnose as diagnose_cli
from loom.cli import experiment as experiment_cli
from loom.cli import localize as localize_cli
from loom.cli import perf as perf_cli
from loom.cli import place as place_cli
from loom.cli import predict as predict_cli
from loom.cli import report as report_cli
from loom.cli import run as run_cli
from loom.cli import service as service_cli
from loom.cli import traces as traces_cli
from loom.cli import workload as workload_cli
from loom.cli.common import WideConsole, use_plan_cache
from loom.cli.errors import err_console, user_errors
from loom.errors import LoomInputError

if TYPE_CHECKING:
    from loom.config import SimConfig

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
run_cli.register(app)
service_cli.register(app)
diagnose_cli.register(app)
localize_cli.register(app)
console = WideConsole()


def _version(value: bool) -> None:
    if value:
        import loom

        typer.echo(f"loom {loom.version()}")
        raise typer.Exit()


@app.callback()
def main(version: bool = typer.Option(None, "--version", callback=_version, is_eager=True,
                                      help="Print Loom's version and exit.")) -> None:
    """Loom: an LLM-aware GPU cluster scheduler and simulator."""


RECORDED_FAILURES = ("drop", "keep")  # the values of the config's `recorded_failures` (tests check they agree)


@app.command()
@user_errors
def simulate(
    config: Path = typer.Option(None, "--config", "-c", help="YAML config; flags below override its fields."),
    trace: str = typer.Option(None, help="Trace: a name (philly, see `loom traces list`), FORMAT:PATH "
                              "(rfold:FILE) or a trace file (its format recognised from its header)."),
    cluster: str = typer.Option(None, help="Cluster: a name (see `loom clusters list`) or FORMAT:PATH."),
    policy: str = typer.Option(None, help="Scheduling policy (see `loom plugins`)."),
    placer: str = typer.Option(None, help="Placer (see `loom plugins`)."),
    speed_model: str = typer.Option(None, help="Speed model: trace (recorded durations) or estimator "
                                    "(time from model, batch and iterations; for Crius/Arena traces)."),
    seed: int = typer.Option(None, help="Random seed (default 0)."),
    out: Path = typer.Option(None, "--out", "-o", help="Output directory (default runs/latest)."),
    force: bool = typer.Option(False, "--force", "-f", help="Replace a run already in the output directory "
                               "(its files this run does not write are removed). Without it such a directory "
                               "is refused, except the default runs/latest: a scratch directory, always replaced."),
    limit: int = typer.Option(None, help="Simulate only the first N jobs of the trace."),
    load: float = typer.Option(None, "--load", metavar="X", help="Compress arrivals X times (2 = twice the "
                               "arrival rate; sizes and durations unchanged) so a light trace loads its cluster."),
    repeat: int = typer.Option(None, "--repeat", metavar="N", help="Replay the (scaled) trace N times back to "
                               "back (job ids get #2, #3, …)."),
    round_interval: float = typer.Option(None, help="Also run a scheduling round every S seconds."),
    decision_log: bool = typer.Option(None, "--decision-log/--no-decision-log", help="Write decisions.jsonl."),
    report: bool = typer.Option(None, "--report/--no-report", help="Write report.html."),
    failures: str = typer.Option(None, help="Node failures: infinitehbd (the real fault trace), rate:R "
                                 "(per node per day) or a fault-trace JSON; turns on checkpoints and recovery."),
    recorded_failures: str = typer.Option(
        None, "--recorded-failures", metavar="|".join(RECORDED_FAILURES).upper(),
        help="With --failures, the trace's jobs recorded as failed: drop (the default: they already end at "
             "their recorded failure, which the injected failures would count twice) or keep (replay them)."),
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
    as_json: bool = typer.Option(False, "--json", help="Print the summary (the dict in summary.json) as JSON on "
                                 "stdout and nothing else there; progress and notes go to stderr."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar."),
) -> None:
    """Replay a trace on a cluster with a policy and a placer; write metrics to --out."""
    from loom.config import load_config

    use_plan_cache(plan_cache)
    _check_launch(launch)
    cfg = load_config(config, {
        "trace": trace, "cluster": cluster, "policy": policy, "placer": placer, "speed_model": speed_model, "seed": seed,
        "outputs.dir": str(out) if out else None, "limit_jobs": limit, "load": load, "repeat": repeat,
        "round_interval_s": round_interval,
        "outputs.decision_log": decision_log, "outputs.report": report, "failures_from": failures,
        "recorded_failures": recorded_failures, "job_failures": job_failures,
        "interruptions.checkpoint_mode": checkpoint,
        "interruptions.checkpoint_interval_s": parse_duration(checkpoint_interval, "--checkpoint-interval"),
        "recovery.replacement": recovery, "recovery.spares_per_minipod": spares,
        **({"launch": "none"} if launch == "none" else {"launch.profile": launch}),
    })
    if recorded_failures is not None and cfg.failures_from is None:
        raise LoomInputError("only applies with --failures (failures_from); without injected node failures "
                             "the trace's failed jobs are replayed as recorded", field="--recorded-failures")
    _claim_out_dir(cfg, force)
    try:
        _run_and_show(cfg, as_json=as_json, quiet=quiet)
    except LoomInputError as exc:  # a config field the run found wrong: point at its line in the file
        from loom.config import locate_in_config

        raise locate_in_config(exc, config) from None


def _check_launch(launch: str | None) -> None:
    if launch is not None:
        from loom.sim.launch import PROFILES

        if launch not in PROFILES:
            raise LoomInputError(f"unknown launch profile '{launch}' (known: {', '.join(PROFILES)})", field="--launch")


def _claim_out_dir(cfg: SimConfig, force: bool) -> None:
    """Refuse an output directory holding a run, unless --force or it is the default scratch directory."""
    from loom.run import claim_out_dir

    out = Path(cfg.outputs.dir)
    scratch = "dir" not in cfg.outputs.model_fields_set  # neither --out nor the config chose it
    previous = claim_out_dir(out, replace=force or scratch)
    if previous is not None and scratch and not force:
        err_console.print(f"replacing the run in {out} ({previous.describe()}): the default scratch "
                          "directory; --out DIR keeps a run", style="dim", highlight=False, soft_wrap=True)


def _run_and_show(cfg: SimConfig, *, as_json: bool, quiet: bool) -> None:
    from loom.cli.run_view import RunDisplay, dropped_line, rejections_line, summary_table
    from loom.run import exit_without_collecting, run

    with RunDisplay(err_console, enabled=not quiet) as display:
        outputs = run(cfg, display.factory, display.stage)
    exit_without_collecting(keep=outputs)  # the process ends after this run: no teardown of it
    if (note := dropped_line(outputs.dropped, cfg.limit_jobs)) is not None:
        err_console.print(note, style="yellow", highlight=False, soft_wrap=True)
    where = f"outputs in [bold]{outputs.out_dir}[/]: {', '.join(outputs.files)}"
    if as_json:
        sys.stdout.write(json.dumps(outputs.summary, indent=2) + "\n")
        err_console.print(where, highlight=False, soft_wrap=True)
    else:
        console.print(summary_table(outputs.summary))
        console.print(where, highlight=False, soft_wrap=True)
    if (note := rejections_line(outputs.result)) is not None:
        err_console.print(note, style="yellow", highlight=False, soft_wrap=True)
    for warning in outputs.summary.get("warnings", []):
        err_console.print(f"warning: {warning['message']}", style="yellow", highlight=False, soft_wrap=True)


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
