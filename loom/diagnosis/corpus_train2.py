"""Training templates, second set: failure phrasings from production clusters the first set lacks.

Kernel and syslog-forwarded hardware reports with no Python traceback, DCGM and fabric-manager
alerts, hangs seen only through heartbeat monitors, socket- and verbs-level network errors,
scheduler-side node loss, object-store throttling, host and device OOM in other wordings, and
framework, script and divergence errors as other frameworks print them.

Registered by importing (loom/diagnosis/corpus.py imports this module at its end).
"""

from __future__ import annotations

from collections.abc import Sequence

from loom.diagnosis import scenarios as sc
from loom.diagnosis.corpus import HEALTHY, _bad, _everyone_fails, _fault_mid_run, template
from loom.diagnosis.logsim import Ctx, routine_steps, start_job, train_steps

_PKG = "/usr/local/lib/python3.10/dist-packages"
_CUDA_HINT = ("CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below "
              "might be incorrect.")
_NCCL_ERR = ("torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:"
             "1691, {what}, NCCL version 2.20.5")


# -- helpers -----------------------------------------------------------------------------------
def _kernel(c: Ctx, rank: int, text: str, *, root: bool = True, style: str | None = None) -> None:
    """A kernel message of `rank`'s node as a job wrapper forwards it (syslog, journald or dmesg -T)."""
    style = style or c.rng.choice(("syslog", "journal", "dmesg"))
    up = f"[{c.rng.uniform(1e5, 9e6):12.6f}]"
    head = {"syslog": f"{c.clock.strftime('%b %d %H:%M:%S')} {c.host(rank)} kernel: {up} ",
            "journal": f"{c.clock.strftime('%Y-%m-%dT%H:%M:%S')}.{c.clock.microsecond:06d}+08:00 {c.host(rank)} "
                       "kernel: ",
            "dmesg": f"[{c.clock.strftime('%a %b %d %H:%M:%S %Y')}] "}[style]
    (c.add_root if root else c.add)(head + text)


def _bus(rank: int) -> str:
    return f"0000:{0x18 + (rank % 8) * 0x10:02x}:00"


def _xid(c: Ctx, rank: int, code: int, text: str, *, root: bool = True, style: str | None = None) -> None:
    name = c.rng.choice(("python3", "pt_main_thread", "python"))
    _kernel(c, rank, f"NVRM: Xid (PCI:{_bus(rank)}): {code}, pid={c.pids[rank]}, name={name}, {text}", root=root,
            style=style)


def _hang(c: Ctx, bad: int, *, secondary: bool = True) -> None:
    """`bad` stops answering: the others time out in their collective, the agent kills everything."""
    others = c.other_ranks(bad)
    if secondary:
        sc.watchdogs(c, others)
    sc.sigterms(c, others[: c.rng.randrange(1, len(others) + 1)])
    sc.torchrun_summary(c, others[0], -6)


def _exc_lines(c: Ctx, rank: int, lines: Sequence[str], *, root_first: bool = True) -> sc.Stream:
    return [(f"{c.p(rank)}{x}", root_first and i == 0) for i, x in enumerate(lines)]


# ------------------------------------------------------------- GPU: kernel-only reports ----
_GPU_XIDS = {79: "GPU has fallen off the bus.",
             119: "Timeout after 6s of waiting for RPC response from GPU{g} GSP! Expected function 76 (GSP_RM_CONTROL) "
                  "(0x20800a4c 0x4).",
             120: "GSP task timeout @ pc:0x{pc:x}, task: 1",
             62: "0000({pc:x}) 00000000 00000000",
             61: "0cec({pc:x}) 00000000 00000000"}


@template("xid-kernel-only-hang", "CUDAError", "train")
def _xid_hang(c: Ctx) -> None:
    """A GPU fault reported only by the kernel log; the rank hangs silently and its peers time out."""
    start_job(c, routine_steps(c))
    bad, code = _bad(c), c.rng.choice(sorted(_GPU_XIDS))
    style = c.rng.choice(("syslog", "journal", "dmesg"))
    c.tick(20)
    _xid(c, bad, code, _GPU_XIDS[code].format(g=bad % 8, pc=c.rng.randrange(1 << 20, 1 << 28)), style=style)
    if code == 79:
        _kernel(c, bad, f"NVRM: GPU {_bus(bad)}.0: GPU has fallen off the bus.", style=style)
        _kernel(c, bad, f"NVRM: GPU {_bus(bad)}.0: RmInitAdapter failed! (0x26:0x65:1474)", root=False, style=style)
    train_steps(c, c.rng.randrange(0, 3))
    _hang(c, bad)


@template("xid-mmu-fault-appended", "CUDAError", "train")
def _xid_mmu(c: Ctx) -> None:
    """An illegal address in the process; the wrapper appends the node's MMU-fault or channel-reset Xid."""
    start_job(c, routine_steps(c))
    bad = _bad(c)
    msg = c.rng.choice(("CUDA error: an illegal memory access was encountered", "CUDA error: misaligned address",
                        "CUDA error: an illegal instruction was encountered"))
    sc.single_rank_fault(c, bad, [f"{c.rng.choice(('RuntimeError', 'torch.AcceleratorError'))}: {msg}", _CUDA_HINT])
    if c.rng.random() < 0.5:
        _xid(c, bad, 31, f"Ch 0000000{c.rng.randrange(8)}, intr 10000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_"
                         f"{c.rng.randrange(8)} faulted @ 0x7f{c.rng.getrandbits(32):08x}_00000000. Fault is of type "
                         "FAULT_PDE ACCESS_TYPE_VIRT_READ")
    else:
        _xid(c, bad, 43, f"Ch 000000{c.rng.randrange(16, 99)}")


_ECC_XIDS = {48: "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition "
                 "{a}, subpartition {b}.",
             94: "Contained: SM (0x1). RST: No, D-RST: No",
             95: "Uncontained: FBHUB. RST: Yes, D-RST: No",
             92: "High single-bit ECC error rate",
             64: "Row Remapper Error: failed to remap row, remapping table full ({a}, {b})"}


@template("ecc-xid-syslog", "ECCError", "train")
def _ecc_xid(c: Ctx) -> None:
    """A memory error Xid forwarded from syslog, then the process's CUDA error or a silent hang."""
    start_job(c, routine_steps(c))
    bad, code = _bad(c), c.rng.choice(sorted(_ECC_XIDS))
    c.tick(5)
    _xid(c, bad, code, _ECC_XIDS[code].format(a=c.rng.randrange(8), b=c.rng.randrange(2)))
    if code in (94, 95):
        _xid(c, bad, 63, "Row Remapper: New row marked for remapping, reset gpu to activate.")
    if c.rng.random() < 0.5:
        sc.single_rank_fault(c, bad, ["RuntimeError: CUDA error: uncorrectable ECC error encountered", _CUDA_HINT])
    else:
        _hang(c, bad)


@template("nvlink-dcgm-health", "NVLinkError", "train")
def _nvlink_dcgm(c: Ctx) -> None:
    """DCGM's health watch reports an NVLink fault; NCCL hangs on the ring through that link."""
    start_job(c, routine_steps(c))
    bad = _bad(c)
    link, g = c.rng.randrange(18), bad % 8
    c.tick(30)
    stamp = c.ts()
    err = c.rng.choice((f"DCGM_FR_NVLINK_DOWN: GPU {g}'s NvLink link {link} is currently down",
                        f"DCGM_FR_NVLINK_ERROR_CRITICAL: Detected {c.rng.randrange(2, 90)} NvLink replay errors on "
                        f"GPU {g}'s link {link} which exceeds threshold of 1"))
    c.add_root(f"[{stamp}] [dcgm-health] {c.host(bad)} GPU {g}: DCGM_HEALTH_WATCH_NVLINK FAIL - {err}")
    c.add(f"[{stamp}] [dcgm-health] {c.host(bad)} GPU {g}: DCGM_HEALTH_WATCH_MEM PASS")
    _hang(c, bad)


@template("nvlink-nvswitch-fabric", "NVLinkError", "train")
def _nvlink_fabric(c: Ctx) -> None:
    """NVSwitch SXid and the fabric manager's fatal report; NCCL fails with a CUDA error on the node."""
    start_job(c, routine_steps(c))
    bad = _bad(c)
    sw, port, sxid = c.rng.randrange(6), c.rng.randrange(64), c.rng.choice((24007, 12028, 20034, 19084))
    c.tick(10)
    _kernel(c, bad, f"nvidia-nvswitch{sw}: SXid (PCI:0000:{0x84 + sw:02x}:00.0): {sxid}, Fatal, Link {port} "
                    "sourcetrack timeout error (First)")
    _kernel(c, bad, f"nvidia-nvswitch{sw}: SXid (PCI:0000:{0x84 + sw:02x}:00.0): {sxid}, Severity 1 Engine instance "
                    f"{port} Sub-engine instance 00", root=False)
    c.add_root(f"[{c.ts()}] [ERROR] [tid {c.rng.randrange(1000, 9999)}] fabricmanager: detected NVSwitch fatal error "
               f"{sxid} on fid 0 switch id {sw} link {port}; NVLink training failed, partition 0 degraded")
    h, pid = c.host(bad), c.pids[bad]
    c.add(f"{c.p(bad)}{h}:{pid}:{pid + 77} [{bad % 8}] enqueue.cc:1218 NCCL WARN Cuda failure 'unspecified launch "
          "failure'")
    sc.single_rank_fault(c, bad, [_NCCL_ERR.format(what="unhandled cuda error (run with NCCL_DEBUG=INFO for details)"),
                                  "ncclUnhandledCudaError: Call to CUDA function failed."])


@template("pcie-aer-fatal", "CUDAError", "train")
def _pcie_aer(c: Ctx) -> None:
    """An uncorrected PCIe error on the GPU's link (kernel AER report); the process sees an unknown CUDA error."""
    start_job(c, routine_steps(c))
    bad = _bad(c)
    port = f"0000:{0x17 + (bad % 8) * 0x10:02x}:01.0"
    c.tick(8)
    _kernel(c, bad, f"pcieport {port}: AER: Uncorrected (Fatal) error received: {_bus(bad)}.0")
    _kernel(c, bad, f"nvidia {_bus(bad)}.0: PCIe Bus Error: severity=Uncorrected (Fatal), type=Transaction Layer, "
                    "(Receiver ID)")
    _kernel(c, bad, f"nvidia {_bus(bad)}.0:   device [10de:2330] error status/mask=00040000/00180000", root=False)
    sc.single_rank_fault(c, bad, [c.rng.choice(("RuntimeError: CUDA error: unknown error",
                                                "RuntimeError: CUDA driver error: unknown error")), _CUDA_HINT])


# -------------------------------------------------------------------- network / hangs ----
@template("nccl-heartbeat-monitor-dump", "NCCLTimeout", "train")
def _heartbeat(c: Ctx) -> None:
    """A collective hangs inside NCCL; torch's heartbeat monitor, not the watchdog, takes the ranks down."""
    start_job(c, routine_steps(c))
    c.tick(600)
    ranks = sorted(c.rng.sample(range(c.world), k=c.rng.randrange(2, c.world + 1)))
    stuck = c.rng.choice((480, 600))
    streams = []
    for r in ranks:
        g = f"{c.p(r)}[{c.glog('E')} ProcessGroupNCCL.cpp:{c.rng.choice((1316, 1423))}] [PG 0 Rank {r}]"
        streams.append([(f"{g} Heartbeat monitor timed out! Process will be terminated after dumping debug info. "
                         "workMetaList_.size()=1", True),
                        (f"{g} ProcessGroupNCCL's watchdog got stuck for {stuck} seconds without making progress in "
                         "monitoring enqueued collectives. This typically indicates a NCCL/CUDA API hang blocking the "
                         "watchdog, and could be triggered by another thread holding the GIL inside a CUDA api, or "
                         "other deadlock-prone behaviors.", False),
                        (f"{c.p(r)}[{c.glog('F')} ProcessGroupNCCL.cpp:1161] [PG 0 Rank {r}] [PG 0 Rank {r}] "
                         "Terminating the process after attempting to dump debug info, due to ProcessGroupNCCL "
                         "watchdog hang.", False)])
    c.merge(streams)
    sc.torchrun_summary(c, ranks[0], -6)


@template("straggler-ft-heartbeat", "NCCLTimeout", "train")
def _straggler(c: Ctx) -> None:
    """Straggler detection flags a rank, then the fault-tolerance launcher's heartbeat timeout kills the job."""
    start_job(c, routine_steps(c))
    bad = _bad(c)
    for _ in range(c.rng.randrange(1, 4)):
        c.tick(60)
        c.add(f"[NeMo W {c.ts()[:19]} straggler_det_callback:216] Straggler report: GPU relative performance: "
              f"rank {bad}: {c.rng.uniform(0.05, 0.4):.2f} (min), individual GPU performance: rank {bad}: "
              f"{c.rng.uniform(0.05, 0.4):.2f}")
    c.tick(900)
    timeout = c.rng.choice((600.0, 900.0, 1800.0))
    c.add_root(f"[{c.ts()}] [ERROR] [ft_launcher] rank {bad} ({c.host(bad)}): no heartbeat received for "
               f"{timeout:.1f} s (timeout {timeout:.0f} s): training appears hung, terminating workers")
    c.add_root(f"[NeMo E {c.ts()[:19]} straggler_det_callback:240] Detected stragglers, stopping the run: rank {bad}")
    sc.sigterms(c, range(c.world))
    sc.torchrun_summary(c, bad, -15)


@template("gloo-recv-timeout", "NCCLTimeout", "train")
def _gloo_timeout(c: Ctx) -> None:
    """A CPU-side (gloo) barrier or object collective never completes on the ranks waiting for a hung peer."""
    start_job(c, routine_steps(c))
    bad = _bad(c)
    c.tick(1800)
    ms = c.rng.choice((1800000, 600000))
    site = c.rng.choice(("unbound_buffer.cc:81] Timed out waiting {ms}ms for recv operation to complete",
                         "unbound_buffer.cc:133] Timed out waiting {ms}ms for send operation to complete"))
    streams = [[(f"{c.p(r)}[E ProcessGroupGloo.cpp:138] Rank {r} successfully reached monitoredBarrier, but "
                 f"received errors while waiting for send/recv from rank {bad}.", False)]
               + _exc_lines(c, r, [f"RuntimeError: [/opt/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/"
                                   f"{site.format(ms=ms)}"])
               for r in c.other_ranks(bad)[: c.rng.randrange(2, c.world)]]
    c.merge(streams)
    sc.sigterms(c, [bad])
    sc.torchrun_summary(c, (bad + 1) % c.world)


@template("nccl-socket-closed", "NCCLRemoteError", "train")
def _nccl_socket(c: Ctx) -> None:
    """NCCL over TCP sockets (no IB): a peer connection closes mid-collective."""
    start_job(c, routine_steps(c))
    bad = _bad(c)
    peer = (bad + 8) % c.world
    h, pid = c.host(bad), c.pids[bad]
    c.tick(3)
    c.add_root(f"{c.p(bad)}{h}:{pid}:{pid + 212} [{bad % 8}] misc/socket.cc:{c.rng.choice((49, 538))} NCCL WARN "
               f"socketProgress: Connection closed by remote peer {c.host(peer)}<{c.rng.randrange(30000, 60000)}>")
    c.add(f"{c.p(bad)}{h}:{pid}:{pid + 212} [{bad % 8}] NCCL INFO misc/socket.cc:752 -> 6")
    c.add(f"{c.p(bad)}{h}:{pid}:{pid + 212} [{bad % 8}] NCCL INFO transport/net_socket.cc:474 -> 6")
    exc = [_NCCL_ERR.format(what="remote process exited or there was a network error"),
           "ncclRemoteError: A call failed possibly due to a network error or a remote process exiting prematurely.",
           f"Last error: socketProgress: Connection closed by remote peer {c.host(peer)}<{c.rng.randrange(30000, 60000)}>"]
    c.merge([sc.traceback(c, r, "step", exc, root=False) for r in (bad, peer)])
    sc.sigterms(c, c.other_ranks(bad))
    sc.torchrun_summary(c, bad)


@template("ib-retry-exceeded", "NCCLRemoteError", "train")
def _ib_retry(c: Ctx) -> None:
    """An InfiniBand link flaps: the NIC reports link down, verbs completions fail with retry-exceeded."""
    start_job(c, routine_steps(c))
    bad = _bad(c)
    dev = c.rng.randrange(8)
    c.tick(2)
    if c.rng.random() < 0.6:
        _kernel(c, bad, f"mlx5_core 0000:{0x1a + dev * 0x10:02x}:00.0 ib{dev}: Link down")
    h, pid = c.host(bad), c.pids[bad]
    c.add_root(f"{c.p(bad)}{h}:{pid}:{pid + 55} [{bad % 8}] transport/net_ib.cc:{c.rng.choice((1346, 1696))} NCCL WARN "
               f"NET/IB : Got completion from peer {c.ip((bad + 8) % c.world)}<{c.rng.randrange(30000, 60000)}> with "
               "status=IBV_WC_RETRY_EXC_ERR(12) opcode=RDMA_WRITE len=0 vendor err 129 (Send)")
    c.add_root(f"{c.p(bad)}{h}:{pid}:{pid + 55} [{bad % 8}] NCCL WARN NET/IB : ibv_poll_cq returned error: transport "
               f"retry counter exceeded on mlx5_{dev}:1")
    exc = [_NCCL_ERR.format(what="remote process exited or there was a network error"),
           "ncclRemoteError: A call failed possibly due to a network error or a remote process exiting prematurely."]
    c.merge([sc.traceback(c, r, "step", exc, root=False) for r in (bad, (bad + 8) % c.world)])
    if c.rng.random() < 0.5:
        sc.watchdogs(c, c.other_ranks(bad)[:4])
    sc.sigterms(c, c.other_ranks(bad))
    sc.torchrun_summary(c, bad)


# ------------------------------------------------------------------------ node loss ----
@template("node-slurm-sacct", "NodeFailure", "train")
def _node_sacct(c: Ctx) -> None:
    """A node dies without a word; the peers hang; the wrapper appends slurmctld's and sacct's view."""
    start_job(c, routine_steps(c))
    bad_node = c.rng.randrange(len(c.hosts))
    host, job = c.hosts[bad_node], c.rng.randrange(10**5, 10**7)
    others = [r for r in range(c.world) if r // 8 != bad_node] or [0]
    c.tick(300)
    c.add_root(f"[{c.clock.strftime('%Y-%m-%dT%H:%M:%S')}.{c.rng.randrange(1000):03d}] slurmctld: error: Nodes "
               f"{host} not responding, setting DOWN")
    sc.watchdogs(c, others[: c.rng.randrange(1, len(others) + 1)])
    c.add(f"===== sacct -j {job} --format=JobID,State,ExitCode,NodeList =====")
    c.add_root(f"{job}                NODE_FAIL      0:0  {host}")
    c.add(f"{job}.batch          CANCELLED     0:15  {c.hosts[0]}")
    c.add(f"{job}.0              NODE_FAIL      1:0  {','.join(c.hosts)}")


@template("node-k8s-preempted", "NodeFailure", "train")
def _node_preempted(c: Ctx) -> None:
    """Kubernetes preempts or evicts one worker pod; its ranks get SIGTERM, the others lose their peer."""
    start_job(c, routine_steps(c))
    bad_node = c.rng.randrange(len(c.hosts))
    pod = f"{c.run}-worker-{bad_node}"
    c.tick(20)
    c.add_root(c.rng.choice((
        f"[{c.ts()}] [training-operator] PyTorchJob default/{c.run}: pod {pod} was preempted: Preempted in order to "
        "admit critical pod",
        f"[{c.ts()}] [training-operator] PyTorchJob default/{c.run}: pod {pod} evicted (DisruptionTarget: "
        "TerminationByKubelet): node is shutting down")))
    for r in range(bad_node * 8, min(c.world, bad_node * 8 + 8)):
        c.add(f"{c.p(r)}torch.distributed.elastic.multiprocessing.api.SignalException: Process {c.pids[r]} got "
              "signal: 15")
    others = [r for r in range(c.world) if r // 8 != bad_node] or [0]
    sc.remote_exits(c, others)
    sc.torchrun_summary(c, others[0])


@template("node-elastic-keepalive", "NodeFailure", "train")
def _node_keepalive(c: Ctx) -> None:
    """The node hosting the rendezvous store is lost: every other agent fails its keep-alive heartbeat."""
    start_job(c, routine_steps(c))
    rdzv = f"{c.run}-rdzv"
    c.tick(30)
    for n in range(1, len(c.hosts)):
        c.add_root(f"{c.glog('W')} torch/distributed/elastic/rendezvous/dynamic_rendezvous.py:{c.rng.choice((688, 1139))}"
                   f"] The node '{c.hosts[n]}_{c.pids[n * 8]}_0' has failed to send a keep-alive heartbeat to the "
                   f"rendezvous '{rdzv}' due to an error of type RendezvousConnectionError.")
    if len(c.hosts) == 1:
        c.add_root(f"{c.glog('W')} torch/distributed/elastic/rendezvous/dynamic_rendezvous.py:688] The node "
                   f"'{c.hosts[0]}_{c.pids[0]}_0' has failed to send a keep-alive heartbeat to the rendezvous "
                   f"'{rdzv}' due to an error of type RendezvousConnectionError.")
    for r in c.rng.sample(range(c.world), k=min(4, c.world)):
        c.add(f"{c.p(r)}[W socket.cpp:{c.rng.choice((428, 663))}] [c10d] sendBytes failed on SocketImpl(fd="
              f"{c.rng.randrange(30, 90)}, addr=[{c.hosts[0]}]:{c.rng.randrange(40000, 60000)}): Connection reset "
              "by peer")
    c.tick(600)
    sc.watchdogs(c, range(8, c.world) if c.world > 8 else range(1, c.world))
    sc.torchrun_summary(c, c.world - 1, -6)


# More training templates (storage to healthy runs) live in corpus_train2b; importing it registers them.
from loom.diagnosis import corpus_train2b  # noqa: E402,F401  (registration)
