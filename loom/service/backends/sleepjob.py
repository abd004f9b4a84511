"""The built-in sleep-style job: holds its GPUs for `--duration` seconds of work and speaks the
control channel, so a job with only a duration can be preempted, resumed, migrated and resized
like a real one.

Run as a script (`python -I -S sleepjob.py --duration 600`): standard library only, so it
starts in a few tens of milliseconds (importing `loom.runtime` would cost more than the job).
It follows the runtime's file protocol (docs/RUNTIME.md, "The control channel") from the job's
side, under `$LOOM_RUNTIME_DIR/$LOOM_JOB_ID/`:

* `status.json` — `{"job_id", "state", "progress", "started", "end", "updated", ...}`: `state`
  running / stopped / finished / failed; `progress` work done (seconds) when `started` (clock
  time); `end` the clock time at which it will be done if left alone;
* `control/requests/N.json` → `control/acks/N.json`: `checkpoint` (ack once durable), `stop`,
  `migrate`, `resize` (checkpoint, ack, exit 0; the backend starts it again where it goes); acks
  carry `progress`;
* its checkpoint: `$LOOM_CHECKPOINT_DIR/sleep.json` `{"progress"}`, written durably; a start
  resumes from it unless `LOOM_RESUME=none`.

Time is `time.time()`, or, under a virtual clock, the float in `$LOOM_CLOCK_FILE`. For tests of
failure handling, `LOOM_SLEEP_FAIL_AFTER=S` exits with status 3 after S seconds of work and
`LOOM_SLEEP_HANG_AFTER=S` stops answering and reporting (a hang).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

ACTIONS = ("checkpoint", "stop", "migrate", "resize")


class Clock:
    def __init__(self, file: str | None) -> None:
        self.file = file
        self.last = 0.0

    def now(self) -> float:
        if not self.file:
            return time.time()
        try:
            with open(self.file) as handle:
                self.last = float(handle.read())
        except (OSError, ValueError):  # being replaced: the previous reading stands
            pass
        return self.last


def write_json(path: str, data: dict, durable: bool = False) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as handle:
        json.dump(data, handle)
        if durable:
            handle.flush()
            os.fsync(handle.fileno())
    os.replace(tmp, path)


def read_json(path: str) -> dict | None:
    try:
        with open(path) as handle:
            data = json.load(handle)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


class SleepJob:
    def __init__(self, duration: float) -> None:
        env = os.environ
        self.job_id = env["LOOM_JOB_ID"]
        self.job_dir = os.path.join(env["LOOM_RUNTIME_DIR"], self.job_id)
        self.requests = os.path.join(self.job_dir, "control", "requests")
        self.acks = os.path.join(self.job_dir, "control", "acks")
        for folder in (self.requests, self.acks):
            os.makedirs(folder, exist_ok=True)
        ckpt_dir = env.get("LOOM_CHECKPOINT_DIR") or os.path.join(self.job_dir, "checkpoints")
        os.makedirs(ckpt_dir, exist_ok=True)
        self.checkpoint = os.path.join(ckpt_dir, "sleep.json")
        self.clock = Clock(env.get("LOOM_CLOCK_FILE"))
        self.poll_s = float(env.get("LOOM_SLEEP_POLL_S") or 0.05)
        self.fail_after = _float(env.get("LOOM_SLEEP_FAIL_AFTER"))
        self.hang_after = _float(env.get("LOOM_SLEEP_HANG_AFTER"))
        self.duration = duration
        saved = read_json(self.checkpoint) if env.get("LOOM_RESUME", "") != "none" else None
        self.progress0 = float(saved["progress"]) if saved else 0.0
        self.answered = {name for name in os.listdir(self.acks) if name.endswith(".json")}
        self.started = self.clock.now()
        # the one expression the backend evaluates too: both agree on the end to the bit
        self.end = self.started + (self.duration - self.progress0)
        self.heartbeat = 0.0

    def done(self, now: float) -> float:
        return min(self.duration, self.progress0 + (now - self.started))

    def status(self, state: str, now: float, **extra: object) -> None:
        write_json(os.path.join(self.job_dir, "status.json"), {
            "job_id": self.job_id, "state": state, "progress": self.progress0, "started": self.started,
            "end": self.end, "duration": self.duration, "done": self.done(now), "pid": os.getpid(),
            "updated": time.time(), **extra})
        self.heartbeat = time.monotonic()

    def event(self, kind: str, **fields: object) -> None:
        with open(os.path.join(self.job_dir, "events.jsonl"), "a") as handle:
            handle.write(json.dumps({"time": time.time(), "event": kind, "source": "sleepjob", **fields}) + "\n")

    def save(self, progress: float) -> str:
        write_json(self.checkpoint, {"progress": progress}, durable=True)
        return self.checkpoint

    def ack(self, seq: int, action: str | None, status: str, progress: float, reason: str | None = None,
            checkpoint: str | None = None) -> None:
        name = f"{seq:08d}.json"
        write_json(os.path.join(self.acks, name), {
            "seq": seq, "action": action, "status": status, "reason": reason, "checkpoint": checkpoint,
            "iteration": None, "progress": progress, "time": time.time()}, durable=True)
        self.answered.add(name)

    def run(self) -> int:
        self.status("running", self.started)
        self.event("resumed" if self.progress0 else "started", progress=self.progress0)
        while True:
            now = self.clock.now()
            work = self.done(now)
            if self.hang_after is not None and work >= self.hang_after:
                while True:  # a hang: no answers, no status, until killed
                    time.sleep(3600)
            if self.fail_after is not None and work >= self.fail_after:
                print(f"sleep job {self.job_id}: emulated failure after {work:g} s of work", file=sys.stderr)
                self.status("failed", now, error="emulated failure")
                return 3
            if now >= self.end:  # finished first (a backend reading a refusal then sees why)
                self.status("finished", now)
                self.fail_pending("the job finished before the request was served", self.duration)
                self.event("finished")
                return 0
            stop = self.serve(work)
            if stop:
                self.status("stopped", now)
                self.event("stopped", action=stop, progress=work)
                return 0
            if time.monotonic() - self.heartbeat >= 1.0:
                self.status("running", now)
            pause = self.poll_s
            if not self.clock.file:
                pause = max(0.0, min(pause, self.end - time.time()))
            time.sleep(pause)

    def serve(self, work: float) -> str | None:
        """Answer new requests in order; the action that stops the job, if one did."""
        try:
            names = sorted(n for n in os.listdir(self.requests) if n.endswith(".json") and n[:8].isdigit())
        except OSError:
            return None
        for name in names:
            if name in self.answered:
                continue
            seq = int(name[:8])
            request = read_json(os.path.join(self.requests, name))
            action = request.get("action") if request else None
            if action not in ACTIONS:
                self.ack(seq, action if isinstance(action, str) else None, "failed", work,
                         reason=f"unknown action {action!r}; known actions: {', '.join(ACTIONS)}")
                continue
            path = self.save(work)
            self.ack(seq, action, "done", work, checkpoint=path)
            if action != "checkpoint":
                return action
        return None

    def fail_pending(self, reason: str, work: float) -> None:
        try:
            names = sorted(n for n in os.listdir(self.requests) if n.endswith(".json") and n[:8].isdigit())
        except OSError:
            return
        for name in names:
            if name not in self.answered:
                request = read_json(os.path.join(self.requests, name)) or {}
                self.ack(int(name[:8]), request.get("action"), "failed", work, reason=reason)


def _float(text: str | None) -> float | None:
    return float(text) if text not in (None, "") else None


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] != "--duration":
        print("usage: sleepjob.py --duration SECONDS", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    return SleepJob(float(argv[1])).run()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
