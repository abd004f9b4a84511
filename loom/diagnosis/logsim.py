"""Building blocks of synthetic training logs: a seeded job context and its routine output.

The corpus (`corpus.py`) composes these with failure scenarios. Everything is drawn from one
`random.Random`, so a (template, seed) pair always yields the same log byte for byte.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

_USERS = ("zhangwei", "liuyang", "chenjie", "wangfang", "lihua", "acme-pt", "mlops")
_MODELS = ("llama2-7b", "llama2-13b", "internlm-20b", "gpt3-30b", "llama2-70b", "internlm-104b")
_FS = ("/mnt/lustre", "/mnt/petrelfs", "/cpfs01/shared", "/nfs/acme")
_PREFIX_STYLES = ("rank", "default", "none")
_STYLES = ("megatron", "hf", "deepspeed")


@dataclass
class Ctx:
    """One synthetic job: its ranks, hosts, paths and a clock that only moves forward."""

    rng: random.Random
    world: int
    hosts: tuple[str, ...]
    prefix_style: str
    style: str
    user: str
    model: str
    root: str
    run: str
    clock: datetime
    pids: tuple[int, ...]
    ips: tuple[str, ...]
    iteration: int = 0
    lines: list[str] = field(default_factory=list)
    root_cause: set[int] = field(default_factory=set)

    # -- output ---------------------------------------------------------------------------
    def add(self, text: str) -> None:
        self.lines.append(text)

    def add_root(self, text: str) -> None:
        """A line stating the root cause (its 1-based number is the label)."""
        self.lines.append(text)
        self.root_cause.add(len(self.lines))

    def merge(self, streams: Sequence[Sequence[tuple[str, bool]]]) -> None:
        """Interleave per-rank streams at random, each keeping its own order (as stdout pipes do)."""
        pos = [0] * len(streams)
        live = [i for i, s in enumerate(streams) if s]
        while live:
            i = self.rng.choice(live)
            text, is_root = streams[i][pos[i]]
            (self.add_root if is_root else self.add)(text)
            pos[i] += 1
            if pos[i] == len(streams[i]):
                live.remove(i)

    # -- naming ---------------------------------------------------------------------------
    def p(self, rank: int) -> str:
        """The launcher's prefix of a rank's line."""
        if self.prefix_style == "rank":
            return f"[rank{rank}]:"
        if self.prefix_style == "default":
            return f"[default{rank % 8}]:"
        return ""

    def host(self, rank: int) -> str:
        return self.hosts[rank // 8]

    def ip(self, rank: int) -> str:
        return self.ips[rank // 8]

    def tick(self, seconds: float) -> None:
        self.clock += timedelta(seconds=seconds * (0.5 + self.rng.random()))

    def ts(self) -> str:
        return self.clock.strftime("%Y-%m-%d %H:%M:%S,") + f"{self.clock.microsecond // 1000:03d}"

    def glog(self, level: str = "E") -> str:
        return f"{level}{self.clock.strftime('%m%d %H:%M:%S')}.{self.clock.microsecond:06d} {self.pids[0]}"

    def path(self, *parts: str) -> str:
        return "/".join((self.root, self.user, *parts))

    def other_ranks(self, bad: int) -> list[int]:
        return [r for r in range(self.world) if r != bad]


def new_ctx(rng: random.Random) -> Ctx:
    world = rng.choice((8, 16, 16, 32, 32, 64))
    n_nodes = max(1, world // 8)
    rack = rng.randrange(1, 40)
    hosts = tuple(f"{rng.choice(('node', 'gpu', 'a100', 'SH-IDC1'))}-{rack:02d}-{rng.randrange(100, 999)}"
                  for _ in range(n_nodes))
    ips = tuple(f"10.{rng.randrange(1, 250)}.{rng.randrange(0, 250)}.{rng.randrange(2, 250)}" for _ in hosts)
    user = rng.choice(_USERS)
    start = datetime(2023, rng.randrange(3, 10), rng.randrange(1, 28), rng.randrange(0, 24), rng.randrange(60))
    return Ctx(rng=rng, world=world, hosts=hosts, prefix_style=rng.choice(_PREFIX_STYLES), style=rng.choice(_STYLES),
               user=user, model=rng.choice(_MODELS), root=rng.choice(_FS), run=f"{user}-{rng.randrange(1000, 9999)}",
               clock=start, pids=tuple(rng.randrange(2000, 400000) for _ in range(world)), ips=ips)


# -- routine output ------------------------------------------------------------------------
def launcher_preamble(c: Ctx) -> None:
    stamp = c.glog("W") + " torch/distributed/run.py:779]"
    c.add(f"{stamp} ")
    c.add(f"{stamp} *****************************************")
    c.add(f"{stamp} Setting OMP_NUM_THREADS environment variable for each process to be 1 in default, to avoid "
          "your system being overloaded, please further tune the variable for optimal performance in your "
          "application as needed. ")
    c.add(f"{stamp} *****************************************")


def nccl_init(c: Ctx) -> None:
    """NCCL INFO chatter of every rank (only with NCCL_DEBUG=INFO, as debugging runs set it)."""
    version = c.rng.choice(("2.18.5+cuda12.1", "2.19.3+cuda12.2", "2.20.5+cuda12.4"))
    comm = c.rng.getrandbits(48)
    streams = []
    for r in range(c.world):
        h, pid, lr = c.host(r), c.pids[r], r % 8
        tid = pid + c.rng.randrange(50, 400)
        s = [f"{c.p(r)}{h}:{pid}:{pid} [{lr}] NCCL INFO Bootstrap : Using eth0:{c.ip(r)}<0>",
             (f"{c.p(r)}{h}:{pid}:{pid} [{lr}] NCCL INFO NET/Plugin: No plugin found (libnccl-net.so), using "
             "internal implementation"),
             f"{c.p(r)}{h}:{pid}:{pid} [{lr}] NCCL INFO cudaDriverVersion 12020",
             (f"{c.p(r)}{h}:{pid}:{tid} [{lr}] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB [2]mlx5_2:1/IB "
             f"[3]mlx5_3:1/IB ; OOB eth0:{c.ip(r)}<0>"),
             f"{c.p(r)}{h}:{pid}:{tid} [{lr}] NCCL INFO Using network IB",
             (f"{c.p(r)}{h}:{pid}:{tid} [{lr}] NCCL INFO comm 0x{comm + r * 4096:x} rank {r} nranks {c.world} cudaDev "
             f"{lr} nvmlDev {lr} busId {0x18 + lr * 0x10:x}000 commId 0x{comm:x} - Init START"),
             f"{c.p(r)}{h}:{pid}:{tid} [{lr}] NCCL INFO Trees [0] {(r + 1) % c.world}/-1/-1->{r}->{(r - 1) % c.world}",
             f"{c.p(r)}{h}:{pid}:{tid} [{lr}] NCCL INFO Connected all rings",
             f"{c.p(r)}{h}:{pid}:{tid} [{lr}] NCCL INFO Connected all trees",
             (f"{c.p(r)}{h}:{pid}:{tid} [{lr}] NCCL INFO comm 0x{comm + r * 4096:x} rank {r} nranks {c.world} cudaDev "
             f"{lr} nvmlDev {lr} busId {0x18 + lr * 0x10:x}000 commId 0x{comm:x} - Init COMPLETE")]
        if r == 0:
            s.insert(3, f"{c.p(0)}NCCL version {version}")
        streams.append([(x, False) for x in s])
    c.merge(streams)


_ARGS = ("tensor_model_parallel_size", "pipeline_model_parallel_size", "micro_batch_size", "global_batch_size",
         "seq_length", "hidden_size", "num_layers", "num_attention_heads", "lr", "min_lr", "weight_decay",
         "clip_grad", "adam_beta2", "save_interval", "eval_interval", "log_interval", "seed", "bf16",
         "use_flash_attn", "recompute_granularity", "data_path", "tokenizer_model", "save", "load")


def model_setup(c: Ctx) -> None:
    """Rank 0's configuration dump, model building and checkpoint loading."""
    p = c.p(0)
    c.add(f"{p}using world size: {c.world}, data-parallel size: {c.world // 8}, tensor-model-parallel size: 8, "
          "pipeline-model-parallel size: 1")
    c.add(f"{p}------------------------ arguments ------------------------")
    for name in c.rng.sample(_ARGS, k=c.rng.randrange(12, len(_ARGS))):
        value = c.path("data", "pile_text_document") if name in ("data_path", "save", "load") else \
            str(c.rng.choice((1, 2, 4, 8, 1024, 4096, 0.0003, True, "selective")))
        c.add(f"{p}  {name} {'.' * (48 - len(name))} {value}")
    c.add(f"{p}-------------------- end of arguments ---------------------")
    c.add(f"{p}> building {c.model} model ...")
    for pp in range(c.rng.randrange(1, 4)):
        c.add(f"{p} > number of parameters on (tensor, pipeline) model parallel rank (0, {pp}): "
              f"{c.rng.randrange(400_000_000, 9_000_000_000)}")
    c.add(f"{p}> learning rate decay style: cosine")
    it = c.rng.randrange(0, 40) * 1000
    c.iteration = it
    if it:
        c.add(f"{p} loading checkpoint from {c.path('ckpt', c.run)} at iteration {it}")
        c.add(f"{p}  successfully loaded checkpoint from {c.path('ckpt', c.run)} [ t 0, p 0 ] at iteration {it}")
    c.add(f"{p}> building train, validation, and test datasets ...")
    c.add(f"{p} > finished creating GPT datasets ...")
    c.add(f"{p}[after dataloaders are built] datetime: {c.ts()[:19]} ")
    c.add(f"{p}done with setup ...")
    c.add(f"{p}training ...")


def recurring_warnings(c: Ctx) -> None:
    """Warnings every rank prints at its first step, in healthy runs too."""
    streams = []
    for r in range(c.world):
        s = [(f"{c.p(r)}/usr/local/lib/python3.10/dist-packages/torch/utils/checkpoint.py:464: UserWarning: "
             "torch.utils.checkpoint: the use_reentrant parameter should be passed explicitly. In version 2.4 we "
             "will raise an exception if use_reentrant is not passed. use_reentrant=False is recommended, but if "
             "you need to preserve the current default behavior, you can pass use_reentrant=True."),
             f"{c.p(r)}  warnings.warn("]
        if c.rng.random() < 0.5:
            s += [(f"{c.p(r)}/workspace/megatron/core/tensor_parallel/layers.py:609: FutureWarning: "
                  "`torch.cuda.amp.custom_fwd(args...)` is deprecated. Please use "
                  "`torch.amp.custom_fwd(args..., device_type='cuda')` instead."),
                  f"{c.p(r)}  def forward("]
        streams.append([(x, False) for x in s])
    c.merge(streams)


def _loss(c: Ctx) -> float:
    return max(1.2, 2.0 + 3.0 * 0.9995 ** c.iteration + c.rng.gauss(0, 0.03))


def train_steps(c: Ctx, n: int) -> None:
    """`n` logged iterations in the log's style, with periodic throughput, memory and checkpoints."""
    for _ in range(n):
        c.iteration += 1
        c.tick(4.0)
        {"megatron": _megatron_step, "hf": _hf_step, "deepspeed": _ds_step}[c.style](c)
        if c.iteration % 500 == 0:
            _checkpoint(c)


def _megatron_step(c: Ctx) -> None:
    p = c.p(c.world - 1 if c.prefix_style != "none" else 0)
    c.add(f"{p} [{c.ts()[:19]}] iteration {c.iteration:>8}/  500000 | consumed samples: {c.iteration * 1024:>12} | "
          f"elapsed time per iteration (ms): {c.rng.uniform(3000, 9000):.1f} | learning rate: "
          f"{c.rng.uniform(1e-5, 3e-4):.6E} | global batch size:  1024 | lm loss: {_loss(c):.6E} | loss scale: 1.0 | "
          f"grad norm: {c.rng.uniform(0.2, 1.6):.3f} | number of skipped iterations:   0 | number of nan "
          "iterations:   0 |")
    if c.iteration % 10 == 0:
        c.add(f"{p}[Rank {c.world - 1}] (after {c.iteration} iterations) memory (MB) | allocated: "
              f"{c.rng.uniform(2e4, 4e4):.1f} | max allocated: {c.rng.uniform(4e4, 7e4):.1f} | reserved: "
              f"{c.rng.uniform(5e4, 7.5e4):.1f} | max reserved: {c.rng.uniform(5e4, 7.5e4):.1f}")
        c.add(f"{p} throughput per GPU (TFLOP/s/GPU): {c.rng.uniform(120, 190):.1f} | tokens/s/GPU: "
              f"{c.rng.randrange(2000, 4500)}")


def _hf_step(c: Ctx) -> None:
    total = 100_000
    rate = c.rng.uniform(1.5, 3.5)
    segs = []
    for k in range(c.rng.randrange(2, 6)):  # tqdm's \r updates between two newlines
        i = c.iteration * 10 + k
        pct = 100 * i // total
        left = (total - i) // 60
        segs.append(f"{pct:3d}%|{'█' * (pct // 10):<10}| {i}/{total} [{i // 60:02d}:{i % 60:02d}<{left // 60:02d}:"
                    f"{left % 60:02d}, {rate:.2f}it/s]")
    c.add(c.p(0) + "\r".join(segs))
    if c.iteration % 5 == 0:
        c.add(f"{c.p(0)}{{'loss': {_loss(c):.4f}, 'grad_norm': {c.rng.uniform(0.2, 2):.4f}, 'learning_rate': "
              f"{c.rng.uniform(1e-6, 3e-5):.4e}, 'epoch': {c.iteration / 3000:.2f}}}")


def _ds_step(c: Ctx) -> None:
    p, ts = c.p(0), c.ts()
    c.add(f"{p}[{ts}] [INFO] [logging.py:96:log_dist] [Rank 0] step={c.iteration}, skipped=0, "
          f"lr=[{c.rng.uniform(1e-5, 3e-4):.8f}], mom=[(0.9, 0.95)]")
    c.add(f"{p}[{ts}] [INFO] [timer.py:260:stop] epoch=0/micro_step={c.iteration * 4}/global_step="
          f"{c.iteration}, RunningAvgSamplesPerSec={c.rng.uniform(30, 60):.4f}, CurrSamplesPerSec="
          f"{c.rng.uniform(30, 60):.4f}, MemAllocated={c.rng.uniform(10, 40):.2f}GB, "
          f"MaxMemAllocated={c.rng.uniform(40, 70):.2f}GB")
    c.add(f"{p}steps: {c.iteration} loss: {_loss(c):.4f} iter time (s): {c.rng.uniform(3, 9):.3f} "
          f"samples/sec: {c.rng.uniform(100, 300):.3f}")


def _checkpoint(c: Ctx) -> None:
    p = c.p(0)
    where = c.path("ckpt", c.run)
    c.add(f"{p}saving checkpoint at iteration {c.iteration:>8} to {where}")
    c.tick(30)
    c.add(f"{p}  successfully saved checkpoint at iteration {c.iteration:>8} to {where}")
    c.add(f"{p}(min, max) time across ranks (ms):")
    c.add(f"{p}    save-checkpoint ................................: ({c.rng.uniform(1e4, 3e4):.2f}, "
          f"{c.rng.uniform(3e4, 6e4):.2f})")


def start_job(c: Ctx, steps: int) -> None:
    """Everything a job prints from launch to `steps` logged iterations."""
    launcher_preamble(c)
    if c.rng.random() < 0.7:
        nccl_init(c)
    model_setup(c)
    recurring_warnings(c)
    train_steps(c, steps)


def routine_steps(c: Ctx) -> int:
    """A random length for the healthy part of a log: thousands of lines in all."""
    return c.rng.randrange(600, 2400)
