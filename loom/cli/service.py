"""`loom submit | status | cancel | queue | nodes | explain | events | tenant`: the service's API
from the command line (`loom serve` lives in `loom.cli.serve`).

Each command takes `--url` and `--token` (else `$LOOM_URL` / `$LOOM_TOKEN`, else the client config
file, see `loom.service.client`) and `--json` for machine-readable output.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer
import yaml
from rich.table import Table

from loom.cli.common import WideConsole
from loom.cli.errors import user_errors
from loom.errors import LoomInputError

URL = typer.Option(None, "--url", help="The service (default $LOOM_URL, the client config, http://127.0.0.1:8470).")
TOKEN = typer.Option(None, "--token", help="API token (default $LOOM_TOKEN or the client config file).",
                     show_default=False)
JSON = typer.Option(False, "--json", help="Machine-readable output.")
console = WideConsole(highlight=False)


def _client(url: str | None, token: str | None) -> Any:
    from loom.service.client import Client, resolve

    return Client(resolve(url, token))


def _echo_json(data: Any) -> None:
    typer.echo(json.dumps(data, indent=2))


def _where(job: dict[str, Any]) -> str:
    alloc = job.get("allocation")
    return ", ".join(f"{n}:{g}" for n, g in zip(alloc["nodes"], alloc["gpus"])) if alloc else "–"


def _jobs_table(jobs: list[dict[str, Any]], title: str) -> Table:
    table = Table(title=title, title_justify="left")
    for column in ("job", "tenant", "state", "class", "prio", "GPUs", "where"):
        table.add_column(column, justify="right" if column in ("prio", "GPUs") else "left")
    for job in jobs:
        spec = job["spec"]
        state = job["state"].lower() + (" (cancel requested)" if job.get("cancel_requested") and
                                        job["state"] not in ("CANCELLED", "FINISHED", "FAILED") else "")
        table.add_row(job["job_id"], job["tenant"], state, spec.get("job_class", ""), str(spec.get("priority", 0)),
                      str(spec.get("gpus", "")), _where(job))
    return table


SPEC_FILE = typer.Option(None, "--file", "-f", help="A job spec (YAML or JSON, the API's submission fields); "
                         "flags override its fields.")


def submit_cmd(
    command: list[str] = typer.Argument(None, metavar="[-- COMMAND...]", help="The training script and its "
                                        "arguments, run through `loom run` (a script path relative to here is made "
                                        "absolute); omit for a sleep-style job with --duration."),
    spec_file: Path = SPEC_FILE,
    gpus: int = typer.Option(None, "--gpus", help="GPUs (logical data-parallel ranks)."),
    duration: float = typer.Option(None, "--duration", help="Seconds: a sleep-style job's run time, or a real "
                                   "job's expected run time."),
    job_class: str = typer.Option(None, "--class", help="pretrain, sft, eval, debug, other or unknown."),
    priority: int = typer.Option(None, "--priority"),
    gpu_type: str = typer.Option(None, "--gpu-type"),
    procs: int = typer.Option(None, "--procs", help="Processes for `loom run` (≤ --gpus)."),
    job_id: str = typer.Option(None, "--job-id"),
    not_preemptible: bool = typer.Option(False, "--not-preemptible", help="The scheduler may not preempt it."),
    idempotency_key: str = typer.Option(None, "--idempotency-key", help="Retrying with the same key submits once."),
    url: str = URL, token: str = TOKEN, as_json: bool = JSON,
) -> None:
    """Submit a job; prints its id."""
    spec = _spec_file(spec_file) if spec_file else {}
    if command and not Path(command[0]).is_absolute() and Path(command[0]).is_file():
        command = [str(Path(command[0]).resolve()), *command[1:]]  # the service runs jobs elsewhere
    given = {"command": command or None, "gpus": gpus, "duration": duration, "job_class": job_class,
             "priority": priority, "gpu_type": gpu_type, "procs": procs, "job_id": job_id}
    spec.update({k: v for k, v in given.items() if v is not None})
    if not_preemptible:
        spec["preemptible"] = False
    with _client(url, token) as client:
        job = client.submit(spec, idempotency_key=idempotency_key)
    if as_json:
        _echo_json(job)
    else:
        typer.echo(job["job_id"])


def _spec_file(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise LoomInputError(f"cannot read: {exc.strerror or exc}", source=str(path)) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise LoomInputError(f"not valid YAML/JSON: {getattr(exc, 'problem', exc)}", source=str(path),
                             line=mark.line + 1 if mark else None) from None
    if not isinstance(data, dict):
        raise LoomInputError("expected a mapping of submission fields (gpus, command, duration, ...)",
                             source=str(path))
    return data


def status_cmd(job_id: str = typer.Argument(..., metavar="JOB"), url: str = URL, token: str = TOKEN,
               as_json: bool = JSON) -> None:
    """One job: its state, where it runs, its spec."""
    with _client(url, token) as client:
        job = client.status(job_id)
    if as_json:
        _echo_json(job)
        return
    console.print(_jobs_table([job], f"job {job_id}"))


def cancel_cmd(job_id: str = typer.Argument(..., metavar="JOB"), url: str = URL, token: str = TOKEN,
               as_json: bool = JSON) -> None:
    """Cancel a job (the scheduler stops it if it runs)."""
    with _client(url, token) as client:
        job = client.cancel(job_id)
    if as_json:
        _echo_json(job)
    else:
        typer.echo(f"cancel requested for {job_id} (state {job['state'].lower()})")


def queue_cmd(all_jobs: bool = typer.Option(False, "--all", help="Also finished, failed and cancelled jobs."),
              url: str = URL, token: str = TOKEN, as_json: bool = JSON) -> None:
    """Waiting and running jobs (yours; every tenant's with an admin token)."""
    with _client(url, token) as client:
        jobs = client.jobs(all=all_jobs)
    if as_json:
        _echo_json(jobs)
        return
    console.print(_jobs_table(jobs, f"{len(jobs)} job(s)"))


def nodes_cmd(url: str = URL, token: str = TOKEN, as_json: bool = JSON) -> None:
    """The inventory: nodes, their GPUs, state and jobs."""
    with _client(url, token) as client:
        data = client.nodes()
    if as_json:
        _echo_json(data)
        return
    table = Table(title=f"inventory generation {data['generation']}: {len(data['nodes'])} node(s)",
                  title_justify="left")
    for column in ("node", "type", "GPUs", "free", "state", "switch", "jobs"):
        table.add_column(column, justify="right" if column in ("GPUs", "free") else "left")
    for node in data["nodes"]:
        table.add_row(node["name"], node["gpu_type"], str(node["gpus"]), str(node["free"]), node["state"],
                      (node["switches"] or ["–"])[-1], ", ".join(node["jobs"]))
    console.print(table)


def explain_cmd(job_id: str = typer.Argument(..., metavar="JOB"), url: str = URL, token: str = TOKEN,
                as_json: bool = JSON) -> None:
    """Why a job is where it is, or why it waits: its decisions and transitions."""
    with _client(url, token) as client:
        data = client.explain(job_id)
    if as_json:
        _echo_json(data)
        return
    console.print(f"[bold]{job_id}[/]: {data['summary']}")
    table = Table(title="decisions", title_justify="left")
    for column in ("ticket", "decision", "status", "reason"):
        table.add_column(column)
    for d in data["decisions"]:
        status = d["status"] + (f" ({d['answer']})" if d.get("answer") else "")
        table.add_row(str(d["ticket"]), d["kind"], status, d["reason"])
    console.print(table)
    for t in data["transitions"]:
        console.print(f"  {t['at']:.3f}  {t['old'].lower()} → {t['new'].lower()}  ({t['event']})")


def events_cmd(after: int = typer.Option(0, "--after", help="Only events after this sequence number."),
               follow: bool = typer.Option(False, "--follow", "-f", help="Keep the stream open."),
               url: str = URL, token: str = TOKEN, as_json: bool = JSON) -> None:
    """The event stream: submissions, transitions, decisions, answers (server-sent events)."""
    with _client(url, token) as client:
        for event in client.events(after=after, follow=follow):
            if as_json:
                typer.echo(json.dumps(event))
            else:
                data = event.get("data") or {}
                detail = " ".join(f"{k}={v}" for k, v in data.items() if not isinstance(v, (dict, list)))
                typer.echo(f"{event['seq']:>8}  {event['kind']:<16} {event.get('job_id') or '-':<20} {detail}")


def tenant_cmd(name: str = typer.Argument(..., metavar="NAME"),
               admin: bool = typer.Option(False, "--admin", help="An admin tenant (nodes, tenants, policy)."),
               url: str = URL, token: str = TOKEN, as_json: bool = JSON) -> None:
    """Create a tenant and print its token (needs an admin token)."""
    with _client(url, token) as client:
        data = client.create_tenant(name, admin=admin)
    if as_json:
        _echo_json(data)
    else:
        typer.echo(data["token"])


SERVE_HELP = """Run the scheduler service: the REST API (OpenAPI at /docs), the dashboard (/dashboard),
Prometheus metrics (/metrics) and the scheduling loop, on 127.0.0.1 by default.

\b
State lives in the store (SQLite in --data-dir, or --db postgresql://...): a restart adopts jobs
still running and queues the rest again. On a fresh store an admin tenant is made and its token
written to DATA_DIR/admin.token; make tenants with `loom tenant NAME --token $(cat that file)`.
"""


def serve_cmd(
    data_dir: Path = typer.Option(Path("loom-data"), "--data-dir", help="The store (SQLite), job files, admin token."),
    db: str = typer.Option(None, "--db", help="Store URL instead of SQLite in --data-dir (postgresql://user@host:port/db)."),
    backend: str = typer.Option("local", "--backend", help="local (processes through `loom run` on emulated nodes), "
                                "slurm (batch jobs on the Slurm cluster this host's scontrol/sbatch reach; "
                                "LOOM_SLURM_PREFIX prepends a command to them) or sim (nothing runs; jobs take their "
                                "durations)."),
    gpu_type: str = typer.Option(None, "--gpu-type", help="slurm: the GPU type of nodes whose Gres= names none."),
    partition: str = typer.Option(None, "--partition", help="slurm: the partition Loom's jobs are submitted to."),
    inventory: Path = typer.Option(None, "--inventory", help="The local backend's inventory file (nodes, GPUs)."),
    cluster: str = typer.Option(None, "--cluster", help="The sim backend's cluster, as `loom simulate --cluster`."),
    policy: str = typer.Option("fcfs", "--policy", help="Scheduling policy (`loom policies`)."),
    placer: str = typer.Option("best-fit", "--placer", help="Placer (`loom policies`)."),
    round_interval: float = typer.Option(30.0, "--round-interval", help="Seconds between periodic rounds while jobs wait."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on."),
    port: int = typer.Option(8470, "--port"),
    recovery: bool = typer.Option(True, "--recovery/--no-recovery", help="Recover failed jobs: diagnose the log, "
                                  "localise faulty nodes, cordon them, restart from the last checkpoint without them "
                                  "(script and framework errors are not retried). Off: a job's error fails it."),
    spares: int = typer.Option(0, "--spares", min=0, help="Hot spare nodes per minipod, kept for recoveries."),
) -> None:
    from loom.core.protocols import PLACERS, POLICIES
    from loom.service.runner import ServeOptions, serve

    POLICIES.get(policy), PLACERS.get(placer)  # unknown names: a clear error before anything starts
    serve(ServeOptions(data_dir=data_dir, db=db, backend=backend, inventory=inventory, cluster=cluster, policy=policy,
                       placer=placer, round_interval=round_interval, host=host, port=port, recovery=recovery,
                       spares_per_minipod=spares,
                       backend_options={k: v for k, v in (("gpu_type", gpu_type), ("partition", partition))
                                        if v is not None}),
          announce=lambda text: typer.echo(text, err=True))


def register(app: typer.Typer) -> None:
    app.command("serve", help=SERVE_HELP, rich_help_panel="Service")(user_errors(serve_cmd))
    for name, fn in (("submit", submit_cmd), ("status", status_cmd), ("cancel", cancel_cmd), ("queue", queue_cmd),
                     ("nodes", nodes_cmd), ("explain", explain_cmd), ("events", events_cmd),
                     ("tenant", tenant_cmd)):
        app.command(name, rich_help_panel="Service")(user_errors(fn))
