"""One job as the local backend runs it: its files, its command line and environment, and
what its control-channel files say (up? progress? its answer to a request?).

A job's files live under the backend's root and outlive its processes, so a preempted
job resumes from its checkpoint wherever it goes next:

    ROOT/runtime/JOB/          the control channel (`loom.runtime.control`), checkpoints/
    ROOT/work/JOB/             its working directory (`loom run --workdir`; JOB.mK after a migration)
    ROOT/logs/JOB.log          stdout and stderr of every incarnation, appended
    ROOT/runs/JOB.json         the process group and GPUs of the live incarnation (for a restart)
"""

from __future__ import annotations

import itertools
import json
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loom.core.events import Event
from loom.hardware.state import Allocation
from loom.hardware.topology import Topology
from loom.service.backends.procs import Proc, read_json
from loom.workload.job import JobSpec

SLEEPJOB = Path(__file__).with_name("sleepjob.py")


@dataclass
class Run:
    """A job the backend holds GPUs for. `phase`:

    delay    an emulated launch delay runs (nothing spawned)
    queued   waiting for its GPUs (held by processes still stopping)
    spawned  processes started, not yet up (`answer` says how to report it once up)
    up       running
    stopping a stop was asked through the control channel (`stop`: its ticket and kind)
    moving   a migrate/resize was asked through the control channel
    dying    killed (node failure, call-off, hang): `after_exit` is reported once it is gone
    """

    job_id: str
    spec: JobSpec
    launch: Any
    allocation: Allocation
    ticket: int | None
    phase: str
    order: int  # for a stable order of events at one instant
    ready_at: float = 0.0
    answer: str = "start"  # start (JobStarted) or move (JobProgress) once up
    binding: dict[int, tuple[int, ...]] | None = None  # node → the emulated GPUs it holds
    next_binding: dict[int, tuple[int, ...]] | None = None  # a move's GPUs, held before the switch
    proc: Proc | None = None
    stop: tuple[int, str] | None = None  # (ticket, "preempt" | "cancel")
    move: tuple[int, Allocation, str] | None = None  # (ticket, allocation, "migrate" | "resize") under way
    moves: list[tuple[int, Allocation, str]] = field(default_factory=list)  # asked since, in order
    spawned_at: float | None = None  # the clock's time its processes were started (in the run record)
    seq: int | None = None  # control request under way
    sent: float = 0.0  # monotonic time it was sent
    escalated: int = 0
    end: float | None = None  # a sleep job: the clock time it will be done
    incarnation: int = 0  # `loom run`'s incarnation number when a move was asked
    signature: tuple = ()  # status.json (mtime, size): progress seen
    beat: float = 0.0  # monotonic time `signature` last changed
    looked: float = 0.0  # monotonic time the watchdog last looked
    reported: float = float("-inf")  # clock time of the last JobProgress sample
    after_exit: list[Event] = field(default_factory=list)
    rollback: Any = None  # the runtime's last loss-spike rollback already reported (status.json)

    @property
    def sleep(self) -> bool:
        return not getattr(self.launch, "command", None)


@dataclass(frozen=True)
class Layout:
    root: Path

    def job_dir(self, job_id: str) -> Path:
        return self.root / "runtime" / job_id

    def runtime(self) -> Path:
        return self.root / "runtime"

    def workdir(self, job_id: str) -> Path:
        return self.root / "work" / job_id

    def log(self, job_id: str) -> Path:
        return self.root / "logs" / f"{job_id}.log"

    def record(self, job_id: str) -> Path:
        return self.root / "runs" / f"{job_id}.json"


def describe_binding(topology: Topology, binding: dict[int, tuple[int, ...]]) -> str:
    """`node0:0,1;node1:0`: the emulated GPUs a job got, as its processes see them."""
    return ";".join(f"{topology.node_names[n]}:{','.join(map(str, g))}" for n, g in sorted(binding.items()))


def processes(run: Run, gpus: int) -> tuple[int, int]:
    """(processes, logical world) of a `loom run` job on `gpus` GPUs. Its logical world is the GPUs it
    asked for (kept across resizes); on all of them it runs `procs` processes (default: one per GPU),
    on fewer GPUs proportionally fewer (at least one): the runtime time-slices the logical ranks."""
    world = max(1, run.spec.gpus)
    full = max(1, min(world, int(getattr(run.launch, "procs", None) or world)))
    return max(1, min(full, -(-gpus * full // world))), world


def duration(run: Run) -> float:
    """A sleep job's work: the spec's duration, else the one its launch spec states."""
    value = run.spec.duration if run.spec.duration is not None else getattr(run.launch, "duration", None)
    return float(value or 0.0)


def current_workdir(layout: Layout, job_id: str) -> Path:
    """Where the job's files are now: where `loom run` last ran it (a migrate moves them), else
    its first working directory."""
    launcher = read_json(layout.job_dir(job_id) / "launcher.json") or {}
    recorded = launcher.get("workdir")
    return Path(recorded) if isinstance(recorded, str) and Path(recorded).is_dir() else layout.workdir(job_id)


def fresh_workdir(layout: Layout, job_id: str) -> Path:
    """A new, unused working directory for a migration (the runtime copies the files there)."""
    for k in itertools.count(1):
        path = layout.workdir(job_id).with_name(f"{job_id}.m{k}")
        if not path.exists():
            return path
    raise AssertionError("unreachable")


def command(run: Run, layout: Layout, python: str = sys.executable) -> list[str]:
    """What to start: the sleep job, or `loom run` of the job's script on its share of processes."""
    if run.sleep:
        return [python, "-I", "-S", str(SLEEPJOB), "--duration", repr(duration(run))]
    procs, world = processes(run, run.allocation.total)
    script, *args = list(run.launch.command)
    return [python, "-m", "loom.cli.main", "run", "--job-id", run.job_id, "--runtime-dir", str(layout.runtime()),
            "--nproc", str(procs), "--logical-world", str(world),
            "--workdir", str(current_workdir(layout, run.job_id)),
            script, "--", *args]


def environment(run: Run, layout: Layout, topology: Topology, extra: dict[str, str]) -> dict[str, str]:
    """The job's environment: what it got (emulated nodes and GPUs), where its files are."""
    assert run.binding is not None
    env = dict(os.environ)
    env.update(extra)
    env.update({
        "LOOM_JOB_ID": run.job_id,
        "LOOM_RUNTIME_DIR": str(layout.runtime()),
        "LOOM_JOB_DIR": str(layout.job_dir(run.job_id)),
        "LOOM_CONTROL_DIR": str(layout.job_dir(run.job_id) / "control"),
        "LOOM_CHECKPOINT_DIR": str(layout.job_dir(run.job_id) / "checkpoints"),
        "LOOM_RESUME": "auto",
        "LOOM_NODES": ",".join(topology.node_names[n] for n in sorted(run.binding)),
        "LOOM_GPUS": describe_binding(topology, run.binding),
        "LOOM_GPU_COUNT": str(sum(len(g) for g in run.binding.values())),
    })
    extra_env = getattr(run.launch, "env", None) or ()
    pairs = extra_env.items() if isinstance(extra_env, Mapping) else extra_env
    env.update({str(k): str(v) for k, v in pairs})
    if not run.sleep:
        env.pop("LOOM_CHECKPOINT_DIR")  # `loom run` puts checkpoints in the job directory itself
    return env


def status(layout: Layout, job_id: str) -> dict[str, Any]:
    return read_json(layout.job_dir(job_id) / "status.json") or {}


def signature(layout: Layout, job_id: str) -> tuple:
    """Changes whenever the job reports (status.json rewritten): the hang watchdog's pulse."""
    try:
        st = os.stat(layout.job_dir(job_id) / "status.json")
    except OSError:
        return ()
    return (st.st_mtime_ns, st.st_size)


def ack(layout: Layout, job_id: str, seq: int) -> dict[str, Any] | None:
    return read_json(layout.job_dir(job_id) / "control" / "acks" / f"{seq:08d}.json")


def incarnation(layout: Layout, job_id: str) -> int:
    launcher = read_json(layout.job_dir(job_id) / "launcher.json") or {}
    value = launcher.get("incarnation")
    return int(value) if isinstance(value, int) else 0


def work_done(run: Run, layout: Layout, answer: dict[str, Any] | None = None) -> float | None:
    """Work done (reference seconds) by the last durable checkpoint, or as an answer states it:
    exact for a sleep job; for a `loom run` job, its iterations scaled to the spec's duration
    when the spec gives both (else unknown: None)."""
    if answer is not None and isinstance(answer.get("progress"), (int, float)):
        return float(answer["progress"])
    if run.sleep:
        saved = read_json(layout.job_dir(run.job_id) / "checkpoints" / "sleep.json")
        return float(saved["progress"]) if saved and isinstance(saved.get("progress"), (int, float)) else None
    iteration = (answer or {}).get("iteration")
    if iteration is None:
        from loom.runtime.store import latest_complete

        try:
            last = latest_complete(layout.job_dir(run.job_id) / "checkpoints")
        except Exception:  # noqa: BLE001 - no checkpoint to speak of
            last = None
        iteration = getattr(last, "iteration", None) if last is not None else None
    return scale(run, iteration)


def scale(run: Run, iteration: Any) -> float | None:
    spec = run.spec
    if not isinstance(iteration, int) or not spec.duration or not spec.iterations:
        return None
    return float(spec.duration) * min(1.0, iteration / spec.iterations)


def save_record(layout: Layout, run: Run, topology: Topology) -> None:
    """Where the live incarnation runs, for a service restarted while it kept running."""
    path = layout.record(run.job_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {"job_id": run.job_id, "pid": run.proc.pid if run.proc else None, "sleep": run.sleep,
            "started_at": run.spawned_at,
            "gpus": {topology.node_names[n]: list(g) for n, g in (run.binding or {}).items()},
            **(getattr(run.proc, "record_fields", None) or {})}  # e.g. the Slurm job id
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def mark_ended(layout: Layout, job_id: str, exit_code: int) -> None:
    """Keep a run record after the run ended on its own, saying how: until the service has stored
    the end (`LocalBackend.forget_ended`), a restart adopts the record and reports the end again,
    so a job that finished while its end was not yet durable is never launched twice (a restart
    tells a stored end by a transition out of STARTING/RUNNING/STOPPING at or after `started_at`)."""
    path = layout.record(job_id)
    data = read_json(path)
    if not data:
        return
    data["ended"] = {"exit_code": int(exit_code)}
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)
