"""Blind test templates, set 3 (split "blind2"): written without reading the rules, the filters or
the retrieval code, and measured once.

20 templates: the infrastructure ones here, the framework, script, loss-spike and healthy ones in
`corpus_blind2b.py` (imported at the end). Scenarios differ from every earlier template: new
failure situations (GSP RPC timeouts, requeued jobs, post-run ECC queries, NVLink4 Xids, pipeline
P2P hangs, power loss under the DeepSpeed launcher, cable faults, machine checks, NFS hangs masked
by NCCL timeouts, FUSE-backed object storage, metrics push timeouts, NCCL buffer OOM...).

Registered by importing (loom/diagnosis/corpus.py imports this module at its end).
"""

from __future__ import annotations

from collections.abc import Sequence

from loom.diagnosis import scenarios as sc
from loom.diagnosis.corpus import _TORCH, _bad, _bus, _frames, _syslog, template
from loom.diagnosis.logsim import (
    Ctx,
    launcher_preamble,
    routine_steps,
    start_job,
    train_steps,
)

Frame = tuple[str, int, str, str]
PKG = "/usr/local/lib/python3.10/dist-packages"
MEG = "/workspace/Megatron-LM/megatron"


# ------------------------------------------------------------------------------ helpers ----
def tb(c: Ctx, rank: int, frames: Sequence[Frame], exc: Sequence[str], roots: Sequence[int] = (0,), *,
       pre: Sequence[str] = ()) -> sc.Stream:
    """One rank's traceback through `frames`; the exception lines numbered in `roots` state the cause."""
    p = c.p(rank)
    s: sc.Stream = [(f"{p}{x}", False) for x in pre]
    s.append((f"{p}Traceback (most recent call last):", False))
    s += _frames(p, tuple(frames))
    s += [(f"{p}{line}", i in roots) for i, line in enumerate(exc)]
    return s


def dies(c: Ctx, bad: int, stream: sc.Stream, exitcode: int = 1, script: str = "pretrain_gpt.py") -> None:
    """`bad` prints `stream` and exits; its peers time out or see it go; torchrun names a rank."""
    c.tick(2)
    c.merge([stream])
    others = c.other_ranks(bad)
    if c.rng.random() < 0.5:
        sc.watchdogs(c, others)
    else:
        sc.remote_exits(c, others)
    sc.sigterms(c, others[: c.rng.randrange(1, len(others) + 1)])
    sc.torchrun_summary(c, bad, exitcode, script=script)


def kstyle(c: Ctx) -> str:
    return c.rng.choice(("syslog", "journal", "agent"))


def kern(c: Ctx, host: str, style: str) -> str:
    """The prefix of a kernel line forwarded into the job log (syslog, journald or the node agent)."""
    if style == "syslog":
        return _syslog(c, host)
    c.tick(0.5)
    if style == "journal":
        return f"{c.clock.strftime('%Y-%m-%dT%H:%M:%S')}.{c.clock.microsecond:06d}+08:00 {host} kernel: "
    return f"[{c.ts()}] [node-agent] {host} kern.err kernel: "


def node_ranks(c: Ctx, node: int) -> tuple[list[int], list[int]]:
    """The ranks on `node` and the ranks elsewhere."""
    mine = [r for r in range(c.world) if r // 8 == node]
    return mine, [r for r in range(c.world) if r // 8 != node]


def hexwords(c: Ctx, n: int = 8) -> str:
    return " ".join(f"0x{c.rng.getrandbits(32) if i < 2 else 0:08x}" for i in range(n))


# ------------------------------------------------------------------------------ CUDAError ----
@template("cuda-gsp-rpc-timeout-xid119", "CUDAError", "blind2")
def _gsp_timeout(c: Ctx) -> None:
    """GSP firmware stops answering RPCs (Xid 119) on one GPU; its rank stalls silently and every peer times out."""
    start_job(c, routine_steps(c))
    bad = _bad(c)
    host, lr, ks = c.host(bad), bad % 8, kstyle(c)
    fn, name = c.rng.choice(((76, "GSP_RM_CONTROL"), (103, "GSP_RM_ALLOC"), (10, "FREE")))
    c.tick(25)
    for attempt in range(c.rng.randrange(1, 3)):
        c.add_root(f"{kern(c, host, ks)}NVRM: Xid (PCI:{_bus(bad)}): 119, pid={c.pids[bad]}, name=python3, Timeout "
                   f"after 6s of waiting for RPC response from GPU{lr} GSP! Expected function {fn} ({name}) "
                   f"(0x{c.rng.getrandbits(32):08x} 0x{c.rng.randrange(1, 0x200):x}).")
        if attempt == 0:
            c.add(f"{kern(c, host, ks)}NVRM: GPU{lr} GSP RPC buffer contains function {fn} ({name}) and data "
                  f"0x{c.rng.getrandbits(64):016x} 0x{c.rng.randrange(1, 0x200):016x}.")
            c.add(f"{kern(c, host, ks)}NVRM: GPU{lr} RPC history (CPU -> GSP):")
            c.add(f"{kern(c, host, ks)}NVRM:     entry function                   data0              data1              "
                  "ts_start           ts_end             duration actively_polling")
            for i in range(c.rng.randrange(3, 6)):
                f2, n2 = c.rng.choice(((76, "GSP_RM_CONTROL"), (103, "GSP_RM_ALLOC"), (10, "FREE")))
                c.add(f"{kern(c, host, ks)}NVRM:     {-i:>5} {f2:<4} {n2:<24} 0x{c.rng.getrandbits(64):016x} "
                      f"0x{c.rng.getrandbits(16):016x} 0x{c.rng.getrandbits(52):016x} 0x{c.rng.getrandbits(52):016x} "
                      f"{c.rng.randrange(10, 900):>6}us")
        c.tick(6)
    others = c.other_ranks(bad)
    sc.watchdogs(c, others, op=c.rng.choice(("ALLREDUCE", "_REDUCE_SCATTER_BASE", "_ALLGATHER_BASE")))
    sc.sigterms(c, others[: c.rng.randrange(1, len(others) + 1)])
    sc.torchrun_summary(c, others[0], -6)


@template("cuda-device-busy-requeued", "CUDAError", "blind2")
def _device_busy(c: Ctx) -> None:
    """A preempted, requeued Slurm job (output appended) fails at start-up: one GPU is held by a stale context."""
    start_job(c, routine_steps(c))
    job = c.rng.randrange(10**5, 10**7)
    c.tick(5)
    c.add(f"slurmstepd: error: *** JOB {job} ON {c.hosts[0]} CANCELLED AT {c.clock.strftime('%Y-%m-%dT%H:%M:%S')} "
          "DUE TO PREEMPTION ***")
    c.add(f"{c.glog('W')} torch/distributed/elastic/agent/server/api.py:704] Received Signals.SIGTERM death signal, "
          "shutting down workers")
    sc.sigterms(c, range(min(8, c.world)))
    c.tick(1800)
    c.add(f"[{c.ts()}] [launch.sh] SLURM_JOB_ID={job} SLURM_RESTART_COUNT=1 SLURM_JOB_NODELIST={','.join(c.hosts)}")
    c.add(f"[{c.ts()}] [launch.sh] resuming from {c.path('ckpt', c.run)}/latest_checkpointed_iteration.txt")
    launcher_preamble(c)
    bad = _bad(c)
    frames = (("/workspace/Megatron-LM/pretrain_gpt.py", 233, "<module>", "pretrain(train_valid_test_datasets_provider,"),
              (f"{MEG}/training/training.py", 214, "pretrain", ("initialize_megatron(extra_args_provider="
               "extra_args_provider,")),
              (f"{MEG}/training/initialize.py", 80, "initialize_megatron", "finish_mpu_init()"),
              (f"{MEG}/training/initialize.py", 60, "finish_mpu_init", "_initialize_distributed()"),
              (f"{MEG}/training/initialize.py", 258, "_initialize_distributed", "torch.cuda.set_device(device)"),
              (f"{_TORCH}/cuda/__init__.py", 399, "set_device", "torch._C._cuda_setDevice(device)"))
    c.merge([tb(c, bad, frames, ["RuntimeError: CUDA error: CUDA-capable device(s) is/are busy or unavailable",
                                 ("CUDA kernel errors might be asynchronously reported at some other API call, so the "
                                  "stacktrace below might be incorrect."),
                                 "For debugging consider passing CUDA_LAUNCH_BLOCKING=1.",
                                 "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.", ""])])
    mine, _ = node_ranks(c, bad // 8)
    sc.sigterms(c, [r for r in mine if r != bad])
    sc.torchrun_summary(c, bad)
    c.add(f"srun: error: {c.host(bad)}: task {bad // 8}: Exited with exit code 1")


# ------------------------------------------------------------------------------ ECCError ----
@template("ecc-postrun-query-drain", "ECCError", "blind2")
def _ecc_query(c: Ctx) -> None:
    """The rank dies with a launch failure; only the wrapper's post-run nvidia-smi query shows the uncorrectable ECC."""
    start_job(c, routine_steps(c))
    bad = _bad(c)
    host, g = c.host(bad), bad % 8
    train_steps(c, c.rng.randrange(0, 3))
    dies(c, bad, sc.traceback(c, bad, "step", [
        "RuntimeError: CUDA error: unspecified launch failure",
        ("CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be "
        "incorrect."), "For debugging consider passing CUDA_LAUNCH_BLOCKING=1."]))
    c.tick(20)
    c.add(f"[{c.ts()}] [post-run-check] {host}: nvidia-smi --query-gpu=index,pci.bus_id,"
          "ecc.errors.uncorrected.volatile.total,remapped_rows.pending,remapped_rows.failure --format=csv")
    c.add("index, pci.bus_id, ecc.errors.uncorrected.volatile.total, remapped_rows.pending, remapped_rows.failure")
    n = c.rng.randrange(1, 12)
    for i in range(8):
        row = f"{i}, 00000000:{0x18 + i * 0x10:02X}:00.0, "
        (c.add_root(row + f"{n}, Yes, No") if i == g else c.add(row + "0, No, No"))
    c.add_root(f"[{c.ts()}] [post-run-check] {host}: GPU {g} reports {n} uncorrectable volatile ECC error(s) and a "
               f"pending row remap; draining {host} (reason=\"gpu{g} dbe, needs reset\")")
    c.add(f"[{c.ts()}] [post-run-check] scontrol update nodename={host} state=drain reason=\"gpu{g} dbe, needs reset\"")


# ---------------------------------------------------------------------------- NVLinkError ----
@template("nvlink-netir-xid149-hang", "NVLinkError", "blind2")
def _nvlink_149(c: Ctx) -> None:
    """An H100 NVLink goes down (Xid 145, then fatal Xid 149): collectives hang; the post-run check finds it inactive."""
    start_job(c, routine_steps(c))
    bad = _bad(c)
    host, g, ks, link = c.host(bad), bad % 8, kstyle(c), c.rng.randrange(18)
    c.tick(15)
    if c.rng.random() < 0.6:
        c.add_root(f"{kern(c, host, ks)}NVRM: Xid (PCI:{_bus(bad)}): 145, pid={c.pids[bad]}, name=python3, RLW_REMAP "
                   f"Nonfatal XC0 i0 Link {link:02d} ({hexwords(c)})")
    c.tick(3)
    c.add_root(f"{kern(c, host, ks)}NVRM: Xid (PCI:{_bus(bad)}): 149, pid={c.pids[bad]}, name=python3, NETIR_LINK_EVT "
               f"Fatal XC0 i0 Link {link:02d} (0x004505c6 {' '.join(['0x00000000'] * 7)})")
    sc.watchdogs(c, range(c.world), op=c.rng.choice(("ALLREDUCE", "_REDUCE_SCATTER_BASE")))
    sc.sigterms(c, [r for r in range(c.world) if r % 4 == 1])
    sc.torchrun_summary(c, c.rng.randrange(c.world), -6)
    c.add(f"[{c.ts()}] [post-run-check] {host}: nvidia-smi nvlink --status -i {g}")
    c.add(f"GPU {g}: NVIDIA H100 80GB HBM3 (UUID: GPU-{c.rng.getrandbits(32):08x}-{c.rng.getrandbits(16):04x}-"
          f"{c.rng.getrandbits(16):04x}-{c.rng.getrandbits(16):04x}-{c.rng.getrandbits(48):012x})")
    for i in range(18):
        (c.add_root(f"\t Link {i}: <inactive>") if i == link else c.add(f"\t Link {i}: 26.562 GB/s"))


# ---------------------------------------------------------------------------- NCCLTimeout ----
@template("nccl-pp-p2p-hang-legacy", "NCCLTimeout", "blind2")
def _pp_hang(c: Ctx) -> None:
    """Two pipeline stages hang in send/recv (torch 2.0 watchdog wording, then faulthandler dumps), nothing else fails."""
    c.style = "megatron"
    start_job(c, routine_steps(c))
    c.tick(1800)
    seq = c.rng.randrange(10**4, 10**6)
    per = c.world // 4  # pipeline-parallel size 4: stage s sends its activations to stage s + 1
    stage = c.rng.randrange(3)
    k = c.rng.randrange(1, per + 1)
    stuck = sorted(c.rng.sample(range(stage * per, (stage + 1) * per), k)
                   + c.rng.sample(range((stage + 1) * per, (stage + 2) * per), k))
    streams = []
    for r in stuck:
        p, op = c.p(r), "SEND" if r // per == stage else "RECV"
        w = (f"[Rank {r}] Watchdog caught collective operation timeout: WorkNCCL(SeqNum={seq}, OpType={op}, "
             f"Timeout(ms)=1800000) ran for {1800000 + c.rng.randrange(1, 900)} milliseconds before timing out.")
        s = [(f"{p}[E ProcessGroupNCCL.cpp:828] {w}", True),
             ((f"{p}[E ProcessGroupNCCL.cpp:455] Some NCCL operations have failed or timed out. Due to the asynchronous "
              "nature of CUDA kernels, subsequent GPU operations might run on corrupted/incomplete data."), False),
             (f"{p}[E ProcessGroupNCCL.cpp:460] To avoid data inconsistency, we are taking the entire process down.",
              False),
             (f"{p}terminate called after throwing an instance of 'std::runtime_error'", False),
             (f"{p}  what():  [Rank {r}] NCCL watchdog thread terminated with exception: {w}", False),
             (f"{p}Fatal Python error: Aborted", False), (f"{p}", False),
             (f"{p}Thread 0x{c.rng.getrandbits(44):012x} (most recent call first):", False)]
        for path, line, fn in ((f"{MEG}/core/pipeline_parallel/p2p_communication.py", 318, "_communicate"),
                               (f"{MEG}/core/pipeline_parallel/p2p_communication.py", 409 if op == "RECV" else 452,
                                "recv_forward" if op == "RECV" else "send_forward"),
                               (f"{MEG}/core/pipeline_parallel/schedules.py", 1245,
                                "forward_backward_pipelining_without_interleaving"),
                               (f"{MEG}/training/training.py", 556, "train_step"),
                               (f"{MEG}/training/training.py", 1049, "train"),
                               ("/workspace/Megatron-LM/pretrain_gpt.py", 233, "<module>")):
            s.append((f'{p}  File "{path}", line {line} in {fn}', False))
        streams.append(s)
    c.merge(streams)
    c.tick(3)
    c.add(f"{c.glog('E')} torch/distributed/elastic/multiprocessing/api.py:673] failed (exitcode: -6) local_rank: "
          f"{stuck[0] % 8} (pid: {c.pids[stuck[0]]}) of binary: /usr/bin/python3")
    sc.sigterms(c, [r for r in range(c.world) if r not in stuck])
    sc.torchrun_summary(c, stuck[0], -6)


# -------------------------------------------------------------------------- NCCLRemoteError ----
@template("nccl-ib-cable-fault", "NCCLRemoteError", "blind2")
def _ib_cable(c: Ctx) -> None:
    """An InfiniBand cable/transceiver fault (mlx5 port module event) breaks one rank's QPs mid-collective."""
    start_job(c, routine_steps(c))
    bad = _bad(c)
    peer = (bad + 8) % c.world if c.world > 8 else (bad + 4) % c.world
    h, pid, p, lr, ks = c.host(bad), c.pids[bad], c.p(bad), bad % 8, kstyle(c)
    pci = f"0000:{c.rng.choice((0x0c, 0x2a, 0x41, 0x58, 0x8d, 0xa8, 0xc1, 0xd8)):02x}:00.0"
    why = c.rng.choice(("High Temperature", "Bus stuck (I2C or data shorted)", "Power budget exceeded"))
    c.tick(10)
    c.add_root(f"{kern(c, h, ks)}mlx5_core {pci}: mlx5_port_module_event:1162:(pid 0): Port module event[error]: "
               f"module {c.rng.randrange(8)}, Cable error, {why}")
    c.tick(2)
    tid = pid + c.rng.randrange(100, 400)
    port = c.rng.randrange(30000, 60000)
    c.add_root(f"{p}{h}:{pid}:{tid} [{lr}] transport/net_ib.cc:1696 NCCL WARN NET/IB : Got completion from peer "
               f"{c.ip(peer)}<{port}> with status=12 opcode=0 len=0 vendor err 129 (Send) localGid ::ffff:{c.ip(bad)} "
               f"remoteGids::ffff:{c.ip(peer)}")
    for _ in range(c.rng.randrange(1, 4)):
        c.add(f"{p}{h}:{pid}:{tid} [{lr}] transport/net_ib.cc:1696 NCCL WARN NET/IB : Got completion from peer "
              f"{c.ip(peer)}<{port}> with status=5 opcode=0 len=0 vendor err 249 (Recv) localGid ::ffff:{c.ip(bad)} "
              f"remoteGids::ffff:{c.ip(peer)}")
    c.add(f"{p}{h}:{pid}:{tid} [{lr}] NCCL INFO transport/net.cc:1298 -> 6")
    c.add(f"{p}{h}:{pid}:{tid} [{lr}] NCCL INFO proxy.cc:694 -> 6")
    c.add(f"{p}{h}:{pid}:{tid} [{lr}] NCCL INFO proxy.cc:874 -> 6 [Progress Thread]")
    c.merge([sc.traceback(c, bad, "step", [
        ("torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1275, "
         "remote process exited or there was a network error, NCCL version 2.18.5"),
        "ncclRemoteError: A call failed possibly due to a network error or a remote process exiting prematurely.",
        "Last error:",
        (f"NET/IB : Got completion from peer {c.ip(peer)}<{port}> with status=12 opcode=0 len=0 vendor err 129 "
         "(Send)")], root=False)])
    others = c.other_ranks(bad)
    sc.remote_exits(c, others)
    sc.sigterms(c, others)
    sc.torchrun_summary(c, bad)


# ----------------------------------------------------------------------------- NodeFailure ----
@template("node-power-loss-pdsh", "NodeFailure", "blind2")
def _power_loss(c: Ctx) -> None:
    """A node loses AC power under the DeepSpeed (pdsh) launcher: BMC event, ssh 255, peers' NCCL errors."""
    c.style = "deepspeed"
    start_job(c, routine_steps(c))
    node = c.rng.randrange(1, len(c.hosts)) if len(c.hosts) > 1 else 0
    host = c.hosts[node]
    origin = c.hosts[0] if node else f"login-{c.rng.randrange(1, 4):02d}"
    _, others = node_ranks(c, node)
    c.tick(8)
    c.add_root(f"[{c.ts()}] [cluster-monitor] {host}: BMC SEL 0x{c.rng.getrandbits(16):04x} | Power Supply "
               f"PS{c.rng.randrange(1, 3)} | Power Supply AC lost | Asserted")
    c.add(f"[{c.ts()}] [cluster-monitor] {host}: BMC SEL 0x{c.rng.getrandbits(16):04x} | Power Unit | Power off/down "
          "| Asserted")
    if others:
        sc.remote_exits(c, others)
    c.tick(60)
    c.add(f"{host}: Connection to {host} closed by remote host.")
    c.add_root(f"pdsh@{origin}: {host}: ssh exited with exit code 255")
    c.add(f"[{c.ts()}] [cluster-monitor] {host}: no ping/ssh answer for 90s, marking DOWN")
    for r in others[: c.rng.randrange(1, len(others) + 1)] if others else []:
        c.add(f"{c.host(r)}: [{c.ts()}] [INFO] [launch.py:315:sigkill_handler] Killing subprocess {c.pids[r]}")
    if others:
        r = others[0]
        c.add(f"{c.host(r)}: [{c.ts()}] [ERROR] [launch.py:321:sigkill_handler] ['/usr/bin/python3', '-u', "
              f"'pretrain_gpt.py', '--local_rank={r % 8}', '--deepspeed', '--deepspeed_config', 'ds_config.json'] "
              "exits with return code = 1")
        c.add(f"pdsh@{origin}: {c.host(r)}: ssh exited with exit code 1")


@template("node-mce-kernel-panic", "NodeFailure", "blind2")
def _mce_panic(c: Ctx) -> None:
    """A fatal machine check panics one node (serial-console capture); the other nodes see the peer vanish."""
    start_job(c, routine_steps(c))
    node = c.rng.randrange(len(c.hosts))
    host = c.hosts[node]
    _, others = node_ranks(c, node)
    c.tick(30)
    t = 86400.0 * c.rng.randrange(3, 60) + c.rng.uniform(0, 86400)
    con = f"[console {host}] "

    def k(text: str, root: bool = False) -> None:
        nonlocal t
        t += c.rng.uniform(0, 0.002)
        (c.add_root if root else c.add)(f"{con}[{t:12.6f}] {text}")

    cpu, bank = c.rng.randrange(128), c.rng.choice((4, 5, 12, 17))
    k(f"mce: [Hardware Error]: CPU {cpu}: Machine Check Exception: 5 Bank {bank}: b{c.rng.getrandbits(60):015x}",
      True)
    k(f"mce: [Hardware Error]: RIP !INEXACT! 10:<ffffffff{c.rng.getrandbits(32):08x}> "
      f"{{intel_idle+0x{c.rng.randrange(0x20, 0x90):x}/0x{c.rng.randrange(0x300, 0x400):x}}}")
    k(f"mce: [Hardware Error]: TSC 0 ADDR {c.rng.getrandbits(36):x} MISC {c.rng.getrandbits(40):x} ")
    k(f"mce: [Hardware Error]: PROCESSOR 0:806f8 TIME {c.rng.randrange(1680000000, 1700000000)} SOCKET "
      f"{cpu // 64} APIC {c.rng.getrandbits(8):x} microcode 2b000{c.rng.randrange(100, 600)}")
    k("mce: [Hardware Error]: Run the above through 'mcelog --ascii'")
    k("mce: [Hardware Error]: Machine check: Processor context corrupt")
    k("Kernel panic - not syncing: Fatal machine check", True)
    k(f"Kernel Offset: 0x{c.rng.getrandbits(28) << 4:x} from 0xffffffff81000000 (relocation range: "
      "0xffffffff80000000-0xffffffffbfffffff)")
    k("---[ end Kernel panic - not syncing: Fatal machine check ]---")
    if not others:
        return
    sc.remote_exits(c, others)
    c.tick(40)
    for r in others[:: 8][: c.rng.randrange(1, 4)]:
        c.add(f"{c.p(r)}[W socket.cpp:697] [c10d] recvValue failed on SocketImpl(fd={c.rng.randrange(20, 90)}, "
              f"addr=[{c.ip(r)}]:{c.rng.randrange(30000, 60000)}, remote=[{host}]:29500): Connection timed out")
    sc.sigterms(c, others)
    sc.torchrun_summary(c, others[0])


# ----------------------------------------------------------------------------- StorageError ----
@template("storage-nfs-hung-fsync", "StorageError", "blind2")
def _nfs_hung(c: Ctx) -> None:
    """The NFS server stops answering during a checkpoint fsync; the rank blocks in D state, peers time out 30 min later."""
    start_job(c, routine_steps(c))
    bad = _bad(c)
    host, ks = c.host(bad), kstyle(c)
    server = c.rng.choice(("nfs-ckpt-02", "filer03", "nas-home-1"))
    c.add(f"{c.p(0)}saving checkpoint at iteration {c.iteration:>8} to /nfs/acme/{c.user}/ckpt/{c.run}")
    c.tick(60)
    for h in sorted({host, c.rng.choice(c.hosts)}):
        c.add_root(f"{kern(c, h, ks)}nfs: server {server} not responding, still trying")
    c.tick(120)
    pre = kern(c, host, ks)
    c.add(f"{pre}INFO: task python3:{c.pids[bad]} blocked for more than {c.rng.choice((120, 122, 241))} seconds.")
    c.add(f"{pre}      Tainted: P           OE     5.15.0-{c.rng.randrange(60, 120)}-generic #{c.rng.randrange(60, 130)}"
          "-Ubuntu")
    c.add(f'{pre}"echo 0 > /proc/sys/kernel/hung_task_timeout_secs" disables this message.')
    c.add(f"{pre}task:python3         state:D stack:    0 pid:{c.pids[bad]} ppid:{c.pids[bad] - c.rng.randrange(1, 90)} "
          "flags:0x00004002")
    c.add(f"{pre}Call Trace:")
    for fn in ("<TASK>", "__schedule+0x2e3/0x740", "schedule+0x69/0x110", "io_schedule+0x46/0x80",
               "wait_on_page_bit_common+0x10c/0x3d0", "wait_on_page_writeback+0x22/0x80",
               "__filemap_fdatawait_range+0x8b/0xf0", "filemap_write_and_wait_range+0x8a/0xd0",
               "nfs_file_fsync+0x8b/0x1d0 [nfs]", "__x64_sys_fsync+0x38/0x70", "do_syscall_64+0x59/0xc0",
               "entry_SYSCALL_64_after_hwframe+0x62/0xcc", "</TASK>"):
        c.add(f"{pre} {fn}")
    others = c.other_ranks(bad)
    sc.watchdogs(c, others, op=c.rng.choice(("ALLREDUCE", "BARRIER", "_ALLGATHER_BASE")))
    sc.sigterms(c, others[: c.rng.randrange(1, len(others) + 1)])
    sc.torchrun_summary(c, others[0], -6)
    if c.rng.random() < 0.5:
        c.add(f"{kern(c, host, ks)}nfs: server {server} OK")


@template("storage-gcsfuse-write-failed", "StorageError", "blind2")
def _gcsfuse(c: Ctx) -> None:
    """HF Trainer saves to a gcsfuse mount; the bucket answers 503 and torch.save fails with an enforce error."""
    c.style = "hf"
    start_job(c, routine_steps(c))
    out = f"/gcs/{c.user}-sft/{c.run}/checkpoint-{c.iteration * 10}"
    c.add(f"{c.p(0)}Saving model checkpoint to {out}")
    c.add(f"{c.p(0)}Model weights saved in {out}/model.safetensors")
    side = "[gke-gcsfuse-sidecar] "
    sec = int(c.clock.timestamp())
    for i in range(c.rng.randrange(1, 4)):
        c.add(f'{side}{{"timestamp":{{"seconds":{sec + 2 * i},"nanos":{c.rng.randrange(10**9)}}},"severity":"WARNING",'
              f'"message":"Retrying upload of {c.run}/checkpoint-{c.iteration * 10}/optimizer.pt after 503 (attempt '
              f'{i + 1})"}}')
    c.tick(30)
    c.add_root(f'{side}{{"timestamp":{{"seconds":{sec + 30},"nanos":{c.rng.randrange(10**9)}}},"severity":"ERROR",'
               '"message":"fuse: *fuseops.SyncFileOp error: SyncFile: error in closing writer : googleapi: Error 503: '
               'We encountered an internal error. Please try again., backendError"}')
    trainer = f"{PKG}/transformers/trainer.py"
    frames = (("/workspace/sft/train_sft.py", 212, "<module>", "main()"),
              ("/workspace/sft/train_sft.py", 198, "main", "trainer.train(resume_from_checkpoint=cfg.resume)"),
              (trainer, 1938, "train", "return inner_training_loop("),
              (trainer, 2356, "_inner_training_loop", ("self._maybe_log_save_evaluate(tr_loss, grad_norm, model, "
                                                       "trial, epoch, ignore_keys_for_eval)")),
              (trainer, 2807, "_maybe_log_save_evaluate", "self._save_checkpoint(model, trial, metrics=metrics)"),
              (trainer, 2890, "_save_checkpoint", "self._save_optimizer_and_scheduler(output_dir)"),
              (trainer, 3001, "_save_optimizer_and_scheduler",
               "torch.save(self.optimizer.state_dict(), os.path.join(output_dir, OPTIMIZER_NAME))"),
              (f"{_TORCH}/serialization.py", 652, "save", ("_save(obj, opened_zipfile, pickle_module, pickle_protocol, "
                                                          "_disable_byteorder_record)")),
              (f"{_TORCH}/serialization.py", 886, "_save", "zip_file.write_record(name, storage, num_bytes)"))
    p = c.p(0)
    s = tb(c, 0, frames, [(f"RuntimeError: [enforce fail at inline_container.cc:764] . PytorchStreamWriter failed "
                          f"writing file data/{c.rng.randrange(3, 40)}: file write failed"), "",
                          "During handling of the above exception, another exception occurred:", ""])
    n = c.rng.randrange(10**9, 4 * 10**9)
    s += tb(c, 0, frames[:7] + ((f"{_TORCH}/serialization.py", 651, "save",
                                 "with _open_zipfile_writer(f) as opened_zipfile:"),
                                (f"{_TORCH}/serialization.py", 499, "__exit__", "self.file_like.write_end_of_file()")),
            [f"RuntimeError: [enforce fail at inline_container.cc:595] . unexpected pos {n} vs {n - 112}"], ())
    s.insert(0, (f"{p}", False))
    dies(c, 0, s, script="train_sft.py")


# -------------------------------------------------------------------------- ConnectionError ----
@template("conn-pushgateway-timeout", "ConnectionError", "blind2")
def _pushgateway(c: Ctx) -> None:
    """The logging rank's Prometheus push times out (TimeoutError chained into URLError); no 'ConnectionError' word."""
    start_job(c, routine_steps(c))
    bad = c.rng.choice((0, c.world - 1))
    lib, expo = "/usr/lib/python3.10", f"{PKG}/prometheus_client/exposition.py"
    gw = c.rng.choice(("pushgateway.monitoring.svc:9091", "prom-push.acme.internal:9091"))
    for attempt in range(1, 3):
        c.tick(c.rng.uniform(30, 70))
        c.add(f"{c.p(bad)}[{c.ts()}] [acme_metrics] WARNING push to http://{gw} failed (attempt {attempt}/3): "
              "timed out; retrying in 5s")
    inner = ((f"{lib}/urllib/request.py", 1348, "do_open", ("h.request(req.get_method(), req.selector, req.data, "
                                                           "headers,")),
             (f"{lib}/http/client.py", 1283, "request", ("self._send_request(method, url, body, headers, "
                                                       "encode_chunked)")),
             (f"{lib}/http/client.py", 1038, "_send_output", "self.send(msg)"),
             (f"{lib}/http/client.py", 976, "send", "self.connect()"),
             (f"{lib}/http/client.py", 942, "connect", "self.sock = self._create_connection("),
             (f"{lib}/socket.py", 845, "create_connection", "raise err"),
             (f"{lib}/socket.py", 833, "create_connection", "sock.connect(sa)"))
    outer = ((f"{MEG}/training/training.py", 1063, "train", ("report_memory_flag = training_log(loss_dict, "
                                                            "total_loss_dict,")),
             (f"{MEG}/training/training.py", 790, "training_log", "acme_metrics.push(iteration, metrics)"),
             ("/workspace/acme_metrics/reporter.py", 57, "push", ("push_to_gateway(self.gateway, job=self.job, "
                                                                 "registry=self.registry, timeout=10)")),
             (expo, 526, "push_to_gateway", ("_use_gateway('PUT', gateway, job, registry, grouping_key, timeout, "
                                            "handler)")),
             (expo, 627, "_use_gateway", "handler("),
             (expo, 452, "handle", "default_handler(url, method, timeout, headers, data)()"),
             (expo, 438, "handle", "resp = build_opener(base_handler).open(request, timeout=timeout)"),
             (f"{lib}/urllib/request.py", 519, "open", "response = self._open(req, data)"),
             (f"{lib}/urllib/request.py", 1377, "http_open", "return self.do_open(http.client.HTTPConnection, req)"),
             (f"{lib}/urllib/request.py", 1351, "do_open", "raise URLError(err)"))
    s = tb(c, bad, inner, ["TimeoutError: [Errno 110] Connection timed out", "",
                           "During handling of the above exception, another exception occurred:", ""])
    s += tb(c, bad, outer, ["urllib.error.URLError: <urlopen error [Errno 110] Connection timed out>"])
    dies(c, bad, s)


# ------------------------------------------------------------------------------------ OOM ----
@template("oom-nccl-comm-buffers", "OOM", "blind2")
def _oom_nccl(c: Ctx) -> None:
    """At the first evaluation a new NCCL communicator cannot allocate its buffers: 'unhandled cuda error' on a full GPU."""
    c.style = "megatron"
    start_job(c, routine_steps(c))
    last = c.p(c.world - 1 if c.prefix_style != "none" else 0)
    c.add(f"{last}[Rank {c.world - 1}] (after {c.iteration} iterations) memory (MB) | allocated: "
          f"{c.rng.uniform(6.6e4, 7.2e4):.1f} | max allocated: {c.rng.uniform(7.9e4, 8.05e4):.1f} | reserved: "
          f"{c.rng.uniform(8.05e4, 8.08e4):.1f} | max reserved: {c.rng.uniform(8.08e4, 8.1e4):.1f}")
    c.tick(5)
    frames = (("/workspace/Megatron-LM/pretrain_gpt.py", 233, "<module>", "pretrain(train_valid_test_datasets_provider,"),
              (f"{MEG}/training/training.py", 1123, "train", "evaluate_and_print_results(prefix, forward_step_func,"),
              (f"{MEG}/training/training.py", 1421, "evaluate", "loss_dicts = forward_backward_func("),
              ("/workspace/Megatron-LM/pretrain_gpt.py", 151, "loss_func",
               "averaged_loss = average_losses_across_data_parallel_group([loss])"),
              (f"{MEG}/training/utils.py", 112, "average_losses_across_data_parallel_group",
               "torch.distributed.all_reduce(averaged_losses,"),
              (f"{_TORCH}/distributed/c10d_logger.py", 72, "wrapper", "return func(*args, **kwargs)"),
              (f"{_TORCH}/distributed/distributed_c10d.py", 1992, "all_reduce", "work = group.allreduce([tensor], opts)"))
    streams = []
    bad = sorted(c.rng.sample(range(c.world), k=c.rng.randrange(1, min(8, c.world) + 1)))
    at = c.rng.choice((103, 185))
    for r in bad:
        h, pid, lr = c.host(r), c.pids[r], r % 8
        tid = pid + c.rng.randrange(100, 400)
        s: sc.Stream = [((f"{c.p(r)}{h}:{pid}:{tid} [{lr}] include/alloc.h:{at} NCCL WARN Cuda "
                         "failure 'out of memory'"), True)]
        s += [(f"{c.p(r)}{h}:{pid}:{tid} [{lr}] NCCL INFO {w} -> 1", False)
              for w in ("include/alloc.h:191", "channel.cc:41", "init.cc:1147", "init.cc:1384", "init.cc:1627")]
        s.append((f"{c.p(r)}{h}:{pid}:{tid} [{lr}] NCCL INFO group.cc:64 -> 1 [Async thread]", False))
        s += tb(c, r, frames, [
            ("torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:"
             "1691, unhandled cuda error (run with NCCL_DEBUG=INFO for details), NCCL version 2.19.3"),
            "ncclUnhandledCudaError: Call to CUDA function failed.", "Last error:",
            "Cuda failure 'out of memory'"], roots=(3,))
        streams.append(s)
    c.merge(streams)
    others = [r for r in range(c.world) if r not in bad]
    if others:
        sc.watchdogs(c, others[: c.rng.randrange(1, len(others) + 1)])
        sc.sigterms(c, others)
    sc.torchrun_summary(c, bad[0])


HF_EVAL = (("/workspace/sft/train_sft.py", 212, "<module>", "main()"),
           ("/workspace/sft/train_sft.py", 198, "main", "trainer.train(resume_from_checkpoint=cfg.resume)"),
           (f"{PKG}/transformers/trainer.py", 1938, "train", "return inner_training_loop("),
           (f"{PKG}/transformers/trainer.py", 2356, "_inner_training_loop",
            "self._maybe_log_save_evaluate(tr_loss, grad_norm, model, trial, epoch, ignore_keys_for_eval)"),
           (f"{PKG}/transformers/trainer.py", 2797, "_maybe_log_save_evaluate",
            "metrics = self._evaluate(trial, ignore_keys_for_eval)"),
           (f"{PKG}/transformers/trainer.py", 2754, "_evaluate", "metrics = self.evaluate(ignore_keys=ignore_keys_for_eval)"),
           ("/workspace/sft/gen_eval_trainer.py", 64, "evaluate",
            "outputs = self.model.generate(**batch, max_new_tokens=self.args.generation_max_length)"),
           (f"{_TORCH}/utils/_contextlib.py", 116, "decorate_context", "return func(*args, **kwargs)"),
           (f"{PKG}/transformers/generation/utils.py", 2215, "generate", "result = self._sample("))


def hf_eval_banner(c: Ctx) -> None:
    p = c.p(0)
    c.add(f"{p}***** Running Evaluation *****")
    c.add(f"{p}  Num examples = {c.rng.choice((1000, 2000, 5000))}")
    c.add(f"{p}  Batch size = {c.rng.choice((8, 16, 32))}")


@template("oom-eval-generate-cublas", "OOM", "blind2")
def _oom_generate(c: Ctx) -> None:
    """Generation during HF evaluation exhausts GPU memory: cuBLAS cannot allocate its handle, then torch OOMs."""
    c.style = "hf"
    start_job(c, routine_steps(c))
    hf_eval_banner(c)
    c.tick(40)
    gen = HF_EVAL + ((f"{PKG}/transformers/generation/utils.py", 3206, "_sample", ("outputs = self(**model_inputs, "
                                                                                 "return_dict=True)")),
                     (f"{_TORCH}/nn/modules/module.py", 1553, "_wrapped_call_impl",
                      "return self._call_impl(*args, **kwargs)"),
                     (f"{PKG}/transformers/models/llama/modeling_llama.py", 1189, "forward",
                      "logits = self.lm_head(hidden_states)"),
                     (f"{_TORCH}/nn/modules/linear.py", 117, "forward", "return F.linear(input, self.weight, self.bias)"))
    ranks = sorted(c.rng.sample(range(c.world), k=c.rng.randrange(2, min(8, c.world) + 1)))
    streams = [tb(c, ranks[0], gen, [("RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling "
                                     "`cublasCreate(handle)`")])]
    for r in ranks[1:]:
        free = c.rng.randrange(20, 900)
        streams.append(tb(c, r, gen, [
            (f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {c.rng.uniform(1, 6):.2f} GiB. GPU {r % 8} "
            f"has a total capacity of 79.11 GiB of which {free}.{c.rng.randrange(10, 99)} MiB is free. Process "
            f"{c.pids[r]} has 78.{c.rng.randrange(10, 99)} GiB memory in use. Of the allocated memory "
            f"{c.rng.uniform(68, 74):.2f} GiB is allocated by PyTorch, and {c.rng.uniform(2, 6):.2f} GiB is reserved "
            "by PyTorch but unallocated. If reserved but unallocated memory is large try setting "
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory "
            "Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)")]))
    c.merge(streams[:1])
    c.tick(1)
    c.merge(streams[1:])
    others = [r for r in range(c.world) if r not in ranks]
    if others:
        sc.watchdogs(c, others[: c.rng.randrange(1, len(others) + 1)], op="_ALLGATHER_BASE")
    sc.sigterms(c, others)
    sc.torchrun_summary(c, ranks[0], script="train_sft.py")


from loom.diagnosis import corpus_blind2b  # noqa: F401  (registration of the other seven)
