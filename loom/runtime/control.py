"""The control channel between the scheduler and a running job: files in the job directory.

Files, not sockets, so the channel works across nodes on a shared file system and
under Slurm, and survives the job's processes (a restarted job finds what was asked)::

    $LOOM_RUNTIME_DIR/$LOOM_JOB_ID/
        control/requests/00000001.json  scheduler -> job, written atomically (tmp + link)
        control/acks/00000001.json      job (rank 0) -> scheduler, written atomically
        status.json                     rewritten atomically at most every ~1 s and on state changes
        events.jsonl                    one JSON object per line, appended

A request is `{"seq", "action", "args", "time"}`; an ack is `{"seq", "action",
"status": "done"|"failed", "reason", "checkpoint", "iteration"}`. A request that
cannot be parsed or names an unknown action is answered `failed` with the reason;
`ControlClient.wait_ack` raises `RequestFailed` for any failed ack.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loom.runtime.errors import (
    ControlError,
    ControlTimeout,
    RequestFailed,
    UnknownJobError,
)

ACTIONS = ("checkpoint", "stop", "migrate", "resize")
STATES = ("starting", "running", "checkpointing", "stopping", "stopped", "finished", "failed")
_REQUEST = re.compile(r"^(\d{8})\.json$")
_counter = itertools.count()
log = logging.getLogger("loom.runtime")


@dataclass(frozen=True)
class JobFiles:
    """The paths of one job's control channel."""

    job_dir: Path

    @property
    def requests(self) -> Path:
        return self.job_dir / "control" / "requests"

    @property
    def acks(self) -> Path:
        return self.job_dir / "control" / "acks"

    @property
    def status(self) -> Path:
        return self.job_dir / "status.json"

    @property
    def events(self) -> Path:
        return self.job_dir / "events.jsonl"

    def request(self, seq: int) -> Path:
        return self.requests / f"{seq:08d}.json"

    def ack(self, seq: int) -> Path:
        return self.acks / f"{seq:08d}.json"


@dataclass(frozen=True)
class Request:
    """A parsed, well-formed control request."""

    seq: int
    action: str
    args: dict[str, Any] = field(default_factory=dict)
    time: float = 0.0


def write_json_atomic(path: Path, data: Any, *, durable: bool = False) -> None:
    """Write `path` so a reader sees the old file or the new one, never half of one."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{threading.get_ident()}-{next(_counter)}.tmp")
    with open(tmp, "w") as handle:
        json.dump(data, handle)
        if durable:
            handle.flush()
            os.fsync(handle.fileno())
    os.replace(tmp, path)


class ControlChannel:
    """The job's side (rank 0 only): reads requests, writes acks, status and events."""

    def __init__(self, job_dir: Path, job_id: str) -> None:
        self.files = JobFiles(job_dir)
        self.job_id = job_id
        self._lock = threading.Lock()
        self._status_cv = threading.Condition()  # the background status writer's hand-over
        self._status_seq = self._status_written = 0
        self._status_pending: tuple[int, dict[str, Any]] | None = None
        self._status_writer: threading.Thread | None = None
        for directory in (self.files.requests, self.files.acks):
            directory.mkdir(parents=True, exist_ok=True)
        self._seen = {int(m[1]) for p in self.files.acks.iterdir() if (m := _REQUEST.match(p.name))}

    def poll(self, iteration: int) -> list[Request]:
        """New requests in sequence order; malformed ones are answered `failed` here."""
        fresh = []
        for path in sorted(self.files.requests.iterdir()):
            match = _REQUEST.match(path.name)
            if not match or int(match[1]) in self._seen:
                continue
            seq = int(match[1])
            self._seen.add(seq)
            request, problem = _parse(path, seq)
            if request is None:
                self.ack(seq, "failed", reason=problem, iteration=iteration)
                self.event("request_rejected", seq=seq, reason=problem)
            else:
                fresh.append(request)
        return fresh

    def ack(self, seq: int, status: str, *, reason: str | None = None, checkpoint: str | None = None,
            iteration: int | None = None, action: str | None = None) -> None:
        answer = {"seq": seq, "action": action, "status": status, "reason": reason,
                  "checkpoint": checkpoint, "iteration": iteration, "time": time.time()}
        with self._lock:
            write_json_atomic(self.files.ack(seq), answer, durable=True)

    def write_status(self, status: dict[str, Any], *, background: bool = False) -> None:
        """Replace status.json. `background`: a writer thread does it, so the training loop does not wait
        for the file system (a create and a rename: milliseconds on a busy machine); the newest status
        handed over wins, and none ever replaces a newer one written in the foreground."""
        with self._status_cv:
            self._status_seq += 1
            seq = self._status_seq
            if background:
                self._status_pending = (seq, status)
                if self._status_writer is None:
                    self._status_writer = threading.Thread(target=self._write_statuses, daemon=True,
                                                           name="loom-status")
                    self._status_writer.start()
                self._status_cv.notify()
                return
        self._write_status(seq, status)

    def _write_status(self, seq: int, status: dict[str, Any]) -> None:
        with self._lock:
            if seq > self._status_written:
                write_json_atomic(self.files.status, status)
                self._status_written = seq

    def _write_statuses(self) -> None:
        while True:
            with self._status_cv:
                while self._status_pending is None:
                    self._status_cv.wait()
                (seq, status), self._status_pending = self._status_pending, None
            try:
                self._write_status(seq, status)
            except OSError as exc:  # the next status (or the final, foreground one) tries again
                log.warning("loom runtime: could not write %s: %s", self.files.status, exc)

    def event(self, kind: str, **fields: Any) -> None:
        line = json.dumps({"time": time.time(), "event": kind, **fields}, default=str)
        with self._lock, open(self.files.events, "a") as handle:
            handle.write(line + "\n")


def _parse(path: Path, seq: int) -> tuple[Request | None, str | None]:
    """The request in `path`, or (None, why it is malformed)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        return None, f"malformed request file {path}: not JSON ({exc})"
    if not isinstance(data, dict):
        return None, f"malformed request file {path}: not a JSON object"
    if data.get("seq") != seq:
        return None, f"malformed request file {path}: 'seq' is {data.get('seq')!r}, the file name says {seq}"
    action = data.get("action")
    if action not in ACTIONS:
        return None, f"unknown action {action!r}; known actions: {', '.join(ACTIONS)}"
    args = data.get("args", {})
    if not isinstance(args, dict):
        return None, f"malformed request file {path}: 'args' must be a JSON object"
    stamp = data.get("time", 0.0)
    if not isinstance(stamp, (int, float)):
        return None, f"malformed request file {path}: 'time' must be a number"
    return Request(seq, action, args, float(stamp)), None


class ControlClient:
    """The scheduler's side: ask a job to checkpoint, stop, migrate or resize; read its state."""

    def __init__(self, runtime_dir: str | os.PathLike, job_id: str) -> None:
        self.runtime_dir, self.job_id = Path(runtime_dir), str(job_id)
        job_dir = self.runtime_dir / self.job_id
        if not job_dir.is_dir():
            where = ("the runtime directory does not exist" if not self.runtime_dir.is_dir()
                     else f"no directory {job_dir}")
            raise UnknownJobError(f"unknown job '{self.job_id}': {where}", source=str(self.runtime_dir))
        self.files = JobFiles(job_dir)

    def request(self, action: str, **args: Any) -> int:
        """Write a request atomically; returns its sequence number."""
        self.files.requests.mkdir(parents=True, exist_ok=True)
        try:
            json.dumps(args)
        except TypeError as exc:
            raise ControlError(f"request arguments must be JSON values ({exc})") from None
        while True:
            seq = self._next_seq()
            body = {"seq": seq, "action": action, "args": args, "time": time.time()}
            if _create_exclusive(self.files.request(seq), body):
                return seq

    def _next_seq(self) -> int:
        seqs = [int(m[1]) for p in self.files.requests.iterdir() if (m := _REQUEST.match(p.name))]
        return max(seqs, default=0) + 1

    def ack(self, seq: int) -> dict[str, Any] | None:
        """The job's answer to request `seq`, or None while there is none."""
        try:
            return json.loads(self.files.ack(seq).read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise ControlError(f"unreadable ack ({exc})", source=str(self.files.ack(seq))) from None

    def wait_ack(self, seq: int, timeout_s: float = 60.0, poll_s: float = 0.05) -> dict[str, Any]:
        """Block until the job answers `seq`; raise `RequestFailed` if it failed, `ControlTimeout` if none."""
        deadline = time.monotonic() + timeout_s
        while (answer := self.ack(seq)) is None:
            if time.monotonic() >= deadline:
                raise ControlTimeout(f"no answer to request {seq} within {timeout_s:g} s "
                                     f"(state: {self._state_or_unknown()})",
                                     source=f"job '{self.job_id}'")
            time.sleep(poll_s)
        if answer.get("status") != "done":
            raise RequestFailed(f"request {seq} ({answer.get('action') or 'unparsed'}) failed: "
                                f"{answer.get('reason')}", ack=answer, source=f"job '{self.job_id}'")
        return answer

    def status(self) -> dict[str, Any]:
        """The job's last status (raises if it never reported one)."""
        try:
            return json.loads(self.files.status.read_text())
        except FileNotFoundError:
            raise ControlError("the job has not reported a status yet (no status.json; does the "
                               "script call loom.runtime.wrap?)", source=f"job '{self.job_id}'") from None
        except (OSError, ValueError) as exc:
            raise ControlError(f"unreadable status ({exc})", source=str(self.files.status)) from None

    def events(self) -> list[dict[str, Any]]:
        """Every event the job logged, oldest first (a line being written is skipped)."""
        try:
            lines = self.files.events.read_text().splitlines()
        except FileNotFoundError:
            return []
        out = []
        for line in lines:
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
        return out

    def _state_or_unknown(self) -> str:
        try:
            return str(self.status().get("state"))
        except ControlError:
            return "unknown"


def _create_exclusive(path: Path, body: dict[str, Any]) -> bool:
    """Publish `body` at `path` atomically unless the name is taken (False: try another seq)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{next(_counter)}.tmp")
    tmp.write_text(json.dumps(body))
    try:
        os.link(tmp, path)
        return True
    except FileExistsError:
        return False
    except OSError:  # a file system without hard links: rename, after checking the name is free
        if path.exists():
            return False
        os.replace(tmp, path)
        return True
    finally:
        tmp.unlink(missing_ok=True)
