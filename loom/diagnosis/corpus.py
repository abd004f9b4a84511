"""The labelled corpus: realistic failure logs of LLM training jobs, generated from a seed.

Each template is one failure scenario (or a healthy run) with its Acme error type; each log is a
template rendered with its own ranks, hosts, paths, timings and thousands of routine lines, and
with the numbers of the lines that state the root cause. Templates are split into a training set,
a test set and a blind set: rules, compression filters and the retrieval store are built from the
training split only; the test split holds scenarios never seen there (several phrased so that the
hand-written rules miss them), but it was looked at while the retrieval was designed; the blind
split (15 templates) was written afterwards by someone who had not read the rules, the filters
or the retrieval code, and was measured once. Bump GENERATOR_VERSION whenever the output changes: it keys the
cached retrieval store and the learned filters.
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from loom.diagnosis import scenarios as sc
from loom.diagnosis.logsim import Ctx, new_ctx, routine_steps, start_job, train_steps

GENERATOR_VERSION = "3"
HEALTHY = "Healthy"  # label of healthy runs; the diagnosis expected for them is Unknown
LOGS_PER_TEMPLATE = 5


@dataclass(frozen=True, slots=True)
class Template:
    name: str
    error_type: str
    split: str  # "train" | "test" | "blind" | "blind2" | "blind3"
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


# ----------------------------------------------------------- blind test templates (set 2) ----
# Written after the first 19 test templates had been used while tuning, without looking at the
# rules, filters or retrieval store; test split only, so the training split (and everything built
# from it) is unchanged.
_TORCH = "/usr/local/lib/python3.10/dist-packages/torch"
_RERAISE = ((f"{_TORCH}/utils/data/dataloader.py", 1346, "_next_data", "return self._process_data(data)"),
            (f"{_TORCH}/utils/data/dataloader.py", 1372, "_process_data", "data.reraise()"),
            (f"{_TORCH}/_utils.py", 705, "reraise", "raise exception"))
_WORKER = ((f"{_TORCH}/utils/data/_utils/worker.py", 308, "_worker_loop", "data = fetcher.fetch(index)"),
           (f"{_TORCH}/utils/data/_utils/fetch.py", 51, "fetch",
            "data = [self.dataset[idx] for idx in possibly_batched_index]"),
           (f"{_TORCH}/utils/data/_utils/fetch.py", 51, "<listcomp>",
            "data = [self.dataset[idx] for idx in possibly_batched_index]"))


def _frames(p: str, frames: tuple[tuple[str, int, str, str], ...]) -> sc.Stream:
    out: sc.Stream = []
    for path, line, fn, code in frames:
        out.append((f'{p}  File "{path}", line {line}, in {fn}', False))
        out.append((f"{p}    {code}", False))
    return out


def _worker_error(c: Ctx, rank: int, exc: str, inner: tuple[tuple[str, int, str, str], ...], inner_exc: str, *,
                  outer_root: bool, inner_root: bool) -> sc.Stream:
    """A DataLoader worker's exception as the main process re-raises it (outer + 'Original Traceback')."""
    p = c.p(rank)
    s: sc.Stream = [(f"{p}Traceback (most recent call last):", False)]
    s += _frames(p, sc.FRAMES["data"][:3] + _RERAISE)
    s.append((f"{p}{exc}: Caught {exc} in DataLoader worker process {c.rng.randrange(8)}.", outer_root))
    s.append((f"{p}Original Traceback (most recent call last):", False))
    s += _frames(p, _WORKER + inner)
    s.append((f"{p}{inner_exc}", inner_root))
    return s


def _rank_dies(c: Ctx, bad: int, stream: sc.Stream, exitcode: int = 1) -> None:
    """`bad` prints `stream` and exits; its peers time out or see it go; torchrun reports."""
    c.tick(2)
    c.merge([stream])
    others = c.other_ranks(bad)
    if c.rng.random() < 0.5:
        sc.watchdogs(c, others)
    else:
        sc.remote_exits(c, others)
    sc.sigterms(c, others[: c.rng.randrange(1, len(others) + 1)])
    sc.torchrun_summary(c, bad, exitcode)


def _glog_r(c: Ctx, level: str, rank: int) -> str:
    return f"{level}{c.clock.strftime('%m%d %H:%M:%S')}.{c.clock.microsecond:06d} {c.pids[rank]}"


def _syslog(c: Ctx, host: str) -> str:
    """The prefix of a kernel line from the node's syslog, as the node agent forwards it into the job log."""
    c.tick(0.5)
    uptime = 86400.0 * (sum(map(ord, host)) % 40 + 3) + (c.clock - c.clock.replace(day=1, hour=0, minute=0, second=0,
                                                                                    microsecond=0)).total_seconds()
    return f"{c.clock.strftime('%b %d %H:%M:%S')} {host} kernel: [{uptime:.6f}] "


def _bus(rank: int) -> str:
    return f"0000:{0x18 + (rank % 8) * 0x10:02x}:00"


def _cpp_frames(c: Ctx, rank: int, funcs: tuple[tuple[str, str], ...]) -> sc.Stream:
    p = c.p(rank)
    out: sc.Stream = []
    for i, (fn, lib) in enumerate(funcs):
        where = f"{_TORCH}/lib" if lib.startswith(("libc10", "libtorch")) else "/lib/x86_64-linux-gnu"
        out.append(((f"{p}frame #{i}: {fn} + 0x{c.rng.randrange(0x20, 0x900):x} (0x7f{c.rng.getrandbits(40):010x} "
                    f"in {where}/{lib})"), False))
    return out


_WATCHDOG_CPP = (("c10::Error::Error(c10::SourceLocation, std::string)", "libc10.so"),
                 ("c10::cuda::c10_cuda_check_implementation(int, char const*, char const*, int, bool)",
                  "libc10_cuda.so"),
                 ("c10d::ProcessGroupNCCL::WorkNCCL::finishedGPUExecutionInternal() const", "libtorch_cuda.so"),
                 ("c10d::ProcessGroupNCCL::WorkNCCL::isCompleted()", "libtorch_cuda.so"),
                 ("c10d::ProcessGroupNCCL::watchdogHandler()", "libtorch_cuda.so"),
                 ("c10d::ProcessGroupNCCL::ncclCommWatchdog()", "libtorch_cuda.so"),
                 ("<unknown function>", "libstdc++.so.6"),
                 ("<unknown function>", "libc.so.6"),
                 ("clone", "libc.so.6"))


@template("cuda-xid79-off-bus", "CUDAError", "blind")
def _cuda_off_bus(c: Ctx) -> None:
    """A GPU drops off the PCIe bus: Xid 79 in syslog, the rank sees an 'unknown error', the epilog can't find it."""
    start_job(c, routine_steps(c))
    bad = _bad(c)
    host, bus = c.host(bad), _bus(bad)
    c.tick(30)
    c.add_root(f"{_syslog(c, host)}NVRM: GPU {bus}.0: GPU has fallen off the bus.")
    c.add(f"{_syslog(c, host)}NVRM: GPU at PCI:{bus}: GPU-{c.rng.getrandbits(32):08x}-{c.rng.getrandbits(16):04x}-"
          f"{c.rng.getrandbits(16):04x}-{c.rng.getrandbits(16):04x}-{c.rng.getrandbits(48):012x}")
    c.add(f"{_syslog(c, host)}NVRM: GPU Board Serial Number: 1{c.rng.randrange(10**12, 10**13)}")
    c.add_root(f"{_syslog(c, host)}NVRM: Xid (PCI:{bus}): 79, pid='<unknown>', name=<unknown>, GPU has fallen off "
               "the bus.")
    c.add(f"{_syslog(c, host)}NVRM: A GPU crash dump has been created. If possible, please run")
    c.add(f"{_syslog(c, host)}NVRM: nvidia-bug-report.sh as root to collect this data before")
    c.add(f"{_syslog(c, host)}NVRM: the NVIDIA kernel module is unloaded.")
    p = c.p(bad)
    stream = sc.traceback(c, bad, "step", ["RuntimeError: CUDA error: unknown error",
                                            ("CUDA kernel errors might be asynchronously reported at some other API "
                                             "call, so the stacktrace below might be incorrect."),
                                            "For debugging consider passing CUDA_LAUNCH_BLOCKING=1."])
    stream.insert(0, ((f"{p}[W CUDAGuardImpl.h:118] Warning: CUDA warning: unknown error (function "
                      "destroyEvent)"), False))
    _rank_dies(c, bad, stream)
    c.add(f"[{c.ts()}] [epilog] {host}: running nvidia-smi health check")
    c.add_root(f"[{c.ts()}] [epilog] {host}: Unable to determine the device handle for GPU{bus.upper()}.0: Unknown "
               "Error")


@template("ecc-xid95-watchdog", "ECCError", "blind")
def _ecc_xid95(c: Ctx) -> None:
    """An uncontained ECC error (Xid 95); the rank's NCCL watchdog thread dies with a C++ stack, no Python one."""
    start_job(c, routine_steps(c))
    bad = _bad(c)
    host, bus, p = c.host(bad), _bus(bad), c.p(bad)
    c.tick(5)
    c.add_root(f"{_syslog(c, host)}NVRM: Xid (PCI:{bus}): 95, pid={c.pids[bad]}, name=python3, Uncontained: FBHUB. "
               "RST: Yes, D-RST: No")
    for r in c.rng.sample([x for x in range(c.world) if x // 8 == bad // 8 and x != bad], k=c.rng.randrange(0, 3)):
        c.add(f"{_syslog(c, host)}NVRM: Xid (PCI:{_bus(r)}): 94, pid={c.pids[r]}, name=python3, Contained: SM "
              "(0x1). RST: No, D-RST: No")
    c.tick(1)
    g = _glog_r(c, "E", bad)
    stream: sc.Stream = [
        ((f"{p}[{g} ProcessGroupNCCL.cpp:1414] [PG 0 Rank {bad}] Process group watchdog thread terminated with "
         "exception: CUDA error: uncorrectable ECC error encountered"), True),
        ((f"{p}CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below "
         "might be incorrect."), False),
        (f"{p}For debugging consider passing CUDA_LAUNCH_BLOCKING=1.", False),
        (f"{p}Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.", False),
        (f"{p}", False),
        ((f"{p}Exception raised from c10_cuda_check_implementation at ../c10/cuda/CUDAException.cpp:43 (most recent "
         "call first):"), False)]
    stream += _cpp_frames(c, bad, _WATCHDOG_CPP)
    stream += [(f"{p}", False),
               (f"{p}terminate called after throwing an instance of 'c10::DistBackendError'", False),
               ((f"{p}  what():  [PG 0 Rank {bad}] Process group watchdog thread terminated with exception: CUDA "
                "error: uncorrectable ECC error encountered"), True)]
    _rank_dies(c, bad, stream, -6)


@template("nvlink-nvswitch-sxid", "NVLinkError", "blind")
def _nvlink_sxid(c: Ctx) -> None:
    """An NVSwitch link fault on one node: SXid + fabric manager lines, then every rank hangs and times out."""
    start_job(c, routine_steps(c))
    node = c.rng.randrange(len(c.hosts))
    host = c.hosts[node]
    sw, link = c.rng.randrange(4), c.rng.randrange(64)
    sbus = f"0000:{c.rng.choice((0x05, 0x06, 0x07, 0x08)):02x}:00.0"
    c.tick(20)
    c.add_root(f"{_syslog(c, host)}nvidia-nvswitch{sw}: SXid (PCI:{sbus}): 20034, Fatal, Link {link:02d} LTSSM "
               "Fault Up")
    c.add(f"{_syslog(c, host)}nvidia-nvswitch{sw}: SXid (PCI:{sbus}): 20034, Severity 5 Engine instance {link:02d} "
          "Sub-engine instance 00")
    c.add(f"{_syslog(c, host)}nvidia-nvswitch{sw}: SXid (PCI:{sbus}): 20034, Data {{0x{c.rng.getrandbits(32):08x}, "
          f"0x{c.rng.getrandbits(32):08x}, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000}}")
    c.add_root(f"[{c.clock.strftime('%b %d %Y %H:%M:%S')}] [ERROR] [tid {c.rng.randrange(1000, 9999)}] "
               f"nv-fabricmanager on {host}: detected NVSwitch fatal error 20034 on fid 0 on NVSwitch pci bus id "
               f"0000{sbus} physical id {sw} port {link}")
    c.add(f"[{c.clock.strftime('%b %d %Y %H:%M:%S')}] [INFO] [tid {c.rng.randrange(1000, 9999)}] "
          f"nv-fabricmanager on {host}: NVSwitch fatal error; GPUs attached to the partition need a reset")
    sc.watchdogs(c, range(c.world), op=c.rng.choice(("REDUCE_SCATTER", "ALLREDUCE", "_ALLGATHER_BASE")))
    sc.sigterms(c, [r for r in range(c.world) if r % 3 == 0])
    sc.torchrun_summary(c, node * 8, -6)


@template("nccl-heartbeat-monitor", "NCCLTimeout", "blind")
def _nccl_heartbeat(c: Ctx) -> None:
    """A hang seen by torch>=2.3's heartbeat monitor instead of the watchdog's collective timeout."""
    start_job(c, routine_steps(c))
    c.tick(600)
    hb = c.rng.choice((480, 600))
    ranks = sorted(c.rng.sample(range(c.world), k=c.rng.randrange(max(2, c.world // 4), c.world + 1)))
    streams = []
    for r in ranks:
        p = c.p(r)
        streams.append([
            ((f"{p}[{_glog_r(c, 'E', r)} ProcessGroupNCCL.cpp:1316] [PG 0 Rank {r}] Heartbeat monitor timed out! "
             "Process will be terminated after dumping debug info. workMetaList_.size()=1"), True),
            ((f"{p}[{_glog_r(c, 'E', r)} ProcessGroupNCCL.cpp:1153] [PG 0 Rank {r}] ProcessGroupNCCL preparing to dump "
             "debug info."), False),
            ((f"{p}[{_glog_r(c, 'F', r)} ProcessGroupNCCL.cpp:1169] [PG 0 Rank {r}] [PG 0 Rank {r}] ProcessGroupNCCL's "
             f"watchdog got stuck for {hb} seconds without making progress in monitoring enqueued collectives. This "
             "typically indicates a NCCL/CUDA API hang blocking the watchdog, and could be triggered by another "
             "thread holding the GIL inside a CUDA api, or other deadlock-prone behaviors.If you suspect the "
             "watchdog is not actually stuck and a longer timeout would help, you can either increase the timeout "
             "(TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC) to a larger value or disable the heartbeat monitor "
             "(TORCH_NCCL_ENABLE_MONITORING=0).If either of aforementioned helps, feel free to file an issue to "
             "PyTorch about the short timeout or false positive abort; otherwise, please attempt to debug the hang. "
             "workMetaList_.size() = 1"), True)])
    c.merge(streams)
    c.add(f"{c.glog('W')} torch/distributed/elastic/multiprocessing/api.py:858] Sending process "
          f"{c.pids[ranks[-1]]} closing signal SIGTERM")
    sc.torchrun_summary(c, ranks[0], -6)


@template("nccl-socket-reset", "NCCLRemoteError", "blind")
def _nccl_socket(c: Ctx) -> None:
    """NCCL's socket transport loses its peer mid-collective; the watchdog aborts the communicator."""
    start_job(c, routine_steps(c))
    bad = _bad(c)
    peer = (bad + 8) % c.world if c.world > 8 else (bad + 1) % c.world
    h, pid, p, lr = c.host(bad), c.pids[bad], c.p(bad), bad % 8
    tid = pid + c.rng.randrange(100, 400)
    port = c.rng.randrange(30000, 60000)
    c.tick(3)
    warn = f"socketProgressOpt: Call to recv from {c.ip(peer)}<{port}> failed : Connection reset by peer"
    c.add_root(f"{p}{h}:{pid}:{tid} [{lr}] misc/socket.cc:49 NCCL WARN {warn}")
    for where in ("misc/socket.cc:64", "misc/socket.cc:80", "transport/net_socket.cc:474", "transport/net.cc:1302",
                  "proxy.cc:698"):
        c.add(f"{p}{h}:{pid}:{tid} [{lr}] NCCL INFO {where} -> 6")
    c.add(f"{p}{h}:{pid}:{tid} [{lr}] NCCL INFO proxy.cc:878 -> 6 [Progress Thread]")
    c.tick(2)
    g = _glog_r(c, "E", bad)
    stream: sc.Stream = [
        ((f"{p}[{g} ProcessGroupNCCL.cpp:1414] [PG 0 Rank {bad}] Process group watchdog thread terminated with "
         "exception: NCCL error: remote process exited or there was a network error, NCCL version 2.20.5"), False),
        ((f"{p}ncclRemoteError: A call failed possibly due to a network error or a remote process exiting "
         "prematurely."), False),
        (f"{p}Last error:", False),
        (f"{p}{warn}", True),
        ((f"{p}Exception raised from checkForNCCLErrorsInternal at ../torch/csrc/distributed/c10d/"
         "ProcessGroupNCCL.cpp:1723 (most recent call first):"), False)]
    stream += _cpp_frames(c, bad, (("c10::Error::Error(c10::SourceLocation, std::string)", "libc10.so"),
                                   (("c10d::ProcessGroupNCCL::checkForNCCLErrorsInternal(std::shared_ptr<c10d::"
                                    "NCCLComm>&)"), "libtorch_cuda.so"),
                                   ("c10d::ProcessGroupNCCL::watchdogHandler()", "libtorch_cuda.so"),
                                   ("c10d::ProcessGroupNCCL::ncclCommWatchdog()", "libtorch_cuda.so"),
                                   ("<unknown function>", "libstdc++.so.6"), ("<unknown function>", "libc.so.6")))
    stream.append((f"{p}terminate called after throwing an instance of 'c10::DistBackendError'", False))
    c.merge([stream])
    others = c.other_ranks(bad)
    sc.watchdogs(c, others[: c.rng.randrange(1, len(others) + 1)])
    sc.sigterms(c, others)
    sc.torchrun_summary(c, bad, -6)


@template("storage-quota-dcp", "StorageError", "blind")
def _storage_quota(c: Ctx) -> None:
    """A distributed checkpoint save runs into the file-system quota; every rank raises CheckpointException."""
    start_job(c, routine_steps(c))
    where = c.path("ckpt", c.run, f"iter_{c.iteration:07d}")
    c.add(f"{c.p(0)}saving checkpoint at iteration {c.iteration:>8} to {where} in torch_dist format")
    c.tick(40)
    failed = sorted(c.rng.sample(range(c.world), k=c.rng.randrange(1, min(8, c.world) + 1)))
    dcp = f"{_TORCH}/distributed/checkpoint"
    inner = ((f"{dcp}/utils.py", 204, "reduce_scatter", "local_data = map_fun()"),
             (f"{dcp}/state_dict_saver.py", 297, "write_data", ("all_writes = storage_writer.write_data(final_local_plan, "
                                                               "planner)")),
             (f"{dcp}/filesystem.py", 542, "write_data", "_write_files_from_queue("),
             (f"{dcp}/filesystem.py", 339, "_write_files_from_queue", ("_write_item(stream, data, write_item, "
                                                                      "storage_key)")),
             (f"{dcp}/filesystem.py", 258, "_write_item", "torch.save(data, stream)"),
             (f"{_TORCH}/serialization.py", 629, "save", ("_save(obj, opened_zipfile, pickle_module, pickle_protocol, "
                                                         "_disable_byteorder_record)")),
             (f"{_TORCH}/serialization.py", 863, "_save", "zip_file.write_record(name, storage, num_bytes)"))
    streams = []
    for r in range(c.world):
        p = c.p(r)
        s = sc.traceback(c, r, "dcp", [(f"torch.distributed.checkpoint.api.CheckpointException: CheckpointException "
                                       f"ranks:dict_keys({failed})")], root=False)
        for _ in failed[:2]:
            s.append((f"{p}Traceback: (most recent call last):", False))
            s += _frames(p, inner)
            s.append((f"{p}OSError: [Errno 122] Disk quota exceeded", True))
            s.append((f"{p}", False))
        streams.append(s)
    c.merge(streams[: c.rng.randrange(1, c.world + 1)])
    sc.torchrun_summary(c, 0)


@template("storage-lustre-evicted", "StorageError", "blind")
def _storage_evicted(c: Ctx) -> None:
    """The Lustre client loses an OST and is evicted; a DataLoader worker's read fails with ESHUTDOWN."""
    start_job(c, routine_steps(c))
    bad = _bad(c)
    host = c.host(bad)
    fs = c.rng.choice(("lustre", "scratch", "petrel"))
    ost = f"{fs}-OST{c.rng.randrange(0, 0x60):04x}"
    osc = f"{ost}-osc-ffff{c.rng.getrandbits(40):010x}"
    nid = f"10.{c.rng.randrange(1, 250)}.{c.rng.randrange(250)}.{c.rng.randrange(2, 250)}@o2ib"
    c.tick(60)
    c.add(f"{_syslog(c, host)}Lustre: {osc}: Connection to {ost} (at {nid}) was lost; in progress operations using "
          "this service will wait for recovery to complete")
    c.add_root(f"{_syslog(c, host)}LustreError: 11-0: {osc}: operation ost_read to node {nid} failed: rc = -107")
    c.add_root(f"{_syslog(c, host)}LustreError: 167-0: {osc}: This client was evicted by {ost}; in progress "
               "operations using this service will fail.")
    train_steps(c, c.rng.randrange(0, 2))
    shard = f"{c.path('data', 'tokens')}/shard_{c.rng.randrange(10**4):05d}.bin"
    inner = (("/workspace/data/indexed_dataset.py", 512, "__getitem__", "return self._read(idx)"),
             ("/workspace/data/indexed_dataset.py", 538, "_read", ("buf = np.fromfile(f, dtype=self._dtype, "
                                                                   "count=length)")))
    stream = _worker_error(c, bad, "OSError", inner, f"OSError: [Errno 108] Cannot send after transport endpoint "
                           f"shutdown: '{shard}'", outer_root=False, inner_root=True)
    _rank_dies(c, bad, stream)
    c.add(f"{_syslog(c, host)}Lustre: {osc}: Connection restored to {ost} (at {nid})")


@template("conn-mlflow-503", "ConnectionError", "blind")
def _conn_mlflow(c: Ctx) -> None:
    """The experiment tracker answers 503s until the HTTP client gives up; the logging rank dies."""
    start_job(c, routine_steps(c))
    bad = c.rng.choice((0, c.world - 1))
    host = c.rng.choice(("mlflow.acme.internal", "tracking.ml.acme.internal"))
    url = "/api/2.0/mlflow/runs/log-batch"
    c.tick(c.rng.uniform(30, 120))
    stream = sc.traceback(c, bad, "log", [
        (f"mlflow.exceptions.MlflowException: API request to http://{host}:5000{url} failed with exception "
         f"HTTPConnectionPool(host='{host}', port=5000): Max retries exceeded with url: {url} (Caused by "
         "ResponseError('too many 503 error responses'))")])
    _rank_dies(c, bad, stream)


@template("oom-cgroup-dataloader", "OOM", "blind")
def _oom_cgroup(c: Ctx) -> None:
    """The pod's memory cgroup kills a DataLoader worker; the rank only reports the worker's SIGKILL."""
    start_job(c, routine_steps(c))
    bad = _bad(c)
    host, p = c.host(bad), c.p(bad)
    wpid = c.pids[bad] + c.rng.randrange(10, 500)
    c.tick(10)
    c.add_root(f"{_syslog(c, host)}python3 invoked oom-killer: gfp_mask=0xcc0(GFP_KERNEL), order=0, oom_score_adj=0")
    limit = c.rng.choice((268435456, 536870912, 1073741824))
    c.add(f"{_syslog(c, host)}memory: usage {limit}kB, limit {limit}kB, failcnt {c.rng.randrange(1, 3000)}")
    c.add_root(f"{_syslog(c, host)}Memory cgroup out of memory: Killed process {wpid} (python3) total-vm:"
               f"{c.rng.randrange(10**8, 3 * 10**8)}kB, anon-rss:{c.rng.randrange(10**7, 6 * 10**7)}kB, file-rss:"
               f"{c.rng.randrange(10**4, 10**6)}kB, shmem-rss:{c.rng.randrange(10**5, 10**7)}kB, UID:0 pgtables:"
               f"{c.rng.randrange(10**4, 10**6)}kB oom_score_adj:0")
    c.tick(1)
    s: sc.Stream = [(f"{p}Traceback (most recent call last):", False)]
    s += _frames(p, ((f"{_TORCH}/utils/data/dataloader.py", 1133, "_try_get_data",
                      "data = self._data_queue.get(timeout=timeout)"),
                     ("/usr/lib/python3.10/multiprocessing/queues.py", 113, "get", "if not self._poll(timeout):"),
                     (f"{_TORCH}/utils/data/_utils/signal_handling.py", 66, "handler", "_error_if_any_worker_fails()")))
    s.append((f"{p}RuntimeError: DataLoader worker (pid {wpid}) is killed by signal: Killed. ", False))
    s += [(f"{p}", False), (f"{p}The above exception was the direct cause of the following exception:", False),
          (f"{p}", False), (f"{p}Traceback (most recent call last):", False)]
    s += _frames(p, sc.FRAMES["data"][:3] + ((f"{_TORCH}/utils/data/dataloader.py", 1329, "_next_data",
                                              "idx, data = self._get_data()"),
                                             (f"{_TORCH}/utils/data/dataloader.py", 1146, "_try_get_data",
                                              ("raise RuntimeError(f'DataLoader worker (pid(s) {pids_str}) exited "
                                              "unexpectedly') from e"))))
    s.append((f"{p}RuntimeError: DataLoader worker (pid(s) {wpid}) exited unexpectedly", False))
    _rank_dies(c, bad, s)


@template("rt-ddp-unused-params", "RuntimeError", "blind")
def _rt_ddp_unused(c: Ctx) -> None:
    """DDP's reducer finds parameters without gradients at the second iteration, on every rank."""
    start_job(c, c.rng.randrange(1, 4))
    c.tick(1)
    idx = sorted(c.rng.sample(range(100, 400), k=c.rng.randrange(1, 4)))
    ranks = list(range(c.world))
    if c.rng.random() < 0.3:
        ranks = sorted(c.rng.sample(ranks, k=max(1, c.world // 2)))
    c.merge([sc.traceback(c, r, "step", [
        ("RuntimeError: Expected to have finished reduction in the prior iteration before starting a new one. This "
         "error indicates that your module has parameters that were not used in producing loss. You can enable "
         "unused parameter detection by passing the keyword argument `find_unused_parameters=True` to "
         "`torch.nn.parallel.DistributedDataParallel`, and by "),
        "making sure all `forward` function outputs participate in calculating loss. ",
        ("If you already have done the above, then the distributed data parallel module wasn't able to locate the "
         "output tensors in the return value of your module's `forward` function. Please include the loss function "
         "and the structure of the return value of `forward` of your module when reporting this issue (e.g. list, "
         "dict, iterable)."),
        f"Parameter indices which did not receive grad for rank {r}: {' '.join(map(str, idx))}",
        (" In addition, you can set the environment variable TORCH_DISTRIBUTED_DEBUG to either INFO or DETAIL to "
         "print out information about which particular parameters did not receive gradient on this rank as part "
         "of this error")]) for r in ranks])
    sc.sigterms(c, [r for r in range(c.world) if r not in ranks])
    sc.torchrun_summary(c, ranks[0])


@template("import-undefined-symbol", "ImportError", "blind")
def _import_symbol(c: Ctx) -> None:
    """A compiled extension built against another torch: the import fails with an undefined C++ symbol."""
    so, sym = c.rng.choice((("fused_layer_norm_cuda", "_ZN3c1015SmallVectorBaseIjE8grow_podEPKvmm"),
                            ("fused_layer_norm_cuda", "_ZN3c106detail14torchCheckFailEPKcS2_jRKSs")))
    _everyone_fails(c, [(f"ImportError: /usr/local/lib/python3.10/dist-packages/{so}.cpython-310-x86_64-linux-gnu.so:"
                        f" undefined symbol: {sym}")], site="import", at_start=True)


@template("key-dataloader-column", "KeyError", "blind")
def _key_column(c: Ctx) -> None:
    """The dataset lacks the column the collate step expects; every rank's worker raises KeyError."""
    start_job(c, c.rng.randrange(0, 10))
    c.tick(1)
    col = c.rng.choice(("input_ids", "labels", "attention_mask"))
    inner = (("/workspace/sft/data.py", 88, "__getitem__", f'ids = sample["{col}"]'),)
    ranks = list(range(c.world))
    if c.rng.random() < 0.3:
        ranks = sorted(c.rng.sample(ranks, k=max(1, c.world // 2)))
    c.merge([_worker_error(c, r, "KeyError", inner, f"KeyError: '{col}'", outer_root=True, inner_root=True)
             for r in ranks])
    sc.sigterms(c, [r for r in range(c.world) if r not in ranks])
    sc.torchrun_summary(c, ranks[0], script="train_sft.py")


@template("fnf-datasets-pattern", "FileNotFoundError", "blind")
def _fnf_pattern(c: Ctx) -> None:
    """HF datasets resolves a data_files glob that matches nothing on the nodes."""
    pattern = c.path("data", "sft", c.rng.choice(("train-*.jsonl", "train/*.parquet", "mix_v3/*.json")))
    _everyone_fails(c, [f"FileNotFoundError: Unable to find '{pattern}'"], site="hfds", at_start=True)


@template("syntax-indent-config", "SyntaxError", "blind")
def _syntax_indent(c: Ctx) -> None:
    """An imported config module does not parse: IndentationError (a SyntaxError) with the import frame above it."""
    from loom.diagnosis.logsim import launcher_preamble

    launcher_preamble(c)
    line = c.rng.randrange(20, 200)
    mod = c.rng.choice(("llama_sft", "pretrain_7b", "mix_v3"))
    code = c.rng.choice(("warmup_steps=2000,", "lr_decay_style = 'cosine'", "return cfg"))
    msg = c.rng.choice(("unexpected indent", "unindent does not match any outer indentation level"))
    streams = []
    for r in range(c.world):
        p = c.p(r)
        streams.append([(f"{p}Traceback (most recent call last):", False),
                        (f'{p}  File "/workspace/{c.user}/train.py", line 14, in <module>', False),
                        (f"{p}    from configs.{mod} import get_config", False),
                        (f'{p}  File "/workspace/{c.user}/configs/{mod}.py", line {line}', False),
                        (f"{p}    {code}", False),
                        (f"{p}IndentationError: {msg}", True)])
    c.merge(streams)
    sc.torchrun_summary(c, 0, script="train.py")


@template("loss-scale-minimum", "LossSpike", "blind")
def _loss_scale_min(c: Ctx) -> None:
    """fp16 training diverges: loss jumps, every step overflows, DeepSpeed's loss scaler hits its floor."""
    c.style = "deepspeed"
    start_job(c, routine_steps(c))
    p = c.p(0)
    loss = c.rng.uniform(2.0, 2.6)
    for _ in range(c.rng.randrange(3, 7)):
        c.iteration += 1
        c.tick(4)
        loss = min(loss * c.rng.uniform(1.3, 2.0), c.rng.uniform(11, 13))
        c.add(f"{p}steps: {c.iteration} loss: {loss:.4f} iter time (s): {c.rng.uniform(3, 9):.3f} "
              f"samples/sec: {c.rng.uniform(100, 300):.3f}")
    scale = 2 ** c.rng.randrange(12, 17)
    while scale > 1:
        c.iteration += 1
        c.tick(4)
        c.add(f"{p}[{c.ts()}] [INFO] [loss_scaler.py:183:update_scale] [deepspeed] OVERFLOW! Rank 0 Skipping step. "
              f"Attempted loss scale: {scale}, reducing to {scale // 2}")
        c.add(f"{p}[{c.ts()}] [INFO] [logging.py:96:log_dist] [Rank 0] step={c.iteration}, skipped="
              f"{c.rng.randrange(1, 40)}, lr=[{c.rng.uniform(1e-5, 3e-4):.8f}], mom=[(0.9, 0.95)]")
        scale //= 2
    c.iteration += 1
    c.tick(4)
    c.add(f"{p}[{c.ts()}] [INFO] [loss_scaler.py:183:update_scale] [deepspeed] OVERFLOW! Rank 0 Skipping step. "
          "Attempted loss scale: 1, reducing to 1")
    ranks = list(range(c.world)) if c.rng.random() < 0.5 else [0]
    c.merge([sc.traceback(c, r, "ds_step", [("Exception: Current loss scale already at minimum - cannot decrease "
                                             "scale anymore. Exiting run.")]) for r in ranks])
    sc.sigterms(c, [r for r in range(c.world) if r not in ranks])
    sc.torchrun_summary(c, 0)


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


# More templates live in modules of their own; importing them registers them (after the above).
from loom.diagnosis import corpus_blind2, corpus_blind3, corpus_train2, corpus_train3  # noqa: E402,F401  (registration)
