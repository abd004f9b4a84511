"""Process groups for the local backend: start one, watch it, signal it, read its log's tail.

Every job runs as its own process group (a new session), so a signal reaches the
launcher, torchrun and every worker at once, and a node failure can kill exactly
the jobs on that node. A job found alive after the service restarted is not our
child: it is watched by pid, and its exit status is read from the files it left
(`launcher.json` for `loom run`, `status.json` for the sleep job).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

TAIL_LINES = 20


class Proc:
    """A job's process group: our child (`Popen`), or a survivor of a restart known by pid."""

    def __init__(self, pid: int, popen: subprocess.Popen[bytes] | None = None, job_dir: Path | None = None) -> None:
        self.pid = pid
        self.popen = popen
        self.job_dir = job_dir
        self._code: int | None = None

    @classmethod
    def spawn(cls, argv: Sequence[str], *, cwd: Path, env: Mapping[str, str], log: Path,
              job_dir: Path | None = None) -> Proc:
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "ab") as out:
            popen = subprocess.Popen(list(argv), cwd=cwd, env=dict(env), stdin=subprocess.DEVNULL, stdout=out,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        return cls(popen.pid, popen, job_dir)

    def poll(self) -> int | None:
        """The exit status once it ended (a signal `s` as 128 + s), else None."""
        if self._code is not None:
            return self._code
        if self.popen is not None:
            code = self.popen.poll()
            if code is not None:
                self._code = 128 - code if code < 0 else code
        elif not alive(self.pid):
            self._code = self._code_from_files()
        return self._code

    def _code_from_files(self) -> int:
        """A survivor that ended while nobody was its parent: what it wrote says how."""
        if self.job_dir is None:
            return 1
        launcher = _read(self.job_dir / "launcher.json")
        if launcher and launcher.get("pid") == self.pid and isinstance(launcher.get("exit_code"), int):
            return int(launcher["exit_code"])
        status = _read(self.job_dir / "status.json") or {}
        if status.get("state") in ("finished", "stopped"):
            return 0
        if status.get("state") == "failed" and isinstance(status.get("exit_code"), int):
            return int(status["exit_code"])
        return 128 + signal.SIGKILL  # it left no word: killed (the machine, the service's shutdown)

    def signal(self, signum: int) -> None:
        """Signal the job's group and every process it started: torchrun starts each worker in a
        session of its own, so a signal to the launcher's group alone would leave them running
        (orphans, once the launcher is gone)."""
        groups = {self.pid}
        for pid in descendants(self.pid):
            try:
                groups.add(os.getpgid(pid))
            except OSError:
                continue
        for group in groups:
            try:
                os.killpg(group, signum)
            except (ProcessLookupError, PermissionError):
                pass

    def kill(self) -> None:
        self.signal(signal.SIGKILL)

    @property
    def running(self) -> bool:
        return self.poll() is None


class EndedProc:
    """The incarnation a kept run record says ended (`runs.mark_ended`): nothing left to watch or
    signal; polled, it answers the exit status it ended with."""

    pid = None
    popen = None

    def __init__(self, code: int) -> None:
        self._code = code
        self.record_fields: dict[str, object] = {}

    def poll(self) -> int:
        return self._code

    def signal(self, signum: int) -> None:
        pass

    def kill(self) -> None:
        pass

    @property
    def running(self) -> bool:
        return False


def descendants(pid: int) -> list[int]:
    """Every live process below `pid` (children, their children, ...), from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as handle:
                parent = int(handle.read().rsplit(")", 1)[-1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(parent, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), ()):
            found.append(child)
            todo.append(child)
    return found


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie (exited, not yet reaped by its parent) is not alive
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:
        return True


def tail(path: Path, lines: int = TAIL_LINES, limit: int = 4000) -> str:
    """The last `lines` lines of a log (at most `limit` characters), for a failure's cause."""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - 64 * 1024))
            text = handle.read().decode("utf-8", "replace")
    except OSError:
        return ""
    kept = "\n".join(line for line in text.splitlines()[-lines:])
    return kept[-limit:]


def _read(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


read_json = _read
