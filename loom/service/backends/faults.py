"""Faulty emulated nodes and the recovery pipeline's steps, for the local backend.

**Emulated hardware faults** (`make_faulty(node, kind)`): a broken node does to the
processes on it what real broken hardware does — `hang` freezes them (SIGSTOP: a rank
stuck in a collective, as with a bad NVLink or NIC; the job's other ranks wait on it
until the hang watchdog kills the job), `crash` kills them. Which worker processes are
"on" a node: a job's worker ranks are laid out over its nodes (in `LOOM_NODES` order)
in contiguous blocks, rank r of P on node ⌊r·N/P⌋ of N; a sleep job's one process is on
all of its nodes. The fault stays until `repair_node`; tests run on the node meanwhile
see it too (the localisation agent started "on" a faulty node gets its fault).

**Steps** the core's recovery pipeline asks for (`loom.core.recovery`), each run on a
worker thread and answered with an event:

* `Diagnose` → `JobDiagnosed`: `loom.diagnosis.diagnose` over the log of the failed
  incarnation (from where the backend last started it). A hang with no error in the log
  is a collective that never returned (Acme files these as NCCL timeouts): infrastructure.
  An exit with no known error is reported as unknown and not retried.
* `Localize` → `FaultsLocalized`: `loom.localize.localize` over the job's nodes, one
  agent process per node; a one-node job is tested against a healthy-looking partner
  (another node that is up), since a pairwise test needs two.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from loom.core.decisions import Diagnose, Localize
from loom.core.events import DecisionFailed, Event, FaultsLocalized, JobDiagnosed
from loom.hardware.topology import Topology
from loom.service.backends import runs as R
from loom.service.backends.procs import descendants

log = logging.getLogger("loom.service.local")
FAULT_KINDS = ("hang", "crash", "wrong", "slow")
LOCALIZE_TIMEOUT_S = 10.0  # one pairwise test; a hung agent is declared after this


class Faults:
    """The fault and recovery-step part of `LocalBackend` (a mixin sharing its state and lock)."""

    topology: Topology
    layout: R.Layout
    clock: Any
    _runs: dict[str, R.Run]
    _down: set[int]
    _lock: threading.RLock

    def _init_faults(self, localize_timeout_s: float = LOCALIZE_TIMEOUT_S) -> None:
        self._faulty: dict[int, str] = {}  # emulated node → its fault
        self._log_from: dict[str, int] = {}  # job → log offset where its live incarnation began
        self._failed: dict[str, tuple[str, int]] = {}  # job → (cause, log offset) of its last failure
        self.localize_timeout_s = localize_timeout_s
        self._steps = ThreadPoolExecutor(max_workers=1, thread_name_prefix="loom-recovery")

    # ------------------------------------------------------------------ emulated faults
    def make_faulty(self, name: str, kind: str = "hang") -> None:
        """Break emulated node `name`: what runs there now hangs or crashes; tests there see `kind`."""
        if kind not in FAULT_KINDS:
            raise ValueError(f"unknown fault '{kind}' (one of {', '.join(FAULT_KINDS)})")
        with self._lock:
            node = self._node(name)  # type: ignore[attr-defined]
            self._faulty[node] = kind
            if kind not in ("hang", "crash"):
                return
            sig = signal.SIGSTOP if kind == "hang" else signal.SIGKILL
            for run in self._runs.values():
                if run.proc is not None and run.binding and node in run.binding:
                    for pid in self._pids_on(run, node):
                        _signal(pid, sig)

    def fault_of(self, node: int) -> str | None:
        return self._faulty.get(node)

    def _clear_fault(self, node: int) -> None:
        self._faulty.pop(node, None)

    def _pids_on(self, run: R.Run, node: int) -> list[int]:
        """The processes of `run` on emulated `node`: its worker ranks there, or a sleep job's one."""
        below = [run.proc.pid, *descendants(run.proc.pid)]  # type: ignore[union-attr]
        if run.sleep:
            return below
        nodes = sorted(run.binding or ())
        where = nodes.index(node)
        pids = []
        for pid in below:
            env = _environ(pid)
            rank, world = env.get("RANK"), env.get("WORLD_SIZE")
            if rank is None or world is None or env.get("LOOM_JOB_ID") != run.job_id:
                continue  # the launcher or torchrun's agent: on the job's first node, left alone
            if int(rank) * len(nodes) // max(1, int(world)) == where:
                pids.append(pid)
        return pids

    # ------------------------------------------------------------------ what a failure leaves
    def _started_log(self, job_id: str) -> None:
        """A new incarnation writes from here on (called when the backend spawns it)."""
        try:
            self._log_from[job_id] = self.layout.log(job_id).stat().st_size
        except OSError:
            self._log_from[job_id] = 0

    def _note_failure(self, job_id: str, cause: str) -> None:
        self._failed[job_id] = (cause, self._log_from.get(job_id, 0))

    # ------------------------------------------------------------------ steps
    def _step(self, decision: Diagnose | Localize, ticket: int, at: float) -> None:
        work = self._diagnose if isinstance(decision, Diagnose) else self._localize
        self._steps.submit(self._answer, work, decision, ticket)

    def _answer(self, work: Any, decision: Any, ticket: int) -> None:
        try:
            event = work(decision, ticket)
        except Exception as exc:
            log.exception("recovery step %s of %s failed", type(decision).__name__, decision.job_id)
            event = DecisionFailed(ticket, self.clock.now(), f"{type(decision).__name__.lower()} failed: {exc}")
        self._report(event)

    def _report(self, event: Event) -> None:
        with self._lock:
            self._emit(event)  # type: ignore[attr-defined]
        self._flush()  # type: ignore[attr-defined]

    def _diagnose(self, d: Diagnose, ticket: int) -> Event:
        from loom.diagnosis import diagnose

        from loom.errors import LoomInputError

        cause, offset = self._failed.get(d.job_id, ("", 0))
        try:
            result = diagnose(_lines(self.layout.log(d.job_id), offset))
        except LoomInputError:  # nothing written since it started: no log to read
            result = None
        now = self.clock.now()
        if result is None or result.error_type in ("Unknown", "unknown") or result.category == "unknown":
            if "hung" in cause:
                return JobDiagnosed(d.job_id, now, "infrastructure", "NCCLTimeout", True,
                                    f"{cause}; no error in its log: a collective never returned on some rank",
                                    "localise the faulty node and restart without it", ticket)
            return JobDiagnosed(d.job_id, now, "unknown", "Unknown", False, f"no known error in its log ({_gist(cause)})",
                                "read the job's log; resubmit once the cause is fixed", ticket)
        root = " | ".join(line.strip() for line in result.root_cause_lines[:2])
        return JobDiagnosed(d.job_id, now, result.category, result.error_type, bool(result.recoverable),
                            root[:500], result.mitigation, ticket)

    def _localize(self, d: Localize, ticket: int) -> Event:
        from loom.localize import localize

        names = self.topology.node_names
        tested = [names[n] for n in d.nodes]
        if len(tested) < 2:
            with self._lock:
                partner = next((names[n] for n in range(len(names)) if n not in d.nodes and n not in self._down), None)
            if partner is None:
                raise RuntimeError("a pairwise test needs a second node and no other node is up")
            tested.append(partner)
        faults = {names[n]: kind for n, kind in self._faulty.items() if names[n] in tested}
        found = localize(tested, faults, timeout_s=self.localize_timeout_s)
        faulty = tuple(self._node(n) for n in found.faulty)  # type: ignore[attr-defined]
        return FaultsLocalized(d.job_id, self.clock.now(), faulty, found.reason()[:1000], ticket)

    def _close_steps(self) -> None:
        self._steps.shutdown(wait=False, cancel_futures=True)


def _gist(cause: str) -> str:
    """"exit status 3: …" and the log's last lines, from a failure's cause (status, then log tail)."""
    head, _, tail = cause.partition(": ")
    last = [line.strip() for line in tail.splitlines() if line.strip()][-2:]
    return "; ".join([head or "no cause", *last])[:300]


def _lines(path: Path, offset: int) -> Iterator[str]:
    """The log from `offset` on, line by line (a log may be large)."""
    try:
        with open(path, "rb") as handle:
            handle.seek(offset)
            for raw in handle:
                yield raw.decode("utf-8", "replace").rstrip("\n")
    except OSError:
        return


def _environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, v in pairs}


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
