"""Start and stop a real `loom serve` process (tests, benchmarks): a free port on 127.0.0.1, wait until it
answers, stop it by PID (SIGTERM, or SIGKILL for crash tests), and kill whatever job processes it
left behind under its data directory."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Served:
    proc: subprocess.Popen
    url: str
    data_dir: Path
    log: Path

    @property
    def token(self) -> str:
        return (self.data_dir / "admin.token").read_text().strip()

    def client(self):
        from loom.service.client import Client, Target

        return Client(Target(self.url, self.token))

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, sig)
        self.proc.wait(timeout=60)


def start(data_dir: Path, *args: str, port: int | None = None, timeout: float = 60.0,
          env: dict[str, str] | None = None) -> Served:
    port = port or free_port()
    log = data_dir.parent / f"{data_dir.name}-serve-{port}.log"
    with open(log, "ab") as out:  # the child keeps its own copy of the descriptor
        proc = subprocess.Popen([sys.executable, "-m", "loom.cli.main", "serve", "--data-dir", str(data_dir),
                                 "--port", str(port), *args], stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env={**os.environ, **(env or {})})
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"loom serve exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(f"{url}/healthz", timeout=1.0).status_code == 200:
                return Served(proc, url, data_dir, log)
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"loom serve did not answer within {timeout:g} s:\n{log.read_text()[-3000:]}")
        time.sleep(0.1)


def processes_under(path: Path) -> list[int]:
    """PIDs whose working directory is inside `path` (the jobs a service started there)."""
    root = str(path.resolve())
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            cwd = os.readlink(f"/proc/{entry}/cwd")
        except OSError:
            continue
        if cwd == root or cwd.startswith(root + "/"):
            found.append(int(entry))
    return found


def kill_under(path: Path) -> list[int]:
    pids = processes_under(path)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return pids


def wait_for(predicate, timeout: float = 60.0, what: str = "condition", every: float = 0.1):
    """Poll `predicate()` until it is truthy (returned) or `timeout` seconds pass (AssertionError)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"{what} not met within {timeout:g} s")


def loss_curve(path: Path) -> dict[int, float]:
    """Iteration → loss from a `loss.jsonl` of the example job (`examples/jobs/gpt_train.py`). An
    iteration logged twice (run again after a restore) must have the same loss both times."""
    import json

    out: dict[int, float] = {}
    for line in Path(path).read_text().splitlines():
        row = json.loads(line)
        assert out.setdefault(row["iteration"], row["loss"]) == row["loss"], f"iteration {row['iteration']} differs"
    return out


def job_processes(runtime_dir: Path) -> list[int]:
    """Live processes of jobs whose runtime directory is `runtime_dir` (from their environment):
    what a test checks is gone once its jobs were stopped or killed."""
    import os

    found = []
    want = f"LOOM_RUNTIME_DIR={Path(runtime_dir).resolve()}".encode()
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                environ = Path(f"/proc/{entry}/environ").read_bytes()
                state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[-1].split()[0]
            except OSError:
                continue
            if want in environ.split(b"\0") and state != "Z":
                found.append(int(entry))
    return found


def double_starts_and_bindings(c, ids: set[str]) -> tuple[list[str], int]:
    """Jobs with two carried-out starts and no stop/failure between them, and moments where two jobs
    held more GPUs of one node than it has (from each job's transitions and start allocations)."""
    twice: list[str] = []
    spans: list[tuple[float, float, dict]] = []  # (from, to, {node: gpus})
    for job_id in sorted(ids):
        data = c.explain(job_id)
        starts = [d for d in data["decisions"] if d["kind"] in ("start", "resume") and d["status"] == "done"]
        ends = [t for t in data["transitions"] if t["old"] in ("RUNNING", "STOPPING") and t["new"] not in
                ("RUNNING", "STOPPING")]
        if ran_twice(starts, data["transitions"]):
            twice.append(job_id)
        for d, t_end in zip(starts, ends):
            alloc = d["payload"].get("allocation") or {}
            spans.append((d["at"], t_end["at"], dict(zip(alloc.get("nodes", []), alloc.get("gpus", [])))))
    capacity = {n["name"]: n["gpus"] for n in c.nodes()["nodes"]}
    points = sorted({s for s, _, _ in spans})
    double = 0
    for t in points:
        used: dict[str, int] = {}
        for s, e, nodes in spans:
            if s <= t < e:
                for n, g in nodes.items():
                    used[n] = used.get(n, 0) + g
        double += sum(max(0, g - capacity.get(n, 0)) for n, g in used.items())
    return twice, double


def ran_twice(starts: list[dict], transitions: list[dict]) -> bool:
    """Did the job enter RUNNING while it was running (other than being adopted, still running, by a
    restarted service), or have two starts carried out with no end of a run between them?"""
    running = False
    for t in sorted(transitions, key=lambda t: t["at"]):
        if t["new"] == "RUNNING":
            if running and t["old"] != "RUNNING" and "adopted" not in t.get("event", ""):
                return True
            running = True
        elif t["old"] in ("RUNNING", "STOPPING") and t["new"] not in ("RUNNING", "STOPPING"):
            running = False
    ends = sorted(t["at"] for t in transitions if t["old"] in ("RUNNING", "STOPPING")
                  and t["new"] not in ("RUNNING", "STOPPING"))
    times = sorted(d["at"] for d in starts)
    return any(not any(a <= e <= b for e in ends) for a, b in zip(times, times[1:]))
