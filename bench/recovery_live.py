"""Automatic recovery of a live training job, phase by phase (issue 20).

    python bench/recovery_live.py [--runs 1] [--hang-s 30] [--iters 20] [--json OUT]

The scenario of tests/test_recovery_e2e.py, timed: a 4-process `loom run` job of the example GPT
(deterministic mode, a checkpoint every 4 iterations) on 4 of 5 emulated 1-GPU nodes (the fifth a
hot spare) under the local backend and the live engine with the core's recovery pipeline. Once
it has logged 9 iterations, the node of rank 2 breaks (`make_faulty(..., "hang")`: its worker
freezes inside a collective). Per run, from the backend's event times (wall clock):

  detect    fault → JobFailed (the hang watchdog: no progress for --hang-s)
  diagnose  JobFailed → JobDiagnosed (the log of the failed incarnation; the embedding model
            loads on the first diagnosis that needs retrieval)
  localise  JobDiagnosed → FaultsLocalized (two rounds of pairwise all-gathers, one agent per node)
  restart   FaultsLocalized → the job runs again on the spare (JobStarted)
  lost      iterations run again after the restore (logged before the fault, after the checkpoint)

and whether the final loss curve equals an uninterrupted run's (bit for bit).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from benchinfo import machine

from loom.core.events import FaultsLocalized, JobDiagnosed, JobFailed, JobStarted
from loom.core.jobs import JobState
from loom.core.recovery import RecoveryConfig
from loom.service.backends.inventory import emulated
from loom.service.backends.local import LocalBackend
from loom.service.backends.runs import current_workdir
from loom.service.clock import WallClock
from loom.service.engine import LiveEngine
from loom.service.specs import LaunchSpec
from loom.service.testing import loss_curve
from loom.workload.job import JobSpec

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "jobs" / "gpt_train.py"


def baseline(root: Path, args: list[str]) -> dict[int, float]:
    subprocess.run([sys.executable, "-m", "loom.cli.main", "run", "--runtime-dir", str(root / "rt"), "--job-id",
                    "base", "--workdir", str(root / "w"), "--nproc", "1", "--logical-world", "4", "--deterministic",
                    str(EXAMPLE), "--", *args], check=True, capture_output=True)
    return loss_curve(root / "w" / "loss.jsonl")


def one_run(root: Path, args: list[str], hang_s: float, expected: dict[int, float]) -> dict:
    clock = WallClock()
    backend = LocalBackend(emulated(5, 1), root=root, clock=clock, poll_s=0.05, grace_s=20.0, hang_s=hang_s)
    events: list = []
    recovery = RecoveryConfig(detection_s=0.0, diagnosis_s=0.0, localisation_round_s=0.0, spares_per_minipod=1)
    engine = LiveEngine(backend, "fcfs", "first-fit", clock=clock, round_interval=0.5, recovery=recovery,
                        on_event=events.append)
    engine.start()
    try:
        engine.submit(JobSpec("gpt", clock.now(), 4, 60.0), LaunchSpec(
            "gpt", (str(EXAMPLE), *args, "--step-delay", "0.3"), None, 60.0,
            (("LOOM_CHECKPOINT_INTERVAL", "4"), ("LOOM_DETERMINISTIC", "1")))).result(timeout=10)
        job = engine.core.jobs["gpt"]
        log = current_workdir(backend.layout, "gpt") / "loss.jsonl"
        engine.run_until(lambda: log.exists() and len(log.read_text().splitlines()) >= 9, timeout=300)
        names = engine.core.topology.node_names
        broken = job.allocation.nodes[2]
        logged = len(log.read_text().splitlines())
        fault = clock.now()
        backend.make_faulty(names[broken], "hang")
        engine.run_until(lambda: job.state is JobState.FINISHED, timeout=900)
    finally:
        engine.stop()
        backend.close()
        clock.close()

    def first(kind: type, after: float) -> float:
        return next(e.at for e in events if isinstance(e, kind) and e.at >= after)

    failed = first(JobFailed, fault)
    diagnosed, localised = first(JobDiagnosed, failed), first(FaultsLocalized, failed)
    restarted = first(JobStarted, localised)
    found = next(e for e in events if isinstance(e, FaultsLocalized))
    curve = loss_curve(log)
    ran = len(log.read_text().splitlines())
    return {"detect_s": failed - fault, "diagnose_s": diagnosed - failed, "localise_s": localised - diagnosed,
            "restart_s": restarted - localised, "total_s": restarted - fault,
            "found": [names[n] for n in found.faulty], "broken": names[broken],
            "iterations_run_again": ran - len(curve), "logged_before_fault": logged,
            "same_curve": curve == expected, "diagnosis": job.diagnosis}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--hang-s", type=float, default=30.0)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    job_args = ["--iters", str(args.iters), "--layers", "1", "--d-model", "32"]
    with tempfile.TemporaryDirectory() as tmp:
        expected = baseline(Path(tmp) / "base", job_args)
        rows = []
        for k in range(args.runs):
            rows.append(one_run(Path(tmp) / f"run{k}", job_args, args.hang_s, expected))
            print(f"run {k + 1}: {rows[-1]}", file=sys.stderr, flush=True)
    from datetime import UTC, datetime

    from loom.run import git_commit

    print(f"Command: `python bench/recovery_live.py {' '.join(sys.argv[1:])}`; {datetime.now(UTC):%Y-%m-%d %H:%M} UTC; "
          f"{machine()}; commit {(git_commit() or 'unknown')[:10]}\n")
    print("| run | detect s | diagnose s | localise s | restart s | fault → running again s | faulty found "
          "| iterations run again | same loss curve |")
    print("| :--- | ---: | ---: | ---: | ---: | ---: | :--- | ---: | :---: |")
    for k, r in enumerate(rows, 1):
        print(f"| {k} | {r['detect_s']:.1f} | {r['diagnose_s']:.1f} | {r['localise_s']:.1f} | {r['restart_s']:.1f} "
              f"| {r['total_s']:.1f} | {', '.join(r['found'])} (broken: {r['broken']}) | "
              f"{r['iterations_run_again']} | {'yes' if r['same_curve'] else 'NO'} |")
    if len(rows) > 1:
        print(f"| median | {statistics.median(r['detect_s'] for r in rows):.1f} | "
              f"{statistics.median(r['diagnose_s'] for r in rows):.1f} | "
              f"{statistics.median(r['localise_s'] for r in rows):.1f} | "
              f"{statistics.median(r['restart_s'] for r in rows):.1f} | "
              f"{statistics.median(r['total_s'] for r in rows):.1f} | | | |")
    print(f"\nhang watchdog {args.hang_s:g} s; diagnosis: {rows[0]['diagnosis']}")
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "hang_s": args.hang_s}, indent=1))
    return 0 if all(r["same_curve"] and r["found"] == [r["broken"]] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
