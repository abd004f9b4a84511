"""The local backend's monitor stamps what it sees with the time it looked (watch.py `_tick`).

A tick may spawn jobs first (a Slurm submission takes a while under load) and only then
look at the others; what it finds there happened after the spawns, so it must not carry
the time the tick began (it did: a job that ran for 0.5 s was reported finished at once).
"""

from __future__ import annotations

import time

from loom.core.jobs import JobState
from loom.service.backends.inventory import emulated
from loom.service.backends.local import LocalBackend
from loom.service.clock import WallClock
from loom.service.engine import LiveEngine
from loom.service.specs import LaunchSpec
from loom.workload.job import JobSpec


class SlowSpawn(LocalBackend):
    """Spawning job `slow` takes `delay_s` (as an sbatch on a loaded machine can)."""

    delay_s = 2.0

    def _start_proc(self, run, argv, workdir, env):
        if run.job_id == "slow":
            time.sleep(self.delay_s)
        return super()._start_proc(run, argv, workdir, env)


def test_an_exit_seen_after_a_slow_spawn_is_stamped_when_it_was_seen(tmp_path):
    clock = WallClock()
    backend = SlowSpawn(emulated(2, 1), root=tmp_path, clock=clock, poll_s=0.02, grace_s=5.0, hang_s=0.0)
    engine = LiveEngine(backend, "fcfs", "first-fit", clock=clock, round_interval=0.2)
    try:
        now = clock.now()
        for job_id in ("quick", "slow"):  # one round starts both; one tick spawns quick, then slow
            engine.submit(JobSpec(job_id, now, 1, 0.5), LaunchSpec(job_id, None, None, 0.5))
        engine.start()
        engine.run_until(lambda: all(j.state is JobState.FINISHED for j in engine.core.jobs.values()), timeout=30)
    finally:
        engine.stop()
        backend.close()
        clock.close()
    quick = engine.core.jobs["quick"]
    # quick ran its 0.5 s while slow was being spawned: its end is seen after that, not before
    assert quick.end_time - quick.first_start >= 0.5
