"""`loom run`: start a training script under torch.distributed's elastic launcher and supervise it.

The launcher never builds a process group itself: each *incarnation* of a job is
one run of torch's own elastic agent (`torch.distributed.run`, i.e. torchrun) in
a child process (`python -m loom.runtime.launch`), single node, c10d rendezvous
on 127.0.0.1 and a free port, no automatic restarts. The child process keeps
the supervisor free of torch (bad input fails fast) and gives each incarnation
its own environment and working directory.

The supervisor restarts the job when the runtime inside it stopped it for a
`migrate` or `resize` request (a `done` ack from this incarnation): after a
migrate it copies the working directory's files into the new one
(`loom.runtime.workdir`), after a resize it changes the process count; either
way the next incarnation gets `LOOM_RESUME=latest` and the same logical world.
A restart that cannot be carried out leaves the job stopped at its durable
checkpoint and ends `loom run` with one error line saying how to resume it.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TextIO

from loom.errors import LoomInputError
from loom.runtime import workdir as wd
from loom.runtime.config import SPIKE_KEYS, spike_env, spike_rule
from loom.runtime.errors import RuntimeConfigError

CHECKPOINT_MODES = ("sync", "async")
ACTIONS = ("checkpoint", "stop", "migrate", "resize")
RESTARTS = ("migrate", "resize")  # actions after which the launcher starts the job again
RUNTIME_ENV = "LOOM_RUNTIME_DIR"
# "" and "auto": the newest checkpoint if there is one; "none": start afresh; "latest": must have one
RESUME_WORDS = ("", "auto", "latest", "none")
_JOB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def default_runtime_dir() -> Path:
    """`$LOOM_RUNTIME_DIR`, else `~/.local/state/loom/runtime` (one directory per job below it)."""
    env = os.environ.get(RUNTIME_ENV, "").strip()
    if env:
        return Path(env).expanduser()
    state = os.environ.get("XDG_STATE_HOME", "").strip() or str(Path.home() / ".local" / "state")
    return Path(state) / "loom" / "runtime"


@dataclass(frozen=True)
class LaunchSpec:
    """What `loom run` was asked to start (paths absolute once `validated`)."""

    script: Path
    script_args: tuple[str, ...] = ()
    job_id: str = ""
    runtime_dir: Path = field(default_factory=default_runtime_dir)
    nproc: int = 1
    logical_world: int | None = None  # None: as many logical ranks as processes
    workdir: Path = field(default_factory=Path.cwd)
    checkpoint_dir: Path | None = None  # None: <job dir>/checkpoints
    checkpoint_interval: int = 0
    checkpoint_mode: str = "sync"
    resume: str = ""  # one of RESUME_WORDS or a checkpoint path
    deterministic: bool = False  # LOOM_DETERMINISTIC=1: fixed-order gradient reduction
    spike: str = ""  # loss-spike rollback: "", "off" or "z=4,skip=100,..." (LOOM_SPIKE_*)

    @property
    def job_dir(self) -> Path:
        return self.runtime_dir / self.job_id

    @property
    def world(self) -> int:
        return self.logical_world if self.logical_world is not None else self.nproc

    @property
    def ckpt_dir(self) -> Path:
        return self.checkpoint_dir if self.checkpoint_dir is not None else self.job_dir / "checkpoints"


def validated(spec: LaunchSpec) -> LaunchSpec:
    """Check every option before anything starts; absolute paths; a job id if none was given."""
    script = Path(spec.script).expanduser()
    if not script.exists():
        raise LoomInputError(f"training script {spec.script} does not exist", field="SCRIPT")
    if not script.is_file():
        raise LoomInputError(f"training script {spec.script} is not a file", field="SCRIPT")
    job_id = spec.job_id or _fresh_job_id(script)
    if not _JOB_ID.fullmatch(job_id):
        raise LoomInputError(f"'{job_id}' is not a job id: use letters, digits, '.', '_' and '-' "
                             "(starting with a letter or digit, at most 128)", field="--job-id")
    check_processes(spec.nproc, spec.world, "--nproc")
    if spec.checkpoint_mode not in CHECKPOINT_MODES:
        raise LoomInputError(f"unknown checkpoint mode '{spec.checkpoint_mode}': use "
                             f"{' or '.join(CHECKPOINT_MODES)}", field="--checkpoint-mode")
    if spec.checkpoint_interval < 0:
        raise LoomInputError(f"{spec.checkpoint_interval} is negative: give iterations between checkpoints "
                             "(0 = only when asked)", field="--checkpoint-interval")
    if spec.checkpoint_dir is not None and not Path(spec.checkpoint_dir).expanduser().is_dir():
        what = "is not a directory" if Path(spec.checkpoint_dir).expanduser().exists() else "does not exist"
        raise LoomInputError(f"checkpoint directory {spec.checkpoint_dir} {what} (a directory you name is never "
                             "created: a mistyped shared-storage path would keep checkpoints on a local disk)",
                             field="--checkpoint-dir")
    try:
        spike_rule(spike_env(spec.spike))
    except RuntimeConfigError as exc:
        keys = {f"environment variable {var}": key for key, var in SPIKE_KEYS.items()}
        where = f"{keys[exc.source]}: " if exc.source in keys else ""
        raise LoomInputError(f"{where}{exc.message}", field="--spike") from None
    out = replace(spec, script=script.resolve(), job_id=job_id, runtime_dir=_absolute(spec.runtime_dir),
                  workdir=_absolute(spec.workdir), logical_world=spec.world)
    out = replace(out, checkpoint_dir=_absolute(out.ckpt_dir))
    _check_resume(out.resume, out.ckpt_dir)
    return out


def check_processes(nproc: int, world: int, flag: str) -> None:
    """M processes for N logical ranks need 1 ≤ M ≤ N (a process time-slices whole logical ranks)."""
    if nproc < 1:
        raise LoomInputError(f"{nproc} processes: a job needs at least one", field=flag)
    if world < 1:
        raise LoomInputError(f"{world} logical ranks: a job needs at least one", field="--logical-world")
    if nproc > world:
        raise LoomInputError(f"{nproc} processes for {world} logical ranks: cannot run (or resize to) more "
                             "processes than logical ranks (each process runs one or more whole logical ranks)",
                             field=flag)


def _fresh_job_id(script: Path) -> str:
    stem = re.sub(r"[^A-Za-z0-9._-]", "-", script.stem).lstrip("._-") or "job"
    return f"{stem}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid() % 10000:04d}"


def _absolute(path: Path) -> Path:
    return Path(os.path.abspath(Path(path).expanduser()))


def _check_resume(resume: str, ckpt_dir: Path) -> None:
    """`latest` needs a complete checkpoint; a path must be one (never partial: the runtime would refuse it)."""
    from loom.runtime import store

    if resume in RESUME_WORDS:
        if resume == "latest" and not (ckpt_dir.is_dir() and store.complete(ckpt_dir)):
            raise LoomInputError(f"--resume latest: no complete checkpoint in {ckpt_dir} (leave --resume out "
                                 "to start afresh, or give --checkpoint-dir)", field="--resume")
        return
    if not Path(resume).expanduser().exists():
        raise LoomInputError(f"checkpoint {resume} does not exist (give a checkpoint directory, 'latest' "
                             "for the job's newest durable checkpoint, or leave --resume out)", field="--resume")
    store.validate(Path(resume).expanduser(), read_metadata=False)


def prepare_dirs(spec: LaunchSpec) -> None:
    """Create the job, checkpoint and working directories, naming the one that cannot be made."""
    for what, path in (("runtime", spec.job_dir), ("checkpoint", spec.ckpt_dir), ("working", spec.workdir)):
        if path.exists() and not path.is_dir():
            raise LoomInputError(f"{what} directory {path} exists and is not a directory")
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise LoomInputError(f"cannot create {what} directory {path}: {exc.strerror}") from None
        if not os.access(path, os.W_OK | os.X_OK):
            raise LoomInputError(f"{what} directory {path} is not writable")
    for sub in ("control/requests", "control/acks"):
        (spec.job_dir / sub).mkdir(parents=True, exist_ok=True)


# --- the control channel, as the launcher reads it (files under the job directory) ---------------------


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    """Write then rename, so a reader sees the old file or the new one, never half of one."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, path)


def _by_seq(folder: Path) -> dict[int, dict[str, Any]]:
    out: dict[int, dict[str, Any]] = {}
    for path in sorted(folder.glob("*.json")):
        if path.stem.isdigit() and (data := _read_json(path)) is not None:
            out[int(path.stem)] = data
    return out


def requests(job_dir: Path) -> dict[int, dict[str, Any]]:
    return _by_seq(job_dir / "control" / "requests")


def acks(job_dir: Path) -> dict[int, dict[str, Any]]:
    return _by_seq(job_dir / "control" / "acks")


def append_event(job_dir: Path, event: str, **fields: Any) -> None:
    """One line of `events.jsonl`, written with a single O_APPEND write (rank 0 appends there too)."""
    line = json.dumps({"time": time.time(), "event": event, "source": "launcher", **fields}) + "\n"
    fd = os.open(job_dir / "events.jsonl", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def update_status(job_dir: Path, **fields: Any) -> dict[str, Any]:
    """Merge `fields` into `status.json` (keeping what the runtime reported) and stamp `updated`."""
    status = _read_json(job_dir / "status.json") or {}
    status.update(fields, updated=time.time())
    write_json_atomic(job_dir / "status.json", status)
    return status


def fail_pending(job_dir: Path, reason: str) -> list[int]:
    """Ack `failed` every request nobody answered, so no client waits for a job that is gone."""
    answered, asked = acks(job_dir), requests(job_dir)
    pending = [seq for seq in asked if seq not in answered]
    for seq in pending:
        write_json_atomic(job_dir / "control" / "acks" / f"{seq:08d}.json",
                          {"seq": seq, "action": asked[seq].get("action"), "status": "failed", "reason": reason,
                           "checkpoint": None, "iteration": None, "time": time.time()})
    return pending


# --- one incarnation ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Incarnation:
    """Where and how big one start of the job is."""

    number: int
    workdir: Path
    nproc: int
    resume: str


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now (the rendezvous store binds it a moment later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def job_env(spec: LaunchSpec, inc: Incarnation, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of every process of an incarnation (torchrun adds RANK, WORLD_SIZE, ...)."""
    env = dict(os.environ if base is None else base)
    env.update({
        "LOOM_JOB_ID": spec.job_id,
        "LOOM_RUNTIME_DIR": str(spec.runtime_dir),
        "LOOM_LOGICAL_WORLD": str(spec.world),
        "LOOM_CHECKPOINT_DIR": str(spec.ckpt_dir),
        "LOOM_CHECKPOINT_INTERVAL": str(spec.checkpoint_interval),
        "LOOM_CHECKPOINT_MODE": spec.checkpoint_mode,
        "LOOM_RESUME": inc.resume,
        "LOOM_WORKDIR": str(inc.workdir),
        "LOOM_INCARNATION": str(inc.number),
    })
    env.update(spike_env(spec.spike))
    if spec.deterministic:
        env["LOOM_DETERMINISTIC"] = "1"
        env.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS, read at CUDA init
    env.setdefault("OMP_NUM_THREADS", "1")  # torchrun's own default, set here so it prints no banner
    # MKL picks kernels by memory alignment, which differs in a resumed process: without strict
    # conditional bitwise reproducibility a resumed CPU job drifts in the last bit. Read by MKL at its
    # first call, so it must be in the environment before the workers start.
    env.setdefault("MKL_CBWR", "AUTO,STRICT")
    return env


def agent_command(spec: LaunchSpec, inc: Incarnation, port: int) -> list[str]:
    """torchrun's own command line, run by this module's `main` (which reports the job's exit code)."""
    return [
        sys.executable, "-m", "loom.runtime.launch",
        "--nnodes", "1", "--nproc-per-node", str(inc.nproc),
        "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
        "--rdzv-id", f"{spec.job_id}-{inc.number}", "--local-addr", "127.0.0.1",
        "--max-restarts", "0", "--role", "loom",
        str(spec.script), *spec.script_args,
    ]


# --- the supervisor ----------------------------------------------------------------------------------


class Supervisor:
    """Runs incarnations of one job until it finishes, fails or stops for good."""

    def __init__(self, spec: LaunchSpec, log: TextIO | None = None) -> None:
        self.spec = spec
        self.log = log if log is not None else sys.stderr
        self.job_dir = spec.job_dir
        self._child: subprocess.Popen[bytes] | None = None
        self._signalled: int | None = None
        self._starting: dict[str, Any] = {}  # status.json as the launcher last wrote it
        self._launcher: dict[str, Any] = {}  # launcher.json

    def run(self) -> int:
        """Start the job, restart it after migrate/resize; the job's exit code (0: finished or stopped)."""
        prepare_dirs(self.spec)
        self._claim()
        inc: Incarnation | None = Incarnation(0, self.spec.workdir, self.spec.nproc, self.spec.resume)
        code = 0
        previous = signal.signal(signal.SIGTERM, self._forward)
        try:
            while inc is not None:
                before = set(acks(self.job_dir))
                code, snap = self._launch(inc)
                inc, code = self._next(inc, code, before, snap)
        except KeyboardInterrupt:  # Ctrl-C between incarnations (torchrun got it too, if running)
            code = 128 + signal.SIGINT
        finally:
            signal.signal(signal.SIGTERM, previous)
            self._release(code)
        return code

    def _launch(self, inc: Incarnation) -> tuple[int, wd.Snapshot]:
        inc.workdir.mkdir(parents=True, exist_ok=True)
        snap = wd.snapshot(inc.workdir, self._excluded())
        self._record(inc)
        update_status(self.job_dir, job_id=self.spec.job_id, state="starting", processes=inc.nproc,
                      logical_world=self.spec.world, workdir=str(inc.workdir))
        self._starting = _read_json(self.job_dir / "status.json") or {}
        append_event(self.job_dir, "launch", incarnation=inc.number, processes=inc.nproc,
                     logical_world=self.spec.world, workdir=str(inc.workdir), resume=inc.resume)
        if self._signalled is not None:  # SIGTERM while between incarnations: start nothing
            return 128 + self._signalled, snap
        code = self.run_agent(agent_command(self.spec, inc, free_port()), inc.workdir, job_env(self.spec, inc))
        append_event(self.job_dir, "exit", incarnation=inc.number, exit_code=code)
        return code, snap

    def run_agent(self, cmd: list[str], cwd: Path, env: dict[str, str]) -> int:
        """Run torchrun (one incarnation) to its end; its exit code (tests replace this method)."""
        self._child = subprocess.Popen(cmd, cwd=cwd, env=env)
        try:
            while True:
                try:
                    return _exit_code(self._child.wait())
                except KeyboardInterrupt:  # Ctrl-C reached the whole process group; wait for torchrun
                    self._signalled = signal.SIGINT
        finally:
            self._child = None

    def _forward(self, signum: int, _frame: Any) -> None:
        self._signalled = signum
        if self._child is not None and self._child.poll() is None:
            self._child.send_signal(signum)

    def _next(self, inc: Incarnation, code: int, before: set[int], snap: wd.Snapshot
              ) -> tuple[Incarnation | None, int]:
        """The incarnation to start next (None: the job is over) and the exit code so far."""
        self._track_files(inc, snap)
        if self._signalled is not None:
            return self._over(code or 128 + self._signalled, f"loom run was interrupted (signal {self._signalled})")
        if code != 0:
            return self._over(code, f"the job exited with code {code} before handling the request")
        if self._never_reported():
            self._say(f"warning: {self.spec.script.name} never called loom.runtime.wrap, so it could not be "
                      "checkpointed, stopped, migrated or resized through the control channel")
            update_status(self.job_dir, state="finished")
        request = self._stopping_request(before)
        if request is None or request.get("action") not in RESTARTS:
            return self._over(0, "the job ended before handling the request")
        try:
            return self._restart(inc, request), 0
        except LoomInputError as exc:
            where = f"--job-id {self.spec.job_id} --runtime-dir {self.spec.runtime_dir} --resume latest"
            self._say(f"error: cannot {request['action']} job {self.spec.job_id}: {exc.message}; it is stopped at "
                      f"its last checkpoint (resume it with `loom run {where} ...`)")
            append_event(self.job_dir, f"{request['action']}_failed", seq=request.get("seq"), reason=exc.message)
            return self._over(1, f"{request['action']} failed: {exc.message}")

    def _over(self, code: int, reason: str) -> tuple[None, int]:
        if code != 0 and (_read_json(self.job_dir / "status.json") or {}).get("state") != "failed":
            update_status(self.job_dir, state="failed", exit_code=code)
        fail_pending(self.job_dir, reason)
        return None, code

    def _stopping_request(self, before: set[int]) -> dict[str, Any] | None:
        """The request this incarnation stopped for: the newest `done` stop/migrate/resize it acked."""
        answered = acks(self.job_dir)
        asked = requests(self.job_dir)
        for seq in sorted(set(answered) - before, reverse=True):
            req = asked.get(seq, {})
            if answered[seq].get("status") == "done" and req.get("action") in ("stop", *RESTARTS):
                return {**req, "seq": seq}
        return None

    def _restart(self, inc: Incarnation, request: dict[str, Any]) -> Incarnation:
        args = request.get("args") or {}
        if not isinstance(args, dict):
            raise LoomInputError(f"request {request.get('seq')} has args {args!r}, not an object", field="args")
        nproc = _int_arg(args, "processes", inc.nproc)
        check_processes(nproc, self.spec.world, "processes")
        target = inc.workdir
        if request["action"] == "migrate":
            target = self._migrate(inc, args)
        elif "processes" not in args:
            raise LoomInputError("a resize request needs args {\"processes\": M}", field="args")
        nxt = Incarnation(inc.number + 1, target, nproc, "latest")
        append_event(self.job_dir, "restart", seq=request.get("seq"), action=request["action"],
                     incarnation=nxt.number, processes=nproc, workdir=str(target))
        self._say(f"loom run: {request['action']} of job {self.spec.job_id}: restarting on {nproc} "
                  f"process{'es' if nproc != 1 else ''} in {target}")
        return nxt

    def _migrate(self, inc: Incarnation, args: dict[str, Any]) -> Path:
        raw = args.get("workdir")
        if raw is not None and not isinstance(raw, str):
            raise LoomInputError(f"workdir {raw!r} is not a path", field="args.workdir")
        target = _absolute(Path(raw)) if raw else self.job_dir / "workdirs" / str(inc.number + 1)
        moved = wd.transfer(inc.workdir, target, self._excluded())
        write_json_atomic(self.job_dir / "workdir.json", wd.manifest(target, moved))
        append_event(self.job_dir, "files_moved", source=str(inc.workdir), target=str(target),
                     files=len(moved), bytes=sum(e.size for e in moved.values()))
        return target

    def _track_files(self, inc: Incarnation, before: wd.Snapshot) -> None:
        """Record what the incarnation wrote in its working directory (`workdir.json`)."""
        after = wd.snapshot(inc.workdir, self._excluded())
        write_json_atomic(self.job_dir / "workdir.json", wd.manifest(inc.workdir, after, wd.written(before, after)))

    def _excluded(self) -> list[Path]:
        return [self.spec.ckpt_dir, self.spec.runtime_dir]

    def _never_reported(self) -> bool:
        """True when status.json is still the one the launcher wrote: the runtime never ran."""
        return (_read_json(self.job_dir / "status.json") or {}) == self._starting

    def _claim(self) -> None:
        """Refuse a second live `loom run` of the same job; note where it runs (`launcher.json`)."""
        info = _read_json(self.job_dir / "launcher.json") or {}
        pid = info.get("pid")
        if isinstance(pid, int) and info.get("ended") is None and pid != os.getpid() and _alive(pid):
            raise LoomInputError(f"job {self.spec.job_id} is already running (loom run, pid {pid}); pick another "
                                 "--job-id or stop it first", field="--job-id")
        self._launcher = {"pid": os.getpid(), "job_id": self.spec.job_id, "script": str(self.spec.script),
                          "script_args": list(self.spec.script_args), "logical_world": self.spec.world,
                          "checkpoint_dir": str(self.spec.ckpt_dir), "deterministic": self.spec.deterministic,
                          "started": time.time(), "ended": None}
        write_json_atomic(self.job_dir / "launcher.json", self._launcher)

    def _record(self, inc: Incarnation) -> None:
        self._launcher.update(incarnation=inc.number, workdir=str(inc.workdir), processes=inc.nproc)
        write_json_atomic(self.job_dir / "launcher.json", self._launcher)

    def _release(self, code: int) -> None:
        self._launcher.update(ended=time.time(), exit_code=code)
        write_json_atomic(self.job_dir / "launcher.json", self._launcher)

    def _say(self, text: str) -> None:
        print(text, file=self.log, flush=True)


def _int_arg(args: dict[str, Any], key: str, default: int) -> int:
    value = args.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise LoomInputError(f"{key} {value!r} is not a whole number", field=f"args.{key}")
    return value


def _exit_code(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# --- the agent: torchrun in a child process ------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    """Run torch's elastic agent with torchrun's arguments; exit with the failed rank's own exit code."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import get_args_parser, run

    args = get_args_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        run(args)
    except ChildFailedError as exc:
        rank, failure = exc.get_first_failure()
        code = _exit_code(failure.exitcode) or 1
        print(f"loom run: rank {rank} exited with code {code}; the job stopped", file=sys.stderr, flush=True)
        return code
    except SignalException as exc:
        return 128 + int(exc.sigval)
    return 0


if __name__ == "__main__":
    sys.exit(main())
