"""Blind test templates, set 3 (split "blind2"), continued: framework and script errors, a loss
spike and a healthy run. Written without reading the rules, the filters or the retrieval code;
measured once. Imported at the end of `corpus_blind2.py`.
"""

from __future__ import annotations

from collections.abc import Sequence

from loom.diagnosis import scenarios as sc
from loom.diagnosis.corpus import _TORCH, HEALTHY, template
from loom.diagnosis.corpus_blind2 import (
    HF_EVAL,
    MEG,
    PKG,
    Frame,
    dies,
    hf_eval_banner,
    tb,
)
from loom.diagnosis.logsim import (
    Ctx,
    launcher_preamble,
    nccl_init,
    routine_steps,
    start_job,
    train_steps,
)

_BACKWARD = ((f"{_TORCH}/_tensor.py", 521, "backward", "torch.autograd.backward("),
             (f"{_TORCH}/autograd/__init__.py", 289, "backward", "_engine_run_backward("),
             (f"{_TORCH}/autograd/graph.py", 768, "_engine_run_backward",
              "return Variable._execution_engine.run_backward(  # Calls into the C++ engine to run the backward pass"))


def all_ranks_fail(c: Ctx, frames: Sequence[Frame], exc: Sequence[str], *, script: str = "pretrain_gpt.py") -> None:
    """Every rank (or the half that prints before being killed) raises the same error."""
    c.tick(1)
    ranks = list(range(c.world))
    if c.rng.random() < 0.3:
        ranks = sorted(c.rng.sample(ranks, k=max(1, c.world // 2)))
    c.merge([tb(c, r, frames, exc) for r in ranks])
    sc.sigterms(c, [r for r in range(c.world) if r not in ranks])
    sc.torchrun_summary(c, ranks[0], script=script)


# --------------------------------------------------------------------------- RuntimeError ----
@template("rt-inplace-after-curriculum", "RuntimeError", "blind2")
def _rt_inplace(c: Ctx) -> None:
    """A sequence-length curriculum switches on a code path with an in-place op; autograd fails at the next backward."""
    start_job(c, routine_steps(c))
    old, new = c.rng.choice(((1024, 2048), (2048, 4096), (4096, 8192)))
    c.add(f"{c.p(0)}[{c.ts()}] [curriculum] iteration {c.iteration}: seq_length {old} -> {new}, enabling "
          "rope scaling (in-place NTK rescale)")
    train_steps(c, c.rng.randrange(0, 2))
    frames = (("/workspace/train.py", 88, "<module>", "main()"),
              ("/workspace/train.py", 79, "main", "loss.backward()")) + _BACKWARD
    all_ranks_fail(c, frames, [
        (f"RuntimeError: one of the variables needed for gradient computation has been modified by an inplace "
         f"operation: [torch.cuda.BFloat16Tensor [{c.rng.choice((1, 2, 4))}, {new}, 128]], which is output 0 of "
         f"MulBackward0, is at version {c.rng.randrange(2, 5)}; expected version 1 instead. Hint: enable anomaly "
         "detection to find the operation that failed to compute its gradient, with "
         "torch.autograd.set_detect_anomaly(True).")], script="train.py")


# ----------------------------------------------------------------------------- ValueError ----
@template("value-fsdp-mixed-dtype", "ValueError", "blind2")
def _value_fsdp(c: Ctx) -> None:
    """FSDP wrapping fails at start-up: a module mixes bf16 and fp32 parameters in one flat parameter."""
    launcher_preamble(c)
    if c.rng.random() < 0.6:
        nccl_init(c)
    streams = []
    for r in range(c.world):
        n = c.rng.choice((2, 3, 4))
        bars = "\r".join(f"Loading checkpoint shards: {100 * i // n:3d}%|{'█' * (10 * i // n):<10}| {i}/{n} "
                         f"[00:{4 * i:02d}<00:{4 * (n - i):02d},  {c.rng.uniform(3, 5):.2f}s/it]" for i in range(n + 1))
        streams.append([(f"{c.p(r)}{bars}", False)])
    c.merge(streams)
    fsdp = f"{_TORCH}/distributed/fsdp"
    frames = (("/workspace/fsdp_train.py", 301, "<module>", "main(cfg)"),
              ("/workspace/fsdp_train.py", 142, "main", ("model = FSDP(model, auto_wrap_policy=wrap_policy, "
                                                        "mixed_precision=mp_policy, device_id=torch.cuda.current_device())")),
              (f"{fsdp}/fully_sharded_data_parallel.py", 509, "__init__", "_init_param_handle_from_module("),
              (f"{fsdp}/_init_utils.py", 636, "_init_param_handle_from_module",
               "_init_param_handle_from_params(state, managed_params, fully_sharded_module)"),
              (f"{fsdp}/_init_utils.py", 648, "_init_param_handle_from_params", "handle = FlatParamHandle("),
              (f"{fsdp}/_flat_param.py", 581, "__init__", "self._init_flat_param_and_metadata("),
              (f"{fsdp}/_flat_param.py", 631, "_init_flat_param_and_metadata",
               ") = self._validate_tensors_to_flatten(params)"),
              (f"{fsdp}/_flat_param.py", 776, "_validate_tensors_to_flatten", "raise ValueError("))
    a, b = c.rng.sample(("torch.bfloat16", "torch.float32"), 2)
    all_ranks_fail(c, frames, [f"ValueError: Must flatten tensors with uniform dtype but got {a} and {b}"],
                   script="fsdp_train.py")


# ------------------------------------------------------------------------- AttributeError ----
@template("attr-remote-code-cache-api", "AttributeError", "blind2")
def _attr_cache(c: Ctx) -> None:
    """A trust_remote_code model calls a cache method newer transformers removed; it first runs at evaluation."""
    c.style = "hf"
    start_job(c, routine_steps(c))
    hf_eval_banner(c)
    model = c.rng.choice(("deepseek-v2-lite", "phi-3-medium", "minicpm-2b"))
    mod = model.split("-")[0].replace("phi", "phi3")
    meth = c.rng.choice(("get_max_length", "seen_tokens"))
    frames = HF_EVAL + ((f"{PKG}/transformers/generation/utils.py", 3197, "_sample",
                         "model_inputs = self.prepare_inputs_for_generation(input_ids, **model_kwargs)"),
                        (f"/root/.cache/huggingface/modules/transformers_modules/{model}/modeling_{mod}.py",
                         c.rng.randrange(1200, 1800), "prepare_inputs_for_generation",
                         f"max_cache_length = past_key_values.{meth}()" if meth == "get_max_length" else
                         "past_length = past_key_values.seen_tokens"))
    all_ranks_fail(c, frames, [f"AttributeError: 'DynamicCache' object has no attribute '{meth}'"],
                   script="train_sft.py")


# ------------------------------------------------------------------------- AssertionError ----
@template("assert-zero2-grad-reduced-twice", "AssertionError", "blind2")
def _assert_zero(c: Ctx) -> None:
    """DeepSpeed ZeRO-2 with reentrant checkpointing: a parameter's gradient is reduced twice at the first backward."""
    c.style = "deepspeed"
    start_job(c, c.rng.randrange(0, 3))
    ds = f"{PKG}/deepspeed/runtime"
    z = f"{ds}/zero/stage_1_and_2.py"
    frames = (("/workspace/train_ds.py", 233, "<module>", "main()"),
              ("/workspace/train_ds.py", 190, "main", "model_engine.backward(loss)"),
              (f"{PKG}/deepspeed/utils/nvtx.py", 15, "wrapped_fn", "ret_val = func(*args, **kwargs)"),
              (f"{ds}/engine.py", 1976, "backward", "self.optimizer.backward(loss, retain_graph=retain_graph)"),
              (z, 2056, "backward", "self.loss_scaler.backward(loss.float(), retain_graph=retain_graph)"),
              (f"{ds}/fp16/loss_scaler.py", 63, "backward", "scaled_loss.backward(retain_graph=retain_graph)"),
              *_BACKWARD,
              (z, 903, "reduce_partition_and_remove_grads", "self.reduce_ready_partitions_and_remove_grads(param, i)"),
              (z, 1416, "reduce_ready_partitions_and_remove_grads",
               "self.reduce_independent_p_g_buckets_and_remove_grads(param, i)"),
              (z, 949, "reduce_independent_p_g_buckets_and_remove_grads",
               "assert self.params_already_reduced[param_id] == False, \\"))
    all_ranks_fail(c, frames, [
        (f"AssertionError: The parameter {c.rng.randrange(100, 800)} has already been reduced.             Gradient "
        "computed twice for this partition.             Multiple gradient reduction is currently not supported")],
        script="train_ds.py")


# ------------------------------------------------------------------------------ NameError ----
@template("name-eval-hook-mid-run", "NameError", "blind2")
def _name_hook(c: Ctx) -> None:
    """A user hook that runs only at the eval interval lacks an import; the peers hang and time out after it."""
    c.style = "megatron"
    start_job(c, routine_steps(c))
    bad = c.world - 1
    c.add(f"{c.p(bad)}[{c.ts()}] evaluating at iteration {c.iteration} ({c.rng.choice((10, 20, 50))} eval iterations)")
    c.tick(60)
    frames = (("/workspace/Megatron-LM/pretrain_gpt.py", 233, "<module>", "pretrain(train_valid_test_datasets_provider,"),
              (f"{MEG}/training/training.py", 1123, "train", "evaluate_and_print_results(prefix, forward_step_func,"),
              (f"{MEG}/training/training.py", 1468, "evaluate_and_print_results",
               "acme_hooks.on_eval_end(iteration, total_loss_dict, writer)"),
              (f"{MEG}/training/acme_hooks.py", 41, "on_eval_end", "ppl = math.exp(min(20.0, loss))"))
    dies(c, bad, tb(c, bad, frames, ["NameError: name 'math' is not defined"]))


# ------------------------------------------------------------------------------ LossSpike ----
@template("loss-blowup-nan-grad-check", "LossSpike", "blind2")
def _loss_blowup(c: Ctx) -> None:
    """Megatron's loss climbs 4x in a few iterations, grad norm explodes, then its NaN-in-grad check asserts."""
    c.style = "megatron"
    start_job(c, routine_steps(c))
    p = c.p(c.world - 1 if c.prefix_style != "none" else 0)
    loss, norm = c.rng.uniform(1.9, 2.4), c.rng.uniform(0.5, 1.5)
    for i in range(c.rng.randrange(3, 7)):
        c.iteration += 1
        c.tick(4)
        loss, norm = min(loss * c.rng.uniform(1.5, 2.2), c.rng.uniform(10, 11.5)), norm * c.rng.uniform(8, 40)
        (c.add_root if i == 0 else c.add)(
            f"{p} [{c.ts()[:19]}] iteration {c.iteration:>8}/  500000 | consumed samples: {c.iteration * 1024:>12} | "
            f"elapsed time per iteration (ms): {c.rng.uniform(3000, 9000):.1f} | learning rate: "
            f"{c.rng.uniform(1e-4, 3e-4):.6E} | global batch size:  1024 | lm loss: {loss:.6E} | loss scale: 1.0 | "
            f"grad norm: {norm:.3f} | number of skipped iterations:   0 | number of nan iterations:   0 |")
    c.tick(4)
    buf = f"{MEG}/core/distributed/param_and_grad_buffer.py"
    frames = (("/workspace/Megatron-LM/pretrain_gpt.py", 233, "<module>", "pretrain(train_valid_test_datasets_provider,"),
              (f"{MEG}/training/training.py", 1049, "train", "train_step(forward_step_func,"),
              (f"{MEG}/training/training.py", 556, "train_step", "losses_reduced = forward_backward_func("),
              (f"{MEG}/core/pipeline_parallel/schedules.py", 415, "forward_backward_no_pipelining",
               "config.finalize_model_grads_func([model])"),
              (f"{MEG}/core/distributed/finalize_model_grads.py", 110, "finalize_model_grads",
               "model_chunk.finish_grad_sync()"),
              (f"{MEG}/core/distributed/distributed_data_parallel.py", 296, "finish_grad_sync",
               "buffer.finish_grad_sync()"),
              (buf, 497, "finish_grad_sync", "bucket.finish_grad_sync()"),
              (buf, 159, "finish_grad_sync", "self.start_grad_sync()"),
              (buf, 113, "start_grad_sync", "assert not norm_is_nan, ("))
    ranks = sorted(c.rng.sample(range(c.world), k=c.rng.randrange(1, c.world + 1)))
    c.merge([tb(c, r, frames, [(f"AssertionError: Rank {r}: found NaN in local grad norm in backward pass before "
                               f"data-parallel communication collective. Device: {r % 8}, node: {c.host(r)}")])
             for r in ranks])
    sc.sigterms(c, [r for r in range(c.world) if r not in ranks])
    sc.torchrun_summary(c, ranks[0])


# -------------------------------------------------------------------------------- healthy ----
@template("healthy-hf-finish-noisy-exit", HEALTHY, "blind2")
def _healthy_hf(c: Ctx) -> None:
    """An HF run that finishes: a wandb network retry that resolves, a final save, and the benign PG-not-destroyed warning."""
    c.style = "hf"
    start_job(c, routine_steps(c) // 2)
    p = c.p(0)
    c.add(f"{p}wandb: Network error (ReadTimeout), entering retry loop.")
    train_steps(c, c.rng.randrange(20, 80))
    c.add(f"{p}wandb: Network error resolved after 0:00:{c.rng.randrange(10, 59)}.{c.rng.randrange(10**6):06d}, "
          "resuming normal operation.")
    train_steps(c, routine_steps(c) // 2)
    out = c.path("sft", c.run)
    c.add(f"{p}")
    c.add(f"{p}")
    c.add(f"{p}Training completed. Do not forget to share your model on huggingface.co/models =)")
    c.add(f"{p}")
    c.add(f"{p}")
    c.add(f"{p}{{'train_runtime': {c.rng.uniform(2e4, 9e4):.4f}, 'train_samples_per_second': "
          f"{c.rng.uniform(5, 40):.3f}, 'train_steps_per_second': {c.rng.uniform(0.1, 0.9):.3f}, 'train_loss': "
          f"{c.rng.uniform(1.2, 2.0):.6f}, 'epoch': {c.iteration / 3000:.2f}}}")
    c.add(f"{p}Saving model checkpoint to {out}")
    c.add(f"{p}Model weights saved in {out}/model.safetensors")
    c.add(f"{p}tokenizer config file saved in {out}/tokenizer_config.json")
    c.add(f"{p}wandb: 🚀 View run {c.run} at: https://wandb.ai/acme/sft/runs/{c.rng.getrandbits(32):08x}")
    c.tick(5)
    streams = [[((f"{c.p(r)}[W{c.clock.strftime('%m%d %H:%M:%S')}.{c.rng.randrange(10**6):06d} "
                 f"ProcessGroupNCCL.cpp:1168] Warning: WARNING: process group has NOT been destroyed before we "
                 "destruct ProcessGroupNCCL. On normal program exit, the application should call "
                 "destroy_process_group to ensure that any pending NCCL operations have finished in this process. In "
                 "rare cases this process can exit before this point and block the progress of another member of the "
                 "process group. This constraint has always been present,  but this warning has only been added since "
                 "PyTorch 2.4 (function operator())"), False)] for r in range(c.world)]
    c.merge(streams)
    c.add(f"{c.glog('I')} torch/distributed/elastic/agent/server/api.py:876] [default] worker group successfully "
          "finished. Waiting 300 seconds for other agents to finish.")
    c.add(f"{c.glog('I')} torch/distributed/elastic/agent/server/api.py:922] Local worker group finished (WorkerState."
          f"SUCCEEDED). Waiting 300 seconds for other agents to finish")
    c.add(f"{c.glog('I')} torch/distributed/elastic/agent/server/api.py:936] Done waiting for other agents. Elapsed: "
          f"{c.rng.uniform(0.001, 2):.4f} seconds")
