"""The local backend's monitor thread: it spawns, watches and signals the jobs' processes.

Every `poll_s` (or when woken) it gives waiting launches and moves their GPUs in order,
then looks at each job: has it come up (its `status.json` says running), answered a
control request (its ack), exited (and with what status), stopped reporting (the hang
watchdog), outstayed a stop's grace period (SIGTERM, then SIGKILL)? What it learns is
collected as events and reported after the backend's lock is released.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from pathlib import Path

from loom.core.events import (
    DecisionFailed,
    Event,
    JobFailed,
    JobFinished,
    JobProgress,
    JobRestarted,
    JobStarted,
    JobStopped,
)
from loom.service.backends import runs as R
from loom.service.backends.procs import Proc, tail

log = logging.getLogger("loom.service.local")
PROGRESS_EVERY_S = 30.0  # clock seconds between progress samples of a `loom run` job


class Watching:
    """The monitor's part of `LocalBackend` (a mixin: it shares the backend's state and lock)."""

    # the backend's state it works on (set by `LocalBackend.__init__`)
    _runs: dict[str, R.Run]
    _queue: list[tuple[R.Run, str]]
    _free: list[set[int]]
    _lock: threading.RLock
    _wakeup: threading.Event
    _closed: bool
    layout: R.Layout
    errors: int
    hang_s: float
    grace_s: float

    def _monitor(self) -> None:
        while not self._closed:
            self._wakeup.wait(self.poll_s)
            self._wakeup.clear()
            try:
                with self._lock:
                    self._tick()
            except Exception:
                self.errors += 1
                log.exception("local backend: error while watching jobs")
            self._flush()

    def _tick(self) -> None:
        now = self.clock.now()
        self._bind_queued(now)
        for run in sorted(self._runs.values(), key=lambda r: r.order):
            if run.proc is None:
                continue
            code = run.proc.poll()
            # stamped when looked at, not when the tick began: the spawns and polls before may have taken
            # a while (sbatch, squeue under load); a virtual clock waits for the tick (busy() takes the lock)
            now = self.clock.now()
            if run.phase == "dying":
                if code is not None:
                    self._forget(run)
                    for event in run.after_exit:
                        self._emit(event._replace(at=now))
                continue
            if code is not None:
                self._exited(run, code, now)
            elif run.phase == "spawned":
                self._check_up(run, now)
            elif run.phase == "stopping":
                self._check_stop(run, now)
            elif run.phase == "moving" and run.seq is not None:
                self._check_move(run, now)
            elif run.phase == "up":
                self._check_running(run, now)
            if run.phase != "dying" and self._runs.get(run.job_id) is run:
                self._watchdog(run, now)

    def _bind_queued(self, now: float) -> None:
        """Give waiting launches and moves their GPUs, in order; a waiter blocks later ones on its nodes."""
        blocked: set[int] = set()
        waiting = []
        for run, what in self._queue:
            target = run.allocation if what == "launch" else run.move[1]  # type: ignore[index]
            own = run.binding or {}
            grant: dict[int, tuple[int, ...]] = {}
            for node, count in zip(target.nodes, target.gpus):
                pool = sorted(self._free[node] | set(own.get(node, ())))
                if node in blocked or len(pool) < count:
                    grant = {}
                    break
                grant[node] = tuple(pool[:count])
            if not grant:
                blocked.update(target.nodes)
                waiting.append((run, what))
                continue
            for node, gpus in grant.items():
                self._free[node] -= set(gpus)
            if what == "launch":
                run.binding = grant
                self._spawn(run, now)
            else:
                run.next_binding = grant
                self._send_move(run)
        self._queue = waiting

    def _spawn(self, run: R.Run, now: float) -> None:
        (self.layout.job_dir(run.job_id) / "status.json").unlink(missing_ok=True)
        workdir = R.current_workdir(self.layout, run.job_id)
        workdir.mkdir(parents=True, exist_ok=True)
        env = R.environment(run, self.layout, self.topology, self.env)
        clock_file = getattr(self.clock, "file", None)
        if clock_file is not None:
            env["LOOM_CLOCK_FILE"] = str(clock_file)
            env["LOOM_SLEEP_POLL_S"] = str(min(self.poll_s, 0.005))
        self._started_log(run.job_id)  # type: ignore[attr-defined]
        try:
            run.proc = self._start_proc(run, R.command(run, self.layout, self.python), workdir, env)
        except OSError as exc:
            self._forget(run)
            self._emit(DecisionFailed(run.ticket, now, f"cannot start {run.job_id}: {exc}"))  # type: ignore[arg-type]
            return
        run.phase, run.beat, run.signature, run.spawned_at = "spawned", time.monotonic(), (), now
        R.save_record(self.layout, run, self.topology)

    def _start_proc(self, run: R.Run, argv: list[str], workdir: Path, env: dict[str, str]) -> Proc:
        """Start the job's processes (here: a local process group; the Slurm backend submits a job)."""
        return Proc.spawn(argv, cwd=workdir, env=env, log=self.layout.log(run.job_id),
                          job_dir=self.layout.job_dir(run.job_id))

    def _send_move(self, run: R.Run) -> None:
        _, alloc, what = run.move  # type: ignore[misc]
        if run.sleep:
            self._ask(run, what)
            return
        procs, _ = R.processes(run, alloc.total)
        run.incarnation = R.incarnation(self.layout, run.job_id)
        if what == "migrate":  # a fresh working directory stands for the new node's disk
            self._ask(run, "migrate", workdir=str(R.fresh_workdir(self.layout, run.job_id)), processes=procs)
        else:
            self._ask(run, "resize", processes=procs)

    def _check_up(self, run: R.Run, now: float) -> None:
        status = R.status(self.layout, run.job_id)
        if status.get("state") != "running":
            return
        if run.sleep:
            run.end = float(status["end"])
            self.clock.call_at(run.end, self._wakeup.set)  # a virtual clock stops there
            rate, progress = 1.0, float(status.get("progress", 0.0))
        else:
            rate, progress = None, R.scale(run, status.get("iteration"))
        self._came_up(run, now, rate, progress)

    def _came_up(self, run: R.Run, now: float, rate: float | None, progress: float | None) -> None:
        if run.answer == "move":
            self._emit(JobProgress(run.job_id, now, rate, progress, run.move[0] if run.move else None))
        else:
            self._emit(JobStarted(run.job_id, now, rate, progress, run.ticket))
        run.ticket = None
        run.phase, run.answer, run.move, run.reported = "up", "start", None, now
        if run.moves:  # the next move asked while this one was under way
            self._next_move(run)
        elif run.stop is not None:  # a stop asked while it moved: now it can be carried out
            self._ask(run, "stop")

    def _check_stop(self, run: R.Run, now: float) -> None:
        answer = R.ack(self.layout, run.job_id, run.seq) if run.seq is not None else None
        if answer is not None and answer.get("status") == "failed" and not run.escalated \
                and not self._ending(run):
            log.warning("job %s refused to stop (%s); signalling it", run.job_id, answer.get("reason"))
            run.proc.signal(signal.SIGTERM)  # type: ignore[union-attr]
            run.escalated, run.sent = 1, time.monotonic()
        self._escalate(run)

    def _check_move(self, run: R.Run, now: float) -> None:
        answer = R.ack(self.layout, run.job_id, run.seq)  # type: ignore[arg-type]
        if answer is None:
            return self._escalate(run)
        what = run.move[2]  # type: ignore[index]
        if answer.get("status") != "done" and self._ending(run):
            return self._escalate(run)  # it is ending of its own accord: its exit says how
        if answer.get("status") != "done":  # it keeps running on GPUs the core gave away: end it
            reason = f"{what} of {run.job_id} refused: {answer.get('reason')}"
            run.phase = "dying"
            run.after_exit = [JobFailed(run.job_id, now, reason, progress=R.work_done(run, self.layout)),
                              *self._moves_failed(run, now, reason)]
            run.proc.kill()  # type: ignore[union-attr]
            return None
        if run.sleep:
            return None  # it exits after the ack; started again from `_exited`
        if R.incarnation(self.layout, run.job_id) > run.incarnation:
            self._switch(run)
            status = R.status(self.layout, run.job_id)
            if status.get("state") == "running":
                self._came_up(run, now, None, R.scale(run, status.get("iteration")))
            else:
                run.phase, run.answer, run.seq = "spawned", "move", None
        return None

    def _ending(self, run: R.Run) -> bool:
        """The job says it is over (finished, stopped, failed): a refusal means it ended first."""
        return R.status(self.layout, run.job_id).get("state") in ("finished", "stopped", "failed")

    def _switch(self, run: R.Run) -> None:
        """A move's old processes stopped: its old GPUs go back, the new ones are its own."""
        new = run.next_binding or {}
        for node, gpus in (run.binding or {}).items():
            self._free[node] |= set(gpus) - set(new.get(node, ()))
        run.binding, run.next_binding = new, None
        run.allocation = run.move[1] if run.move is not None else run.allocation
        R.save_record(self.layout, run, self.topology)

    def _check_running(self, run: R.Run, now: float) -> None:
        if run.sleep:
            return
        status = R.status(self.layout, run.job_id)
        rollback = status.get("last_rollback")
        if isinstance(rollback, dict) and rollback != run.rollback:  # the runtime rolled back a loss spike
            run.rollback = rollback
            if rollback.get("event") == "rollback":
                self._emit(JobRestarted(run.job_id, now, f"loss spike: {rollback.get('reason', '?')}", None,
                                        R.scale(run, rollback.get("to_iteration"))))
        if now - run.reported < PROGRESS_EVERY_S:
            return
        progress = R.scale(run, status.get("iteration"))
        if progress is not None:
            run.reported = now
            self._emit(JobProgress(run.job_id, now, None, progress))

    def _escalate(self, run: R.Run) -> None:
        """No answer within the grace period: SIGTERM the group; as long again: SIGKILL."""
        waited = time.monotonic() - run.sent
        if run.escalated == 0 and waited > self.grace_s:
            log.warning("job %s: no answer to its control request in %g s; SIGTERM", run.job_id, self.grace_s)
            run.proc.signal(signal.SIGTERM)  # type: ignore[union-attr]
            run.escalated, run.sent = 1, time.monotonic()
        elif run.escalated == 1 and waited > self.grace_s:
            log.warning("job %s: still running %g s after SIGTERM; SIGKILL", run.job_id, self.grace_s)
            run.proc.kill()  # type: ignore[union-attr]
            run.escalated = 2

    def _watchdog(self, run: R.Run, now: float) -> None:
        """A job whose status file has not changed for `hang_s` is hung (looked at about once a second)."""
        mono = time.monotonic()
        if not self.hang_s or mono - run.looked < min(1.0, self.hang_s / 4):
            return
        run.looked = mono
        sig = R.signature(self.layout, run.job_id)
        if sig != run.signature:
            run.signature, run.beat = sig, mono
            return
        if mono - run.beat <= self.hang_s or run.phase == "stopping":
            return
        cause = f"no progress for {self.hang_s:g} s (hung); killed"
        if run.phase == "spawned" and run.answer == "start":
            self._emit(JobStarted(run.job_id, now, None, None, run.ticket))  # it must run before it can fail
            run.ticket = None
        self._note_failure(run.job_id, cause)  # type: ignore[attr-defined]
        run.after_exit = [JobFailed(run.job_id, now, cause, progress=R.work_done(run, self.layout), diagnose=True),
                          *self._moves_failed(run, now, cause)]
        run.phase = "dying"
        run.proc.kill()  # type: ignore[union-attr]

    def _exited(self, run: R.Run, code: int, now: float) -> None:
        """The job's processes are gone: what it means depends on what was under way."""
        answer = R.ack(self.layout, run.job_id, run.seq) if run.seq is not None else None
        progress = R.work_done(run, self.layout, answer if answer and answer.get("status") == "done" else None)
        if run.phase == "moving" and run.sleep and code == 0 and answer and answer.get("status") == "done":
            self._switch(run)  # stopped for its move: start it again on its new GPUs
            run.phase, run.answer, run.seq, run.escalated = "spawned", "move", None, 0
            self._spawn(run, now)
            return
        stopped = run.phase == "stopping" and (code != 0 or bool(answer and answer.get("status") == "done"))
        self._forget(run, ended=None if stopped else code)  # an end on its own is kept until stored
        if run.phase == "stopping":
            stop_ticket = run.stop[0]  # type: ignore[index]
            if not stopped:  # it finished first
                self._emit(JobFinished(run.job_id, now, self._final(run, progress)))
                self._emit(DecisionFailed(stop_ticket, now, f"{run.job_id} finished before it could stop"))
            else:
                self._emit(JobStopped(run.job_id, now, progress, stop_ticket))
            return
        cause = f"exit status {code}" + (f": {text}" if (text := tail(self.layout.log(run.job_id))) else "")
        if run.phase == "spawned" and run.answer == "start":
            self._emit(JobStarted(run.job_id, now, None, None, run.ticket))  # it ran, however briefly
        if code == 0:
            self._emit(JobFinished(run.job_id, now, self._final(run, progress)))
        else:
            self._note_failure(run.job_id, cause)  # type: ignore[attr-defined]
            self._emit(JobFailed(run.job_id, now, cause, fatal=code < 128, progress=progress, diagnose=True))
        for event in self._moves_failed(run, now, f"the job ended ({cause})"):
            self._emit(event)
        if run.stop is not None:
            self._emit(JobStopped(run.job_id, now, progress, run.stop[0]))

    def _moves_failed(self, run: R.Run, at: float, why: str) -> list[Event]:
        """Answers to the move under way and those queued behind it: they cannot happen any more."""
        moves = [*([run.move] if run.move is not None else []), *run.moves]
        run.moves = []
        return [DecisionFailed(ticket, at, f"{what} of {run.job_id}: {why}") for ticket, _, what in moves]

    def _final(self, run: R.Run, progress: float | None) -> float | None:
        """Work done by a job that finished: all of it."""
        return float(run.spec.duration) if run.spec.duration is not None else progress
