"""Talking to Slurm through its own commands: sbatch, scontrol, squeue, scancel.

The backend never links against Slurm; it runs the client commands an operator would,
with a prefix (e.g. `nsenter --net=…` for a cluster inside a network namespace) and an
environment (SLURM_CONF). Output is parsed from the stable one-line formats
(`scontrol -o`, `squeue -o`), which every Slurm since 17.x prints the same way.

`SlurmJob` is one batch job seen through the `Proc` interface the local backend's
monitor uses (poll, signal, kill): its exit status comes from Slurm (`ExitCode=` of
`scontrol show job`), its signals go through `scancel --full`.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL",
            "DEADLINE", "OUT_OF_MEMORY", "SPECIAL_EXIT", "REVOKED"}
_PAIR = re.compile(r"(\S+?)=(.*?)(?= \S+?=|$)")


class SlurmError(RuntimeError):
    """A Slurm command failed (its stderr is in the message)."""


def parse_record(line: str) -> dict[str, str]:
    """`scontrol -o` output: `Key=value Key=value …` (values may hold spaces)."""
    return {m.group(1): m.group(2).strip() for m in _PAIR.finditer(line.strip())}


def gpu_gres(gres: str) -> tuple[str | None, int]:
    """`gpu:8`, `gpu:a100:8(S:0-1)`, `gpu:a100:4,gpu:v100:4` → (type or None, count)."""
    kind, total = None, 0
    for item in gres.split(","):
        m = re.match(r"gpu(?::([^:(]+))?:(\d+)", item.strip())
        if m:
            kind, total = kind or m.group(1), total + int(m.group(2))
    return kind, total


def time_limit(seconds: float) -> str:
    """Slurm's `--time` as D-HH:MM:SS, rounded up to a whole minute (Slurm's granularity)."""
    minutes = max(1, -(-int(seconds) // 60))
    days, rest = divmod(minutes, 24 * 60)
    return f"{days}-{rest // 60:02d}:{rest % 60:02d}:00"


@dataclass(frozen=True)
class SlurmCLI:
    """Slurm's client commands, run with `prefix` (e.g. nsenter) and extra `env` (SLURM_CONF, …)."""

    prefix: tuple[str, ...] = ()
    env: Mapping[str, str] | None = None
    timeout_s: float = 30.0

    def run(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None, check: bool = True) -> str:
        """Run one command; `env` (a job's environment, for sbatch) gets the CLI's own variables on top."""
        merged = {**(os.environ if env is None else env), **(self.env or {})}
        try:
            done = subprocess.run([*self.prefix, *argv], env=merged, capture_output=True, text=True,
                                  timeout=self.timeout_s, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise SlurmError(f"{argv[0]}: {exc}") from exc
        if check and done.returncode != 0:
            raise SlurmError(f"{' '.join(argv[:3])}…: exit {done.returncode}: {done.stderr.strip()[-500:]}")
        return done.stdout

    def nodes(self) -> list[dict[str, str]]:
        return [parse_record(line) for line in self.run(["scontrol", "-o", "show", "nodes"]).splitlines()
                if line.strip()]

    def topology(self) -> str:
        """`scontrol show topology` (empty when the cluster has no tree topology)."""
        out = self.run(["scontrol", "show", "topology"], check=False)
        return out if "SwitchName=" in out else ""

    def job(self, job_id: int) -> list[dict[str, str]]:
        """Every record of a job (one per heterogeneous component); [] once Slurm forgot it."""
        out = self.run(["scontrol", "-o", "show", "job", str(job_id)], check=False)
        return [parse_record(line) for line in out.splitlines() if line.startswith("JobId=")]

    def queue(self) -> dict[int, tuple[str, str]]:
        """Loom's jobs Slurm knows: job id → (state, reason) of its leader (`loom.` names)."""
        out = self.run(["squeue", "-h", "-a", "-t", "all", "-o", "%i|%T|%r|%j"], check=False)
        found: dict[int, tuple[str, str]] = {}
        for line in out.splitlines():
            parts = line.strip().split("|")
            if len(parts) != 4 or not parts[3].startswith("loom."):
                continue
            job, _, offset = parts[0].partition("+")
            if job.isdigit() and offset in ("", "0"):
                found[int(job)] = (parts[1], parts[2])
        return found


class QueueView:
    """One `squeue` for every job per `max_age_s`: the monitor asks about each job every tick."""

    def __init__(self, cli: SlurmCLI, max_age_s: float = 0.25) -> None:
        self.cli, self.max_age_s = cli, max_age_s
        self._at, self._jobs = float("-inf"), {}
        self._lock = threading.Lock()

    def state(self, job_id: int) -> tuple[str, str] | None:
        with self._lock:
            if time.monotonic() - self._at > self.max_age_s:
                try:
                    self._jobs = self.cli.queue()
                    self._at = time.monotonic()
                except SlurmError:
                    return ("UNKNOWN", "")
            return self._jobs.get(job_id)

    def invalidate(self) -> None:
        with self._lock:
            self._at = float("-inf")


class SlurmJob:
    """A batch job through the `Proc` interface (`poll`, `signal`, `kill`, `running`)."""

    def __init__(self, slurm_id: int, cli: SlurmCLI, queue: QueueView) -> None:
        self.slurm_id, self.cli, self.queue = slurm_id, cli, queue
        self.pid: int | None = None  # no local process: faults.py's emulated faults do not apply
        self._code: int | None = None

    @property
    def record_fields(self) -> dict[str, Any]:
        return {"slurm_id": self.slurm_id}

    def release(self) -> None:
        self.cli.run(["scontrol", "release", str(self.slurm_id)])
        self.queue.invalidate()

    def poll(self) -> int | None:
        """The exit status once Slurm says the job ended (a signal s as 128 + s), else None."""
        if self._code is not None:
            return self._code
        seen = self.queue.state(self.slurm_id)
        if seen is not None and seen[0] not in TERMINAL:
            return None
        records = self.cli.job(self.slurm_id)
        if not records:
            self._code = 128 + signal.SIGKILL if seen is None else 1  # forgotten: it left no word
            return self._code
        leader = records[0]
        state = leader.get("JobState", "")
        if state not in TERMINAL:
            return None
        self._code = exit_status(state, leader.get("ExitCode", "0:0"))
        return self._code

    def signal(self, signum: int) -> None:
        """Every step and the batch shell (`--full`), as a local process group is signalled."""
        self.cli.run(["scancel", f"--signal={signal.Signals(signum).name.removeprefix('SIG')}", "--full",
                      str(self.slurm_id)], check=False)

    def kill(self) -> None:
        self.signal(signal.SIGKILL)
        self.cli.run(["scancel", str(self.slurm_id)], check=False)

    @property
    def running(self) -> bool:
        return self.poll() is None


def exit_status(state: str, exit_code: str) -> int:
    """Slurm's `ExitCode=code:signal` and end state as a process exit status."""
    code, _, sig = exit_code.partition(":")
    code_i = int(code) if code.isdigit() else 1
    sig_i = int(sig) if sig.isdigit() else 0
    if sig_i:
        return 128 + sig_i
    if state == "COMPLETED":
        return code_i
    if state in ("CANCELLED", "PREEMPTED", "TIMEOUT", "DEADLINE", "REVOKED"):
        return code_i or 128 + signal.SIGTERM
    if state in ("NODE_FAIL", "BOOT_FAIL"):
        return 128 + signal.SIGKILL
    return code_i or 1
