"""The processes that stand for nodes: the hub and the agents (run as `python -m loom.localize.agent`).

`hub`: imports torch once, forks a child hosting the TCPStore (127.0.0.1, a free
port) every test rendezvouses through, and then forks one agent per node on the
coordinator's request — so 32 emulated nodes cost one torch import, not 32, and
share its memory copy-on-write. `agent`: one long-lived process per node (forked
by the hub, or started by a caller's launcher "on" its node): it connects back to
the coordinator over TCP, says hello, and runs every all-gather test it is sent in
a fresh gloo group of its own (a `PrefixStore` per test over the shared store and
`ProcessGroupGloo` built directly: no global world whose `new_group` a hung node
would block). Its node's fault comes from `LOOM_NODE_FAULT` in its environment.

Every agent is its own session (process group) so the coordinator can kill a hung
one alone, and exits by itself when the coordinator process is gone.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
import threading
import time
import zlib
from datetime import timedelta
from typing import Any

FAULT_ENV = "LOOM_NODE_FAULT"  # the same name as loom.localize.model.FAULT_ENV (kept import-free here)
SLOW_DEFAULT_FRACTION = 0.75  # a `slow` node without a delay waits this fraction of the test timeout
_INHERITED: list[int] = []  # hub file descriptors a forked agent must close (the store's keep-alive pipe)


def pattern(torch: Any, node: str, elements: int) -> Any:
    """The int32 data `node` contributes: derived from its name, so any receiver can check any chunk."""
    code = zlib.crc32(node.encode())
    idx = torch.arange(elements, dtype=torch.int64)
    return ((idx * 2654435761 + code) % 2147483647).to(torch.int32)


def _fault() -> tuple[str, float | None]:
    kind, _, delay = os.environ.get(FAULT_ENV, "").strip().partition(":")
    return kind, (float(delay) if delay else None)


class Agent:
    """One node's agent: a loop answering test commands, one JSON line each way."""

    def __init__(self, connect: tuple[str, int], node: str, coordinator_pid: int, store_port: int,
                 warm_bytes: int) -> None:
        import torch
        import torch.distributed as dist

        self.torch, self.dist, self.node = torch, dist, node
        self.fault, self.delay = _fault()
        threading.Thread(target=_watch, args=(coordinator_pid,), daemon=True).start()
        self._patterns: dict[tuple[str, int], Any] = {}
        started = time.monotonic()
        self._store = dist.TCPStore("127.0.0.1", store_port, None, False, timedelta(seconds=60))
        self._device = dist.ProcessGroupGloo.create_device(hostname="127.0.0.1")
        self._warm_up(max(1, warm_bytes // 4))
        self.sock = socket.create_connection(connect)
        self.rfile = self.sock.makefile("rb")
        self.send({"hello": node, "pid": os.getpid(), "fault": os.environ.get(FAULT_ENV, ""),
                   "warmup_s": time.monotonic() - started})

    def _warm_up(self, elements: int) -> None:
        """A group of one and an all-gather of the test's size in it before saying hello: a
        process's first gloo group and first large buffers cost up to seconds when 32 agents start
        at once on 2 cores, which would otherwise land in round 1's times (false timeouts, false slow)."""
        pg = self._group({"test": f"warm-up/{self.node}/{os.getpid()}", "rank": 0, "members": [self.node],
                          "timeout": 60.0})
        mine = self._pattern(self.node, elements)
        pg.allgather([[self.torch.empty_like(mine)]], [mine]).wait()

    def send(self, obj: dict[str, Any]) -> None:
        self.sock.sendall((json.dumps(obj) + "\n").encode())

    def serve(self) -> None:
        for line in self.rfile:
            cmd = json.loads(line)
            if cmd.get("op") == "exit":
                return
            self.send(self.test(cmd))

    def _pattern(self, node: str, elements: int) -> Any:
        key = (node, elements)
        if key not in self._patterns:
            self._patterns[key] = pattern(self.torch, node, elements)
        return self._patterns[key]

    def _group(self, cmd: dict[str, Any]) -> Any:
        dist = self.dist
        opts = dist.ProcessGroupGloo._Options()
        opts._devices = [self._device]
        opts._timeout = timedelta(seconds=cmd["timeout"])
        store = dist.PrefixStore(f"test/{cmd['test']}", self._store)
        return dist.ProcessGroupGloo(store, cmd["rank"], len(cmd["members"]), opts)

    def test(self, cmd: dict[str, Any]) -> dict[str, Any]:
        """All-gather this node's pattern in a fresh group; check every peer's chunk."""
        torch, members, rank = self.torch, cmd["members"], cmd["rank"]
        elements = max(1, cmd["bytes"] // 4)
        mine = self._pattern(self.node, elements)
        start = time.monotonic()
        try:
            pg = self._group(cmd)
        except RuntimeError as exc:
            return _error(cmd["test"], exc, time.monotonic() - start, "rendezvous")
        joined = time.monotonic()
        self._inject(cmd["timeout"])
        if self.fault == "wrong":
            mine = mine.clone()
            mine[::7] += 1
        out = [torch.empty_like(mine) for _ in members]
        try:
            pg.allgather([out], [mine]).wait()
        except RuntimeError as exc:
            return _error(cmd["test"], exc, time.monotonic() - joined, "allgather")
        seconds = time.monotonic() - joined
        wrong = [peer for j, peer in enumerate(members)
                 if j != rank and not torch.equal(out[j], self._pattern(peer, elements))]
        return {"test": cmd["test"], "ok": not wrong, "wrong_from": wrong, "seconds": seconds,
                "rendezvous_s": joined - start}

    def _inject(self, timeout: float) -> None:
        """The node's fault, after the group formed (so it strikes inside the test, not before)."""
        if self.fault == "crash":
            os._exit(17)
        if self.fault == "hang":
            while True:
                time.sleep(3600)
        if self.fault == "slow":
            time.sleep(self.delay if self.delay is not None else SLOW_DEFAULT_FRACTION * timeout)


def _error(test: int, exc: BaseException, seconds: float, phase: str) -> dict[str, Any]:
    text = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
    low = text.lower()
    kind = "timeout" if "timed out" in low or "timeout" in low else (
        "connection" if any(w in low for w in ("connection", "closed", "reset", "peer")) else "error")
    return {"test": test, "ok": False, "error": kind, "phase": phase, "message": text, "seconds": seconds}


def _watch(pid: int) -> None:
    """Exit when the coordinator is gone: a hung agent must not outlive its localisation."""
    while True:
        time.sleep(0.5)
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            os._exit(0)
        except PermissionError:
            pass


def run_agent(connect: tuple[str, int], node: str, coordinator_pid: int, store_port: int, warm_bytes: int) -> None:
    try:
        Agent(connect, node, coordinator_pid, store_port, warm_bytes).serve()
    finally:
        os._exit(0)


# ------------------------------------------------------------------ hub
def _start_store() -> tuple[int, int]:
    """Fork a child hosting the TCPStore master; it lives as long as the hub (a pipe's other end)."""
    import torch.distributed as dist

    port_r, port_w = os.pipe()
    keep_r, keep_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(port_r)
        os.close(keep_w)
        store = dist.TCPStore("127.0.0.1", 0, None, True, timedelta(seconds=60), wait_for_workers=False)
        os.write(port_w, str(store.port).encode())
        os.close(port_w)
        os.read(keep_r, 1)  # EOF when the hub exits
        os._exit(0)
    os.close(port_w)
    os.close(keep_r)
    _INHERITED.append(keep_w)
    port = int(os.read(port_r, 32))
    os.close(port_r)
    return port, pid


def _fork_agent(node: str, env: dict[str, str], connect: tuple[str, int], coordinator_pid: int,
                store_port: int, warm_bytes: int) -> int:
    pid = os.fork()
    if pid != 0:
        return pid
    try:  # the child: its own session, none of the hub's pipes
        os.setsid()
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for fd in _INHERITED:
            os.close(fd)
        null = os.open(os.devnull, os.O_RDWR)
        os.dup2(null, 0)
        os.dup2(null, 1)
        os.environ.update(env)
        run_agent(connect, node, coordinator_pid, store_port, warm_bytes)
    finally:
        os._exit(1)


def run_hub(coordinator_pid: int) -> None:
    """Reply to `{"op": "spawn", "node", "env", "connect", "bytes"}` lines on stdin with `{"pid"}`; first line:
    the store port."""
    import torch
    import torch.distributed  # noqa: F401

    store, store_pid = _start_store()
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # forked agents are reaped automatically
    threading.Thread(target=_watch, args=(coordinator_pid,), daemon=True).start()
    out = sys.stdout
    out.write(json.dumps({"store_port": store, "store_pid": store_pid}) + "\n")
    out.flush()
    children: list[int] = []
    for line in sys.stdin:
        cmd = json.loads(line)
        host, _, port = cmd["connect"].rpartition(":")
        pid = _fork_agent(cmd["node"], cmd.get("env", {}), (host, int(port)), coordinator_pid, store,
                          int(cmd.get("bytes", 4)))
        children.append(pid)
        out.write(json.dumps({"pid": pid}) + "\n")
        out.flush()
    for pid in children:  # the coordinator closed our stdin: nothing we forked may outlive us
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    os._exit(0)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m loom.localize.agent")
    parser.add_argument("role", choices=("hub", "agent"))
    parser.add_argument("--connect", default="", help="HOST:PORT of the coordinator (agents)")
    parser.add_argument("--node", default="")
    parser.add_argument("--coordinator-pid", type=int, required=True)
    parser.add_argument("--store-port", type=int, default=0, help="the hub's TCPStore (agents)")
    parser.add_argument("--bytes", type=int, default=4, help="the tests' tensor size, to warm up with (agents)")
    parser.add_argument("--tag", default="", help="marks the processes of one localisation (for cleanup checks)")
    args = parser.parse_args(argv)
    if args.role == "hub":
        run_hub(args.coordinator_pid)
    else:
        host, _, port = args.connect.rpartition(":")
        run_agent((host, int(port)), args.node, args.coordinator_pid, args.store_port, args.bytes)


if __name__ == "__main__":
    main()
