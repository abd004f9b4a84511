"""The coordinator's side of the emulated cluster: start, talk to, kill and restart agents.

No torch here: agents are other processes (see `loom.localize.agent`) talking JSON
lines over TCP on 127.0.0.1, so `loom localize` and the service's recovery pipeline
stay light. A round sends every member of every group its test at once and waits
until all have answered or the round's deadline (the gloo timeout plus a grace)
passes; an agent that died is a crash, one that stayed silent past the deadline is
hung and is killed. Either is restarted when a later round needs its node — the
fault belongs to the node (its environment), not to the process, so a restarted
agent on a faulty node fails again, as a rebooted agent on a bad server would.
"""

from __future__ import annotations

import itertools
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

from loom.localize.model import FAULT_ENV, Fault

# node, argv of the agent to run, its full environment (LOOM_NODE_FAULT included) -> the started process
Launcher = Callable[[str, list[str], dict[str, str]], subprocess.Popen]
TAG_PREFIX = "loom-localize"  # in every hub's and agent's argv: `--tag loom-localize-PID-N`
_SERIAL = itertools.count()
_DEBUG = os.environ.get("LOOM_LOCALIZE_DEBUG") == "1"  # agents' stderr shown (else discarded)


def spawn_launcher(node: str, argv: list[str], env: dict[str, str]) -> subprocess.Popen:
    """Start the agent as a fresh process in its own session (imports torch itself: slower than
    the hub's fork, but what a backend starting the agent on a real node does)."""
    return subprocess.Popen(argv, env=env, start_new_session=True, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=None if _DEBUG else subprocess.DEVNULL)


def grace_s(timeout_s: float) -> float:
    """How long past the gloo timeout a round waits for an agent before calling it hung."""
    return 0.5 + 0.25 * timeout_s


def settle_s(timeout_s: float) -> float:
    """How long a silent member gets once its group's other members have reported a failure."""
    return min(0.5, 0.25 * timeout_s)


@dataclass
class _Agent:
    node: str
    pid: int
    conn: socket.socket
    popen: subprocess.Popen | None = None
    buf: bytes = b""
    alive: bool = True


def _base_env() -> dict[str, str]:
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])  # `python -m loom...` works from any directory
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    return env


def _new_tag() -> str:
    return f"{TAG_PREFIX}-{os.getpid()}-{next(_SERIAL)}"


class AgentHub:
    """The hub process: torch imported once, the TCPStore every test meets at, and a fork server
    for agents. `localize()` starts one per call; keep one open (`with AgentHub() as hub:
    localize(..., hub=hub)`) to pay its torch import once across localisations."""

    def __init__(self) -> None:
        self.tag = _new_tag()
        self._proc: subprocess.Popen | None = None
        self.store_port = 0
        self._store_pid = 0

    def __enter__(self) -> Self:
        argv = [sys.executable, "-m", "loom.localize.agent", "hub", "--coordinator-pid", str(os.getpid()),
                "--tag", self.tag]
        self._proc = subprocess.Popen(argv, env=_base_env(), start_new_session=True, stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, stderr=None if _DEBUG else subprocess.DEVNULL,
                                      text=True, bufsize=1)
        line = self._proc.stdout.readline() if self._proc.stdout else ""
        if not line:
            self.close()
            raise RuntimeError("the localisation hub exited before starting its store "
                               "(is torch installed? LOOM_LOCALIZE_DEBUG=1 shows its error)")
        first = json.loads(line)
        self.store_port, self._store_pid = int(first["store_port"]), int(first["store_pid"])
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def fork(self, node: str, env: dict[str, str], connect: str, tensor_bytes: int) -> int:
        """Fork an agent for `node` (its environment changed by `env`) that connects to `connect`."""
        proc = self._proc
        if proc is None or proc.stdin is None or proc.stdout is None:
            raise RuntimeError("the localisation hub is not running")
        proc.stdin.write(json.dumps({"op": "spawn", "node": node, "env": env, "connect": connect,
                                     "bytes": tensor_bytes}) + "\n")
        proc.stdin.flush()
        return int(json.loads(proc.stdout.readline())["pid"])

    def close(self) -> None:
        """Closing its stdin makes the hub kill every agent it forked; then it and its store die."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        for stream in (proc.stdin, proc.stdout):
            try:
                if stream:
                    stream.close()
            except OSError:
                pass
        try:
            proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            pass
        _killpg(proc.pid)  # the hub's group: the hub and its store
        proc.wait()
        if self._store_pid:
            _wait_gone(self._store_pid)


@dataclass
class Cluster:
    """Agents for `nodes`, the hub they are forked from (unless a launcher starts them) and the
    sockets between them and this coordinator."""

    nodes: tuple[str, ...]
    faults: Mapping[str, Fault]
    timeout_s: float
    tensor_bytes: int
    launcher: Launcher | None = None
    node_env: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    hub: AgentHub | None = None
    start_timeout_s: float = 120.0
    tag: str = field(default_factory=_new_tag)
    agents: dict[str, _Agent] = field(default_factory=dict, init=False)
    _tests: Any = field(default_factory=lambda: itertools.count(1), init=False)

    # ---------------------------------------------------------------- life cycle
    def __enter__(self) -> Self:
        self._server = socket.create_server(("127.0.0.1", 0), backlog=512)
        self.address = f"127.0.0.1:{self._server.getsockname()[1]}"
        self._own_hub = self.hub is None
        self._hub: AgentHub | None = self.hub
        try:
            if self._hub is None:
                self._hub = AgentHub().__enter__()
        except BaseException:
            self.close()
            raise
        self.store_port = self._hub.store_port
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _argv(self, node: str) -> list[str]:
        return [sys.executable, "-m", "loom.localize.agent", "agent", "--connect", self.address,
                "--coordinator-pid", str(os.getpid()), "--store-port", str(self.store_port), "--bytes", str(self.tensor_bytes),
                "--tag", self.tag,
                "--node", node]

    def _env(self, node: str) -> dict[str, str]:
        env = _base_env()
        env.update(self.node_env.get(node, {}))
        if node in self.faults:
            env[FAULT_ENV] = self.faults[node].spec()
        return env

    def start(self, nodes: Sequence[str] | None = None) -> None:
        """Start (or restart) agents and wait until each has said hello."""
        wanted = list(nodes if nodes is not None else self.nodes)
        popens: dict[str, subprocess.Popen] = {}
        for node in wanted:
            self._drop(node)
            if self.launcher is None:
                self._fork(node)
            else:
                popens[node] = self.launcher(node, self._argv(node), self._env(node))
        self._await_hellos(set(wanted), popens)

    def _fork(self, node: str) -> int:
        assert self._hub is not None
        base = _base_env()
        env = {k: v for k, v in self._env(node).items() if base.get(k) != v}
        return self._hub.fork(node, env, self.address, self.tensor_bytes)

    def _await_hellos(self, waiting: set[str], popens: dict[str, subprocess.Popen]) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        self._server.settimeout(0.5)
        while waiting:
            if time.monotonic() > deadline:
                raise RuntimeError(f"agents for {', '.join(sorted(waiting))} did not start within "
                                   f"{self.start_timeout_s:g} s")
            for node, proc in popens.items():
                if node in waiting and proc.poll() is not None:
                    raise RuntimeError(f"the agent for {node} exited ({proc.returncode}) before saying hello")
            try:
                conn, _ = self._server.accept()
            except TimeoutError:
                continue
            conn.settimeout(self.start_timeout_s)
            hello, rest = _read_line(conn)
            node = hello["hello"]
            self.agents[node] = _Agent(node, int(hello["pid"]), conn, popens.get(node), rest)
            conn.setblocking(False)
            waiting.discard(node)

    def kill(self, node: str) -> None:
        agent = self.agents.get(node)
        if agent is None:
            return
        agent.alive = False
        _killpg(agent.pid)
        if agent.popen is not None:
            try:
                agent.popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        else:
            _wait_gone(agent.pid)

    def _drop(self, node: str) -> None:
        if node in self.agents:
            self.kill(node)
            self.agents.pop(node).conn.close()

    def close(self) -> None:
        """Kill every agent (and the hub with its store, if ours): nothing is left running."""
        for node in list(self.agents):
            self._drop(node)
        hub = getattr(self, "_hub", None)
        if hub is not None and self._own_hub:
            hub.close()
        self._hub = None
        if getattr(self, "_server", None) is not None:
            self._server.close()

    # ---------------------------------------------------------------- rounds
    def run_round(self, groups: Sequence[tuple[str, ...]]) -> list[dict[str, dict[str, Any]]]:
        """Run one all-gather per group, all at once; per group, each member's answer.

        An answer is the agent's own report (`ok`, `seconds`, `wrong_from`, `error`...) or
        `{"dead": True}` (its process died: crash) or `{"silent": True}` (no answer by the
        deadline: hung; it has been killed).
        """
        needed = [n for g in groups for n in g if n not in self.agents or not self.agents[n].alive]
        if needed:
            self.start(needed)
        answers: dict[str, dict[str, Any]] = {}
        for group in groups:
            test = f"{self.tag}/{next(self._tests)}"  # unique in a store shared across localisations
            for rank, node in enumerate(group):
                cmd = {"op": "test", "test": test, "members": list(group), "rank": rank,
                       "store_port": self.store_port, "timeout": self.timeout_s, "bytes": self.tensor_bytes}
                if not _send(self.agents[node], cmd):
                    answers[node] = {"dead": True}
        self._collect(answers, groups)
        return [{n: answers[n] for n in g} for g in groups]

    def _collect(self, answers: dict[str, dict[str, Any]], groups: Sequence[tuple[str, ...]]) -> None:
        """Wait for the answers. A member still silent at the deadline, or `settle_s` after the last
        of its group's other members answered (they timed out or failed: the test is over), is hung."""
        deadline = time.monotonic() + self.timeout_s + grace_s(self.timeout_s)
        settle = settle_s(self.timeout_s)
        group_of = {n: g for g in groups for n in g}
        waiting = {n for g in groups for n in g if n not in answers}
        sel = selectors.DefaultSelector()
        for node in waiting:
            sel.register(self.agents[node].conn, selectors.EVENT_READ, node)
        last_answer: dict[tuple[str, ...], float] = {}  # group -> when a member last answered
        while waiting and (now := time.monotonic()) < deadline:
            wake = min([deadline, *(t + settle for g, t in last_answer.items() if _only_silent_left(g, answers))])
            for key, _ in sel.select(max(0.0, wake - now)):
                answer = _receive(self.agents[key.data])
                if answer is not None:
                    answers[key.data] = answer
                    waiting.discard(key.data)
                    sel.unregister(key.fileobj)
                    if not answer.get("dead"):
                        last_answer[group_of[key.data]] = time.monotonic()
            now = time.monotonic()
            for group, when in last_answer.items():
                if now >= when + settle and _only_silent_left(group, answers):
                    waiting -= set(group)
        sel.close()
        for node in [n for g in groups for n in g if n not in answers]:
            answers[node] = {"silent": True}
            self.kill(node)
        for node, answer in answers.items():
            if answer.get("dead"):
                self.kill(node)  # reap it (a crashed agent's process is gone or going)


def _only_silent_left(group: tuple[str, ...], answers: dict[str, dict[str, Any]]) -> bool:
    """Some members are silent, and a live member reported the test failed (a passing test needs
    everyone, so the silent ones cannot change the outcome, only be late or hung)."""
    reports = [answers[m] for m in group if m in answers and not answers[m].get("dead")]
    return not all(m in answers for m in group) and any(not r.get("ok") for r in reports)


def _send(agent: _Agent, cmd: dict[str, Any]) -> bool:
    try:
        agent.conn.setblocking(True)
        agent.conn.sendall((json.dumps(cmd) + "\n").encode())
        agent.conn.setblocking(False)
        return True
    except OSError:
        agent.alive = False
        return False


def _receive(agent: _Agent) -> dict[str, Any] | None:
    """The agent's answer once a whole line is in; `{"dead": True}` on end of stream."""
    try:
        data = agent.conn.recv(65536)
    except BlockingIOError:
        return None
    except OSError:
        data = b""
    if not data:
        agent.alive = False
        return {"dead": True}
    agent.buf += data
    if b"\n" not in agent.buf:
        return None
    line, _, agent.buf = agent.buf.partition(b"\n")
    return json.loads(line)


def _read_line(conn: socket.socket) -> tuple[dict[str, Any], bytes]:
    buf = b""
    while b"\n" not in buf:
        chunk = conn.recv(4096)
        if not chunk:
            raise RuntimeError("an agent closed its connection before saying hello")
        buf += chunk
    line, _, rest = buf.partition(b"\n")
    return json.loads(line), rest


def _killpg(pid: int) -> None:
    """Kill the agent's whole session (it is the leader): its process and anything it started."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _wait_gone(pid: int, timeout_s: float = 5.0) -> None:
    """Until a killed agent (the hub's child, not ours to wait for) is gone or a zombie."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError, IndexError):
            return
        if state in ("Z", "X"):
            return
        time.sleep(0.01)
