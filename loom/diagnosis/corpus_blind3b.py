"""Blind test templates, set 4 (split "blind3"), continued: a vLLM CUDA error, a lost JAX node,
local-disk storage, the model hub, XLA OOM, framework and script errors, a divergence nobody caught
and two healthy runs. Written on 2026-11-26 without reading the rules, the compression filters or
the retrieval code; measured once. Imported at the end of `corpus_blind3.py`.
"""

from __future__ import annotations

from loom.diagnosis import scenarios as sc
from loom.diagnosis.corpus import (
    _TORCH,
    HEALTHY,
    _bus,
    _frames,
    _worker_error,
    template,
)
from loom.diagnosis.corpus_blind2 import MEG, PKG, dies, kern, kstyle, tb
from loom.diagnosis.corpus_blind3 import (
    JAX_FILTER,
    TITAN,
    VLLM,
    absl,
    accelerate_summary,
    jax_frames,
    jax_job,
    jax_peers_abort,
    loss_at,
    titan_job,
    titan_step_line,
    torch25,
)
from loom.diagnosis.logsim import (
    Ctx,
    launcher_preamble,
    nccl_init,
    routine_steps,
    start_job,
    train_steps,
)

PRETRAIN = ("/workspace/Megatron-LM/pretrain_gpt.py", 233, "<module>", "pretrain(train_valid_test_datasets_provider,")


def all_fail(c: Ctx, streams: list[sc.Stream], ranks: list[int], script: str) -> None:
    c.tick(1)
    c.merge(streams)
    sc.sigterms(c, [r for r in range(c.world) if r not in ranks])
    sc.torchrun_summary(c, ranks[0], script=script)


def some_ranks(c: Ctx) -> list[int]:
    ranks = list(range(c.world))
    if c.rng.random() < 0.35:
        ranks = sorted(c.rng.sample(ranks, k=max(1, c.world // 4)))
    return ranks


# ------------------------------------------------------------------------------ CUDAError ----
@template("cuda-vllm-eval-xid109", "CUDAError", "blind3")
def _vllm_xid109(c: Ctx) -> None:
    """lm-eval-harness on vLLM (TP=8): a context-switch timeout (Xid 109) kills one worker's CUDA graph replay."""
    workers = vllm_start(c)
    lm_eval_run(c, c.rng.randrange(2, 6))
    bad = c.rng.randrange(1, 8)
    wpid = workers[bad]
    host, ks = c.hosts[0], kstyle(c)
    c.tick(30)
    c.add_root(f"{kern(c, host, ks)}NVRM: Xid (PCI:{_bus(bad)}): 109, pid={wpid}, name=python3, Ch {c.rng.randrange(8, 40):08x}, "
               f"errorString CTX SWITCH TIMEOUT, Info 0x{c.rng.getrandbits(20):x}")
    c.tick(2)
    p = f"(VllmWorkerProcess pid={wpid}) ERROR {c.clock.strftime('%m-%d %H:%M:%S')} multiproc_worker_utils.py:233] "
    frames = ((f"{VLLM}/executor/multiproc_worker_utils.py", 226, "_run_worker_process",
               "output = executor(*args, **kwargs)"),
              (f"{VLLM}/worker/worker_base.py", 85, "start_worker_execution_loop",
               "output = self.execute_model(execute_model_req=None)"),
              (f"{VLLM}/worker/worker_base.py", 327, "execute_model", "output = self.model_runner.execute_model("),
              (f"{_TORCH}/utils/_contextlib.py", 116, "decorate_context", "return func(*args, **kwargs)"),
              (f"{VLLM}/worker/model_runner.py", 1698, "execute_model",
               "hidden_or_intermediate_states = model_executable("),
              (f"{VLLM}/worker/model_runner.py", 1817, "forward", "self.graph.replay()"),
              (f"{_TORCH}/cuda/graphs.py", 88, "replay", "super().replay()"))
    c.add(f"{p}Exception in worker VllmWorkerProcess while processing method start_worker_execution_loop.")
    c.add(f"{p}Traceback (most recent call last):")
    for line, _ in _frames("", frames):
        c.add(f"{p}{line}")
    c.add_root(f"{p}RuntimeError: CUDA error: the launch timed out and was terminated")
    c.add(f"{p}CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below "
          "might be incorrect.")
    c.add(f"{p}For debugging consider passing CUDA_LAUNCH_BLOCKING=1.")
    c.add(f"{p}Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.")
    c.add(f"{p}")
    c.tick(1)
    c.add(f"ERROR {c.clock.strftime('%m-%d %H:%M:%S')} multiproc_worker_utils.py:120] Worker VllmWorkerProcess pid "
          f"{wpid} died, exit code: -6")
    c.add(f"INFO {c.clock.strftime('%m-%d %H:%M:%S')} multiproc_worker_utils.py:124] Killing local vLLM worker "
          "processes")
    c.add("/usr/lib/python3.10/multiprocessing/resource_tracker.py:254: UserWarning: resource_tracker: There appear to "
          "be 1 leaked shared_memory objects to clean up at shutdown")
    c.add("  warnings.warn('resource_tracker: There appear to be %d '")
    c.add(f"srun: error: {host}: task 0: Exited with exit code 1")


def vllm_start(c: Ctx) -> list[int]:
    """vLLM engine start-up (tensor parallel over one node's 8 GPUs); returns the worker pids (index 0 = driver)."""
    d = lambda: c.clock.strftime("%m-%d %H:%M:%S")
    model = c.path("ckpt", c.run, "hf", f"iter_{c.rng.randrange(1, 40) * 1000:07d}")
    ver = c.rng.choice(("0.6.3.post1", "0.6.4", "0.5.5"))
    c.add(f"{time_hf(c)} INFO     [__main__.py:279] Verbosity set to INFO")
    c.add(f"{time_hf(c)} INFO     [__main__.py:376] Selected Tasks: ['gsm8k', 'mmlu', 'arc_challenge', 'hellaswag']")
    c.add(f"INFO {d()} config.py:887] Defaulting to use mp for distributed inference")
    c.add(f"INFO {d()} llm_engine.py:237] Initializing an LLM engine (v{ver}) with config: model='{model}', "
          f"speculative_config=None, tokenizer='{model}', skip_tokenizer_init=False, tokenizer_mode=auto, "
          "revision=None, rope_scaling=None, rope_theta=None, tokenizer_revision=None, trust_remote_code=False, "
          "dtype=torch.bfloat16, max_seq_len=8192, download_dir=None, load_format=LoadFormat.AUTO, "
          "tensor_parallel_size=8, pipeline_parallel_size=1, disable_custom_all_reduce=False, quantization=None, "
          "enforce_eager=False, kv_cache_dtype=auto, device_config=cuda, seed=1234, use_v2_block_manager=True, "
          "num_scheduler_steps=1, chunked_prefill_enabled=False, enable_prefix_caching=False)")
    c.add(f"WARNING {d()} multiproc_gpu_executor.py:53] Reducing Torch parallelism from 112 threads to 1 to avoid "
          "unnecessary CPU contention. Set OMP_NUM_THREADS in the external environment to tune this value as needed.")
    workers = [c.pids[0]] + [c.pids[0] + 60 + 7 * i for i in range(1, 8)]
    for w in workers[1:]:
        c.tick(0.5)
        c.add(f"(VllmWorkerProcess pid={w}) INFO {d()} multiproc_worker_utils.py:215] Worker ready; awaiting tasks")
    for w in workers:
        pre = f"(VllmWorkerProcess pid={w}) " if w != workers[0] else ""
        c.add(f"{pre}INFO {d()} utils.py:1008] Found nccl from library libnccl.so.2")
        c.add(f"{pre}INFO {d()} pynccl.py:63] vLLM is using nccl==2.21.5")
    c.add(f"INFO {d()} custom_all_reduce_utils.py:242] reading GPU P2P access cache from "
          "/root/.cache/vllm/gpu_p2p_access_cache_for_0,1,2,3,4,5,6,7.json")
    c.add(f"INFO {d()} shm_broadcast.py:241] vLLM message queue communication handle: Handle(connect_ip='127.0.0.1', "
          f"local_reader_ranks=[1, 2, 3, 4, 5, 6, 7], buffer=<vllm.distributed.device_communicators.shm_broadcast."
          f"ShmRingBuffer object at 0x7f{c.rng.getrandbits(36):09x}>, local_subscribe_port={c.rng.randrange(30000, 60000)}"
          ", remote_subscribe_port=None)")
    c.add(f"INFO {d()} model_runner.py:1056] Starting to load model {model}...")
    c.tick(40)
    n = c.rng.choice((15, 30, 61))
    c.add(f"Loading safetensors checkpoint shards: 100% Completed | {n}/{n} [00:{c.rng.randrange(20, 59)}<00:00,  "
          f"{c.rng.uniform(0.8, 2):.2f}s/it]")
    for w in workers:
        pre = f"(VllmWorkerProcess pid={w}) " if w != workers[0] else ""
        c.add(f"{pre}INFO {d()} model_runner.py:1067] Loading model weights took {c.rng.uniform(15, 17.5):.4f} GB")
    c.add(f"INFO {d()} distributed_gpu_executor.py:57] # GPU blocks: {c.rng.randrange(20000, 60000)}, # CPU blocks: "
          f"{c.rng.randrange(3000, 7000)}")
    c.add(f"INFO {d()} model_runner.py:1402] Capturing the model for CUDA graphs. This may lead to unexpected "
          "consequences if the model is not static. To run the model in eager mode, set 'enforce_eager=True' or use "
          "'--enforce-eager' in the CLI.")
    c.tick(25)
    c.add(f"INFO {d()} model_runner.py:1530] Graph capturing finished in {c.rng.randrange(12, 40)} secs.")
    return workers


def time_hf(c: Ctx) -> str:
    """lm-eval-harness's log time stamp."""
    c.tick(0.2)
    return c.clock.strftime("%Y-%m-%d:%H:%M:%S,") + f"{c.clock.microsecond // 1000:03d}"


def lm_eval_run(c: Ctx, n_tasks: int) -> None:
    """lm-eval-harness building contexts and generating, with vLLM's progress bars."""
    tasks = c.rng.sample(("gsm8k", "mmlu_abstract_algebra", "arc_challenge", "hellaswag", "truthfulqa_gen",
                          "bbh_cot_fewshot_date_understanding", "humaneval", "ifeval"), k=n_tasks)
    c.add(f"{time_hf(c)} INFO     [evaluator.py:164] Setting random seed to 0 | Setting numpy seed to 1234 | "
          "Setting torch manual seed to 1234 | Setting fewshot manual seed to 1234")
    c.add(f"{time_hf(c)} INFO     [evaluator.py:217] Using pre-initialized model")
    for t in tasks:
        n = c.rng.choice((250, 1172, 1319, 817, 541))
        c.add(f"{time_hf(c)} INFO     [task.py:415] Building contexts for {t} on rank 0...")
        c.add(f"100%|██████████| {n}/{n} [00:0{c.rng.randrange(1, 9)}<00:00, {c.rng.uniform(200, 3000):.2f}it/s]")
        c.add(f"{time_hf(c)} INFO     [evaluator.py:489] Running generate_until requests")
        done, t0 = 0, 0
        while done < n:
            done = min(n, done + c.rng.randrange(4, 40))
            c.tick(2)
            t0 += c.rng.randrange(1, 4)
            pct = 100 * done // n
            c.add(f"Processed prompts: {pct:3d}%|{'█' * (pct // 10):<10}| {done}/{n} [{t0 // 60:02d}:{t0 % 60:02d}<"
                  f"{(n - done) // 15 // 60:02d}:{(n - done) // 15 % 60:02d}, {c.rng.uniform(5, 30):.2f}it/s, est. "
                  f"speed input: {c.rng.uniform(1000, 9000):.2f} toks/s, output: {c.rng.uniform(200, 2000):.2f} toks/s]")


# ----------------------------------------------------------------------------- NodeFailure ----
@template("node-jax-heartbeat-timeout", "NodeFailure", "blind3")
def _jax_node(c: Ctx) -> None:
    """A node running one JAX process goes silent; the coordinator's heartbeat check ends the job; Slurm marks it DOWN."""
    jax_job(c, routine_steps(c))
    n = len(c.hosts)
    dead = c.rng.randrange(1, n) if n > 1 else 0
    host = c.hosts[dead]
    c.tick(c.rng.uniform(100, 200))
    if n > 1:
        c.add_root(f"0: {absl(c, 'E', c.pids[0], 'coordination_service.cc:352')}Task /job:jax_worker/replica:0/task:"
                   f"{dead} heartbeat timeout. This indicates that the remote task has failed, got preempted, or "
                   "crashed unexpectedly. Check the task logs for an earlier error to debug further.")
        jax_peers_abort(c, dead, [k for k in range(n) if k != dead],
                        why="The following tasks are unhealthy (stopped sending heartbeats):")
        for k in range(n):
            if k != dead:
                c.add(f"srun: error: {c.hosts[k]}: task {k}: Aborted (core dumped)")
    c.tick(60)
    c.add("srun: Job step aborted: Waiting up to 32 seconds for job step to finish.")
    c.add(f"[{c.ts()}] [epilog] scontrol show node {host}")
    c.add(f"NodeName={host} Arch=x86_64 CoresPerSocket=56 ")
    c.add(f"   CPUAlloc=0 CPUEfctv=224 CPUTot=224 CPULoad={c.rng.uniform(20, 90):.2f}")
    c.add("   Gres=gpu:h100:8(S:0-1)")
    c.add(f"   NodeAddr={host} NodeHostName={host} Version=23.11.6")
    c.add_root("   State=DOWN+NOT_RESPONDING ThreadsPerCore=2 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A")
    c.add_root(f"   Reason=Not responding [slurm@{c.clock.strftime('%Y-%m-%dT%H:%M:%S')}]")


# ----------------------------------------------------------------------------- StorageError ----
@template("storage-nvme-stage-readonly", "StorageError", "blind3")
def _nvme_ro(c: Ctx) -> None:
    """The local NVMe RAID that stages checkpoints times out and ext4 remounts read-only; the next save cannot mkdir."""
    c.style = "megatron"
    start_job(c, routine_steps(c))
    host, ks = c.hosts[0], kstyle(c)
    dev = c.rng.choice(("nvme3", "nvme5", "nvme7"))
    md = c.rng.choice(("md0", "md127"))
    c.tick(50)
    for q in c.rng.sample(range(1, 64), k=c.rng.randrange(1, 4)):
        c.add(f"{kern(c, host, ks)}nvme {dev}: I/O {c.rng.randrange(1, 1024)} QID {q} timeout, aborting")
    c.add_root(f"{kern(c, host, ks)}nvme {dev}: controller is down; will reset: CSTS=0xffffffff, PCI_STATUS=0xffff")
    c.add(f"{kern(c, host, ks)}nvme {dev}: Removing after probe failure status: -19")
    c.add(f"{kern(c, host, ks)}md/raid0:{md}: Disk failure on {dev}n1 detected, failing array.")
    c.add(f"{kern(c, host, ks)}Buffer I/O error on dev {md}, logical block {c.rng.randrange(10**6, 10**9)}, lost async "
          "page write")
    c.add(f"{kern(c, host, ks)}EXT4-fs error (device {md}): ext4_journal_check_start:83: comm python3: Detected aborted "
          "journal")
    c.add_root(f"{kern(c, host, ks)}EXT4-fs ({md}): Remounting filesystem read-only")
    train_steps(c, c.rng.randrange(1, 40))
    while c.iteration % 250:
        c.iteration += 1
    stage = f"/raid/ckpt_stage/{c.run}/iter_{c.iteration:07d}"
    c.add(f"{c.p(0)}saving checkpoint at iteration {c.iteration:>8} to {stage} (async upload to "
          f"{c.path('ckpt', c.run)})")
    writers = sorted(c.rng.sample(range(min(8, c.world)), k=c.rng.randrange(1, min(8, c.world) + 1)))
    frames = (PRETRAIN, (f"{MEG}/training/training.py", 1101, "train", ("save_checkpoint_and_time(iteration, model, "
                                                                       "optimizer,")),
              (f"{MEG}/training/training.py", 862, "save_checkpoint_and_time", ("save_checkpoint(iteration, model, "
                                                                               "optimizer, opt_param_scheduler,")),
              (f"{MEG}/training/checkpointing.py", 371, "save_checkpoint", "ensure_directory_exists(checkpoint_name)"),
              (f"{MEG}/training/checkpointing.py", 121, "ensure_directory_exists", ("os.makedirs(dirname, "
                                                                                   "exist_ok=True)")),
              ("<frozen os>", 215, "makedirs", ""), ("<frozen os>", 225, "makedirs", "mkdir(name, mode)"))
    streams = []
    for r in writers:
        s = tb(c, r, frames, [f"OSError: [Errno 30] Read-only file system: '{stage}/mp_rank_{r:02d}'"])
        streams.append([x for x in s if x[0] != f"{c.p(r)}    "])
    c.tick(2)
    c.merge(streams)
    others = [r for r in range(c.world) if r not in writers]
    if others:
        sc.watchdogs(c, others[: c.rng.randrange(1, len(others) + 1)], op="BARRIER")
        sc.sigterms(c, others)
    sc.torchrun_summary(c, writers[0])


# -------------------------------------------------------------------------- ConnectionError ----
@template("conn-hf-hub-unreachable", "ConnectionError", "blind3")
def _hub(c: Ctx) -> None:
    """`accelerate launch` SFT resolves the base model on the Hub at start-up; the proxy/egress is down, every rank fails."""
    c.style = "hf"
    launcher_preamble(c)
    repo = c.rng.choice(("meta-llama/Meta-Llama-3-8B", "Qwen/Qwen2.5-14B", "mistralai/Mistral-7B-v0.3"))
    fname = c.rng.choice(("config.json", "tokenizer_config.json"))
    url = f"/{repo}/resolve/main/{fname}"
    if c.rng.random() < 0.5:
        cause = ("ProxyError('Unable to connect to proxy', OSError('Tunnel connection failed: 503 Service "
                 "Unavailable'))")
        top = "requests.exceptions.ProxyError"
    else:
        cause = (f"NewConnectionError('<urllib3.connection.HTTPSConnection object at 0x7f{c.rng.getrandbits(36):09x}>: "
                 "Failed to establish a new connection: [Errno 101] Network is unreachable')")
        top = "requests.exceptions.ConnectionError"
    err = (f"{top}: (MaxRetryError(\"HTTPSConnectionPool(host='huggingface.co', port=443): Max retries exceeded with "
           f"url: {url} (Caused by {cause})\"), '(Request ID: {c.rng.getrandbits(128):032x})')")
    hub = f"{PKG}/huggingface_hub"
    tf = f"{PKG}/transformers"
    ranks = some_ranks(c)
    streams = []
    for r in ranks:
        p = c.p(r)
        s: sc.Stream = []
        for k in range(1, c.rng.randrange(2, 5)):
            s.append((f"{p}'{err.split(': ', 1)[1]}' thrown while requesting HEAD https://huggingface.co{url}", False))
            s.append((f"{p}Retrying in {2 ** (k - 1)}s [Retry {k}/5].", False))
        s += tb(c, r, ((f"{hub}/file_download.py", 1746, "_get_metadata_or_catch_error",
                        "metadata = get_hf_file_metadata("),
                       (f"{hub}/utils/_http.py", 311, "http_backoff", ("response = session.request(method=method, "
                                                                         "url=url, **kwargs)")),
                       (f"{PKG}/requests/adapters.py", 700, "send", f"raise {top.rsplit('.', 1)[1]}(e, request=request)")),
                [err, "", "The above exception was the direct cause of the following exception:", ""])
        s += tb(c, r, ((f"{tf}/utils/hub.py", 403, "cached_file", "resolved_file = hf_hub_download("),
                       (f"{hub}/file_download.py", 1375, "_hf_hub_download_to_cache_dir",
                        "_raise_on_head_call_error(head_call_error, force_download, local_files_only)"),
                       (f"{hub}/file_download.py", 1857, "_raise_on_head_call_error", "raise LocalEntryNotFoundError(")),
                [("huggingface_hub.errors.LocalEntryNotFoundError: An error happened while trying to locate the file "
                 "on the Hub and we cannot find the requested files in the local cache. Please check your connection "
                 "and try again or make sure your Internet connection is on."), "",
                 "The above exception was the direct cause of the following exception:", ""], roots=())
        s += tb(c, r, (("/workspace/sft/train_sft.py", 212, "<module>", "main()"),
                       ("/workspace/sft/train_sft.py", 96, "main", ("tokenizer = AutoTokenizer.from_pretrained("
                                                                   "cfg.model.name_or_path)")),
                       (f"{tf}/models/auto/tokenization_auto.py", 857, "from_pretrained",
                        "config = AutoConfig.from_pretrained("),
                       (f"{tf}/utils/hub.py", 446, "cached_file", "raise EnvironmentError(")),
                [(f"OSError: We couldn't connect to 'https://huggingface.co' to load this file, couldn't find it in "
                 f"the cached files and it looks like {repo} is not the path to a directory containing a file named "
                 f"{fname}."), ("Checkout your internet connection or see how to run the library in offline mode at "
                 "'https://huggingface.co/docs/transformers/installation#offline-mode'.")])
        streams.append(s)
    c.tick(30)
    c.merge(streams)
    sc.sigterms(c, [r for r in range(c.world) if r not in ranks])
    accelerate_summary(c, ranks[0], "train_sft.py")


# ------------------------------------------------------------------------------------ OOM ----
@template("oom-jax-resource-exhausted", "OOM", "blind3")
def _jax_oom(c: Ctx) -> None:
    """MaxText resumed with a larger per-device batch: XLA's BFC allocator runs out at the first step on every process."""
    jax_job(c, c.rng.randrange(0, 3))
    n = len(c.hosts)
    procs = sorted(c.rng.sample(range(n), k=c.rng.randrange(1, n + 1)))
    c.tick(60)
    for k in procs:
        pid = c.pids[k * 8]
        for dev in sorted(c.rng.sample(range(8), k=c.rng.randrange(1, 4))):
            gib = c.rng.choice((6, 12, 24, 30)) + c.rng.choice((0, 0.5, 0.25))
            byt = int(gib * 2**30)
            c.add_root(f"{k}: {absl(c, 'W', pid, 'bfc_allocator.cc:482')}Allocator (GPU_{dev}_bfc) ran out of memory "
                       f"trying to allocate {gib:.2f}GiB (rounded to {byt})requested by op ")
            c.add(f"{k}: {absl(c, 'W', pid, 'bfc_allocator.cc:494')}" + "*" * c.rng.randrange(60, 99) + "_" *
                  c.rng.randrange(1, 20) + "x")
            c.add(f"{k}: {absl(c, 'E', pid, 'pjrt_stream_executor_client.cc:3084')}Execution of replica {k * 8 + dev} "
                  f"failed: RESOURCE_EXHAUSTED: Out of memory while trying to allocate {byt} bytes.")
        c.add(f"{k}: BufferAssignment OOM Debugging.")
        c.add(f"{k}: BufferAssignment stats:")
        c.add(f"{k}:              parameter allocation:   {c.rng.uniform(10, 40):.2f}GiB")
        c.add(f"{k}:               maybe_live_out allocation:   {c.rng.uniform(10, 40):.2f}GiB")
        c.add(f"{k}:      preallocated temp allocation:   {c.rng.uniform(40, 70):.2f}GiB")
        c.add(f"{k}:                  total allocation:   {c.rng.uniform(80, 120):.2f}GiB")
        s = tb(c, k, jax_frames(), [("jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory while "
                                    f"trying to allocate {byt} bytes."), "--------------------", JAX_FILTER])
        c.merge([[(f"{k}: {x}", root) for x, root in s]])
    for k in procs:
        c.add(f"srun: error: {c.hosts[k]}: task {k}: Exited with exit code 1")


# ----------------------------------------------------------------------------- RuntimeError ----
@template("rt-dcp-resume-missing-key", "RuntimeError", "blind3")
def _dcp_missing(c: Ctx) -> None:
    """torchtitan resumes a DCP checkpoint written with fewer layers: the load planner reports a missing key."""
    titan_job(c, 0, resume=c.rng.randrange(1, 60) * 500)
    dcp = f"{_TORCH}/distributed/checkpoint"
    layer = c.rng.choice((16, 24, 32, 40))
    fqn = f"model.layers.{layer}.{c.rng.choice(('attention.wq.weight', 'feed_forward.w1.weight', 'attention_norm.weight'))}"
    outer = ((f"{TITAN}/train.py", 465, "<module>", "main(config)"),
             (f"{_TORCH}/distributed/elastic/multiprocessing/errors/__init__.py", 355, "wrapper",
              "return f(*args, **kwargs)"),
             (f"{TITAN}/train.py", 226, "main", ("checkpoint_loaded = checkpoint.load(step=job_config.checkpoint."
                                               "load_step)")),
             (f"{TITAN}/torchtitan/checkpoint.py", 457, "load", "dcp.load("),
             (f"{dcp}/logger.py", 83, "wrapper", "result = func(*args, **kwargs)"),
             (f"{dcp}/utils.py", 429, "inner_func", "return func(*args, **kwargs)"),
             (f"{dcp}/state_dict_loader.py", 172, "load", "_load_state_dict("),
             (f"{dcp}/state_dict_loader.py", 229, "_load_state_dict", ("central_plan: LoadPlan = distW.reduce_scatter("
                                                                      "\"plan\", local_step, global_step)")),
             (f"{dcp}/utils.py", 191, "reduce_scatter", "raise result"))
    inner = ((f"{dcp}/utils.py", 163, "reduce_scatter", "local_data = map_fun()"),
             (f"{dcp}/logger.py", 83, "wrapper", "result = func(*args, **kwargs)"),
             (f"{dcp}/state_dict_loader.py", 218, "local_step", "local_plan = planner.create_local_plan()"),
             (f"{dcp}/default_planner.py", 233, "create_local_plan", "return create_default_local_load_plan("),
             (f"{dcp}/default_planner.py", 354, "create_default_local_load_plan",
              "raise RuntimeError(f\"Missing key in checkpoint state_dict: {fqn}.\")"))
    ranks = some_ranks(c)
    failed = list(range(c.world))
    streams = []
    for r in ranks:
        s = tb(c, r, outer, [(f"torch.distributed.checkpoint.api.CheckpointException: CheckpointException ranks:"
                             f"dict_keys({failed})")], roots=())
        for fr in failed[:c.rng.randrange(1, 3)]:
            s += tb(c, r, inner, [f"RuntimeError: Missing key in checkpoint state_dict: {fqn}."])
            s[-len(inner) * 2 - 2] = (f"{c.p(r)}Traceback (most recent call last): (RANK {fr})", False)
        streams.append(s)
    all_fail(c, streams, ranks, "train.py")


# ------------------------------------------------------------------------------- ValueError ----
@template("value-hf-deepspeed-config-mismatch", "ValueError", "blind3")
def _ds_mismatch(c: Ctx) -> None:
    """HF Trainer under the deepspeed launcher: the ZeRO-3 JSON's batch settings contradict TrainingArguments."""
    c.style = "hf"
    stamp = lambda: f"[{c.ts()}] [INFO]"
    c.add(f"{stamp()} [real_accelerator.py:219:get_accelerator] Setting ds_accelerator to cuda (auto detect)")
    c.add(f"{stamp()} [runner.py:585:main] cmd = /usr/bin/python3 -u -m deepspeed.launcher.launch "
          f"--world_info={c.rng.getrandbits(120):030x} --master_addr={c.ips[0]} --master_port=29500 "
          "--enable_each_rank_log=None train_sft.py --deepspeed ds_z3.json --per_device_train_batch_size 8 "
          "--gradient_accumulation_steps 4 --bf16")
    for r in range(min(8, c.world)):
        c.add(f"{stamp()} [launch.py:256:main] process {c.pids[r]} spawned with command: ['/usr/bin/python3', '-u', "
              f"'train_sft.py', '--local_rank={r}', '--deepspeed', 'ds_z3.json']")
    if c.rng.random() < 0.5:
        nccl_init(c)
    streams = []
    for r in range(c.world):
        p = c.p(r)
        n = 4
        bars = "\r".join(f"Loading checkpoint shards: {100 * i // n:3d}%|{'█' * (10 * i // n):<10}| {i}/{n} "
                         f"[00:{5 * i:02d}<00:{5 * (n - i):02d},  {c.rng.uniform(3, 6):.2f}s/it]" for i in range(n + 1))
        streams.append([(f"{p}[{c.ts()}] [INFO] [comm.py:652:init_distributed] cdb=None", False),
                        (f"{p}{bars}", False)])
    c.merge(streams)
    c.add(f"{c.p(0)}[{c.ts()}] [INFO] [comm.py:683:init_distributed] Initializing TorchBackend in DeepSpeed with "
          "backend nccl")
    c.add(f"{c.p(0)}Using auto half precision backend")
    mbs, hf_mbs = c.rng.choice(((4, 8), (2, 8), (16, 4)))
    ga, hf_ga = c.rng.choice(((1, 4), (8, 4), (4, 4)))
    msg = ["ValueError: Please correct the following DeepSpeed config values that mismatch TrainingArguments values:",
           f"- ds train_micro_batch_size_per_gpu={mbs} vs hf per_device_train_batch_size={hf_mbs}"]
    if ga != hf_ga:
        msg.append(f"- ds gradient_accumulation_steps={ga} vs hf gradient_accumulation_steps={hf_ga}")
    msg.append("The easiest method is to set these DeepSpeed config values to 'auto'.")
    tf = f"{PKG}/transformers"
    frames = (("/workspace/sft/train_sft.py", 212, "<module>", "main()"),
              ("/workspace/sft/train_sft.py", 198, "main", "trainer.train(resume_from_checkpoint=cfg.resume)"),
              (f"{tf}/trainer.py", 2123, "train", "return inner_training_loop("),
              (f"{tf}/trainer.py", 2277, "_inner_training_loop", ("self.model, self.optimizer, self.lr_scheduler = "
                                                                 "deepspeed_init(")),
              (f"{tf}/integrations/deepspeed.py", 389, "deepspeed_init",
               "hf_deepspeed_config.trainer_config_finalize(args, model, num_training_steps)"),
              (f"{tf}/integrations/deepspeed.py", 268, "trainer_config_finalize", "raise ValueError("))
    ranks = some_ranks(c)
    streams = [tb(c, r, frames, msg, roots=tuple(range(len(msg) - 1))) for r in ranks]
    c.tick(1)
    c.merge(streams)
    for r in range(min(8, c.world)):
        c.add(f"[{c.ts()}] [INFO] [launch.py:319:sigkill_handler] Killing subprocess {c.pids[r]}")
    c.add(f"[{c.ts()}] [ERROR] [launch.py:325:sigkill_handler] ['/usr/bin/python3', '-u', 'train_sft.py', "
          f"'--local_rank={min(8, c.world) - 1}', '--deepspeed', 'ds_z3.json'] exits with return code = 1")


# --------------------------------------------------------------------------- AttributeError ----
@template("attr-numpy-removed-alias", "AttributeError", "blind3")
def _np_alias(c: Ctx) -> None:
    """An old Megatron-DeepSpeed fork maps index dtypes through a NumPy alias the image's NumPy no longer has."""
    launcher_preamble(c)
    if c.rng.random() < 0.5:
        for r in range(c.world):
            c.add(f"{c.p(r)}[{c.ts()}] [INFO] [real_accelerator.py:219:get_accelerator] Setting ds_accelerator to cuda "
                  "(auto detect)")
    if c.rng.random() < 0.5:
        alias = "float"
        msg = ["AttributeError: module 'numpy' has no attribute 'float'.",
               ("`np.float` was a deprecated alias for the builtin `float`. To avoid this error in existing code, use "
                "`float` by itself. Doing this will not modify any behavior and is safe. If you specifically wanted the "
                "numpy scalar type, use `np.float64` here."),
               ("The aliases was originally deprecated in NumPy 1.20; for more details and guidance see the original "
                "release note at:"), "    https://numpy.org/devdocs/release/1.20.0-notes.html#deprecations"]
    else:
        alias = "float_"
        msg = ["AttributeError: `np.float_` was removed in the NumPy 2.0 release. Use `np.float64` instead."]
    base = "/workspace/Megatron-DeepSpeed/megatron/data"
    frames = (("/workspace/Megatron-DeepSpeed/pretrain_gpt.py", 9, "<module>",
               "from megatron.data.gpt_dataset import build_train_valid_test_datasets"),
              (f"{base}/gpt_dataset.py", 15, "<module>", ("from megatron.data.indexed_dataset import "
                                                         "make_dataset as make_indexed_dataset")),
              (f"{base}/indexed_dataset.py", 101, "<module>", f"6: np.{alias},"),
              (f"{PKG}/numpy/__init__.py", 411 if alias == "float_" else 324, "__getattr__",
               "raise AttributeError(" if alias == "float_" else "raise AttributeError(__former_attrs__[attr])"))
    ranks = some_ranks(c)
    all_fail(c, [tb(c, r, frames, msg) for r in ranks], ranks, "pretrain_gpt.py")


# ------------------------------------------------------------------------------- IndexError ----
@template("index-truncated-idx-blended", "IndexError", "blind3")
def _idx_bounds(c: Ctx) -> None:
    """A blended dataset whose .idx was regenerated from a shorter .bin: a sample id runs past the index mid-run."""
    c.style = "megatron"
    start_job(c, routine_steps(c))
    bad = c.rng.randrange(max(1, c.world // 8)) * 8
    size = c.rng.randrange(10**5, 10**7)
    core = f"{MEG}/core/datasets"
    inner = ((f"{core}/blended_dataset.py", 76, "__getitem__", ("return {\"dataset_id\": dataset_id, "
                                                               "**self.datasets[dataset_id][dataset_sample_id]}")),
             (f"{core}/gpt_dataset.py", 138, "__getitem__", "text, _ = self._query_document_sample_shuffle_index(idx)"),
             (f"{core}/gpt_dataset.py", 231, "_query_document_sample_shuffle_index", "self.dataset.get("),
             (f"{core}/indexed_dataset.py", 592, "get", ("sequence_pointer, sequence_length, sequence_mode = "
                                                        "self.index[idx]")),
             (f"{core}/indexed_dataset.py", 395, "__getitem__", "self.sequence_pointers[idx],"))
    s = _worker_error(c, bad, "IndexError", inner, f"IndexError: index {size} is out of bounds for axis 0 with size "
                                                   f"{size}", outer_root=False, inner_root=True)
    dies(c, bad, s)


# ------------------------------------------------------------------------------- LossSpike ----
@template("loss-titan-diverged-scancel", "LossSpike", "blind3")
def _titan_div(c: Ctx) -> None:
    """torchtitan's loss jumps, grad norm explodes, then NaN for many steps; nothing stops it until the user scancels."""
    titan_job(c, routine_steps(c))
    loss, norm = loss_at(c, c.iteration), c.rng.uniform(0.3, 1.0)
    for i in range(c.rng.randrange(3, 7)):
        c.iteration += 10
        c.tick(40)
        loss, norm = min(loss * c.rng.uniform(1.4, 2.1), c.rng.uniform(10.5, 12)), norm * c.rng.uniform(6, 30)
        (c.add_root if i < 2 else c.add)(titan_step_line(c, loss, norm))
    for i in range(c.rng.randrange(30, 200)):
        c.iteration += 10
        c.tick(40)
        if i < 3:
            c.add(titan_step_line(c, c.rng.uniform(10, 12), float("inf") if i else norm * 40))
        else:
            (c.add_root if i == 3 else c.add)(titan_step_line(c, float("nan"), float("nan")))
    job = c.rng.randrange(10**5, 10**7)
    c.tick(600)
    c.add(f"slurmstepd: error: *** JOB {job} ON {c.hosts[0]} CANCELLED AT {c.clock.strftime('%Y-%m-%dT%H:%M:%S')} ***")
    c.add(f"W{c.clock.strftime('%m%d %H:%M:%S')} {c.pids[0] - 40} torch/distributed/elastic/agent/server/api.py:704] "
          "Received Signals.SIGTERM death signal, shutting down workers")
    sc.sigterms(c, range(min(8, c.world)))


# ---------------------------------------------------------------------------------- healthy ----
@template("healthy-zero3-noisy-shutdown", HEALTHY, "blind3")
def _healthy_z3(c: Ctx) -> None:
    """A ZeRO-3 run that completes: allocator-cache-flush warnings, a slow-rank notice, a harmless exception at exit."""
    c.style = "deepspeed"
    start_job(c, routine_steps(c) // 3)
    p = c.p(0)
    for _ in range(c.rng.randrange(2, 6)):
        c.add(f"{p}[{c.ts()}] [WARNING] [stage3.py:2069:step] {c.rng.randrange(1, 6)} pytorch allocator cache flushes "
              "since last step. this happens when there is high memory pressure and is detrimental to performance. if "
              "this is happening frequently consider adjusting settings to reduce memory consumption. If you are "
              "unable to make the cache flushes go away consider adding get_accelerator().empty_cache() calls in your "
              "training loop to ensure that all ranks flush their caches at the same time")
        train_steps(c, c.rng.randrange(50, 300))
    slow = c.rng.randrange(c.world)
    c.add(f"{p}[{c.ts()}] [WARNING] [straggler] rank {slow} on {c.host(slow)} step time {c.rng.uniform(1.3, 1.9):.2f}x "
          "the median over the last 100 steps (recovered)")
    train_steps(c, routine_steps(c) // 3)
    c.add(f"{p}[{c.ts()}] [INFO] [logging.py:96:log_dist] [Rank 0] training finished at step {c.iteration}; saving "
          "final checkpoint")
    c.add(f"{p}  successfully saved checkpoint at iteration {c.iteration:>8} to {c.path('ckpt', c.run)}")
    for r in c.rng.sample(range(c.world), k=c.rng.randrange(1, min(4, c.world) + 1)):
        q = c.p(r)
        c.add(f"{q}Exception ignored in: <function _MultiProcessingDataLoaderIter.__del__ at "
              f"0x7f{c.rng.getrandbits(36):09x}>")
        c.add(f"{q}Traceback (most recent call last):")
        c.add(f'{q}  File "{_TORCH}/utils/data/dataloader.py", line 1479, in __del__')
        c.add(f"{q}    self._shutdown_workers()")
        c.add(f'{q}  File "{_TORCH}/utils/data/dataloader.py", line 1443, in _shutdown_workers')
        c.add(f"{q}    if self._persistent_workers or self._workers_status[worker_id]:")
        c.add(f"{q}AttributeError: '_MultiProcessingDataLoaderIter' object has no attribute '_workers_status'")
    for r in range(min(8, c.world)):
        c.add(f"[{c.ts()}] [INFO] [launch.py:351:main] Process {c.pids[r]} exits successfully.")


@template("healthy-vllm-eval-warnings", HEALTHY, "blind3")
def _healthy_vllm(c: Ctx) -> None:
    """An lm-eval-harness run on vLLM that finishes: truncation and long-prompt warnings, a results table, clean exit."""
    workers = vllm_start(c)
    d = lambda: c.clock.strftime("%m-%d %H:%M:%S")
    n = c.rng.randrange(3, 7)
    for _ in range(n):
        lm_eval_run(c, 1)
        if c.rng.random() < 0.6:
            c.add(f"Token indices sequence length is longer than the specified maximum sequence length for this model "
                  f"({c.rng.randrange(8200, 12000)} > 8192). Running this sequence through the model will result in "
                  "indexing errors")
        if c.rng.random() < 0.5:
            c.add(f"WARNING {d()} scheduler.py:1089] Input prompt ({c.rng.randrange(8200, 12000)} tokens) is too long "
                  "and exceeds limit of 8192")
    c.add(f"{time_hf(c)} INFO     [evaluation_tracker.py:206] Saving results aggregated")
    c.add(f"vllm (pretrained={c.path('ckpt', c.run, 'hf')},tensor_parallel_size=8,dtype=bfloat16,"
          f"gpu_memory_utilization=0.85), gen_kwargs: (None), limit: None, num_fewshot: None, batch_size: auto")
    c.add("|    Tasks    |Version|     Filter     |n-shot|  Metric   |   |Value |   |Stderr|")
    c.add("|-------------|------:|----------------|-----:|-----------|---|-----:|---|-----:|")
    for t, f, m in (("arc_challenge", "none", "acc_norm"), ("gsm8k", "strict-match", "exact_match"),
                    ("hellaswag", "none", "acc_norm"), ("mmlu", "none", "acc")):
        c.add(f"|{t:<13}|      {c.rng.choice((1, 2, 3))}|{f:<16}|{c.rng.choice((0, 5, 25)):>6}|{m:<11}|↑  |"
              f"{c.rng.uniform(0.3, 0.85):.4f}|±  |{c.rng.uniform(0.003, 0.015):.4f}|")
    c.add(f"INFO {d()} multiproc_worker_utils.py:141] Terminating local vLLM worker processes")
    for w in workers[1:]:
        c.add(f"(VllmWorkerProcess pid={w}) INFO {d()} multiproc_worker_utils.py:253] Worker exiting")
    c.add(f"[rank0]:{torch25(c, 'W', 'ProcessGroupNCCL.cpp:1250')} Warning: WARNING: process group has NOT been "
          "destroyed before we destruct ProcessGroupNCCL. On normal program exit, the application should call "
          "destroy_process_group to ensure that any pending NCCL operations have finished in this process. "
          "(function operator())")
    c.add("/usr/lib/python3.10/multiprocessing/resource_tracker.py:254: UserWarning: resource_tracker: There appear to "
          "be 1 leaked semaphore objects to clean up at shutdown")
    c.add("  warnings.warn('resource_tracker: There appear to be %d '")

