"""The labelled corpus: realistic failure logs of LLM training jobs, generated from a seed.

Each template is one failure scenario (or a healthy run) with its Acme error type; each log is a
template rendered with its own ranks, hosts, paths, timings and thousands of routine lines, and
with the numbers of the lines that state the root cause. Templates are split into training and
test sets: rules, compression filters and the retrieval store are built from the training split
only, and the test split holds scenarios never seen there (several phrased so that the
hand-written rules miss them). Bump GENERATOR_VERSION whenever the output changes: it keys the
cached retrieval store and the learned filters.
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from loom.diagnosis import scenarios as sc
from loom.diagnosis.logsim import Ctx, new_ctx, routine_steps, start_job, train_steps

GENERATOR_VERSION = "1"
HEALTHY = "Healthy"  # label of healthy runs; the diagnosis expected for them is Unknown
LOGS_PER_TEMPLATE = 5


@dataclass(frozen=True, slots=True)
class Template:
    name: str
    error_type: str
    split: str  # "train" | "test"
    write: Callable[[Ctx], None]


@dataclass(frozen=True, slots=True)
class LabelledLog:
    name: str
    template: str
    split: str
    error_type: str
    lines: tuple[str, ...]
    root_cause: frozenset[int]  # 1-based numbers of the lines stating the root cause

    @property
    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


TEMPLATES: list[Template] = []


def template(name: str, error_type: str, split: str) -> Callable[[Callable[[Ctx], None]], Callable[[Ctx], None]]:
    def register(fn: Callable[[Ctx], None]) -> Callable[[Ctx], None]:
        TEMPLATES.append(Template(name, error_type, split, fn))
        return fn
    return register


def _bad(c: Ctx) -> int:
    return c.rng.randrange(c.world)


def _fault_mid_run(c: Ctx, exc: list[str], *, site: str = "step", exitcode: int = 1) -> None:
    """A routine run, one rank fails, the rest time out; with a chance of a torchrun restart first."""
    start_job(c, routine_steps(c))
    bad = _bad(c)
    if c.rng.random() < 0.35:  # torchrun --max-restarts: the fault hits, the job restarts, hits it again
        c.merge([sc.traceback(c, bad, site, exc)])
        c.add(f"{c.glog('W')} torch/distributed/elastic/agent/server/api.py:723] [default] Worker group FAILED. "
              "3/3 attempts left; will restart worker group")
        start_job(c, c.rng.randrange(50, 300))
    train_steps(c, c.rng.randrange(0, 3))
    sc.single_rank_fault(c, bad, exc, site=site, exitcode=exitcode)


# ---------------------------------------------------------------- infrastructure: GPU ----
@template("cuda-illegal-access", "CUDAError", "train")
def _cuda_illegal(c: Ctx) -> None:
    _fault_mid_run(c, ["RuntimeError: CUDA error: an illegal memory access was encountered",
                       ("CUDA kernel errors might be asynchronously reported at some other API call, so the "
                       "stacktrace below might be incorrect."),
                       "For debugging consider passing CUDA_LAUNCH_BLOCKING=1.",
                       "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions."])


@template("cuda-launch-failure-xid13", "CUDAError", "train")
def _cuda_xid13(c: Ctx) -> None:
    start_job(c, routine_steps(c))
    bad = _bad(c)
    sc.dmesg(c, bad, 13, "Graph Exception on (GPC 4, TPC 1, SM 0): Illegal Instruction Encoding")
    sc.single_rank_fault(c, bad, ["RuntimeError: CUDA error: unspecified launch failure",
                                  ("CUDA kernel errors might be asynchronously reported at some other API call, so "
                                  "the stacktrace below might be incorrect.")])


@template("cuda-cublas", "CUDAError", "test")
def _cuda_cublas(c: Ctx) -> None:
    _fault_mid_run(c, [("RuntimeError: CUDA error: CUBLAS_STATUS_EXECUTION_FAILED when calling `cublasGemmEx( "
                       "handle, opa, opb, m, n, k, &falpha, a, CUDA_R_16BF, lda, b, CUDA_R_16BF, ldb, &fbeta, c, "
                       "CUDA_R_16BF, ldc, CUDA_R_32F, CUBLAS_GEMM_DEFAULT_TENSOR_OP)`")])


@template("ecc-runtime", "ECCError", "train")
def _ecc_runtime(c: Ctx) -> None:
    _fault_mid_run(c, ["RuntimeError: CUDA error: uncorrectable ECC error encountered",
                       ("CUDA kernel errors might be asynchronously reported at some other API call, so the "
                       "stacktrace below might be incorrect.")])


@template("ecc-dmesg-appended", "ECCError", "train")
def _ecc_dmesg(c: Ctx) -> None:
    """The process only sees a launch failure; the wrapper appends the kernel log with Xid 48 at the end."""
    start_job(c, routine_steps(c))
    bad = _bad(c)
    sc.single_rank_fault(c, bad, ["RuntimeError: CUDA error: unspecified launch failure"])
    sc.dmesg(c, bad, 48, "DBE (Double Bit ECC Error) has been detected on GPU in the framebuffer at partition 6, "
                         "subpartition 1.")
    sc.dmesg(c, bad, 63, "ECC page retirement or row remapping recording event.", header=False)


@template("ecc-dcgm", "ECCError", "test")
def _ecc_dcgm(c: Ctx) -> None:
    start_job(c, routine_steps(c))
    bad = _bad(c)
    c.add_root(f"[{c.ts()}] [health-monitor] DCGM_FR_VOLATILE_DBE_DETECTED: GPU {bad % 8} on {c.host(bad)}: "
               f"{c.rng.randrange(1, 9)} volatile double-bit ECC error(s) detected; drain the node")
    sc.single_rank_fault(c, bad, ["RuntimeError: CUDA error: uncorrectable ECC error encountered"])


@template("nvlink-xid74", "NVLinkError", "train")
def _nvlink_xid74(c: Ctx) -> None:
    start_job(c, routine_steps(c))
    bad = _bad(c)
    sc.dmesg(c, bad, 74, f"NVLink: fatal error detected on link {c.rng.randrange(12)}(0x0, 0x0, 0x10000, 0x0, "
                         "0x0, 0x0, 0x0)")
    sc.single_rank_fault(c, bad, [("RuntimeError: CUDA error: an uncorrectable NVLink error was detected during "
                                  "the execution")])


@template("nvlink-nccl-warn", "NVLinkError", "test")
def _nvlink_nccl(c: Ctx) -> None:
    start_job(c, routine_steps(c))
    bad = _bad(c)
    h, pid = c.host(bad), c.pids[bad]
    c.add_root(f"{c.p(bad)}{h}:{pid}:{pid + 77} [{bad % 8}] transport/p2p.cc:275 NCCL WARN Cuda failure 'an "
               "uncorrectable NVLink error was detected during the execution'")
    c.add(f"{c.p(bad)}{h}:{pid}:{pid + 77} [{bad % 8}] NCCL INFO transport/p2p.cc:327 -> 1")
    sc.single_rank_fault(c, bad, [("torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/"
                                  "c10d/NCCLUtils.hpp:275, unhandled cuda error, NCCL version 2.19.3"),
                                  "ncclUnhandledCudaError: Call to CUDA function failed."])


# ------------------------------------------------------------ infrastructure: network ----
@template("nccl-hang", "NCCLTimeout", "train")
def _nccl_hang(c: Ctx) -> None:
    start_job(c, routine_steps(c))
    sc.watchdogs(c, range(c.world), root=True)
    sc.torchrun_summary(c, c.rng.randrange(c.world), -6)


@template("nccl-hang-allgather", "NCCLTimeout", "test")
def _nccl_hang_ag(c: Ctx) -> None:
    start_job(c, routine_steps(c))
    stuck = sorted(c.rng.sample(range(c.world), k=max(2, c.world // 2)))
    sc.watchdogs(c, stuck, op="_ALLGATHER_BASE", root=True)
    for r in stuck[:3]:
        c.add(f"{c.p(r)}torch.distributed.DistBackendError: [Rank {r}] NCCL watchdog thread terminated with "
              f"exception: [Rank {r}] Watchdog caught collective operation timeout")
    sc.torchrun_summary(c, stuck[0], -6)


@template("nccl-ib-remote", "NCCLRemoteError", "train")
def _nccl_ib(c: Ctx) -> None:
    start_job(c, routine_steps(c))
    bad = _bad(c)
    h, pid = c.host(bad), c.pids[bad]
    c.add_root(f"{c.p(bad)}{h}:{pid}:{pid + 91} [{bad % 8}] transport/net_ib.cc:1295 NCCL WARN NET/IB : Got "
               f"completion from peer {c.ip((bad + 8) % c.world)}<{c.rng.randrange(30000, 60000)}> with error 12, "
               "opcode 32753, len 0, vendor err 129 (Recv)")
    c.add(f"{c.p(bad)}{h}:{pid}:{pid + 91} [{bad % 8}] NCCL INFO include/net.h:35 -> 6")
    exc = [("torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:"
           "1970, remote process exited or there was a network error, NCCL version 2.19.3"),
           "ncclRemoteError: A call failed possibly due to a network error or a remote process exiting prematurely."]
    c.merge([sc.traceback(c, r, "step", exc, root=False) for r in (bad, (bad + 8) % c.world)])
    sc.sigterms(c, c.other_ranks(bad))
    sc.torchrun_summary(c, bad)


@template("nccl-roce-retry", "NCCLRemoteError", "test")
def _nccl_roce(c: Ctx) -> None:
    start_job(c, routine_steps(c))
    bad = _bad(c)
    h, pid = c.host(bad), c.pids[bad]
    c.add_root(f"{c.p(bad)}{h}:{pid}:{pid + 12} [{bad % 8}] NCCL WARN NET/IB : mlx5_{c.rng.randrange(4)}:1 "
               "Got async event : port error")
    c.add_root(f"{c.p(bad)}{h}:{pid}:{pid + 12} [{bad % 8}] NCCL WARN NET/IB : Got completion from peer "
               f"{c.ip((bad + 8) % c.world)} with status=IBV_WC_RETRY_EXC_ERR(12) opcode=1 len=524288 vendor err 129")
    c.merge([sc.traceback(c, bad, "step", [
        ("torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:2006, "
        "remote process exited or there was a network error, NCCL version 2.20.5"),
        "ncclRemoteError: A call failed possibly due to a network error or a remote process exiting prematurely."],
        root=False)])
    sc.torchrun_summary(c, bad)


@template("node-slurm", "NodeFailure", "train")
def _node_slurm(c: Ctx) -> None:
    start_job(c, routine_steps(c))
    bad_node = c.rng.randrange(len(c.hosts))
    host = c.hosts[bad_node]
    c.tick(10)
    c.add_root(f"srun: error: Node failure on {host}")
    c.add_root(f"slurmstepd: error: *** STEP {c.rng.randrange(10**5, 10**6)}.0 ON {host} CANCELLED AT "
               f"{c.clock.strftime('%Y-%m-%dT%H:%M:%S')} DUE TO NODE FAILURE, SEE SLURMCTLD LOG FOR DETAILS ***")
    others = [r for r in range(c.world) if r // 8 != bad_node] or [0]
    for r in others[: c.rng.randrange(1, len(others) + 1)]:
        c.add(f"{c.p(r)}[W socket.cpp:464] [c10d] The server socket has failed to listen on any local network "
              f"address. Connection reset by peer")
    sc.remote_exits(c, others)
    c.add(f"srun: error: {host}: tasks {bad_node * 8}-{bad_node * 8 + 7}: Killed")


@template("node-k8s-notready", "NodeFailure", "train")
def _node_k8s(c: Ctx) -> None:
    start_job(c, routine_steps(c))
    bad_node = c.rng.randrange(len(c.hosts))
    host = c.hosts[bad_node]
    c.tick(40)
    c.add_root(f"[{c.ts()}] [job-controller] node {host} became NotReady: Kubelet stopped posting node status "
               "(NodeStatusUnknown)")
    c.add(f"[{c.ts()}] [job-controller] pod {c.run}-worker-{bad_node} evicted: node {host} NotReady")
    others = [r for r in range(c.world) if r // 8 != bad_node] or [0]
    sc.remote_exits(c, others)
    sc.torchrun_summary(c, others[0])


@template("node-heartbeat-storm", "NodeFailure", "test")
def _node_heartbeat(c: Ctx) -> None:
    """A node vanishes: its peers see connection resets, the rendezvous loses its keep-alive."""
    start_job(c, routine_steps(c))
    bad_node = c.rng.randrange(len(c.hosts))
    others = [r for r in range(c.world) if r // 8 != bad_node] or [0]
    c.tick(20)
    for r in others[: c.rng.randrange(2, len(others) + 2)]:
        c.add(f"{c.p(r)}[W socket.cpp:697] [c10d] recvValue failed on SocketImpl(fd={c.rng.randrange(20, 90)}, "
              f"addr=[{c.ip(r)}]:{c.rng.randrange(30000, 60000)}): Connection reset by peer")
        c.add(f"{c.p(r)}ConnectionResetError: [Errno 104] Connection reset by peer")
    c.tick(30)
    c.add_root(f"{c.glog('E')} torch/distributed/elastic/rendezvous/dynamic_rendezvous.py:1121] The node "
               f"'{c.hosts[bad_node]}_{c.pids[bad_node * 8]}_0' has failed to send a keep-alive heartbeat to the "
               f"rendezvous '{c.run}' due to an error of type RendezvousConnectionError.")
    sc.sigterms(c, others)
    sc.torchrun_summary(c, others[0], -15)


# ------------------------------------------------------------ infrastructure: storage ----
@template("storage-lustre-eio", "StorageError", "train")
def _storage_eio(c: Ctx) -> None:
    start_job(c, routine_steps(c))
    c.merge([sc.traceback(c, 0, "save", [
        (f"OSError: [Errno 5] Input/output error: '{c.path('ckpt', c.run, f'iter_{c.iteration:07d}')}/"
        "mp_rank_00/model_optim_rng.pt'")])])
    sc.sigterms(c, range(1, c.world))
    sc.torchrun_summary(c, 0)


@template("storage-stale-handle", "StorageError", "train")
def _storage_stale(c: Ctx) -> None:
    _fault_mid_run(c, [(f"OSError: [Errno 116] Stale file handle: '{c.path('data', 'shards')}/"
                       f"shard_{c.rng.randrange(10**4):05d}.bin'")], site="data")


@template("storage-s3-ceph", "StorageError", "train")
def _storage_ceph(c: Ctx) -> None:
    start_job(c, routine_steps(c))
    c.merge([sc.traceback(c, 0, "save", [
        (f"S3StorageError: failed to write s3://{c.user}-ckpt/{c.run}/iter_{c.iteration:07d}/optim.pt: "
        "ceph rgw returned 503 after 5 retries")])])
    sc.sigterms(c, range(1, c.world))
    sc.torchrun_summary(c, 0)


@template("storage-s3-slowdown", "StorageError", "test")
def _storage_s3(c: Ctx) -> None:
    start_job(c, routine_steps(c))
    c.add(f"{c.p(0)}[{c.ts()}] uploading checkpoint shards to s3://{c.user}-ckpt/{c.run}/iter_{c.iteration:07d}")
    c.merge([sc.traceback(c, 0, "save", [
        ("botocore.exceptions.ClientError: An error occurred (SlowDown) when calling the PutObject operation "
        "(reached max retries: 4): Please reduce your request rate.")])])
    sc.sigterms(c, range(1, c.world))
    sc.torchrun_summary(c, 0)


# -------------------------------------------------------- infrastructure: connections ----
@template("conn-metrics-http", "ConnectionError", "train")
def _conn_http(c: Ctx) -> None:
    _fault_mid_run(c, [("requests.exceptions.ConnectionError: HTTPConnectionPool(host='metrics.acme.internal', "
                       "port=8086): Max retries exceeded with url: /write?db=train (Caused by NewConnectionError("
                       "'<urllib3.connection.HTTPConnection object at 0x7f3a2c1d0>: Failed to establish a new "
                       "connection: [Errno 111] Connection refused'))")])


@template("conn-redis", "ConnectionError", "train")
def _conn_redis(c: Ctx) -> None:
    _fault_mid_run(c, [(f"redis.exceptions.ConnectionError: Error 111 connecting to {c.ips[0]}:6379. "
                       "Connection refused.")], site="data")


@template("conn-aborted-monitor", "ConnectionError", "test")
def _conn_aborted(c: Ctx) -> None:
    _fault_mid_run(c, [("urllib3.exceptions.ProtocolError: ('Connection aborted.', RemoteDisconnected('Remote end "
                       "closed connection without response'))")])


# -------------------------------------------------------------------------- memory ----
@template("oom-cuda", "OOM", "train")
def _oom_cuda(c: Ctx) -> None:
    gpu = c.rng.randrange(8)
    _fault_mid_run(c, [(f"torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate "
                       f"{c.rng.uniform(0.5, 8):.2f} GiB. GPU {gpu} has a total capacity of 79.15 GiB of which "
                       f"{c.rng.uniform(0.1, 1):.2f} GiB is free. Including non-PyTorch memory, this process has 78.2 "
                       "GiB memory in use. Of the allocated memory 74.1 GiB is allocated by PyTorch, and 2.3 GiB is "
                       "reserved by PyTorch but unallocated.")])


@template("oom-legacy", "OOM", "train")
def _oom_legacy(c: Ctx) -> None:
    _fault_mid_run(c, [(f"RuntimeError: CUDA out of memory. Tried to allocate {c.rng.randrange(128, 4096)}.00 MiB "
                       f"(GPU {c.rng.randrange(8)}; 79.35 GiB total capacity; 76.12 GiB already allocated; 201.19 MiB "
                       "free; 77.80 GiB reserved in total by PyTorch)")])


@template("oom-host", "OOM", "test")
def _oom_host(c: Ctx) -> None:
    _fault_mid_run(c, [(f"RuntimeError: [enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: not enough "
                       f"memory: you tried to allocate {c.rng.randrange(2, 64) * 2**30} bytes.")], site="save")


# ------------------------------------------------------------------ framework / script ----
def _everyone_fails(c: Ctx, exc: list[str], *, site: str = "step", at_start: bool | None = None,
                    pre: tuple[str, ...] = ()) -> None:
    """Every rank raises the same exception (a config or code error), at start-up or mid-run."""
    early = c.rng.random() < 0.5 if at_start is None else at_start
    start_job(c, c.rng.randrange(0, 20) if early else routine_steps(c))
    c.tick(1)
    ranks = list(range(c.world))
    if c.rng.random() < 0.3:  # some ranks die before they print
        ranks = sorted(c.rng.sample(ranks, k=max(1, c.world // 2)))
    c.merge([sc.traceback(c, r, site, exc, pre=pre) for r in ranks])
    sc.sigterms(c, [r for r in range(c.world) if r not in ranks])
    sc.torchrun_summary(c, ranks[0])


def _shape(c: Ctx) -> str:
    return f"[{c.rng.choice((1, 2, 4))}, {c.rng.choice((2048, 4096))}, {c.rng.choice((32, 40, 64))}, 128]"


@template("rt-view-shape", "RuntimeError", "train")
def _rt_shape(c: Ctx) -> None:
    _everyone_fails(c, [(f"RuntimeError: shape '{_shape(c)}' is invalid for input of size "
                        f"{c.rng.randrange(10**6, 10**8)}")])


@template("rt-state-dict", "RuntimeError", "train")
def _rt_state(c: Ctx) -> None:
    _everyone_fails(c, ["RuntimeError: Error(s) in loading state_dict for GPTModel:",
                        (f"\tsize mismatch for embedding.word_embeddings.weight: copying a param with shape torch.Size("
                        f"[{c.rng.randrange(32000, 64000)}, 4096]) from checkpoint, the shape in current model is "
                        "torch.Size([32000, 4096]).")], site="init", at_start=True)


@template("rt-device-mismatch", "RuntimeError", "test")
def _rt_device(c: Ctx) -> None:
    _everyone_fails(c, [(f"RuntimeError: Expected all tensors to be on the same device, but found at least two "
                        f"devices, cuda:{c.rng.randrange(8)} and cpu!")])


@template("value-heads", "ValueError", "train")
def _value_heads(c: Ctx) -> None:
    _everyone_fails(c, [(f"ValueError: num_attention_heads ({c.rng.choice((40, 52, 56))}) must be divisible by "
                        f"tensor_model_parallel_size ({c.rng.choice((8, 16))})")], site="init", at_start=True)


@template("value-tokenizer", "ValueError", "train")
def _value_tok(c: Ctx) -> None:
    _everyone_fails(c, [("ValueError: Tokenizer class LlamaTokenizerFast does not exist or is not currently "
                        "imported.")], site="init", at_start=True)


@template("value-unpack", "ValueError", "test")
def _value_unpack(c: Ctx) -> None:
    _everyone_fails(c, ["ValueError: too many values to unpack (expected 2)"], site="data")


@template("attr-ddp-module", "AttributeError", "train")
def _attr_module(c: Ctx) -> None:
    _everyone_fails(c, ["AttributeError: 'GPTModel' object has no attribute 'module'"], site="save")


@template("attr-torch-api", "AttributeError", "test")
def _attr_api(c: Ctx) -> None:
    _everyone_fails(c, ["AttributeError: module 'torch.distributed' has no attribute '_reduce_scatter_base'"],
                    at_start=True)


@template("import-flash-attn", "ImportError", "train")
def _import_flash(c: Ctx) -> None:
    _everyone_fails(c, [("ImportError: cannot import name 'flash_attn_varlen_func' from 'flash_attn' "
                        "(/usr/local/lib/python3.10/dist-packages/flash_attn/__init__.py)")], site="init",
                    at_start=True)


@template("import-module-missing", "ImportError", "test")
def _import_missing(c: Ctx) -> None:
    _everyone_fails(c, [f"ModuleNotFoundError: No module named '{c.rng.choice(('apex', 'transformer_engine'))}'"],
                    site="init", at_start=True)


@template("key-checkpoint", "KeyError", "train")
def _key_ckpt(c: Ctx) -> None:
    _everyone_fails(c, [f"KeyError: '{c.rng.choice(('model', 'optimizer', 'rng_state'))}'"], site="init",
                    at_start=True)


@template("key-config", "KeyError", "test")
def _key_cfg(c: Ctx) -> None:
    _everyone_fails(c, ["KeyError: 'rope_scaling'"], site="init", at_start=True)


@template("fnf-tokenizer", "FileNotFoundError", "train")
def _fnf_tok(c: Ctx) -> None:
    _everyone_fails(c, [(f"FileNotFoundError: [Errno 2] No such file or directory: "
                        f"'{c.path('tokenizers', 'llama', 'tokenizer.model')}'")], site="init", at_start=True)


@template("fnf-dataset-index", "FileNotFoundError", "test")
def _fnf_idx(c: Ctx) -> None:
    _everyone_fails(c, [(f"FileNotFoundError: [Errno 2] No such file or directory: "
                        f"'{c.path('data', 'pile_text_document')}.idx'")], site="data")


def _syntax(c: Ctx, code: str, caret: int, msg: str) -> None:
    """A script that does not parse: every rank prints the error right after launch (a short log)."""
    from loom.diagnosis.logsim import launcher_preamble

    launcher_preamble(c)
    line = c.rng.randrange(20, 400)
    ranks = list(range(c.world))
    c.merge([[(f'{c.p(r)}  File "/workspace/{c.user}/train.py", line {line}', False), (f"{c.p(r)}    {code}", False),
              (f"{c.p(r)}    {' ' * caret}^", False), (f"{c.p(r)}SyntaxError: {msg}", True)] for r in ranks])
    sc.torchrun_summary(c, 0, script="train.py")


@template("syntax-comma", "SyntaxError", "train")
def _syntax_comma(c: Ctx) -> None:
    _syntax(c, "lr = 3e-4,,", 10, "invalid syntax")


@template("syntax-unterminated", "SyntaxError", "test")
def _syntax_str(c: Ctx) -> None:
    _syntax(c, "print(f'step {step} loss {loss:.3f})", 10, f"unterminated string literal (detected at line "
                                                           f"{c.rng.randrange(20, 400)})")


@template("type-kwarg", "TypeError", "train")
def _type_kwarg(c: Ctx) -> None:
    _everyone_fails(c, ["TypeError: forward() got an unexpected keyword argument 'attention_mask'"])


@template("name-undefined", "NameError", "train")
def _name_undef(c: Ctx) -> None:
    _everyone_fails(c, ["NameError: name 'tokenizer' is not defined"], site="data")


@template("assert-divisible", "AssertionError", "train")
def _assert_div(c: Ctx) -> None:
    _everyone_fails(c, [("AssertionError: global batch size must be divisible by micro batch size times data "
                        "parallel size")], site="init", at_start=True)


@template("index-vocab", "IndexError", "train")
def _index_vocab(c: Ctx) -> None:
    _everyone_fails(c, ["IndexError: index out of range in self"])


@template("index-collate", "IndexError", "test")
def _index_collate(c: Ctx) -> None:
    _everyone_fails(c, ["IndexError: list index out of range"], site="data")


# ----------------------------------------------------------------------- loss spikes ----
@template("loss-spike-detector", "LossSpike", "train")
def _spike_detector(c: Ctx) -> None:
    start_job(c, routine_steps(c))
    p = c.p(0)
    spike = c.rng.uniform(6, 12)
    c.add_root(f"{p}[{c.ts()}] [WARNING] loss spike detected at iteration {c.iteration}: lm loss {spike:.4f} > "
               f"{c.rng.uniform(2.5, 4):.1f} x running median {c.rng.uniform(1.8, 2.6):.4f} over the last 100 "
               "iterations")
    c.add(f"{p}[{c.ts()}] [WARNING] exiting so that the job can restart from an earlier checkpoint")
    sc.torchrun_summary(c, 0, 3)


@template("loss-nan", "LossSpike", "train")
def _loss_nan(c: Ctx) -> None:
    start_job(c, routine_steps(c))
    c.merge([sc.traceback(c, 0, "step", [(f"FloatingPointError: Loss is nan at iteration {c.iteration + 1}, "
                                         "stopping training")])])
    sc.sigterms(c, range(1, c.world))
    sc.torchrun_summary(c, 0)


@template("loss-diverged", "LossSpike", "test")
def _loss_diverged(c: Ctx) -> None:
    start_job(c, routine_steps(c))
    p = c.p(0)
    c.add_root(f"{p}[{c.ts()}] [ERROR] training diverged: the loss has stayed above 3 sigma of its trailing mean "
               f"for {c.rng.randrange(5, 30)} consecutive steps since step {c.iteration - 20}")
    c.add(f"{p}[{c.ts()}] [INFO] requesting a rollback to the last good checkpoint")
    sc.torchrun_summary(c, 0, 3)


# ---------------------------------------------------------------------- healthy runs ----
@template("healthy-pretrain", HEALTHY, "train")
def _healthy_pretrain(c: Ctx) -> None:
    start_job(c, routine_steps(c))


@template("healthy-finetune", HEALTHY, "train")
def _healthy_finetune(c: Ctx) -> None:
    start_job(c, routine_steps(c) // 2)
    c.add(f"{c.p(0)}[after training is done] datetime: {c.ts()[:19]} ")


@template("healthy-resumed", HEALTHY, "test")
def _healthy_resumed(c: Ctx) -> None:
    start_job(c, routine_steps(c) // 3)
    c.add(f"{c.glog('W')} torch/distributed/elastic/agent/server/api.py:723] [default] Worker group stopped by the "
          "scheduler; 3/3 attempts left; will restart worker group")
    start_job(c, routine_steps(c) // 3)


# -------------------------------------------------------------------------- generation ----
def render(t: Template, index: int, seed: int = 0) -> LabelledLog:
    """Log number `index` of template `t` (deterministic in seed, template and index)."""
    rng = random.Random(zlib.crc32(f"{GENERATOR_VERSION}/{seed}/{t.name}/{index}".encode()))
    c = new_ctx(rng)
    t.write(c)
    return LabelledLog(f"{t.name}-{index}", t.name, t.split, t.error_type, tuple(c.lines), frozenset(c.root_cause))


def generate(split: str | None = None, *, seed: int = 0, per_template: int = LOGS_PER_TEMPLATE) -> Iterator[LabelledLog]:
    """The corpus (or one split of it), template by template."""
    for t in TEMPLATES:
        if split is None or t.split == split:
            for i in range(per_template):
                yield render(t, i, seed)


def templates(split: str | None = None) -> list[Template]:
    return [t for t in TEMPLATES if split is None or t.split == split]
