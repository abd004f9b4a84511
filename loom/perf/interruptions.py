"""What an interruption costs: checkpoint, preempt, resume, migrate, resize, fail.

Each primitive is priced as the phases Singularity (seed 004 §4) goes through,
so a migration's latency is explained rather than one number:

    barrier → dump (GPU → host) → upload → download → restore (host → GPU,
    process restart) → rendezvous

* **Barrier.** The distributed barrier completes within about two mini-batches
  (Singularity §4.3): `barrier_iterations` × the job's iteration time.
* **Checkpoint size.** Model states only — weights, fp32 master copy and Adam's
  two moments, 14 bytes per parameter (`CHECKPOINT_BYTES_PER_PARAM`; gradients
  are not saved) — counted once however many data-parallel replicas hold them
  (content-hash deduplication, Singularity §4.6). A transparent (Singularity)
  dump also uploads each rank's host process image (CRIU), `host_gib_per_rank`.
* **Dump / restore.** Every rank copies its own GPU state to or from host
  memory in parallel: its model states (`loom.perf.memory.model_state_bytes`,
  ZeRO-aware) at `host_copy_gbps` (an effective rate that includes
  serialisation, below PCIe peak).
* **Upload / download.** The deduplicated bytes through the job's storage path:
  `storage_gbps_per_node` per node (Acme's storage NICs: 25 Gb/s) capped by the
  file system's `storage_gbps_total`.
* **Restart / rendezvous.** Process restart (CRIU restore, device-proxy replay)
  `restart_s`; rendezvous `rendezvous_s` (ranks find each other, rebuild rings).
* **Periodic checkpoints** (Acme §6.1): a synchronous checkpoint stalls training
  for the snapshot and the upload; an asynchronous one only for the snapshot
  (upload runs in a background thread). Defaults put the sync/async ratio for
  Acme's 7B–123B jobs inside its published 3.6–58.7× (tests check this).
* **Time-slicing** (Singularity §5): a job resized to fewer devices than its
  logical world size runs that many times slower plus `time_slice_overhead`
  (< 3% measured); a job sharded with ZeRO over S ranks cannot squeeze below S
  devices (§5.4), nor below one device per (tensor, pipeline) shard.

Jobs with no `loom.perf` model are sized by the documented GPU-count rule
`loom.perf.presets.SIZE_RULE` (7B up to 8 GPUs, 13B up to 64, 70B beyond); jobs with no
iteration count use `default_iteration_s` for the barrier; jobs with no plan
are data parallel over their request with ZeRO-1 within a node
(`default_plan`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from loom.core.plan import ParallelPlan
from loom.errors import LoomInputError
from loom.perf.memory import model_state_bytes
from loom.perf.presets import preset, preset_for_gpus, preset_names
from loom.workload.job import JobSpec

GB = 1e9
GIB = 2**30
CHECKPOINT_BYTES_PER_PARAM = 14.0  # bf16 weights 2 + fp32 master 4 + Adam m, v 8
CHECKPOINT_MODES = ("async", "sync")
MAY_BE_ZERO = ("barrier_iterations", "host_gib_per_rank", "restart_s", "rendezvous_s", "time_slice_overhead")


@dataclass(frozen=True)
class InterruptionCosts:
    """Parameters of the cost model, with defaults from the seeds (see module doc)."""

    barrier_iterations: float = 2.0  # Singularity: barrier within ~2 mini-batches
    default_iteration_s: float = 2.0  # when the job states no iteration time
    host_copy_gbps: float = 4.0  # effective GPU↔host snapshot rate per GPU (GB/s)
    host_gib_per_rank: float = 0.5  # CRIU image of one rank's host process
    storage_gbps_per_node: float = 3.125  # 25 Gb/s storage NIC per node (Acme)
    storage_gbps_total: float = 100.0  # parallel file system ceiling (GB/s)
    restart_s: float = 20.0  # process restart + device-proxy replay
    rendezvous_s: float = 10.0  # ranks rediscover each other, rebuild rings
    time_slice_overhead: float = 0.03  # Singularity §7.3: < 3% beyond the N× slowdown
    checkpoint_interval_s: float = 1800.0  # Singularity/Acme: every 30 min
    checkpoint_mode: str = "async"

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "checkpoint_mode":
                if value not in CHECKPOINT_MODES:
                    raise LoomInputError(f"must be one of {', '.join(CHECKPOINT_MODES)}, got {value!r}",
                                         field="checkpoint_mode")
                continue
            zero_ok = f.name in MAY_BE_ZERO
            number = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            if not number or value < 0 or (value == 0 and not zero_ok):
                raise LoomInputError(f"must be a finite number {'≥' if zero_ok else '>'} 0, got {value!r}",
                                     field=f.name)


@dataclass(frozen=True)
class Phases:
    """Seconds per phase of one primitive; `total_s` is what the job loses."""

    barrier_s: float = 0.0
    dump_s: float = 0.0
    upload_s: float = 0.0
    download_s: float = 0.0
    restore_s: float = 0.0
    rendezvous_s: float = 0.0

    @property
    def total_s(self) -> float:
        return (self.barrier_s + self.dump_s + self.upload_s + self.download_s + self.restore_s
                + self.rendezvous_s)

    def __add__(self, other: Phases) -> Phases:
        return Phases(*(getattr(self, f.name) + getattr(other, f.name) for f in fields(self)))

    def describe(self) -> str:
        parts = [f"{f.name[:-2]} {getattr(self, f.name):.1f}s" for f in fields(self) if getattr(self, f.name) > 0]
        return " → ".join(parts) + f" = {self.total_s:.1f}s" if parts else "0s"


@dataclass(frozen=True)
class JobShape:
    """What the cost model needs to know about a job where it runs."""

    params: float  # model parameters Ψ
    gpus: int  # devices it runs on
    nodes: int  # hosts those devices are on
    iteration_s: float  # seconds per training iteration
    plan: ParallelPlan  # its parallelisation (world size = logical ranks)


class InterruptionModel:
    """Prices the core's primitives for one `InterruptionCosts`."""

    def __init__(self, costs: InterruptionCosts | None = None) -> None:
        self.costs = costs or InterruptionCosts()

    # -- shapes -----------------------------------------------------------------
    def shape(self, spec: JobSpec, gpus: int, nodes: int, plan: ParallelPlan | None = None) -> JobShape:
        """The job's shape on `gpus` devices over `nodes` hosts (plan: DP over them if unknown)."""
        params = float(model_params(spec))
        if spec.duration and spec.iterations:
            iteration_s = spec.duration / spec.iterations
        else:
            iteration_s = self.costs.default_iteration_s
        return JobShape(params, max(1, gpus), max(1, nodes), iteration_s, plan or default_plan(spec.gpus))

    # -- sizes ------------------------------------------------------------------
    def checkpoint_bytes(self, shape: JobShape, with_host: bool = False) -> float:
        """Deduplicated bytes a checkpoint uploads (plus CRIU host images when transparent)."""
        size = CHECKPOINT_BYTES_PER_PARAM * shape.params
        if with_host:
            size += self.costs.host_gib_per_rank * GIB * shape.plan.world_size
        return size

    def rank_state_bytes(self, shape: JobShape) -> float:
        """GPU state one rank holds (its model-parallel share, ZeRO-sharded)."""
        plan = shape.plan
        return model_state_bytes(shape.params / (plan.tp * plan.pp), plan)

    # -- phases -------------------------------------------------------------------
    def _storage_gbps(self, shape: JobShape) -> float:
        c = self.costs
        return min(c.storage_gbps_per_node * shape.nodes, c.storage_gbps_total)

    def _copy_s(self, shape: JobShape) -> float:
        """GPU↔host copy of every rank's state; ranks sharing a device copy one after another."""
        ranks_per_device = math.ceil(shape.plan.world_size / shape.gpus)
        return ranks_per_device * self.rank_state_bytes(shape) / (self.costs.host_copy_gbps * GB)

    def save(self, shape: JobShape) -> Phases:
        """Consistent cut and upload: what a preemption costs before the GPUs are free."""
        c = self.costs
        upload = self.checkpoint_bytes(shape, with_host=True) / (self._storage_gbps(shape) * GB)
        return Phases(barrier_s=c.barrier_iterations * shape.iteration_s, dump_s=self._copy_s(shape),
                      upload_s=upload)

    def load(self, shape: JobShape) -> Phases:
        """Download, restore and rendezvous: what a resumed job pays before it progresses."""
        c = self.costs
        download = self.checkpoint_bytes(shape, with_host=True) / (self._storage_gbps(shape) * GB)
        return Phases(download_s=download, restore_s=self._copy_s(shape) + c.restart_s, rendezvous_s=c.rendezvous_s)

    def migrate(self, before: JobShape, after: JobShape) -> Phases:
        """Save where it runs, load where it goes: a migration, or a resize (same world size, maybe
        fewer devices)."""
        return self.save(before) + self.load(after)

    # -- periodic checkpoints and failures -------------------------------------
    def checkpoint_stall_s(self, shape: JobShape, mode: str | None = None) -> float:
        """Seconds training stops for one periodic (application-level) checkpoint."""
        mode = mode or self.costs.checkpoint_mode
        if mode not in CHECKPOINT_MODES:
            raise LoomInputError(f"must be one of {', '.join(CHECKPOINT_MODES)}, got {mode!r}",
                                 field="checkpoint_mode")
        # the snapshot: each rank copies its share of the deduplicated state to host memory
        snapshot = self.checkpoint_bytes(shape) / shape.gpus / (self.costs.host_copy_gbps * GB)
        if mode == "async":
            return snapshot
        return snapshot + self.checkpoint_bytes(shape) / (self._storage_gbps(shape) * GB)

    def persist_s(self, shape: JobShape) -> float:
        """How long the upload of one periodic checkpoint takes (in the background when async)."""
        return self.checkpoint_bytes(shape) / (self._storage_gbps(shape) * GB)

    def checkpoint_slowdown(self, shape: JobShape, mode: str | None = None) -> float:
        """Wall seconds per second of training with periodic checkpoints (≥ 1)."""
        interval = self.costs.checkpoint_interval_s
        return (interval + self.checkpoint_stall_s(shape, mode)) / interval

    # -- time-slicing -----------------------------------------------------------
    def min_devices(self, plan: ParallelPlan) -> int:
        """The fewest devices the job can be squeezed onto (Singularity §5.4)."""
        shards = plan.tp * plan.pp
        if plan.zero_stage >= 1:
            shards *= plan.zero_shard or plan.dp
        return shards

    def time_slice_factor(self, plan: ParallelPlan, devices: int) -> float:
        """Run-time multiplier on `devices` devices for a job of `plan.world_size` ranks."""
        if devices >= plan.world_size:
            return 1.0
        if devices < self.min_devices(plan):
            raise LoomInputError(
                f"a job with {plan.describe()} cannot time-slice onto {devices} devices "
                f"(at least {self.min_devices(plan)}: ZeRO shards and model-parallel ranks need their own)",
                field="gpus")
        return plan.world_size / devices * (1.0 + self.costs.time_slice_overhead)


def default_plan(gpus: int) -> ParallelPlan:
    """The plan assumed for a job that states none: data parallel over its request with
    ZeRO-1 sharded within a node (Acme's InternEvo hierarchical ZeRO)."""
    gpus = max(1, gpus)
    return ParallelPlan(dp=gpus, zero_stage=1, zero_shard=min(gpus, 8))


def model_params(spec: JobSpec) -> int:
    """Parameters of the job's model: its `loom.perf` preset, else by the GPU-count rule."""
    name = spec.model if spec.model in preset_names() else preset_for_gpus(spec.gpus)
    return preset(name).total_params()
