"""Training templates, second set (continued): storage, auxiliary services, memory, framework and
script errors, divergence, and healthy runs with noisy but harmless warnings.

Registered by importing (loom/diagnosis/corpus_train2.py imports this module at its end).
"""

from __future__ import annotations

from loom.diagnosis import scenarios as sc
from loom.diagnosis.corpus import HEALTHY, _bad, _everyone_fails, _fault_mid_run, template
from loom.diagnosis.corpus_train2 import _CUDA_HINT, _NCCL_ERR, _PKG, _exc_lines, _kernel
from loom.diagnosis.logsim import Ctx, routine_steps, start_job, train_steps

_DURING = "During handling of the above exception, another exception occurred:"


def _fails_at_save(c: Ctx, exc: list[str], *, rank: int = 0) -> None:
    """Rank `rank` fails while writing a checkpoint; the others are torn down by the agent."""
    start_job(c, routine_steps(c))
    c.merge([sc.traceback(c, rank, "save", exc)])
    others = [r for r in range(c.world) if r != rank]
    if c.rng.random() < 0.5:
        sc.watchdogs(c, others[: c.rng.randrange(1, len(others) + 1)])
    sc.sigterms(c, others)
    sc.torchrun_summary(c, rank)


# ------------------------------------------------------------------------------ storage ----
@template("storage-ckpt-enospc", "StorageError", "train")
def _enospc(c: Ctx) -> None:
    """torch.save runs out of space: the zip writer's enforce failure, then the OSError behind it."""
    where = c.path("ckpt", c.run, f"iter_{c.iteration + 500:07d}", "mp_rank_00", "model_optim_rng.pt")
    first = c.rng.choice((f"RuntimeError: [enforce fail at inline_container.cc:{c.rng.choice((595, 764))}] . "
                          f"PytorchStreamWriter failed writing file data/{c.rng.randrange(90)}: file write failed",
                          f"RuntimeError: [enforce fail at inline_container.cc:{c.rng.choice((595, 764))}] . unexpected "
                          f"pos {c.rng.randrange(10**8, 10**9)} vs {c.rng.randrange(10**8, 10**9)}"))
    _fails_at_save(c, [first, "", _DURING, "", f"OSError: [Errno 28] No space left on device: '{where}'"])


@template("storage-safetensors-quota", "StorageError", "train")
def _quota(c: Ctx) -> None:
    """A Hugging Face Trainer checkpoint hits the project quota (safetensors' Rust IoError, errno 122)."""
    start_job(c, routine_steps(c))
    step = c.rng.randrange(1, 90) * 500
    c.merge([[(f"{c.p(0)}Saving model checkpoint to {c.path('output', c.run)}/checkpoint-{step}", False)]
             + sc.traceback(c, 0, "step", [
                 c.rng.choice(('safetensors_rust.SafetensorError: Error while serializing: IoError(Os { code: 122, '
                               'kind: FilesystemQuotaExceeded, message: "Disk quota exceeded" })',
                               f"OSError: [Errno 122] Disk quota exceeded: '{c.path('output', c.run)}/checkpoint-"
                               f"{step}/optimizer.pt'"))])])
    sc.sigterms(c, range(1, c.world))
    sc.torchrun_summary(c, 0, script="train_sft.py")


@template("storage-kernel-lustre-nfs", "StorageError", "train")
def _fs_kernel(c: Ctx) -> None:
    """The parallel file system drops the client (Lustre eviction, NFS server not responding); reads fail."""
    start_job(c, routine_steps(c))
    bad = _bad(c)
    c.tick(5)
    if c.rng.random() < 0.6:
        fs = c.rng.choice(("lustre", "petrel", "scratch"))
        _kernel(c, bad, f"LustreError: 11-0: {fs}-OST00{c.rng.randrange(10, 99)}-osc-ffff{c.rng.getrandbits(32):08x}: "
                        f"operation ost_read to node {c.ips[0]}@o2ib failed: rc = -107")
        _kernel(c, bad, f"LustreError: 167-0: {fs}-MDT0000-mdc-ffff{c.rng.getrandbits(32):08x}: This client was "
                        f"evicted by {fs}-MDT0000; in progress operations using this service will fail.")
        errno = c.rng.choice(("[Errno 108] Cannot send after transport endpoint shutdown", "[Errno 5] Input/output error"))
    else:
        _kernel(c, bad, f"nfs: server nas-{c.rng.randrange(1, 9):02d} not responding, timed out")
        errno = c.rng.choice(("[Errno 5] Input/output error", "[Errno 116] Stale file handle"))
    c.tick(30)
    sc.single_rank_fault(c, bad, [f"OSError: {errno}: '{c.path('data', 'shards')}/part-{c.rng.randrange(10**4):05d}"
                                  ".bin'"], site="data")


@template("storage-object-store-5xx", "StorageError", "train")
def _object_store(c: Ctx) -> None:
    """Checkpoint upload to an object store is throttled or gets 5xx (GCS, Azure Blob or S3 clients)."""
    bucket = f"{c.user}-ckpt"
    key = f"{c.run}/iter_{c.iteration + 500:07d}/__0_0.distcp"
    exc = c.rng.choice((
        [f"google.api_core.exceptions.{c.rng.choice(('ServiceUnavailable: 503', 'TooManyRequests: 429'))} PUT "
         f"https://storage.googleapis.com/upload/storage/v1/b/{bucket}/o?uploadType=resumable: We encountered an "
         "internal error. Please try again."],
        ["azure.core.exceptions.HttpResponseError: (ServerBusy) The server is busy.",
         "Code: ServerBusy", "Message: The server is busy."],
        [f"botocore.exceptions.ClientError: An error occurred ({c.rng.choice(('ServiceUnavailable', 'InternalError'))})"
         " when calling the UploadPart operation (reached max retries: 4): Please reduce your request rate."]))
    _fails_at_save(c, exc)


# ------------------------------------------------------------------ auxiliary services ----
@template("conn-tracking-5xx", "ConnectionError", "train")
def _tracking(c: Ctx) -> None:
    """The experiment tracker or metrics endpoint answers 5xx or drops the connection; the logger raises."""
    host = c.rng.choice(("api.wandb.ai", "wandb.acme.internal", "metrics.acme.internal"))
    exc = c.rng.choice((
        [f"requests.exceptions.HTTPError: {c.rng.choice((500, 502, 503, 504))} Server Error: "
         f"{c.rng.choice(('Bad Gateway', 'Service Unavailable', 'Gateway Time-out'))} for url: https://{host}/graphql"],
        ["wandb.errors.CommError: Error communicating with wandb process, exiting..."],
        [f"urllib3.exceptions.ProtocolError: ('Connection aborted.', RemoteDisconnected('Remote end closed connection "
         "without response'))", "", _DURING, "",
         f"requests.exceptions.ConnectionError: ('Connection aborted.', RemoteDisconnected('Remote end closed "
         "connection without response'))"]))
    start_job(c, routine_steps(c))
    for _ in range(c.rng.randrange(1, 4)):
        c.add(f"{c.p(0)}wandb: Network error (ReadTimeout), entering retry loop.")
        train_steps(c, c.rng.randrange(1, 20))
    c.merge([sc.traceback(c, 0, "step", exc)])
    sc.sigterms(c, range(1, c.world))
    sc.torchrun_summary(c, 0)


@template("conn-pushgateway-etcd", "ConnectionError", "train")
def _kv_push(c: Ctx) -> None:
    """A Prometheus push or an etcd key-value call cannot reach its server."""
    exc = c.rng.choice((
        [f"urllib.error.URLError: <urlopen error [Errno {c.rng.choice(('110] Connection timed out', '111] Connection refused'))}>"],
        ["etcd3.exceptions.ConnectionFailedError"],
        ["grpc._channel._InactiveRpcError: <_InactiveRpcError of RPC that terminated with:",
         "\tstatus = StatusCode.UNAVAILABLE",
         f'\tdetails = "failed to connect to all addresses; last error: UNKNOWN: ipv4:{c.ips[0]}:2379: Failed to '
         'connect to remote host: Connection refused"']))
    _fault_mid_run(c, exc)


# ------------------------------------------------------------------------------ memory ----
@template("oom-device-variants", "OOM", "train")
def _oom_device(c: Ctx) -> None:
    """Device memory exhausted, in the wordings of torch >= 2.5, cuBLAS handle creation and NCCL buffers."""
    kind = c.rng.randrange(3)
    if kind == 0:
        _fault_mid_run(c, [f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {c.rng.uniform(1, 20):.2f} "
                           f"GiB. GPU {c.rng.randrange(8)} has a total capacity of 79.10 GiB of which "
                           f"{c.rng.randrange(10, 900)}.00 MiB is free."])
    elif kind == 1:
        _fault_mid_run(c, ["RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"])
    else:
        start_job(c, routine_steps(c))
        bad = _bad(c)
        h, pid = c.host(bad), c.pids[bad]
        c.add_root(f"{c.p(bad)}{h}:{pid}:{pid + 31} [{bad % 8}] include/alloc.h:{c.rng.choice((103, 185))} NCCL WARN "
                   f"Cuda failure 'out of memory'")
        c.add(f"{c.p(bad)}{h}:{pid}:{pid + 31} [{bad % 8}] NCCL INFO include/alloc.h:109 -> 1")
        sc.single_rank_fault(c, bad, [_NCCL_ERR.format(what="unhandled cuda error (run with NCCL_DEBUG=INFO for "
                                                            "details)"),
                                      "ncclUnhandledCudaError: Call to CUDA function failed.",
                                      "Last error:", "Cuda failure 'out of memory'"])


@template("oom-host-killer", "OOM", "train")
def _oom_host(c: Ctx) -> None:
    """Host memory runs out: the kernel's OOM killer takes a worker (exit -9), or the CPU allocator fails."""
    start_job(c, routine_steps(c))
    bad = _bad(c)
    c.tick(3)
    if c.rng.random() < 0.5:
        _kernel(c, bad, f"python3 invoked oom-killer: gfp_mask=0x100cca(GFP_HIGHUSER_MOVABLE), order=0, "
                        "oom_score_adj=0")
        _kernel(c, bad, c.rng.choice((f"Out of memory: Killed process {c.pids[bad]} (pt_main_thread) total-vm:"
                                      f"{c.rng.randrange(10**8, 10**9)}kB, anon-rss:{c.rng.randrange(10**8, 10**9)}kB",
                                      f"Memory cgroup out of memory: Killed process {c.pids[bad]} (python3) "
                                      f"total-vm:{c.rng.randrange(10**8, 10**9)}kB")))
        others = c.other_ranks(bad)
        sc.watchdogs(c, others) if c.rng.random() < 0.5 else sc.remote_exits(c, others)
        sc.torchrun_summary(c, bad, -9)
    else:
        sc.single_rank_fault(c, bad, [f"RuntimeError: [enforce fail at alloc_cpu.cpp:{c.rng.choice((83, 117))}] "
                                      f"err == 0. DefaultCPUAllocator: can't allocate memory: you tried to allocate "
                                      f"{c.rng.randrange(10**9, 10**11)} bytes. Error code 12 (Cannot allocate "
                                      "memory)"], site="data")


@template("oom-dataloader-killed", "OOM", "train")
def _oom_worker(c: Ctx) -> None:
    """A DataLoader worker is killed by the OOM killer; the main process reports the signal."""
    _fault_mid_run(c, [c.rng.choice((f"RuntimeError: DataLoader worker (pid {c.rng.randrange(10**4, 10**6)}) is killed "
                                     "by signal: Killed. ",
                                     f"RuntimeError: DataLoader worker (pid {c.rng.randrange(10**4, 10**6)}) is killed "
                                     "by signal: Bus error. It is possible that dataloader's workers are out of shared "
                                     "memory. Please try to raise your shared memory limit."))],
                   site="data")


# ------------------------------------------------------------------- framework errors ----
@template("rt-ddp-dtype-device", "RuntimeError", "train")
def _rt_variants(c: Ctx) -> None:
    """Framework RuntimeErrors with a known cause: DDP bookkeeping, dtype and device mismatches."""
    _everyone_fails(c, [c.rng.choice((
        "RuntimeError: Expected to have finished reduction in the prior iteration before starting a new one. This "
        "error indicates that your module has parameters that were not used in producing loss. You can enable unused "
        "parameter detection by passing the keyword argument `find_unused_parameters=True` to "
        "`torch.nn.parallel.DistributedDataParallel`.",
        "RuntimeError: Expected to mark a variable ready only once. This error is caused by one of the following "
        "reasons: 1) Use of a module parameter outside the `forward` function.",
        "RuntimeError: expected scalar type BFloat16 but found Float",
        "RuntimeError: mat1 and mat2 must have the same dtype, but got Float and BFloat16",
        "RuntimeError: Expected all tensors to be on the same device, but found at least two devices, cuda:3 and cpu!"
    ))])


@template("import-compiled-extension", "ImportError", "train")
def _import_ext(c: Ctx) -> None:
    """A compiled extension built against another torch or CUDA: undefined symbol or a missing library."""
    ext = c.rng.choice(("transformer_engine_torch", "flash_attn_2_cuda", "apex_C", "fused_layer_norm_cuda"))
    _everyone_fails(c, [c.rng.choice((
        f"ImportError: {_PKG}/{ext}.cpython-310-x86_64-linux-gnu.so: undefined symbol: "
        "_ZN3c104cuda9SetDeviceEi",
        f"ImportError: libcudnn.so.{c.rng.choice((8, 9))}: cannot open shared object file: No such file or directory",
        "ImportError: Megatron-Core requires transformer-engine>=1.7.0, but found 1.4.0"))], site="import",
        at_start=True)


@template("key-env-local-rank", "KeyError", "train")
def _key_env(c: Ctx) -> None:
    """The script was started with python instead of torchrun: the launcher's environment is missing."""
    _everyone_fails(c, [f"KeyError: '{c.rng.choice(('LOCAL_RANK', 'MASTER_ADDR', 'WORLD_SIZE'))}'"], site="init",
                    at_start=True)


@template("fnf-resume-checkpoint", "FileNotFoundError", "train")
def _fnf_resume(c: Ctx) -> None:
    """Resuming from a checkpoint directory whose shard files are not there."""
    step = c.rng.randrange(1, 90) * 1000
    _everyone_fails(c, [f"FileNotFoundError: [Errno 2] No such file or directory: "
                        f"'{c.path('ckpt', c.run, f'global_step{step}', 'mp_rank_00_model_states.pt')}'"],
                    site="init", at_start=True)


@template("syntax-indentation", "SyntaxError", "train")
def _indent(c: Ctx) -> None:
    """An edited module does not parse: indentation errors at import time."""
    from loom.diagnosis.logsim import launcher_preamble

    launcher_preamble(c)
    line = c.rng.randrange(20, 400)
    msg = c.rng.choice(("IndentationError: unexpected indent",
                        "IndentationError: unindent does not match any outer indentation level",
                        "TabError: inconsistent use of tabs and spaces in indentation"))
    c.merge([[(f"{c.p(r)}Traceback (most recent call last):", False),
              (f'{c.p(r)}  File "/workspace/{c.user}/train.py", line 12, in <module>', False),
              (f"{c.p(r)}    from model import build", False),
              (f'{c.p(r)}  File "/workspace/{c.user}/model.py", line {line}', False),
              (f"{c.p(r)}    return x + self.dropout(h)", False), (f"{c.p(r)}    ^", False),
              (f"{c.p(r)}{msg}", True)] for r in range(c.world)])
    sc.torchrun_summary(c, 0, script="train.py")


@template("value-precision-config", "ValueError", "train")
def _value_cfg(c: Ctx) -> None:
    """An invalid combination of settings rejected by the framework."""
    _everyone_fails(c, [c.rng.choice((
        "ValueError: Attempting to unscale FP16 gradients.",
        "ValueError: Your setup doesn't support bf16/gpu. You need torch>=1.10, using Ampere GPU with cuda>=11.0",
        f"ValueError: sequence_parallel requires tensor_model_parallel_size > 1, got {c.rng.choice((0, 1))}"))],
        site=c.rng.choice(("init", "step")))


# ----------------------------------------------------------------------- script errors ----
@template("index-embedding-device-assert", "IndexError", "train")
def _index_assert(c: Ctx) -> None:
    """A token id beyond the vocabulary: CUDA's index assertion on many threads, then a device-side assert."""
    start_job(c, routine_steps(c))
    bad = _bad(c)
    p = c.p(bad)
    block = c.rng.randrange(100, 900)
    s = [(f"{p}../aten/src/ATen/native/cuda/Indexing.cu:1290: indexSelectLargeIndex: block: [{block},0,0], thread: "
          f"[{t},0,0] Assertion `srcIndex < srcSelectDimSize` failed.", True)
         for t in sorted(c.rng.sample(range(128), k=c.rng.randrange(2, 6)))]
    s += sc.traceback(c, bad, "step", ["RuntimeError: CUDA error: device-side assert triggered", _CUDA_HINT])
    c.merge([s])
    others = c.other_ranks(bad)
    sc.watchdogs(c, others)
    sc.torchrun_summary(c, bad)


@template("type-dataloader-worker", "TypeError", "train")
def _type_worker(c: Ctx) -> None:
    """A collate or dataset bug surfaces as a TypeError re-raised from a DataLoader worker."""
    w = c.rng.randrange(8)
    _fault_mid_run(c, [f"TypeError: Caught TypeError in DataLoader worker process {w}.",
                       "Original Traceback (most recent call last):",
                       c.rng.choice(("TypeError: 'NoneType' object is not subscriptable",
                                     "TypeError: unsupported operand type(s) for +: 'NoneType' and 'int'",
                                     "TypeError: expected Tensor as element 0 in argument 0, but got str"))],
                   site="data")


@template("name-unbound-local", "NameError", "train")
def _unbound(c: Ctx) -> None:
    """A variable used before assignment on a code path the first steps did not take."""
    _everyone_fails(c, [c.rng.choice(("UnboundLocalError: local variable 'loss' referenced before assignment",
                                      "UnboundLocalError: cannot access local variable 'grad_norm' where it is not "
                                      "associated with a value",
                                      "NameError: name 'math' is not defined"))])


@template("assert-bare", "AssertionError", "train")
def _assert_bare(c: Ctx) -> None:
    """An assertion with or without a message deep inside the model code."""
    _everyone_fails(c, [c.rng.choice(("AssertionError", "AssertionError: ",
                                      f"AssertionError: sequence length {c.rng.choice((8192, 16384))} exceeds "
                                      f"max_position_embeddings {c.rng.choice((2048, 4096))}"))],
                    site=c.rng.choice(("step", "init")))


# --------------------------------------------------------------------------- divergence ----
@template("loss-nan-grad-norm", "LossSpike", "train")
def _nan_grad(c: Ctx) -> None:
    """Megatron's check finds a NaN gradient norm after the grad norm climbed for a few iterations."""
    start_job(c, routine_steps(c))
    p = c.p(c.world - 1 if c.prefix_style != "none" else 0)
    for i in range(c.rng.randrange(2, 5)):
        c.iteration += 1
        c.add(f"{p} [{c.ts()[:19]}] iteration {c.iteration:>8}/  500000 | consumed samples: {c.iteration * 1024:>12} "
              f"| lm loss: {3 + i * c.rng.uniform(1, 3):.6E} | loss scale: 1.0 | grad norm: "
              f"{10 ** (2 + i) * c.rng.uniform(1, 9):.3f} | number of skipped iterations:   0 | number of nan "
              "iterations:   0 |")
    bad = _bad(c)
    c.merge([sc.traceback(c, bad, "step", [c.rng.choice((
        f"RuntimeError: Rank {bad}, node {c.host(bad)}, device {bad % 8}, iteration {c.iteration + 1}: Unexpected "
        "result nan (message='found NaN in local grad norm in backward pass before data-parallel communication "
        "collective')",
        "AssertionError: found NaN in local grad norm in backward pass before data-parallel communication "
        "collective"))])])
    sc.remote_exits(c, c.other_ranks(bad))
    sc.torchrun_summary(c, bad)


@template("loss-scale-floor-fairseq", "LossSpike", "train")
def _scale_floor(c: Ctx) -> None:
    """fp16 training whose dynamic loss scale keeps shrinking until it reaches the floor."""
    start_job(c, routine_steps(c))
    p = c.p(0)
    scale = 2.0 ** c.rng.randrange(4, 8)
    while scale > 0.0001:
        c.add(f"{p}{c.ts()} | INFO | fairseq.trainer | NOTE: gradient overflow detected, ignoring gradient, setting "
              f"loss scale to: {scale / 2}")
        scale /= 2
    c.merge([sc.traceback(c, 0, "step", ["FloatingPointError: Minimum loss scale reached (0.0001). Your loss is "
                                         "probably exploding. Try lowering the learning rate, using gradient "
                                         "clipping or increasing the batch size."])])
    sc.sigterms(c, range(1, c.world))
    sc.torchrun_summary(c, 0, script="fairseq-train")


@template("loss-nonfinite-trainer", "LossSpike", "train")
def _nonfinite(c: Ctx) -> None:
    """The trainer logs a non-finite loss, then its divergence guard stops the run."""
    start_job(c, routine_steps(c))
    p = c.p(0)
    step = c.iteration + 1
    c.add_root(c.rng.choice((f"{p}{{'loss': nan, 'grad_norm': nan, 'learning_rate': 2.9e-05, 'epoch': {step / 3000:.2f}}}",
                             f"{p}[{c.ts()}] [WARNING] [trainer] non-finite loss (inf) at step {step}, skipping batch")))
    train_steps(c, c.rng.randrange(0, 3))
    c.add_root(f"{p}[{c.ts()}] [ERROR] [trainer] training diverged: {c.rng.randrange(5, 20)} consecutive steps with a "
               "non-finite loss, stopping")
    sc.torchrun_summary(c, 0, 2)


# ------------------------------------------------------------------------- healthy runs ----
@template("healthy-noisy-warnings", HEALTHY, "train")
def _healthy_noisy(c: Ctx) -> None:
    """A run that finishes despite harmless noise: corrected PCIe errors, tracker retries, fp16 overflow skips."""
    start_job(c, routine_steps(c) // 2)
    for _ in range(c.rng.randrange(2, 6)):
        r = _bad(c)
        noise = c.rng.randrange(5)
        if noise == 0:
            _kernel(c, r, f"pcieport 0000:{0x17 + (r % 8) * 0x10:02x}:01.0: AER: Corrected error received: "
                          f"0000:{0x18 + (r % 8) * 0x10:02x}:00.0", root=False)
            _kernel(c, r, f"nvidia 0000:{0x18 + (r % 8) * 0x10:02x}:00.0: PCIe Bus Error: severity=Corrected, "
                          "type=Physical Layer, (Receiver ID)", root=False)
        elif noise == 1:
            c.add(f"{c.p(0)}wandb: Network error (ReadTimeout), entering retry loop.")
        elif noise == 2:
            c.add(f"{c.p(0)}[{c.ts()}] [INFO] [loss_scaler.py:183:update_scale] [deepspeed] OVERFLOW! Rank 0 Skipping "
                  f"step. Attempted loss scale: {2 ** c.rng.randrange(10, 17)}, reducing to {2 ** c.rng.randrange(9, 16)}")
        elif noise == 3:
            c.add(f"{c.p(r)}huggingface/tokenizers: The current process just got forked, after parallelism has already "
                  "been used. Disabling parallelism to avoid deadlocks...")
        else:
            c.add(f"{c.p(r)}[W ProcessGroupNCCL.cpp:{c.rng.choice((1856, 2291))}] Warning: TORCH_NCCL_AVOID_RECORD_STREAMS"
                  "=1 has no effect for point-to-point collectives. (function operator())")
        train_steps(c, c.rng.randrange(20, 200))
    c.add(f"{c.p(0)}[after training is done] datetime: {c.ts()[:19]} ")
