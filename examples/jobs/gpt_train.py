"""A small GPT-style character model trained with data parallelism, the job `loom run` tests launch.

    loom run --nproc 2 examples/jobs/gpt_train.py -- --iters 60

An ordinary DDP script (gloo on CPU, NCCL with one GPU per process when CUDA is
there) plus one line, `loom.runtime.wrap(...)`, which gives Loom the barrier,
checkpoints, the data position, the control channel and world-size virtualisation
(`--logical-world N` on fewer processes: the loop runs once per hosted logical rank
per iteration). Everything is seeded and deterministic (fixed data windows,
`torch.use_deterministic_algorithms`), so a run stopped and resumed, or migrated, logs
the same losses bit for bit as one left alone (and, with `loom run --deterministic`,
one resized). Logical rank 0 appends `{"iteration", "loss"}` per iteration (1, 2, ...:
the runtime's count of optimizer steps, which a resumed job continues) to `loss.jsonl`
in the working directory: the file a job writes locally and that must travel with it.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from contextlib import nullcontext
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset, DistributedSampler

import loom.runtime

TEXT = Path(__file__).with_name("sonnets.txt")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=60, help="training iterations (one epoch of windows)")
    parser.add_argument("--batch", type=int, default=8, help="sequences per logical rank per iteration")
    parser.add_argument("--block", type=int, default=32, help="context length (characters)")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--d-model", type=int, default=64)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--text", type=Path, default=TEXT, help="training text (default: bundled sonnets)")
    parser.add_argument("--log", default="loss.jsonl", help="loss log, relative to the working directory")
    parser.add_argument("--step-delay", type=float, default=0.0, help="sleep per batch, so per slice "
                        "(tests use it to catch the job running; changes no result)")
    return parser.parse_args(argv)


class Block(nn.Module):
    """Pre-norm transformer block: causal self-attention and an MLP."""

    def __init__(self, d_model: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.qkv, self.proj = nn.Linear(d_model, 3 * d_model), nn.Linear(d_model, d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(c // self.heads)
        mask = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        x = x + self.proj((att @ v).transpose(1, 2).reshape(b, t, c))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """Token and position embeddings, a stack of blocks, a tied-free language-model head."""

    def __init__(self, vocab: int, block: int, layers: int, d_model: int, heads: int) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d_model), nn.Embedding(block, d_model)
        self.blocks = nn.Sequential(*(Block(d_model, heads) for _ in range(layers)))
        self.ln, self.head = nn.LayerNorm(d_model), nn.Linear(d_model, vocab)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        return self.head(self.ln(self.blocks(self.tok(idx) + self.pos(pos))))


class Windows(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """`count` (input, next-character target) windows at seeded random offsets of the text."""

    def __init__(self, data: torch.Tensor, block: int, count: int, seed: int) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.data, self.block = data, block
        self.starts = torch.randint(0, len(data) - block - 1, (count,), generator=gen)

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        s = int(self.starts[i])
        return self.data[s:s + self.block], self.data[s + 1:s + self.block + 1]


def encode(path: Path) -> tuple[torch.Tensor, int]:
    """Character-level tokens of the text and the vocabulary size."""
    text = path.read_text(encoding="utf-8")
    vocab = sorted(set(text))
    index = {ch: i for i, ch in enumerate(vocab)}
    return torch.tensor([index[ch] for ch in text], dtype=torch.long), len(vocab)


def device_and_backend() -> tuple[torch.device, str]:
    if torch.cuda.is_available():
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        return torch.device("cuda", local), "nccl"
    return torch.device("cpu"), "gloo"


def build(args: argparse.Namespace, device: torch.device) -> tuple[nn.Module, torch.optim.Optimizer,
                                                                   DataLoader, torch.optim.lr_scheduler.LRScheduler]:
    """Model (DDP), optimizer, data loader and LR schedule, all from the seed."""
    data, vocab = encode(args.text)
    torch.manual_seed(args.seed)
    model = GPT(vocab, args.block, args.layers, args.d_model, args.heads).to(device)
    model = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    warmup = max(1, args.iters // 10)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda it: min(1.0, (it + 1) / warmup))
    # sized by the *logical* world (what `loom run` keeps across resizes), so the data is the same at any size
    ranks = int(os.environ.get("LOOM_LOGICAL_WORLD") or dist.get_world_size())
    windows = Windows(data, args.block, args.iters * args.batch * ranks, args.seed)
    loader = DataLoader(windows, batch_size=args.batch, sampler=DistributedSampler(windows, shuffle=False),
                        drop_last=True)
    return model, optimizer, loader, schedule


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    device, backend = device_and_backend()
    dist.init_process_group(backend)
    torch.use_deterministic_algorithms(True)
    model, optimizer, loader, schedule = build(args, device)
    model, optimizer, loader = loom.runtime.wrap(model, optimizer, loader, lr_scheduler=schedule)
    runtime = loom.runtime.current()  # logical ranks: this process's, and the running slice's
    with open(args.log, "a", encoding="utf-8") if 0 in runtime.logical_ranks else nullcontext() as log:
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            schedule.step()
            value = loss.item()
            loom.runtime.report(loss=value)
            if log is not None and runtime.logical_rank == 0:  # flushed: a stop may come at any iteration
                log.write(json.dumps({"iteration": runtime.iteration, "loss": value}) + "\n")
                log.flush()
            time.sleep(args.step_delay)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
