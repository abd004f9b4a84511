"""Blind test templates, set 4 (split "blind3"): written on 2026-11-26 without reading the rules,
the compression filters or the retrieval code (only the corpus API, the taxonomy and the earlier
blind sets were read), and measured once.

20 templates: eight infrastructure ones here (with the shared helpers), the other twelve (a vLLM
CUDA error, a lost JAX node, storage, connection, OOM, framework, script, loss-spike and two healthy
runs) in `corpus_blind3b.py`, imported at the end. The scenarios use
software stacks and tools the earlier sets lack: JAX/XLA (MaxText) on GPU with its coordination
service, vLLM evaluation through lm-eval-harness, torchtitan/FSDP2 with torch 2.5 wording and the
NCCL flight recorder, Ray Train with Lightning, AWS EFA (aws-ofi-nccl), PBS Pro, the NVSwitch fabric
manager at start-up, GPFS (Spectrum Scale) and HF Accelerate.
"""

from __future__ import annotations

from collections.abc import Sequence

from loom.diagnosis import scenarios as sc
from loom.diagnosis.corpus import _TORCH, _bad, _bus, template
from loom.diagnosis.corpus_blind2 import PKG, kern, kstyle, node_ranks, tb
from loom.diagnosis.logsim import (
    Ctx,
    launcher_preamble,
    model_setup,
    nccl_init,
    recurring_warnings,
    routine_steps,
    start_job,
    train_steps,
)

Frame = tuple[str, int, str, str]
MAXTEXT = "/opt/maxtext/MaxText"
JAX = f"{PKG}/jax/_src"
TITAN = "/workspace/torchtitan"
VLLM = f"{PKG}/vllm"


# ------------------------------------------------------------------------------ helpers ----
def loss_at(c: Ctx, it: int) -> float:
    return max(1.3, 1.9 + 3.2 * 0.9994 ** it + c.rng.gauss(0, 0.03))


def absl(c: Ctx, level: str, pid: int, where: str) -> str:
    """An absl/glog line head as XLA and the coordination service print it."""
    return f"{level}{c.clock.strftime('%m%d %H:%M:%S')}.{c.clock.microsecond:06d} {pid:>7} {where}] "


def torch25(c: Ctx, level: str, where: str) -> str:
    """The c10 log head of torch >= 2.5 (nanosecond fraction, no pid)."""
    return f"[{level}{c.clock.strftime('%m%d %H:%M:%S')}.{c.clock.microsecond:06d}{c.rng.randrange(1000):03d} {where}]"


def jax_job(c: Ctx, steps: int) -> None:
    """A MaxText job under Slurm: one JAX process per node, output labelled by srun (`N: `)."""
    n = len(c.hosts)
    port = c.rng.choice((8476, 12345, 29500))
    ver = c.rng.choice(("0.4.30", "0.4.31", "0.4.33"))
    c.add(f"+ srun --label --ntasks-per-node=1 --gpus-per-node=8 python3 -u {MAXTEXT}/train.py "
          f"{MAXTEXT}/configs/base.yml run_name={c.run} base_output_directory={c.path('maxtext')} "
          f"per_device_batch_size={c.rng.choice((2, 4, 6))} enable_checkpointing=true")
    for k in range(n):
        c.tick(0.3)
        c.add(f"{k}: {absl(c, 'I', c.pids[k * 8], 'distributed.py:90')}Starting JAX distributed service on "
              f"[::]:{port}" if k == 0 else
              f"{k}: {absl(c, 'I', c.pids[k * 8], 'distributed.py:101')}Connecting to JAX distributed service on "
              f"{c.ips[0]}:{port}")
    c.add(f"0: {absl(c, 'I', c.pids[0], 'coordination_service.cc:582')}/job:jax_worker/replica:0/task:0 has "
          "connected to coordination service.")
    for k in range(n):
        c.add(f"{k}: System Information: Jax Version: {ver}")
        c.add(f"{k}: System Information: Jaxlib Version: {ver}")
        c.add(f"{k}: System Information: Jax Backend: PJRT C API")
    c.add(f"0: Num_devices: {c.world}, shape (1, {max(1, n)}, 8, 1, 1, 1, 1, 1)")
    c.add(f"0: Tokenizer path: {c.path('tokenizers', 'llama3', 'tokenizer.model')}")
    c.add(f"0: number parameters: {c.rng.uniform(6.5, 72):.3f} billion")
    it = c.rng.randrange(0, 30) * 1000
    if it:
        c.add(f"0: {absl(c, 'I', c.pids[0], 'checkpoint_manager.py:1410')}Restoring checkpoint from "
              f"{c.path('maxtext', c.run, 'checkpoints', str(it))}.")
        c.tick(40)
        c.add(f"0: {absl(c, 'I', c.pids[0], 'checkpointer.py:167')}Finished restoring checkpoint from "
              f"{c.path('maxtext', c.run, 'checkpoints', str(it))}.")
    c.iteration = it
    c.add("0: Per train step:")
    c.add(f"0:  Total TFLOPs: {c.rng.uniform(200, 4000):.2f} ")
    c.add(f"0:  split as {c.rng.uniform(80, 95):.2f}% learnable weight flops and {c.rng.uniform(5, 20):.2f}% "
          "attention flops")
    for _ in range(steps):
        c.iteration += 1
        c.tick(3)
        c.add(f"0: completed step: {c.iteration}, seconds: {c.rng.uniform(2.5, 6):.3f}, TFLOP/s/device: "
              f"{c.rng.uniform(160, 240):.3f}, Tokens/s/device: {c.rng.uniform(2500, 4200):.3f}, total_weights: "
              f"{c.rng.choice((262144, 524288, 1048576))}, loss: {loss_at(c, c.iteration):.3f}")
        if c.iteration % 1000 == 0:
            c.add(f"0: {absl(c, 'I', c.pids[0], 'checkpoint_manager.py:1255')}[process=0] Saving checkpoint at step "
                  f"{c.iteration}")
            c.tick(20)
            c.add(f"0: saved a checkpoint at step {c.iteration}")


def jax_frames(step: bool = True) -> tuple[Frame, ...]:
    f: tuple[Frame, ...] = ((f"{MAXTEXT}/train.py", 783, "<module>", "app.run(main)"),
                            (f"{PKG}/absl/app.py", 308, "run", "_run_main(main, args)"),
                            (f"{PKG}/absl/app.py", 254, "_run_main", "sys.exit(main(argv))"),
                            (f"{MAXTEXT}/train.py", 779, "main", "train_loop(config)"))
    if step:
        f += ((f"{MAXTEXT}/train.py", 684, "train_loop",
               "state, metrics = p_train_step(state, example_batch, nextrng)"),)
    return f


JAX_FILTER = ("For simplicity, JAX has removed its internal frames from the traceback of the following exception. "
              "Set JAX_TRACEBACK_FILTERING=off to include these.")


def jax_peers_abort(c: Ctx, dead: int, procs: Sequence[int], *, why: str) -> None:
    """The other JAX processes learn from the coordination service that `dead` is gone and abort."""
    for k in procs:
        pid = c.pids[k * 8]
        c.tick(0.2)
        c.add(f"{k}: {absl(c, 'E', pid, 'coordination_service_agent.cc:332')}Polled an error from coordination "
              "service (this can be an error from this or another task).")
        c.add(f"{k}: {absl(c, 'F', pid, 'client.h:77')}Terminating process because the JAX distributed service "
              "detected fatal errors. This most likely indicates that another task died; see the other task logs for "
              "more details. Disable Python buffering, i.e. `python -u`, to be sure to see all the previous output. "
              f"absl::Status: UNAVAILABLE: {why}")
        c.add(f"{k}: /job:jax_worker/replica:0/task:{dead}")
        c.add(f"{k}: The tasks have crashed. Check the task logs for an earlier error to debug further.")
        c.add(f"{k}: *** Check failure stack trace: ***")
        for fn in ("absl::lts_20230802::log_internal::LogMessageFatal::~LogMessageFatal()",
                   "xla::(anonymous namespace)::DistributedRuntimeClientImpl::HeartbeatLoop()",
                   "tsl::(anonymous namespace)::PThread::ThreadFn()", "start_thread"):
            c.add(f"{k}:     @     0x7f{c.rng.getrandbits(40):010x}  {fn}")


def titan_job(c: Ctx, steps: int, *, resume: int = 0) -> None:
    """A torchtitan (FSDP2) run launched by torchrun; rank 0's `[titan]` logger."""
    launcher_preamble(c)
    if c.rng.random() < 0.5:
        nccl_init(c)
    p = c.p(0)
    flavor = c.rng.choice(("8B", "70B", "405B"))
    c.style = "titan"

    def log(msg: str, level: str = "INFO") -> None:
        c.tick(0.3)
        c.add(f"{p}[titan] {c.ts()} - root - {level} - {msg}")

    log(f"Starting job: Llama 3 {flavor} training")
    log(f"Building 1-D device mesh with ['dp_shard'], [{c.world}]")
    log("[GC] Initial GC collection. 0.00 seconds.")
    log(f"Building tiktoken tokenizer locally from {c.path('tokenizers', 'llama3', 'original', 'tokenizer.model')}")
    log("TikTokenizer built: #words 128256, BOS ID 128000, EOS ID 128001")
    log(f"Preparing c4 dataset from {c.path('data', 'c4')}")
    log(f"Building llama3 {flavor} with ModelArgs(dim={c.rng.choice((4096, 8192))}, n_layers="
        f"{c.rng.choice((32, 80, 126))}, n_heads={c.rng.choice((32, 64, 128))}, n_kv_heads=8, vocab_size=128256, "
        "multiple_of=1024, ffn_dim_multiplier=1.3, norm_eps=1e-05, rope_theta=500000, max_seq_len=8192, "
        "depth_init=True, norm_type='rmsnorm')")
    log(f"Model llama3 {flavor} size: {c.rng.randrange(8 * 10**9, 80 * 10**9):,} total parameters")
    log("Applied selective activation checkpointing to the model")
    log("Applied FSDP to the model")
    log(f"CUDA memory usage for model: {c.rng.uniform(2, 12):.2f}GiB({c.rng.uniform(2, 14):.2f}%)")
    log(f"Checkpointing active. Checkpoints will be loaded from and saved to {c.path('outputs', c.run, 'checkpoint')}")
    c.iteration = resume
    if resume:
        log(f"Loading the checkpoint at step {resume}.")
        return
    log(f"Training starts at step 1, with local batch size {c.rng.choice((1, 2))}, global batch size "
        f"{c.world * 2}, sequence length 8192, total steps 100000 (warmup 2000)")
    recurring_warnings(c)
    titan_steps(c, steps)


def titan_step_line(c: Ctx, loss: float, norm: float) -> str:
    mem = c.rng.uniform(55, 74)
    return (f"{c.p(0)}[titan] {c.ts()} - root - INFO - step: {c.iteration:2}  loss: {loss:7.4f}  grad_norm: "
            f"{norm:7.4f}  memory: {mem:5.2f}GiB({mem / 0.7915:.2f}%)  tps: {c.rng.randrange(2800, 4100):,}  "
            f"tflops: {c.rng.uniform(300, 420):.2f}  mfu: {c.rng.uniform(30, 42):.2f}%")


def titan_steps(c: Ctx, n: int) -> None:
    for _ in range(n):
        c.iteration += 10
        c.tick(40)
        c.add(titan_step_line(c, loss_at(c, c.iteration), c.rng.uniform(0.2, 1.2)))
        if c.iteration % 1000 == 0:
            c.add(f"{c.p(0)}[titan] {c.ts()} - root - INFO - Saving the checkpoint (or staging if async is enabled).")
            c.tick(20)
            c.add(f"{c.p(0)}[titan] {c.ts()} - root - INFO - [GC] GC collection invoked by checkpointer. 0.03 "
                  "seconds.")
            c.add(f"{c.p(0)}[titan] {c.ts()} - root - INFO - Finished saving the checkpoint (or staging if async is "
                  f"enabled)in {c.rng.uniform(8, 40):.2f} seconds.")
        if c.rng.random() < 0.002:
            c.add(f"{c.p(0)}[titan] {c.ts()} - root - WARNING - Dataset c4 is being re-looped")


def watchdog25(c: Ctx, ranks: Sequence[int], *, op: str, pg: str, root: bool, group_rank=None) -> None:
    """Watchdog timeouts in torch 2.5 wording (process-group names, flight-recorder dump)."""
    c.tick(600)
    seq = c.rng.randrange(1000, 200000)
    timeout = c.rng.choice((600000, 1200000, 1800000))
    gid = {"default_pg": 0, "DATA_PARALLEL": c.rng.randrange(1, 6), "TENSOR_PARALLEL": c.rng.randrange(1, 6)}.get(pg, 2)
    streams = []
    for r in ranks:
        p, gr = c.p(r), (group_rank(r) if group_rank else r)
        tag = f"[PG ID {gid} PG GUID {gid}({pg}) Rank {gr}]"
        wd = (f"[Rank {gr}] Watchdog caught collective operation timeout: WorkNCCL(SeqNum={seq}, OpType={op}, NumelIn="
              f"{c.rng.randrange(10**5, 10**8)}, NumelOut={c.rng.randrange(10**5, 10**8)}, Timeout(ms)={timeout}) ran "
              f"for {timeout + c.rng.randrange(1, 400)} milliseconds before timing out.")
        s: sc.Stream = [(f"{p}{torch25(c, 'E', 'ProcessGroupNCCL.cpp:616')} {wd}", root),
                        ((f"{p}{torch25(c, 'E', 'ProcessGroupNCCL.cpp:1785')} {tag} Exception (either an error or "
                          f"timeout) detected by watchdog at work: {seq}, last enqueued NCCL work: {seq}, last "
                          f"completed NCCL work: {seq - 1}."), False),
                        ((f"{p}{torch25(c, 'E', 'ProcessGroupNCCL.cpp:1834')} {tag} Timeout at NCCL work: {seq}, last "
                          f"enqueued NCCL work: {seq}, last completed NCCL work: {seq - 1}."), False),
                        ((f"{p}{torch25(c, 'E', 'ProcessGroupNCCL.cpp:630')} [Rank {gr}] Some NCCL operations have "
                          "failed or timed out. Due to the asynchronous nature of CUDA kernels, subsequent GPU "
                          "operations might run on corrupted/incomplete data."), False),
                        ((f"{p}{torch25(c, 'E', 'ProcessGroupNCCL.cpp:636')} [Rank {gr}] To avoid data inconsistency, "
                          "we are taking the entire process down."), False),
                        ((f"{p}{torch25(c, 'E', 'ProcessGroupNCCL.cpp:1595')} [PG ID 0 PG GUID 0(default_pg) Rank {r}] "
                          "ProcessGroupNCCL preparing to dump debug info. Include stack trace: 1"), False),
                        ((f"{p}{torch25(c, 'I', 'NCCLUtils.cpp:348')} Dumping flight recorder to "
                         f"/tmp/nccl_trace_rank_{r}"), False),
                        (f"{p}terminate called after throwing an instance of 'c10::DistBackendError'", False),
                        (f"{p}  what():  {tag} Process group watchdog thread terminated with exception: {wd}", False),
                        ((f"{p}Exception raised from checkTimeout at ../torch/csrc/distributed/c10d/ProcessGroupNCCL."
                          "cpp:618 (most recent call first):"), False)]
        for i, fn in enumerate(("c10::Error::Error(c10::SourceLocation, std::string)",
                                ("c10d::ProcessGroupNCCL::WorkNCCL::checkTimeout(std::optional<std::chrono::duration"
                                "<long, std::ratio<1l, 1000l> > >)"), "c10d::ProcessGroupNCCL::watchdogHandler()",
                                "c10d::ProcessGroupNCCL::ncclCommWatchdog()")):
            s.append(((f"{p}frame #{i}: {fn} + 0x{c.rng.randrange(0x20, 0x900):x} (0x7f{c.rng.getrandbits(40):010x} in "
                      f"{_TORCH}/lib/libtorch_cuda.so)"), False))
        streams.append(s)
    c.merge(streams)


def sigabrt_summary(c: Ctx, rank: int, script: str) -> None:
    """torchrun (torch 2.5) reporting a rank killed by SIGABRT."""
    c.tick(2)
    c.add(f"W{c.clock.strftime('%m%d %H:%M:%S')} {c.pids[0] - 40} torch/distributed/elastic/multiprocessing/api.py:"
          f"897] Sending process {c.pids[(rank + 1) % c.world]} closing signal SIGTERM")
    sc.torchrun_summary(c, rank, -6, script=script)


# ------------------------------------------------------------------------------ CUDAError ----
@template("cuda-jax-xla-illegal-address", "CUDAError", "blind3")
def _jax_illegal(c: Ctx) -> None:
    """MaxText on JAX: one process's step fails with CUDA_ERROR_ILLEGAL_ADDRESS; the rest abort via the coordinator."""
    jax_job(c, routine_steps(c))
    n = len(c.hosts)
    bad = c.rng.randrange(n)
    pid, dev = c.pids[bad * 8], c.rng.randrange(8)
    c.tick(4)
    msg = (f"INTERNAL: Failed to complete all kernels launched on stream 0x{c.rng.getrandbits(44):x}: CUDA error: "
           "Could not synchronize CUDA stream: CUDA_ERROR_ILLEGAL_ADDRESS: an illegal memory access was encountered")
    c.add_root(f"{bad}: {absl(c, 'E', pid, 'cuda_driver.cc:1540')}failed to synchronize the stop event: "
               "CUDA_ERROR_ILLEGAL_ADDRESS: an illegal memory access was encountered")
    c.add(f"{bad}: {absl(c, 'E', pid, 'gpu_timer.cc:202')}Failed to synchronize on the stop event for the GPU "
          "timer; the measured time will be wrong")
    c.add_root(f"{bad}: {absl(c, 'E', pid, 'pjrt_stream_executor_client.cc:3084')}Execution of replica "
               f"{bad * 8 + dev} failed: {msg}")
    s = tb(c, bad, jax_frames(), [f"jaxlib.xla_extension.XlaRuntimeError: {msg}", "--------------------", JAX_FILTER])
    c.merge([[(f"{bad}: {x}", root) for x, root in s]])
    c.tick(c.rng.uniform(10, 100))
    others = [k for k in range(n) if k != bad]
    jax_peers_abort(c, bad, others, why="The following tasks are unhealthy (stopped sending heartbeats):")
    c.add(f"srun: error: {c.hosts[bad]}: task {bad}: Exited with exit code 1")
    for k in others:
        c.add(f"srun: error: {c.hosts[k]}: task {k}: Aborted (core dumped)")


# ------------------------------------------------------------------------------ ECCError ----
@template("ecc-torchtitan-xid94-row-remap", "ECCError", "blind3")
def _titan_ecc(c: Ctx) -> None:
    """torchtitan/FSDP2: a contained ECC error (Xid 94, row remap pending) fails one rank's optimizer step."""
    titan_job(c, routine_steps(c))
    bad = _bad(c)
    host, ks = c.host(bad), kstyle(c)
    c.tick(20)
    c.add_root(f"{kern(c, host, ks)}NVRM: Xid (PCI:{_bus(bad)}): 94, pid={c.pids[bad]}, name=python3, Contained: SM "
               "(0x1). RST: No, D-RST: No")
    if c.rng.random() < 0.7:
        c.add_root(f"{kern(c, host, ks)}NVRM: Xid (PCI:{_bus(bad)}): 63, pid='<unknown>', name=<unknown>, Row "
                   f"Remapper: New row (0x{c.rng.getrandbits(28):08x}) marked for remapping, reset gpu to activate.")
    frames = ((f"{TITAN}/train.py", 465, "<module>", "main(config)"),
              (f"{_TORCH}/distributed/elastic/multiprocessing/errors/__init__.py", 355, "wrapper",
               "return f(*args, **kwargs)"),
              (f"{TITAN}/train.py", 358, "main", "optimizers.step()"),
              (f"{TITAN}/torchtitan/optimizer.py", 62, "step", "optimizer.step()"),
              (f"{_TORCH}/optim/optimizer.py", 487, "wrapper", "out = func(*args, **kwargs)"),
              (f"{_TORCH}/optim/adamw.py", 220, "step", "adamw("),
              (f"{_TORCH}/optim/adamw.py", 782, "adamw", "func("),
              (f"{_TORCH}/optim/adamw.py", 606, "_multi_tensor_adamw", ("torch._foreach_lerp_(device_exp_avgs, "
                                                                       "device_grads, 1 - beta1)")))
    s = tb(c, bad, frames, ["RuntimeError: CUDA error: uncorrectable ECC error encountered",
                            ("CUDA kernel errors might be asynchronously reported at some other API call, so the "
                             "stacktrace below might be incorrect."),
                            "For debugging consider passing CUDA_LAUNCH_BLOCKING=1.",
                            "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.", ""])
    c.tick(1)
    c.merge([s])
    others = c.other_ranks(bad)
    watchdog25(c, others[: c.rng.randrange(1, len(others) + 1)], op="_ALLGATHER_BASE", pg="default_pg", root=False)
    sigabrt_summary(c, bad, "train.py")


# ---------------------------------------------------------------------------- NVLinkError ----
@template("nvlink-fabricmanager-training-failed", "NVLinkError", "blind3")
def _fm_failed(c: Ctx) -> None:
    """At boot the fabric manager cannot train one GPU's NVLinks and exits; the job fails at CUDA init (error 802)."""
    node = c.rng.randrange(len(c.hosts))
    host = c.hosts[node]
    job = c.rng.randrange(10**5, 10**7)
    c.add(f"[{c.ts()}] [prolog] job {job}: nodes {','.join(c.hosts)}")
    for h in c.hosts:
        c.add(f"[{c.ts()}] [prolog] {h}: driver 550.{c.rng.choice(('54.15', '90.07', '127.05'))}, 8 x NVIDIA H100 80GB "
              f"HBM3, {c.rng.randrange(1900, 2000)} GiB RAM, health check passed")
    fm = f"{c.clock.strftime('%b %d %H:%M:%S')} {host} nv-fabricmanager[{c.rng.randrange(1500, 9000)}]: "
    gpu, link, sw = c.rng.randrange(8), c.rng.randrange(18), c.rng.randrange(4)
    c.tick(30)
    c.add(f"{fm}Connected to 1 node.")
    c.add_root(f"{fm}NVLink training failed for GPU physical id {gpu} link {link} (NVSwitch physical id {sw} port "
               f"{c.rng.randrange(64)}): link state FAULT after 3 retries")
    c.add_root(f"{fm}failed to configure NVLink fabric: GPU physical id {gpu} pci bus id 00000000:"
               f"{_bus(gpu)[5:]}.0 could not be added to the NVLink partition, aborting fabric manager")
    sd = f"{c.clock.strftime('%b %d %H:%M:%S')} {host} systemd[1]: "
    c.add(f"{sd}nvidia-fabricmanager.service: Main process exited, code=exited, status=1/FAILURE")
    c.add(f"{sd}nvidia-fabricmanager.service: Failed with result 'exit-code'.")
    c.add_root(f"{sd}Failed to start NVIDIA fabric manager service.")
    c.tick(60)
    launcher_preamble(c)
    mine, others = node_ranks(c, node)
    msg = ("Unexpected error from cudaGetDeviceCount(). Did you run some cuda functions before calling "
           "NumCudaDevices() that might have already set an error? Error 802: system not yet initialized")
    frames = (("/workspace/Megatron-LM/pretrain_gpt.py", 233, "<module>", "pretrain(train_valid_test_datasets_provider,"),
              ("/workspace/Megatron-LM/megatron/training/initialize.py", 258, "_initialize_distributed",
               "torch.cuda.set_device(device)"),
              (f"{_TORCH}/cuda/__init__.py", 399, "set_device", "torch._C._cuda_setDevice(device)"),
              (f"{_TORCH}/cuda/__init__.py", 314, "_lazy_init", "torch._C._cuda_init()"))
    streams = []
    for r in mine:
        p = c.p(r)
        s: sc.Stream = [((f"{p}{_TORCH}/cuda/__init__.py:129: UserWarning: CUDA initialization: {msg} (Triggered "
                         "internally at ../c10/cuda/CUDAFunctions.cpp:108.)"), False),
                        (f"{p}  return torch._C._cuda_getDeviceCount() > 0", False)]
        s += tb(c, r, frames, [f"RuntimeError: {msg}"], roots=())
        streams.append(s)
    c.merge(streams)
    if others:
        c.tick(900)
        for r in others[:: 8]:
            c.add(f"{c.p(r)}[W socket.cpp:697] [c10d] recvValue failed on SocketImpl(fd={c.rng.randrange(20, 90)}, "
                  f"addr=[{c.ip(r)}]:{c.rng.randrange(30000, 60000)}, remote=[{c.hosts[0]}]:29500): Connection reset "
                  "by peer")
        r = others[0]
        c.merge([tb(c, r, frames[:2], [(f"torch.distributed.DistStoreError: Timed out after 901 seconds waiting for "
                                       f"clients. {c.world - 8}/{c.world} clients joined.")], roots=())])
    sc.torchrun_summary(c, mine[0])
    c.add(f"srun: error: {host}: task {node}: Exited with exit code 1")


# ---------------------------------------------------------------------------- NCCLTimeout ----
@template("nccl-tp-timeout-flight-recorder", "NCCLTimeout", "blind3")
def _tp_timeout(c: Ctx) -> None:
    """A tensor-parallel all-reduce hangs inside one node; torch 2.5 watchdogs fire and dump the flight recorder."""
    c.style = "megatron"
    start_job(c, routine_steps(c))
    node = c.rng.randrange(len(c.hosts))
    mine, others = node_ranks(c, node)
    stuck = sorted(c.rng.sample(mine, k=c.rng.randrange(3, 9)))
    watchdog25(c, stuck, op="ALLREDUCE", pg="TENSOR_PARALLEL", root=True, group_rank=lambda r: r % 8)
    if others and c.rng.random() < 0.7:
        watchdog25(c, others[: c.rng.randrange(1, len(others) + 1)], op="_REDUCE_SCATTER_BASE", pg="DATA_PARALLEL",
                   root=False, group_rank=lambda r: r // 8)
    if c.rng.random() < 0.5:
        c.tick(30)
        c.add(f"[{c.ts()}] [fr_trace] analysed {c.world} dumps: collective #{c.rng.randrange(10**3, 10**5)} "
              f"(ALLREDUCE, TENSOR_PARALLEL) on {c.hosts[node]}: {len(stuck)} ranks entered, "
              f"{8 - len(stuck)} ranks never scheduled it")
    sigabrt_summary(c, stuck[0], "pretrain_gpt.py")


@template("nccl-raytrain-lightning-timeout", "NCCLTimeout", "blind3")
def _ray_timeout(c: Ctx) -> None:
    """Ray Train + Lightning FSDP: an all-gather never completes; workers' watchdogs fire, Ray reports dead actors."""
    rt = lambda r: f"(RayTrainWorker pid={c.pids[r]}, ip={c.ip(r)}) "
    head = c.ips[0]
    c.add(f"{c.ts()}\tINFO worker.py:1777 -- Connected to Ray cluster. View the dashboard at http://{head}:8265 ")
    res = c.path("ray_results", f"TorchTrainer_{c.clock.strftime('%Y-%m-%d_%H-%M-%S')}")
    c.add(f"View detailed results here: {res}")
    c.add(f"To visualize your results with TensorBoard, run: `tensorboard --logdir {c.path('ray_results')}`")
    tp = c.rng.randrange(10**5, 10**6)
    c.add(f"(TorchTrainer pid={tp}, ip={head}) Started distributed worker processes: ")
    for r in range(c.world):
        c.add(f"(TorchTrainer pid={tp}, ip={head}) - (node_id={c.rng.getrandbits(112):028x}, ip={c.ip(r)}, "
              f"pid={c.pids[r]}) world_rank={r}, local_rank={r % 8}, node_rank={r // 8}")
    c.add(f"{rt(0)}Setting up process group for: env:// [rank=0, world_size={c.world}]")
    c.add(f"{rt(1)}Setting up process group for: env:// [rank=1, world_size={c.world}] [repeated {c.world - 2}x "
          "across cluster] (Ray deduplicates logs by default. Set RAY_DEDUP_LOGS=0 to disable log deduplication, or "
          "see https://docs.ray.io/en/master/ray-observability/user-guides/configure-logging.html#log-deduplication "
          "for more options.)")
    for x in ("GPU available: True (cuda), used: True", "TPU available: False, using: 0 TPU cores",
              "HPU available: False, using: 0 HPUs", "LOCAL_RANK: 0 - CUDA_VISIBLE_DEVICES: [0,1,2,3,4,5,6,7]",
              "  | Name  | Type             | Params | Mode ", "---------------------------------------------------",
              "0 | model | LlamaForCausalLM | 1.0 B  | train", "---------------------------------------------------"):
        c.add(f"{rt(0)}{x}")
    total = c.rng.choice((20000, 40000, 60000))
    c.iteration = 0
    for i in range(routine_steps(c)):
        c.iteration += c.rng.randrange(3, 9)
        c.tick(6)
        el = int(c.iteration * 1.1)
        c.add(f"{rt(0)}Epoch 0:  {100 * c.iteration // total:2d}%|{'█' * (10 * c.iteration // total):<10}| "
              f"{c.iteration}/{total} [{el // 3600:02d}:{el // 60 % 60:02d}:{el % 60:02d}<{(total - c.iteration) // 3600:02d}"
              f":{(total - c.iteration) // 60 % 60:02d}:00,  {c.rng.uniform(0.8, 1.1):.2f}it/s, v_num=0, train_loss="
              f"{loss_at(c, c.iteration * 2):.3f}]")
        if i % 250 == 249:
            c.add(f"{rt(0)}Checkpoint successfully created at: Checkpoint(filesystem=local, path={res}/"
                  f"TorchTrainer_{c.rng.getrandbits(20):05x}_00000_0/checkpoint_{i // 250:06d})")
    c.tick(1800)
    seq, tmo = c.rng.randrange(10**4, 10**6), 1800000
    stuck = sorted(c.rng.sample(range(c.world), k=c.rng.randrange(max(2, c.world // 2), c.world + 1)))
    streams = []
    for r in stuck:
        wd = (f"[Rank {r}] Watchdog caught collective operation timeout: WorkNCCL(SeqNum={seq}, OpType=_ALLGATHER_BASE, "
              f"NumelIn={c.rng.randrange(10**6, 10**8)}, NumelOut={c.rng.randrange(10**7, 10**9)}, Timeout(ms)={tmo}) ran "
              f"for {tmo + c.rng.randrange(1, 600)} milliseconds before timing out.")
        streams.append([(f"{rt(r)}[E ProcessGroupNCCL.cpp:523] {wd}", True),
                        ((f"{rt(r)}[E ProcessGroupNCCL.cpp:537] Some NCCL operations have failed or timed out. Due to "
                          "the asynchronous nature of CUDA kernels, subsequent GPU operations might run on corrupted/"
                          "incomplete data."), False),
                        ((f"{rt(r)}[E ProcessGroupNCCL.cpp:543] To avoid data inconsistency, we are taking the entire "
                         "process down."), False),
                        ((f"{rt(r)}[E ProcessGroupNCCL.cpp:1182] [Rank {r}] NCCL watchdog thread terminated with "
                         f"exception: {wd}"), False)])
    c.merge(streams)
    c.tick(5)
    for r in stuck[: c.rng.randrange(1, 4)]:
        c.add(f"(raylet, ip={c.ip(r)}) A worker died or was killed while executing a task by an unexpected system "
              f"error. To troubleshoot the problem, check the logs for the dead worker. RayTask ID: "
              f"{c.rng.getrandbits(128):032x} Worker ID: {c.rng.getrandbits(112):028x} Node ID: "
              f"{c.rng.getrandbits(112):028x} Worker IP address: {c.ip(r)} Worker port: {c.rng.randrange(10002, 11000)} "
              f"Worker PID: {c.pids[r]} Worker exit type: SYSTEM_ERROR Worker exit detail: Worker unexpectedly exits "
              "with a connection error code 2. End of file. There are some potential root causes. (1) The process is "
              "killed by SIGKILL by OOM killer due to high memory usage. (2) ray stop --force is called. (3) The "
              "worker is crashed unexpectedly due to SIGSEGV or other unexpected errors.")
    c.add("Traceback (most recent call last):")
    c.add('  File "/workspace/train_ray.py", line 141, in <module>')
    c.add("    result = trainer.fit()")
    c.add(f'  File "{PKG}/ray/train/base_trainer.py", line 638, in fit')
    c.add("    raise TrainingFailedError(")
    c.add("ray.train.base_trainer.TrainingFailedError: The Ray Train run failed. Please inspect the previous error "
          "messages for a cause. After fixing the issue (assuming that the error is not caused by your own application "
          "logic, but rather an error such as OOM), you can restart the run from scratch or continue this run.")
    c.add(f"To continue this run, you can use: `trainer = TorchTrainer.restore(\"{res}\")`.")


# -------------------------------------------------------------------------- NCCLRemoteError ----
def aws_host(c: Ctx, rank: int) -> str:
    return "ip-" + c.ip(rank).replace(".", "-")


@template("nccl-efa-ofi-request-error", "NCCLRemoteError", "blind3")
def _efa(c: Ctx) -> None:
    """On AWS p5 (EFA, aws-ofi-nccl) a completion error on one rank's send aborts the communicator."""
    c.style = "megatron"
    launcher_preamble(c)
    streams = []
    for r in range(c.world):
        h, pid, lr = aws_host(c, r), c.pids[r], r % 8
        pre = f"{c.p(r)}{h}:{pid}:{pid + c.rng.randrange(50, 400)} [{lr}] NCCL INFO "
        streams.append([(f"{pre}NET/OFI Initializing aws-ofi-nccl 1.11.0-aws", False),
                        (f"{pre}NET/OFI Using Libfabric version 1.22", False),
                        (f"{pre}NET/OFI Using CUDA driver version 12040 with runtime 12040", False),
                        (f"{pre}NET/OFI Selected Provider is efa (found 32 nics)", False),
                        (f"{pre}NET/OFI Using transport protocol RDMA", False),
                        (f"{pre}Using network AWS Libfabric", False)])
    c.merge(streams)
    model_setup(c)
    recurring_warnings(c)
    train_steps(c, routine_steps(c))
    bad = _bad(c)
    peer = (bad + 8) % c.world if c.world > 8 else (bad + 1) % c.world
    h, pid, p = aws_host(c, bad), c.pids[bad], c.p(bad)
    tid = pid + c.rng.randrange(400, 900)
    c.tick(5)
    c.add(f"{p}libfabric:{pid}:{int(c.clock.timestamp())}::efa:cq:efa_rdm_pke_handle_tx_error():{c.rng.randrange(400, 600)}"
          f"<warn> err: 113, message: Unreachable remote (113) peer: {c.ip(peer)} fi_addr {c.rng.randrange(4, 64)}")
    req = f"0x{c.rng.getrandbits(44):x}"
    c.add_root(f"{p}{h}:{pid}:{tid} [{bad % 8}] NCCL WARN NET/OFI Request {req} completed with error. RC: 113. Error: "
               f"113 (Unreachable remote). Completed length: 0, Request: {{ dev: {c.rng.randrange(4)}, size: 0, state: "
               "CREATED, type: SEND }")
    for w in ("proxy.cc:1503", "proxy.cc:1545"):
        c.add(f"{p}{h}:{pid}:{tid} [{bad % 8}] NCCL INFO {w} -> 6")
    c.tick(2)
    g = torch25(c, "E", "ProcessGroupNCCL.cpp:1709")
    stream: sc.Stream = [
        ((f"{p}{g} [PG ID 0 PG GUID 0(default_pg) Rank {bad}] Process group watchdog thread terminated with exception: "
         "NCCL error: remote process exited or there was a network error, NCCL version 2.21.5"), False),
        (f"{p}ncclRemoteError: A call failed possibly due to a network error or a remote process exiting prematurely.",
         False), (f"{p}Last error:", False),
        (f"{p}NET/OFI Request {req} completed with error. RC: 113. Error: 113 (Unreachable remote).", True),
        (f"{p}terminate called after throwing an instance of 'c10::DistBackendError'", False)]
    c.merge([stream])
    others = c.other_ranks(bad)
    sc.remote_exits(c, others)
    sc.sigterms(c, others[: c.rng.randrange(1, len(others) + 1)])
    sigabrt_summary(c, bad, "pretrain_gpt.py")


# ----------------------------------------------------------------------------- NodeFailure ----
@template("node-pbs-sister-eof", "NodeFailure", "blind3")
def _pbs(c: Ctx) -> None:
    """A PBS Pro job (mpiexec + DeepSpeed): a sister node's MOM goes away; PBS kills the job with SISTER_EOF."""
    c.style = "deepspeed"
    job = f"{c.rng.randrange(10**6, 10**7)}.pbs-{c.rng.choice(('sched01', 'admin', 'head'))}"
    c.add(f"PBS_JOBID={job} PBS_NODEFILE=/var/spool/pbs/aux/{job} nodes={len(c.hosts)}")
    c.add(f"+ mpiexec -n {c.world} --ppn 8 --cpu-bind depth -d 16 ./set_affinity_gpu.sh python3 pretrain_gpt.py "
          "--deepspeed --deepspeed_config ds_config.json")
    start_job(c, routine_steps(c))
    node = c.rng.randrange(1, len(c.hosts)) if len(c.hosts) > 1 else 0
    host = c.hosts[node]
    _, others = node_ranks(c, node)
    c.tick(40)
    if others:
        sc.remote_exits(c, others)
    c.tick(120)
    c.add_root(f"=>> PBS: job killed: node {node} ({host}) requested job terminate, 'EOF' (code 1099) - received "
               "SISTER_EOF attempting to communicate with sister MOM's")
    for r in others[:: 8]:
        c.add(f"{c.host(r)}: rank {r} died from signal 15")
    if c.rng.random() < 0.6:
        c.add(f"[{c.ts()}] [pbs-epilogue] {host}: pbsnodes -l: {host}  state-unknown,down  node down: communication "
              "closed")


# ----------------------------------------------------------------------------- StorageError ----
@template("storage-gpfs-expelled-dataloader", "StorageError", "blind3")
def _gpfs(c: Ctx) -> None:
    """A node is expelled from the GPFS cluster and unmounts the data file system; its ranks' data reads fail."""
    hf_job(c, routine_steps(c))
    node = c.rng.randrange(len(c.hosts))
    host = c.hosts[node]
    mine, others = node_ranks(c, node)
    fs = c.rng.choice(("gpfs01", "scale_data", "fs1"))
    mgr = f"10.{c.rng.randrange(1, 250)}.{c.rng.randrange(250)}.{c.rng.randrange(2, 250)}"
    agent = f"[node-agent] {host} mmfs.log: "

    def gp() -> str:
        c.tick(1)
        return f"{c.clock.strftime('%Y-%m-%d_%H:%M:%S')}.{c.clock.microsecond // 1000:03d}+0800:"

    c.tick(100)
    c.add(f"{agent}{gp()} [N] Connecting to {mgr} gpfs-mgr0{c.rng.randrange(1, 4)} <c0p{c.rng.randrange(9)}>")
    c.add(f"{agent}{gp()} [W] Lease renewal for this node is overdue; the cluster manager {mgr} did not answer")
    c.add_root(f"{agent}{gp()} [E] This node was expelled from cluster gpfs.acme.internal by cluster manager {mgr}")
    c.add_root(f"{agent}{gp()} [E] Lost membership in cluster gpfs.acme.internal. Unmounting file systems.")
    c.add_root(f"{agent}{gp()} [E] File System {fs} unmounted by the system with return code 5 reason code 0")
    busted = c.rng.sample(mine, k=c.rng.randrange(1, len(mine) + 1))
    mmap = c.rng.random() < 0.5  # memory-mapped Arrow files: a page fault on the gone file system is a SIGBUS
    streams = []
    for r in busted:
        p = c.p(r)
        wpid = c.pids[r] + c.rng.randrange(10, 400)
        if mmap:
            s: sc.Stream = [((f"{p}ERROR: Unexpected bus error encountered in worker. This might be caused by "
                             "insufficient shared memory (shm)."), False), (f"{p} ", False)]
            s += tb(c, r, ((f"{_TORCH}/utils/data/dataloader.py", 1251, "_try_get_data",
                            "data = self._data_queue.get(timeout=timeout)"),
                           ("/usr/lib/python3.10/multiprocessing/queues.py", 113, "get", "if not self._poll(timeout):"),
                           (f"{_TORCH}/utils/data/_utils/signal_handling.py", 73, "handler",
                            "_error_if_any_worker_fails()")),
                    [(f"RuntimeError: DataLoader worker (pid {wpid}) is killed by signal: Bus error. It is possible that "
                     "dataloader's workers are out of shared memory. Please try to raise your shared memory limit.")],
                    roots=())
        else:
            shard = f"/{fs}/datasets/sft_mix/train-{c.rng.randrange(1000):05d}-of-01024.parquet"
            s = tb(c, r, (("/workspace/sft/train_sft.py", 198, "main", "trainer.train()"),
                          (f"{PKG}/accelerate/data_loader.py", 550, "__iter__",
                           "current_batch = next(dataloader_iter)"),
                          ("/workspace/sft/stream_data.py", 71, "__iter__", ("for batch in pf.iter_batches(batch_size="
                                                                            "self.rows):")),
                          ("pyarrow/_parquet.pyx", 1634, "pyarrow._parquet.ParquetReader.iter_batches", ""),
                          ("pyarrow/error.pxi", 91, "pyarrow.lib.check_status", "")),
                   ["OSError: Error reading bytes from file. Detail: [errno 5] Input/output error"])
            s = [x for x in s if x[0] != f"{p}    "]
            s.insert(0, (f"{p}[{c.ts()}] reading {shard}", False))
        streams.append(s)
    c.merge(streams)
    if others:
        sc.watchdogs(c, others[: c.rng.randrange(1, len(others) + 1)], op="_ALLGATHER_BASE")
    sc.sigterms(c, [r for r in mine if r not in busted])
    accelerate_summary(c, busted[0], "train_sft.py")


def hf_job(c: Ctx, steps: int) -> None:
    """An HF Trainer run under `accelerate launch`: the Trainer's banner, then tqdm and loss dictionaries."""
    c.style = "hf"
    launcher_preamble(c)
    if c.rng.random() < 0.5:
        nccl_init(c)
    p = c.p(0)
    for x in ("***** Running training *****", f"  Num examples = {c.rng.randrange(10**5, 10**7):,}",
              "  Num Epochs = 3", f"  Instantaneous batch size per device = {c.rng.choice((1, 2, 4))}",
              f"  Total train batch size (w. parallel, distributed & accumulation) = {c.world * 8}",
              "  Gradient Accumulation steps = 4", "  Total optimization steps = 100,000",
              f"  Number of trainable parameters = {c.rng.randrange(10**9, 8 * 10**9):,}"):
        c.add(f"{p}{x}")
    recurring_warnings(c)
    c.iteration = 0
    train_steps(c, steps)


def accelerate_summary(c: Ctx, rank: int, script: str, exitcode: int = 1) -> None:
    """`accelerate launch` (multi-GPU) re-raising torchrun's ChildFailedError, with the elastic agent's report."""
    n = len(c.lines)
    sc.torchrun_summary(c, rank, exitcode, script=script)
    head = c.lines[n:n + 2]
    tail = c.lines[n + 8:]
    del c.lines[n:]
    c.lines += head
    for line in ('  File "/usr/local/bin/accelerate", line 8, in <module>', "    sys.exit(main())",
                 f'  File "{PKG}/accelerate/commands/accelerate_cli.py", line 48, in main', "    args.func(args)",
                 f'  File "{PKG}/accelerate/commands/launch.py", line 1168, in launch_command',
                 "    multi_gpu_launcher(args)",
                 f'  File "{PKG}/accelerate/commands/launch.py", line 763, in multi_gpu_launcher',
                 "    distrib_run.run(args)",
                 f'  File "{_TORCH}/distributed/run.py", line 910, in run', "    elastic_launch(",
                 f'  File "{_TORCH}/distributed/launcher/api.py", line 138, in __call__',
                 "    return launch_agent(self._config, self._entrypoint, list(args))",
                 f'  File "{_TORCH}/distributed/launcher/api.py", line 269, in launch_agent', "    raise ChildFailedError("):
        c.add(line)
    c.lines += tail


from loom.diagnosis import corpus_blind3b  # noqa: F401  (registration of the other twelve)
