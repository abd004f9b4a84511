"""What failing jobs print: tracebacks, NCCL watchdogs, torchrun summaries, kernel logs.

Shared by the corpus's failure templates. A stream is a list of `(line, is_root_cause)` pairs for
one rank; `Ctx.merge` interleaves several ranks' streams as the launcher's pipes do.
"""

from __future__ import annotations

from collections.abc import Sequence

from loom.diagnosis.logsim import Ctx

Stream = list[tuple[str, bool]]

FRAMES = {
    "step": (("/workspace/Megatron-LM/pretrain_gpt.py", 233, "<module>", "pretrain(train_valid_test_datasets_provider,"),
             ("/workspace/Megatron-LM/megatron/training/training.py", 1049, "train",
              "train_step(forward_step_func,"),
             ("/workspace/Megatron-LM/megatron/training/training.py", 556, "train_step",
              "losses_reduced = forward_backward_func("),
             ("/workspace/Megatron-LM/megatron/core/pipeline_parallel/schedules.py", 381, "forward_backward_no_pipelining",
              "output_tensor = forward_step("),
             ("/usr/local/lib/python3.10/dist-packages/torch/nn/modules/module.py", 1532, "_call_impl",
              "return forward_call(*args, **kwargs)")),
    "init": (("/workspace/train.py", 88, "<module>", "main()"),
             ("/workspace/train.py", 61, "main", "model = build_model(cfg)"),
             ("/workspace/models/build.py", 142, "build_model", "return GPT(cfg.model)")),
    "data": (("/workspace/train.py", 88, "<module>", "main()"),
             ("/workspace/train.py", 73, "main", "for batch in loader:"),
             ("/usr/local/lib/python3.10/dist-packages/torch/utils/data/dataloader.py", 631, "__next__",
              "data = self._next_data()"),
             ("/workspace/data/indexed_dataset.py", 512, "__getitem__", "return self._read(idx)")),
    "save": (("/workspace/Megatron-LM/megatron/training/training.py", 1101, "train",
              "save_checkpoint_and_time(iteration, model, optimizer,"),
             ("/workspace/Megatron-LM/megatron/training/checkpointing.py", 378, "save_checkpoint",
              "torch.save(state_dict, checkpoint_name)"),
             ("/usr/local/lib/python3.10/dist-packages/torch/serialization.py", 628, "save",
              "with _open_zipfile_writer(f) as opened_zipfile:")),
    # sites used only by the blind test templates added later (corpus.py, "blind test templates")
    "log": (("/workspace/Megatron-LM/megatron/training/training.py", 1063, "train",
             "report_memory_flag = training_log(loss_dict, total_loss_dict,"),
            ("/workspace/Megatron-LM/megatron/training/training.py", 742, "training_log",
             "mlflow.log_metrics(metrics, step=iteration)"),
            ("/usr/local/lib/python3.10/dist-packages/mlflow/tracking/fluent.py", 875, "log_metrics",
             "MlflowClient().log_batch(run_id=run_id, metrics=metrics_arr, params=[], tags=[], synchronous=synchronous)"),
            ("/usr/local/lib/python3.10/dist-packages/mlflow/store/tracking/rest_store.py", 380, "log_batch",
             "self._call_endpoint(LogBatch, req_body)"),
            ("/usr/local/lib/python3.10/dist-packages/mlflow/utils/rest_utils.py", 210, "call_endpoint",
             "response = http_request(**call_kwargs)")),
    "dcp": (("/workspace/Megatron-LM/megatron/training/checkpointing.py", 401, "save_checkpoint",
             "dist_checkpointing.save(state_dict, checkpoint_name, save_strategy)"),
            ("/usr/local/lib/python3.10/dist-packages/torch/distributed/checkpoint/state_dict_saver.py", 154,
             "save", "return _save_state_dict("),
            ("/usr/local/lib/python3.10/dist-packages/torch/distributed/checkpoint/state_dict_saver.py", 308,
             "_save_state_dict", 'central_metadata = distW.all_reduce("write", write_data, finish_checkpoint)'),
            ("/usr/local/lib/python3.10/dist-packages/torch/distributed/checkpoint/utils.py", 258, "all_reduce",
             "raise final_result")),
    "import": (("/workspace/Megatron-LM/pretrain_gpt.py", 14, "<module>",
                "from megatron.core.models.gpt import GPTModel"),
               ("/workspace/Megatron-LM/megatron/core/models/gpt/__init__.py", 1, "<module>",
                "from .gpt_model import GPTModel"),
               ("/workspace/Megatron-LM/megatron/core/fusions/fused_layer_norm.py", 20, "<module>",
                "import fused_layer_norm_cuda")),
    "hfds": (("/workspace/sft/train_sft.py", 212, "<module>", "main()"),
             ("/workspace/sft/train_sft.py", 131, "main", 'raw = load_dataset("json", data_files=cfg.data.train_files)'),
             ("/usr/local/lib/python3.10/dist-packages/datasets/load.py", 2556, "load_dataset",
              "builder_instance = load_dataset_builder("),
             ("/usr/local/lib/python3.10/dist-packages/datasets/load.py", 2228, "load_dataset_builder",
              "dataset_module = dataset_module_factory("),
             ("/usr/local/lib/python3.10/dist-packages/datasets/data_files.py", 407, "resolve_pattern",
              "raise FileNotFoundError(error_msg)")),
    "ds_step": (("/workspace/Megatron-DeepSpeed/megatron/training.py", 1218, "train_step",
                 "model[0].step(lr_kwargs={'increment': increment})"),
                ("/usr/local/lib/python3.10/dist-packages/deepspeed/runtime/engine.py", 2213, "step",
                 "self._take_model_step(lr_kwargs)"),
                ("/usr/local/lib/python3.10/dist-packages/deepspeed/runtime/engine.py", 2119, "_take_model_step",
                 "self.optimizer.step()"),
                ("/usr/local/lib/python3.10/dist-packages/deepspeed/runtime/fp16/fused_optimizer.py", 263, "step",
                 "self._update_scale(self.overflow)"),
                ("/usr/local/lib/python3.10/dist-packages/deepspeed/runtime/fp16/loss_scaler.py", 175,
                 "update_scale",
                 ('raise Exception("Current loss scale already at minimum - cannot decrease scale anymore. '
                 'Exiting run.")'))),
}


def traceback(c: Ctx, rank: int, site: str, exc: Sequence[str], *, root: bool = True,
              pre: Sequence[str] = ()) -> Stream:
    """One rank's Python traceback; the first exception line is the root cause when `root`."""
    p = c.p(rank)
    s: Stream = [(f"{p}{x}", False) for x in pre]
    s.append((f"{p}Traceback (most recent call last):", False))
    for path, line, fn, code in FRAMES[site][: c.rng.randrange(2, len(FRAMES[site]) + 1)]:
        s.append((f'{p}  File "{path}", line {line}, in {fn}', False))
        s.append((f"{p}    {code}", False))
    for i, line in enumerate(exc):
        s.append((f"{p}{line}", root and i == 0))
    return s


def every_rank(c: Ctx, site: str, exc: Sequence[str], ranks: Sequence[int] | None = None) -> None:
    """The same traceback printed by every rank, interleaved (a framework or script error)."""
    c.merge([traceback(c, r, site, exc) for r in (range(c.world) if ranks is None else ranks)])


def watchdogs(c: Ctx, ranks: Sequence[int], *, op: str = "ALLREDUCE", root: bool = False) -> None:
    """NCCL watchdog timeouts: the collective the faulty rank never joined (a secondary error)."""
    c.tick(600)
    seq = c.rng.randrange(1000, 90000)
    timeout = c.rng.choice((600000, 1800000))
    streams = []
    for r in ranks:
        g = c.glog("E")
        s = [((f"{c.p(r)}[{g} ProcessGroupNCCL.cpp:632] [Rank {r}] Watchdog caught collective operation timeout: "
              f"WorkNCCL(SeqNum={seq}, OpType={op}, NumelIn={c.rng.randrange(1, 10**8)}, NumelOut=1, "
              f"Timeout(ms)={timeout}) ran for {timeout + c.rng.randrange(1, 900)} milliseconds before timing out."),
              root),
             ((f"{c.p(r)}[{g} ProcessGroupNCCL.cpp:1537] [PG 0 Rank {r}] Timeout at NCCL work: {seq}, last enqueued "
              f"NCCL work: {seq}, last completed NCCL work: {seq - 1}."), False),
             ((f"{c.p(r)}[{g} ProcessGroupNCCL.cpp:577] [Rank {r}] Some NCCL operations have failed or timed out. "
              "Due to the asynchronous nature of CUDA kernels, subsequent GPU operations might run on corrupted/"
              "incomplete data."), False),
             ((f"{c.p(r)}[{g} ProcessGroupNCCL.cpp:583] [Rank {r}] To avoid data inconsistency, we are taking the "
              "entire process down."), False),
             (f"{c.p(r)}terminate called after throwing an instance of 'c10::DistBackendError'", False)]
        streams.append(s)
    c.merge(streams)


def remote_exits(c: Ctx, ranks: Sequence[int]) -> None:
    """Peers of a dead rank: NCCL reports a remote process exit (secondary)."""
    c.tick(5)
    streams = []
    for r in ranks:
        s = traceback(c, r, "step", [
            ("torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:"
            "1970, remote process exited or there was a network error, NCCL version 2.19.3"),
            ("ncclRemoteError: A call failed possibly due to a network error or a remote process exiting "
            "prematurely."),
            (f"Last error: NET/IB : Got completion from peer {c.ip((r + 8) % c.world)}<{c.rng.randrange(30000, 60000)}>"
            " with status=12 opcode=0 len=0 vendor err 129 (Recv) localGid ::ffff:"
            f"{c.ip(r)} remoteGids::ffff:{c.ip((r + 8) % c.world)}")], root=False)
        streams.append(s)
    c.merge(streams[: c.rng.randrange(1, len(streams) + 1)])


def sigterms(c: Ctx, ranks: Sequence[int]) -> None:
    stamp = c.glog("W") + " torch/distributed/elastic/multiprocessing/api.py:858]"
    for r in ranks:
        c.add(f"{stamp} Sending process {c.pids[r]} closing signal SIGTERM")


def torchrun_summary(c: Ctx, rank: int, exitcode: int = 1, script: str = "pretrain_gpt.py") -> None:
    """The elastic agent's ChildFailedError report (always secondary: it names a rank, not a cause)."""
    c.tick(3)
    c.add(f"{c.glog('E')} torch/distributed/elastic/multiprocessing/api.py:833] failed (exitcode: {exitcode}) "
          f"local_rank: {rank % 8} (pid: {c.pids[rank]}) of binary: /usr/bin/python3")
    c.add("Traceback (most recent call last):")
    c.add('  File "/usr/local/bin/torchrun", line 8, in <module>')
    c.add("    sys.exit(main())")
    c.add('  File "/usr/local/lib/python3.10/dist-packages/torch/distributed/run.py", line 892, in main')
    c.add("    run(args)")
    c.add('  File "/usr/local/lib/python3.10/dist-packages/torch/distributed/launcher/api.py", line 263, in '
          "launch_agent")
    c.add("    raise ChildFailedError(")
    c.add("torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ")
    c.add("============================================================")
    c.add(f"{script} FAILED")
    c.add("------------------------------------------------------------")
    c.add("Failures:")
    c.add("  <NO_OTHER_FAILURES>")
    c.add("------------------------------------------------------------")
    c.add("Root Cause (first observed failure):")
    c.add("[0]:")
    c.add(f"  time      : {c.clock.strftime('%Y-%m-%d_%H:%M:%S')}")
    c.add(f"  host      : {c.host(rank)}")
    c.add(f"  rank      : {rank} (local_rank: {rank % 8})")
    c.add(f"  exitcode  : {exitcode} (pid: {c.pids[rank]})")
    c.add("  error_file: <N/A>")
    c.add("  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html")
    c.add("============================================================")


def dmesg(c: Ctx, rank: int, xid: int, text: str, *, root: bool = True, header: bool = True) -> None:
    """A kernel-log line for the GPU of `rank`, as the job wrapper forwards it."""
    bus = f"0000:{0x18 + (rank % 8) * 0x10:02x}:00"
    if header:
        c.add(f"===== kernel log of {c.host(rank)} (dmesg -T | grep NVRM) =====")
    line = (f"[{c.clock.strftime('%a %b %d %H:%M:%S %Y')}] NVRM: Xid (PCI:{bus}): {xid}, "
            f"pid={c.pids[rank]}, name=python3, {text}")
    (c.add_root if root else c.add)(line)


def single_rank_fault(c: Ctx, bad: int, exc: Sequence[str], *, site: str = "step", exitcode: int = 1) -> None:
    """One rank dies with `exc`; the others time out in their next collective; torchrun reports."""
    c.tick(2)
    c.merge([traceback(c, bad, site, exc)])
    others = c.other_ranks(bad)
    if c.rng.random() < 0.5:
        watchdogs(c, others)
    else:
        remote_exits(c, others)
    sigterms(c, others[: c.rng.randrange(1, len(others) + 1)])
    torchrun_summary(c, bad, exitcode)
