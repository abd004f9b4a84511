"""Gradients of time-sliced logical ranks: the squashed path and the unsquashed, fixed-order one.

A process hosting logical ranks `l0 < l1 < …` runs one backward per slice. The job's
gradient is the mean over the **N logical ranks**, whatever the number M of processes:

* **squashed** (default): the slices' gradients accumulate in `p.grad` (DDP's
  `no_sync` for all but the last slice), the last slice's backward joins DDP's
  all-reduce once, and a communication hook divides by N where DDP would divide by
  M. Then the optimizer runs once per process. Fast, but the sum is taken in another
  order than on N processes, so results agree only to rounding.
* **unsquashed** (`ordered`): each slice's gradient is kept apart; at the step every
  process all-gathers every logical rank's gradient and sums them **in logical-rank
  order**, then divides by N. The same additions in the same order on any M, so a
  resized job computes bit-identical updates (deterministic mode). Costs N gradients
  of memory and an all-gather instead of an all-reduce.

**Validation** (Singularity: squashing is checked against the unsquashed run): for the
first iterations of a virtualised incarnation, each slice's gradient is also
captured (tensor hooks) and the squashed result is compared with the unsquashed
one; if they differ beyond `SQUASH_RTOL` every process falls back to the unsquashed
path for good, using its result for that iteration.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

# Relative L2 difference above which a squashed gradient is wrong. Squashing only
# reorders fp32 additions (measured: ~1e-7); a real fault (a wrong scale, a lost or
# doubled slice) is at least 1/N.
SQUASH_RTOL = 1e-4
# Tests only: squashed gradients are multiplied by this (a wrong squash to be caught).
SQUASH_FAULT = 1.0


@dataclass(frozen=True)
class SquashCheck:
    """One comparison of the squashed gradient with the unsquashed one (the same on every process)."""

    relative_difference: float
    ok: bool
    remaining: int  # checks still to run (0: validation over)


@dataclass
class _HookState:
    group: Any
    divisor: int


def _mean_over_logical_world(state: _HookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP's all-reduce hook, dividing by the logical world size N instead of the process count."""
    tensor = bucket.buffer()
    tensor.div_(state.divisor)
    work = dist.all_reduce(tensor, group=state.group, async_op=True)
    return work.get_future().then(lambda fut: fut.value()[0])


# DDP checks a hook's annotations as objects; `from __future__ import annotations` made them strings.
_mean_over_logical_world.__annotations__.update(
    {"bucket": dist.GradBucket, "return": torch.futures.Future[torch.Tensor]})


class Gradients:
    """The gradient handling of one process of a virtualised (or deterministic) job."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, group: Any,
                 layout: list[list[int]], process: int, *, deterministic: bool, checks: int,
                 device: torch.device) -> None:
        self.params = _trainable(optimizer)
        self.group, self.layout, self.process, self.device = group, layout, process, device
        self.logical_world = sum(len(ranks) for ranks in layout)
        self.processes = len(layout)
        self.ddp = model if isinstance(model, DistributedDataParallel) else None
        virtual = self.logical_world != self.processes
        self.mode = "ordered" if deterministic else "squash"
        self.disabled = False  # squashing failed its validation: unsquashed from then on
        self.checks_left = checks if virtual and not deterministic else 0
        self._post_scale = self._install_hook() if self.mode == "squash" else None
        self._kept: dict[int, list[torch.Tensor | None]] = {}
        self._slice_rank = layout[process][0]
        self._handles: list[Any] = []
        if self.checks_left:
            self._capture(True)

    # --- what the slicer asks -------------------------------------------------------------------
    @property
    def validating(self) -> bool:
        return self.checks_left > 0

    @property
    def state(self) -> str:
        """validating | on (squashed) | disabled (validation failed) | off (deterministic mode)."""
        if self.mode == "ordered":
            return "disabled" if self.disabled else "off"
        return "validating" if self.validating else "on"

    def ddp_sync(self, last_slice: bool) -> bool:
        """Whether DDP all-reduces in this slice's backward (squashed: only in the last one)."""
        return self.mode == "squash" and last_slice

    def begin_slice(self, rank: int) -> None:
        self._slice_rank = rank

    def keep(self, rank: int) -> None:
        """A slice ended with a deferred step: keep its gradient apart if the path needs it."""
        if self.mode == "ordered":
            self._kept[rank] = [None if p.grad is None else p.grad.detach().clone() for p in self.params]
            for p in self.params:
                p.grad = None

    def finish(self, rank: int) -> SquashCheck | None:
        """The last slice's step: leave the logical world's mean gradient in `p.grad`."""
        if self.mode == "ordered":
            self.keep(rank)
            self._write(self._ordered_mean())
            return None
        self._scale_squashed()
        return self._validate() if self.validating else None

    def close(self) -> None:
        self._capture(False)
        if self.ddp is not None:
            self.ddp.require_backward_grad_sync = True

    # --- the squashed path ----------------------------------------------------------------------
    def _install_hook(self) -> tuple[str, float] | None:
        """How the squashed sum becomes the mean over N: DDP through our hook (None), else after it."""
        if self.ddp is None:
            return ("div", self.logical_world)  # one process, no all-reduce: the local sum / N
        if getattr(self.ddp, "_comm_hooks", None):  # the script's own hook averages over M
            return ("mul", self.processes / self.logical_world)
        self.ddp.register_comm_hook(_HookState(self.group, self.logical_world), _mean_over_logical_world)
        return None

    def _scale_squashed(self) -> None:
        grads = [p.grad for p in self.params if p.grad is not None]
        if self._post_scale is not None:
            how, value = self._post_scale
            for grad in grads:
                grad.div_(value) if how == "div" else grad.mul_(value)
        if SQUASH_FAULT != 1.0:
            for grad in grads:
                grad.mul_(SQUASH_FAULT)

    # --- validation -----------------------------------------------------------------------------
    def _capture(self, on: bool) -> None:
        """Tensor hooks see each backward's gradient of a parameter before it is accumulated."""
        for handle in self._handles:
            handle.remove()
        self._handles = [p.register_hook(self._hook_for(i)) for i, p in enumerate(self.params)] if on else []

    def _hook_for(self, index: int) -> Callable[[torch.Tensor], None]:
        def hook(grad: torch.Tensor) -> None:
            kept = self._kept.setdefault(self._slice_rank, [None] * len(self.params))
            kept[index] = grad.detach().clone() if kept[index] is None else kept[index] + grad
        return hook

    def _validate(self) -> SquashCheck:
        reference = self._ordered_mean()
        diff = _relative_difference([p.grad for p in self.params], reference)
        diff = self._max_over_processes(diff)
        ok = diff <= SQUASH_RTOL
        self.checks_left = self.checks_left - 1 if ok else 0
        if not ok:
            self.mode, self.disabled = "ordered", True
            self._write(reference)  # this iteration too uses the unsquashed gradient
        if not self.validating:
            self._capture(False)
        return SquashCheck(diff, ok, self.checks_left)

    def _max_over_processes(self, value: float) -> float:
        if self.group is None:
            return value
        flag = torch.tensor([value], dtype=torch.float64, device=self.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.group)
        return float(flag.item())

    # --- the unsquashed path: every logical rank's gradient, summed in logical-rank order -------
    def _ordered_mean(self) -> list[torch.Tensor | None]:
        kept, self._kept = self._kept, {}
        out: list[torch.Tensor | None] = [None] * len(self.params)
        for indices in _buckets(self.params):
            rows = self._gather_rows(indices, kept)
            total = rows[0].clone()
            for row in rows[1:]:
                total.add_(row)
            total.div_(self.logical_world)
            offset, present = 0, total[-len(indices):].tolist()
            for j, i in enumerate(indices):
                n = self.params[i].numel()
                out[i] = total[offset:offset + n].view_as(self.params[i]) if present[j] > 0 else None
                offset += n
        return out

    def _gather_rows(self, indices: list[int], kept: dict[int, list[torch.Tensor | None]]) -> list[torch.Tensor]:
        """Row l: logical rank l's flattened gradients (+ a presence flag per parameter)."""
        hosted = self.layout[self.process]
        width = max(len(ranks) for ranks in self.layout)
        first = self.params[indices[0]]
        local = torch.zeros(width, sum(self.params[i].numel() for i in indices) + len(indices),
                            dtype=first.dtype, device=first.device)
        for row, rank in enumerate(hosted):
            grads = kept.get(rank, [None] * len(self.params))
            _flatten_into(local[row], [grads[i] for i in indices], [self.params[i].numel() for i in indices])
        if self.group is None:
            parts = [local]
        else:
            parts = [torch.empty_like(local) for _ in self.layout]
            dist.all_gather(parts, local, group=self.group)
        return [parts[p][ranks.index(r)] for r in range(self.logical_world)
                for p, ranks in enumerate(self.layout) if r in ranks]

    def _write(self, grads: list[torch.Tensor | None]) -> None:
        for p, grad in zip(self.params, grads):
            p.grad = grad


def pin_bucket_layout(model: torch.nn.Module, processes: int) -> bool | None:
    """Fix DDP's bucket layout for good, so every incarnation sums gradients in the same order.

    DDP all-reduces the first iteration in its initial layout and then rebuilds its
    buckets in gradient-ready order, so a resumed incarnation's first iteration sums
    each element at another ring position than the uninterrupted run did; with three or
    more processes that changes the rounding (two are commutative). Rebuilding at once,
    in parameter order, costs no overlap when the gradients fit one bucket (the rebuilt
    layout is one bucket anyway). True: pinned; False: more than one bucket (left alone:
    such resumes agree to rounding); None: nothing to do.
    """
    if (not isinstance(model, DistributedDataParallel) or processes < 3 or model.static_graph
            or model._has_rebuilt_buckets):
        return None
    size = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    if size > model.bucket_bytes_cap:
        return False
    model.reducer._push_all_rebuilt_params()
    if model.reducer._rebuild_buckets():  # a broadcast of the layout: every process is here
        model._has_rebuilt_buckets = True
    return True


def _trainable(optimizer: torch.optim.Optimizer) -> list[torch.nn.Parameter]:
    seen: set[int] = set()
    params = []
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.requires_grad and id(p) not in seen:
                seen.add(id(p))
                params.append(p)
    return params


def _buckets(params: list[torch.nn.Parameter]) -> list[list[int]]:
    """Parameter indices grouped by (dtype, device): one flat all-gather each."""
    groups: dict[tuple[torch.dtype, torch.device], list[int]] = {}
    for i, p in enumerate(params):
        groups.setdefault((p.dtype, p.device), []).append(i)
    return list(groups.values())


def _flatten_into(row: torch.Tensor, grads: list[torch.Tensor | None], numels: list[int]) -> None:
    """Gradients laid end to end (zeros for None), then one presence flag per parameter."""
    offset = 0
    for grad, n in zip(grads, numels):
        if grad is not None:
            if grad.is_sparse:
                raise RuntimeError("loom runtime: sparse gradients cannot be time-sliced or reduced "
                                   "in deterministic mode")
            row[offset:offset + n].copy_(grad.reshape(-1))
        offset += n
    flags = row[offset:]
    for j, grad in enumerate(grads):
        flags[j] = 1.0 if grad is not None else 0.0


def _relative_difference(squashed: list[torch.Tensor | None], reference: list[torch.Tensor | None]) -> float:
    """‖squashed − reference‖₂ / ‖reference‖₂ over all parameters (inf where presence differs)."""
    num = den = 0.0
    for a, b in zip(squashed, reference):
        if (a is None) != (b is None):
            return math.inf
        if a is None:
            continue
        num += float((a.double() - b.double()).pow(2).sum())
        den += float(b.double().pow(2).sum())
    if num == 0.0:
        return 0.0
    return math.sqrt(num) / max(math.sqrt(den), 1e-30)
