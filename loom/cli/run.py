"""`loom run` (start and supervise a training job) and `loom control` (ask a running job to act)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import typer

from loom.cli.errors import err_console, user_errors
from loom.errors import LoomInputError, did_you_mean

RUN_HELP = """Run SCRIPT on M processes (torch.distributed's elastic launcher, c10d rendezvous on
127.0.0.1) with N logical data-parallel ranks, and supervise it: a job stopped by a `migrate`
request restarts in the new working directory (its files copied there), one stopped by `resize`
restarts at the new process count; both resume from the latest checkpoint. Arguments after
SCRIPT (or after `--`) go to the script. Exit code: the job's own; 0 when it finished or stopped.

\b
Environment of each process, besides torchrun's RANK, WORLD_SIZE, ...:
  LOOM_JOB_ID, LOOM_RUNTIME_DIR, LOOM_LOGICAL_WORLD (N), LOOM_WORKDIR,
  LOOM_CHECKPOINT_DIR, LOOM_CHECKPOINT_INTERVAL, LOOM_CHECKPOINT_MODE,
  LOOM_RESUME (latest, a path or empty), LOOM_INCARNATION (0, 1, ...),
  LOOM_DETERMINISTIC=1 with --deterministic, LOOM_SPIKE* with --spike

\b
Control channel: files in the job directory RUNTIME_DIR/JOB_ID/
  control/requests/SEQ.json  a request, SEQ = 8 digits (00000001.json):
      {"seq", "action", "args", "time"}, written atomically by the
      scheduler (`loom control`, loom.runtime.control.ControlClient)
  actions:
      checkpoint  consistent checkpoint at the distributed barrier
      stop        checkpoint, stop: state "stopped", exit code 0
      migrate     checkpoint, stop, restart in args {"workdir": DIR}
                  (default JOB_DIR/workdirs/K) with the job's files,
                  optionally with args {"processes": M}
      resize      checkpoint, stop, restart with args {"processes": M}
                  (M <= N; the job keeps its N logical ranks)
  control/acks/SEQ.json  the answer, written by the job's rank 0:
      {"seq", "status": "done"|"failed", "reason", "checkpoint",
      "iteration"}; requests left when the job ends: failed
  status.json  {"job_id", "state", "iteration", "logical_world",
      "processes", "iterations_per_s", "samples_per_s", "loss",
      "last_checkpoint", "updated"}; state: starting, running,
      checkpointing, stopping, stopped, finished or failed
  events.jsonl   one JSON object per line (launch, exit, restart, ...)
  launcher.json  where the job runs: pid, incarnation, workdir, M
  workdir.json   its working directory's files, what it last wrote
  checkpoints/   checkpoints, unless --checkpoint-dir says otherwise
"""


@user_errors
def run(
    script: Path = typer.Argument(..., metavar="SCRIPT", help="The training script (a Python file calling loom.runtime.wrap)."),
    script_args: list[str] = typer.Argument(None, metavar="SCRIPT_ARGS", help="Arguments for the script (after SCRIPT or `--`)."),
    job_id: str = typer.Option("", "--job-id", help="Job id: its directory under --runtime-dir (default: "
                               "SCRIPT's name, the time and a number)."),
    runtime_dir: Path = typer.Option(None, "--runtime-dir", help="Root of the job directories (default "
                                     "$LOOM_RUNTIME_DIR, else ~/.local/state/loom/runtime)."),
    nproc: int = typer.Option(1, "--nproc", metavar="M", help="Processes (one per GPU on a GPU node)."),
    logical_world: int = typer.Option(None, "--logical-world", metavar="N", help="Logical data-parallel ranks, "
                                      "N >= M, kept across resizes (default M); a process time-slices "
                                      "N/M of them."),
    workdir: Path = typer.Option(None, "--workdir", help="The job's working directory (default: the current "
                                 "one); its files travel with the job on migration."),
    checkpoint_dir: Path = typer.Option(None, "--checkpoint-dir", help="Checkpoints (default "
                                        "RUNTIME_DIR/JOB_ID/checkpoints)."),
    checkpoint_interval: int = typer.Option(None, "--checkpoint-interval", metavar="ITERS",
                                            help="Checkpoint every ITERS iterations (0: only when asked; default "
                                                 "$LOOM_CHECKPOINT_INTERVAL, else 0)."),
    checkpoint_mode: str = typer.Option("sync", "--checkpoint-mode", metavar="sync|async",
                                        help="async: the loop stalls only to stage; files persist in the "
                                             "background."),
    resume: str = typer.Option("", "--resume", metavar="latest|none|PATH", help="latest: resume from the "
                               "job's newest durable checkpoint (there must be one); none: start afresh; PATH: "
                               "from that checkpoint. Default: the newest checkpoint if there is one."),
    deterministic: bool = typer.Option(False, "--deterministic", help="Reduce the logical ranks' gradients "
                                       "one by one in rank order: losses bit-identical at any process count "
                                       "(M <= N), at the cost of N gradients' memory and an all-gather."),
    spike: str = typer.Option("", "--spike", metavar="on|off|KEY=VALUE,...", help="Loss-spike rollback (off by "
                              "default): on, off, or settings z, window, min-history, rel, abs, skip, max-rollbacks, "
                              "period, which turn it on (e.g. z=8,skip=10; docs/RUNTIME.md)."),
) -> None:
    from loom.runtime.launch import LaunchSpec, Supervisor, default_runtime_dir, validated

    if checkpoint_interval is None:
        checkpoint_interval = _interval_from_env()
    spec = validated(LaunchSpec(
        script=script, script_args=tuple(script_args or ()), job_id=job_id,
        runtime_dir=runtime_dir or default_runtime_dir(), nproc=nproc, logical_world=logical_world,
        workdir=workdir or Path.cwd(), checkpoint_dir=checkpoint_dir, checkpoint_interval=checkpoint_interval,
        checkpoint_mode=checkpoint_mode, resume=resume, deterministic=deterministic, spike=spike))
    mode = ", deterministic" if spec.deterministic else ""
    print(f"loom run: job {spec.job_id} ({_count(spec.nproc, 'process')}, {_count(spec.world, 'logical rank')}"
          f"{mode}), "
          f"control channel {spec.job_dir}", file=sys.stderr, flush=True)
    raise typer.Exit(Supervisor(spec).run())


def _interval_from_env() -> int:
    """`LOOM_CHECKPOINT_INTERVAL` (a service passes a job's interval this way), else 0."""
    import os

    raw = os.environ.get("LOOM_CHECKPOINT_INTERVAL", "").strip()
    if not raw:
        return 0
    if not raw.isdigit():
        raise LoomInputError(f"must be a whole number of iterations ≥ 0, got {raw!r}", field="LOOM_CHECKPOINT_INTERVAL")
    return int(raw)


run.__doc__ = RUN_HELP

CONTROL_ACTIONS = ("checkpoint", "stop", "migrate", "resize", "status")


@user_errors
def control(
    action: str = typer.Argument(..., metavar="ACTION", help="checkpoint, stop, migrate, resize or status."),
    job_id: str = typer.Argument(..., help="The job (its --job-id)."),
    runtime_dir: Path = typer.Option(None, "--runtime-dir", help="Root of the job directories (default "
                                     "$LOOM_RUNTIME_DIR, else ~/.local/state/loom/runtime)."),
    processes: int = typer.Option(None, "--processes", metavar="M", help="resize (or migrate): new process count."),
    workdir: Path = typer.Option(None, "--workdir", help="migrate: the new working directory."),
    wait: bool = typer.Option(True, "--wait/--no-wait", help="Wait for the job's acknowledgement."),
    timeout: float = typer.Option(300.0, "--timeout", metavar="S", help="Seconds to wait for it."),
) -> None:
    """Ask a job started by `loom run` to checkpoint, stop, migrate or resize, or print its status (JSON)."""
    from loom.runtime.launch import default_runtime_dir

    root = runtime_dir or default_runtime_dir()
    _check_job(root, job_id)
    if action not in CONTROL_ACTIONS:
        raise LoomInputError(f"unknown action '{action}'{did_you_mean(action, CONTROL_ACTIONS)} "
                             f"(known: {', '.join(CONTROL_ACTIONS)})", field="ACTION")
    args = _request_args(root / job_id, action, processes, workdir)
    from loom.runtime.control import ControlClient

    client = ControlClient(root, job_id)
    if action == "status":
        _print(client.status())
        return
    seq = client.request(action, **args)
    if not wait:
        _print({"seq": seq, "action": action, "args": args})
        return
    from loom.runtime.errors import RequestFailed

    try:
        _print(client.wait_ack(seq, timeout_s=timeout))
    except RequestFailed as exc:  # the job answered: show its answer, then why, and exit 1
        _print(exc.ack)
        err_console.print(f"[bold red]error:[/] {exc}", highlight=False, soft_wrap=True)
        raise typer.Exit(1) from None


def _check_job(root: Path, job_id: str) -> None:
    if (root / job_id).is_dir():
        return
    known = sorted(p.name for p in root.iterdir() if p.is_dir()) if root.is_dir() else []
    hint = did_you_mean(job_id, known) or (f" (known: {', '.join(known[:8])})" if known else "")
    raise LoomInputError(f"unknown job '{job_id}': no directory {root / job_id}{hint}", field="JOB_ID")


def _request_args(job_dir: Path, action: str, processes: int | None, workdir: Path | None) -> dict[str, Any]:
    """The request's args, checked here so a bad resize never stops the job."""
    from loom.runtime.launch import check_processes

    if processes is not None and action not in ("resize", "migrate"):
        raise LoomInputError(f"only resize and migrate take a process count, not {action}", field="--processes")
    if workdir is not None and action != "migrate":
        raise LoomInputError(f"only migrate takes a working directory, not {action}", field="--workdir")
    if action == "resize" and processes is None:
        raise LoomInputError("resize needs --processes M", field="--processes")
    args: dict[str, Any] = {}
    if processes is not None:
        world = _logical_world(job_dir)
        check_processes(processes, world if world is not None else processes, "--processes")
        args["processes"] = processes
    if workdir is not None:
        args["workdir"] = str(workdir.expanduser().resolve())
    return args


def _logical_world(job_dir: Path) -> int | None:
    for name in ("status.json", "launcher.json"):
        try:
            value = json.loads((job_dir / name).read_text()).get("logical_world")
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(value, int):
            return value
    return None


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "es" if noun.endswith("s") else "s")


def _print(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=1, sort_keys=True, default=str) + "\n")


def register(app: typer.Typer) -> None:
    settings = {"allow_interspersed_args": False}  # everything after SCRIPT belongs to the script, as in torchrun
    app.command("run", context_settings=settings, help=RUN_HELP,
                short_help="Run a training script under torchrun and supervise it (control channel).")(run)
    app.command("control")(control)
