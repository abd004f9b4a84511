"""Training templates, third set: how a cluster reports a lost node or link, and a clean exit.

A node that dies takes its ranks with it silently; what names the cause is the cluster's own
record, appended by the job wrapper or printed by the launcher: the BMC's event log (power lost),
the kernel's last words on a serial console (machine check, panic), pdsh/ssh failing to reach the
node, Slurm's controller marking it down. The peers' NCCL errors come first in time and must not
win. Also NVLink5 Xids (144-150) on the GPU side, a CUDA error at start-up followed by the
scheduler requeueing the job, and healthy runs whose exit is noisy but clean.

Registered by importing (loom/diagnosis/corpus.py imports this module at its end).
"""

from __future__ import annotations

from loom.diagnosis import scenarios as sc
from loom.diagnosis.corpus import HEALTHY, _bad, template
from loom.diagnosis.corpus_train2 import _hang, _kernel, _xid
from loom.diagnosis.logsim import Ctx, routine_steps, start_job, train_steps


def _iso(c: Ctx) -> str:
    return c.clock.strftime("%Y-%m-%dT%H:%M:%S")


def _peers_lose(c: Ctx, bad_node: int) -> list[int]:
    """The ranks of the other nodes see their peers vanish: NCCL remote errors or, later, watchdogs."""
    others = [r for r in range(c.world) if r // 8 != bad_node] or [r for r in range(c.world) if r % 8]
    if c.rng.random() < 0.6:
        sc.remote_exits(c, others)
    else:
        sc.watchdogs(c, others[: c.rng.randrange(1, len(others) + 1)])
    return others


def _launcher_loses(c: Ctx, bad_node: int) -> None:
    """pdsh (DeepSpeed's multi-node runner) or torchrun reports the lost node's ranks."""
    host = c.hosts[bad_node]
    if c.rng.random() < 0.5:
        c.add_root(f"pdsh@{c.hosts[0]}: {host}: ssh exited with exit code 255")
        c.add(f"[{c.ts()}] [INFO] [launch.py:{c.rng.choice((319, 348))}:sigkill_handler] Killing subprocess "
              f"{c.pids[bad_node * 8]}")
    else:
        sc.torchrun_summary(c, min(c.world - 1, bad_node * 8), -9)


# ------------------------------------------------------------------------ node loss ----
@template("node-bmc-power-loss", "NodeFailure", "train")
def _node_power(c: Ctx) -> None:
    """A node loses power; the peers' errors come first, the wrapper appends the BMC's event log."""
    start_job(c, routine_steps(c))
    bad_node = c.rng.randrange(len(c.hosts))
    host = c.hosts[bad_node]
    c.tick(10)
    when = c.clock
    _peers_lose(c, bad_node)
    _launcher_loses(c, bad_node)
    c.add(f"===== ipmitool -H {host}-bmc sel list (last 3) =====")
    stamp = when.strftime("%m/%d/%Y | %H:%M:%S")
    psu = c.rng.randrange(1, 3)
    event = c.rng.choice((f"Power Supply PS{psu} | Power Supply AC lost | Asserted",
                          f"Power Supply PS{psu} | Failure detected | Asserted",
                          "Power Unit #0x01 | Power off/down | Asserted",
                          "System ACPI Power State #0x0 | S5/G2: soft-off | Asserted"))
    c.add_root(f"  {c.rng.randrange(0x100, 0xfff):x} | {stamp} | {event}")
    c.add(f"  {c.rng.randrange(0x100, 0xfff):x} | {stamp} | Power Supply PS{3 - psu} | Presence detected | Asserted")
    if c.rng.random() < 0.5:
        c.add_root(f"[{_iso(c)}] [node-health] {host}: BMC reports chassis power is off (last power event: "
                   "ac-failed); node marked unhealthy")


@template("node-mce-panic", "NodeFailure", "train")
def _node_mce(c: Ctx) -> None:
    """A fatal machine check panics a node's kernel; its serial console is appended after the peers' errors."""
    start_job(c, routine_steps(c))
    bad_node = c.rng.randrange(len(c.hosts))
    c.tick(10)
    _peers_lose(c, bad_node)
    _launcher_loses(c, bad_node)
    c.add(f"===== console log of {c.hosts[bad_node]} (conman) =====")
    cpu, bank = c.rng.randrange(0, 96), c.rng.randrange(0, 24)
    style = c.rng.choice(("syslog", "dmesg"))
    _kernel(c, bad_node * 8, f"mce: [Hardware Error]: CPU {cpu}: Machine Check Exception: 5 Bank {bank}: "
                             f"{c.rng.getrandbits(64):016x}", style=style)
    _kernel(c, bad_node * 8, f"mce: [Hardware Error]: RIP !INEXACT! 10:<{c.rng.getrandbits(48):016x}>", root=False,
            style=style)
    _kernel(c, bad_node * 8, c.rng.choice(("Kernel panic - not syncing: Fatal machine check",
                                           ("Kernel panic - not syncing: Timeout: Not all CPUs entered broadcast "
                                           "exception handler"))), style=style)


@template("node-slurm-not-responding", "NodeFailure", "train")
def _node_slurmd(c: Ctx) -> None:
    """slurmd on one node stops answering; Slurm kills the step; srun reports the node failure."""
    start_job(c, routine_steps(c))
    bad_node = c.rng.randrange(len(c.hosts))
    host, job = c.hosts[bad_node], c.rng.randrange(10**5, 10**7)
    c.tick(60)
    _peers_lose(c, bad_node)
    c.add_root(c.rng.choice((f"srun: error: Node failure on {host}",
                             f"[{_iso(c)}.{c.rng.randrange(1000):03d}] error: Nodes {host} not responding",
                             (f"[{_iso(c)}] [cluster-monitor] {host}: slurmd not responding for 300s, state "
                             "DOWN+NOT_RESPONDING"))))
    c.add(f"slurmstepd: error: *** STEP {job}.0 ON {c.hosts[0]} CANCELLED AT {_iso(c)} ***")
    c.add("srun: Job step aborted: Waiting up to 32 seconds for job step to finish.")
    for n, h in enumerate(c.hosts):
        if n != bad_node:
            c.add(f"srun: error: {h}: tasks {n * 8}-{n * 8 + 7}: Killed")


# ------------------------------------------------------------------------ GPU side ----
_NVLINK5 = {144: "NVLINK: SAW_MVB Fatal error detected, Link {l} (0x00000021 0x00000002 0x0 0x0 0x0 0x0 0x0)",
            145: "NVLINK: RLW_SRC_TRACK Fatal error detected, Link {l} (0x00000062 0x00000010 0x0 0x0 0x0 0x0 0x0)",
            146: "NVLINK: TLW_RX_PIPE0 Fatal error detected, Link {l} (0x00000083 0x00000004 0x0 0x0 0x0 0x0 0x0)",
            149: "NETIR_LINK_EVT Fatal error detected on link {l} (0x00000006 0x00000000 0x0 0x0 0x0 0x0 0x0)",
            150: "NVLINK: MSE Error detected, Link {l} (0x00000009 0x80000000 0x0 0x0 0x0 0x0 0x0)"}


@template("nvlink5-xid-hang", "NVLinkError", "train")
def _nvlink5(c: Ctx) -> None:
    """A Blackwell NVLink fault reported only as an Xid 144-150 (and 154); NCCL hangs on that link."""
    start_job(c, routine_steps(c))
    bad, code = _bad(c), c.rng.choice(sorted(_NVLINK5))
    style = c.rng.choice(("syslog", "journal", "dmesg"))
    c.tick(20)
    _xid(c, bad, code, _NVLINK5[code].format(l=c.rng.randrange(18)), style=style)
    if c.rng.random() < 0.6:
        _xid(c, bad, 154, "GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)", root=False,
             style=style)
    train_steps(c, c.rng.randrange(0, 3))
    _hang(c, bad)


@template("cuda-busy-requeued", "CUDAError", "train")
def _cuda_busy(c: Ctx) -> None:
    """A stale process holds a GPU in exclusive mode; the new job's rank fails at start-up, Slurm requeues it."""
    start_job(c, 0)
    bad, job = _bad(c), c.rng.randrange(10**5, 10**7)
    c.merge([sc.traceback(c, bad, "init", [c.rng.choice((
        "RuntimeError: CUDA error: CUDA-capable device(s) is/are busy or unavailable",
        "torch.AcceleratorError: CUDA error: all CUDA-capable devices are busy or unavailable"))])])
    sc.sigterms(c, c.other_ranks(bad))
    sc.torchrun_summary(c, bad)
    c.add(f"srun: error: {c.host(bad)}: task {bad}: Exited with exit code 1")
    c.tick(30)
    c.add(c.rng.choice(((f"slurmstepd: error: *** JOB {job} ON {c.hosts[0]} CANCELLED AT {_iso(c)} DUE TO JOB "
                        f"REQUEUE ***"),
                        f"[{_iso(c)}] [epilog] {c.host(bad)}: job {job} requeued (JobRequeue=1, Restarts=1)",
                        f"sbatch: job {job} requeued, held until resources are available")))


# ---------------------------------------------------------------------- healthy runs ----
@template("healthy-noisy-exit", HEALTHY, "train")
def _healthy_exit(c: Ctx) -> None:
    """A run that finishes: retried tracker uploads, a warning at teardown, an exception ignored at exit."""
    start_job(c, routine_steps(c) // 2)
    for _ in range(c.rng.randrange(1, 4)):
        c.add(f"{c.p(0)}wandb: Network error ({c.rng.choice(('ConnectionError', 'ReadTimeout'))}), entering retry "
              "loop.")
        train_steps(c, c.rng.randrange(20, 200))
    c.add(f"{c.p(0)}[after training is done] datetime: {c.ts()[:19]} ")
    streams = []
    for r in range(c.world):
        s = [((f"{c.p(r)}[W{c.clock.strftime('%m%d %H:%M:%S')}.000000 {c.pids[r]} ProcessGroupNCCL.cpp:1250] Warning: "
              "WARNING: process group has NOT been destroyed before we destruct ProcessGroupNCCL. On normal program "
              "exit, the application should call destroy_process_group to ensure that any pending NCCL operations "
              "have finished in this process."), False)]
        if c.rng.random() < 0.3:
            s += [((f"{c.p(r)}Exception ignored in: <function _MultiProcessingDataLoaderIter.__del__ at "
                   f"0x7f{c.rng.getrandbits(40):010x}>"), False),
                  (f"{c.p(r)}Traceback (most recent call last):", False),
                  ((f'{c.p(r)}  File "/usr/local/lib/python3.10/dist-packages/torch/utils/data/dataloader.py", line '
                   "1479, in __del__"), False),
                  (f"{c.p(r)}    self._shutdown_workers()", False),
                  ((f"{c.p(r)}AttributeError: '_MultiProcessingDataLoaderIter' object has no attribute "
                   "'_workers_status'"), False)]
        streams.append(s)
    c.merge(streams)
    c.add(f"{c.p(0)}wandb: Synced {c.run}: https://wandb.ai/acme/{c.model}/runs/{c.rng.getrandbits(32):08x}")
    c.add(f"{c.glog('I')} torch/distributed/elastic/agent/server/api.py:{c.rng.choice((889, 902))}] [default] "
          "worker group successfully finished. Waiting 300 seconds for other agents to finish.")
    if c.rng.random() < 0.5:
        c.add(f"[{_iso(c)}] [job-wrapper] {c.run} exited with code 0")
