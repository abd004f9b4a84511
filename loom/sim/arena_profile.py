"""Speed from Arena's profile database: a second performance oracle.

The Crius/Arena artifact (`sjtu-epcc/arena`, branch ``ae-eurosys``) ships
``database/prof_database.pkl``: measured/estimated iteration times per model,
batch size, GPU type and locality. This speed model reads that file (from a
path the user gives; it is never bundled or committed) and prices jobs with it
instead of `loom.perf`, so a JCT gain can be split into what comes from the
scheduler and what comes from the estimator: run the same policy once with
``estimator`` and once with ``arena-profile``.

Hooks are those of `loom.sim.estimator_speed.EstimatorSpeed`:
``prepare`` gives a job without a duration
``iterations × iteration_scale × t(requested)``, and ``rate`` is
``t(requested) / t(allocated)``.

Database schema (as read from Arena's ``database/gen_prof_database.py`` and
``db_querier.py``)::

    {"optimal": {L1: {L2: seconds}},             # iteration time, best plan
     "all":     {L1: {L2: {"(pp, dp, mp)": (comp, intra, inter, e2e)}}}}

* L1 = ``{model}_{param_num}_{batch}``, e.g. ``bert_760M_128``,
  ``wide_resnet_500M_256``; a trace's ``bert__760M`` with batch 128 maps to it.
* L2 = ``{hosts}_{gpu}_{hosts}_n_{gpus_per_host}_d``, e.g. ``2_a100_2_n_4_d``
  (the host count appears twice, as Arena writes it).
* ``optimal`` values are floats in the pickle; the revision database
  (``prof_database_revision.json``, H100/L20) stores lists
  ``[niter, e2e_iter_time, avg_lat, local_total, local_avg_lat, max_mem_gb]``
  — the second item is used. ``all`` maps parallel degrees to 4-tuples whose
  last item is the end-to-end iteration time; the fastest one is used.
  A ``.json`` path is read with `json`, anything else with `pickle`.

Documented rules:
- table: ``optimal`` is used when present (Arena prices running jobs with it
  in simulation), else the minimum over ``all``; ``table="all"`` forces that.
- GPU names: Arena's lower-case names go through
  `loom.hardware.gpus.resolve_gpu_type` (a100 → A100-40GB, v100 → V100,
  a40 → A40, a10 → A10, p100 → P100, h100 → H100, l20 → L20); names Loom does
  not know (1080ti, 3090, the ``-r`` testbed variants) are skipped and listed
  in `unmapped_gpu_types`.
- a non-positive or missing time (Arena's marker for out-of-memory) is treated
  as a missing entry. Arena's 300 s "infeasible above one scheduling interval"
  cut-off is not applied.
- requested GPUs are priced packed, as Arena's best locality: per host
  ``min(gpus, GPUs per node of that type)``. Allocated GPUs are keyed by the
  nodes used and the smallest per-node share (Arena's localities are uniform).
- locality fallback (Arena's rule): an entry missing for a spread locality is
  taken from the most packed entry with the same GPU count and slowed by
  ``locality_scale ** log2(packed per-host / per-host)`` (Arena: 0.9).
- anything else missing (model, batch, GPU type or count not profiled; Arena's
  "grown parameter count" extrapolation is not replicated) falls back to
  `EstimatorSpeed` for both ends of the ratio — a rate never mixes the two
  oracles — and the (model, batch, gpu_type, gpus) key is added to
  `fallbacks`. With ``fallback="error"`` it is a `LoomInputError` instead.
- ``iteration_scale`` (default 0.2): Arena's simulator divides trace
  iterations by 5 (``ITER_NUM_SCALE_FACTOR_SIM``); 1.0 keeps the trace's count.

Security: the database is a pickle, and unpickling runs code. Only point
``path`` at a file from a trusted source (e.g. the one you downloaded from the
Arena repository yourself); the structure is validated after loading.
"""

from __future__ import annotations

import json
import math
import numbers
import pickle
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from loom.core.jobs import Job
from loom.core.protocols import SPEED_MODELS
from loom.errors import LoomInputError
from loom.hardware.gpus import resolve_gpu_type
from loom.hardware.state import Allocation
from loom.hardware.topology import Topology
from loom.sim.estimator_speed import derive_durations
from loom.workload.job import JobSpec

TABLES = ("auto", "optimal", "all")
FALLBACKS = ("estimator", "error")
_L1 = re.compile(r"^(?P<model>.+)_(?P<param>[0-9.]+[KMBT])_(?P<batch>\d+)$")
_L2 = re.compile(r"^(?P<hosts>\d+)_(?P<gpu>[^_]+)_(?P<hosts2>\d+)_n_(?P<per>\d+)_d$")

# (trace model, batch, loom gpu type) -> {(hosts, per_host): seconds}
Index = dict[tuple[str, int, str], dict[tuple[int, int], float]]


@SPEED_MODELS.register("arena-profile")
class ArenaProfileSpeed:
    """Rate = t(requested, packed) / t(allocated), both from Arena's profile database."""

    name = "arena-profile"

    def __init__(self, path: str | None = None, iteration_scale: float = 0.2, table: str = "auto",
                 locality_scale: float = 0.9, fallback: str = "estimator") -> None:
        if not path:
            raise LoomInputError("the Arena profile database path is required (e.g. .../prof_database.pkl)",
                                 field="speed_model.params.path")
        if not (isinstance(iteration_scale, (int, float)) and iteration_scale > 0):
            raise LoomInputError(f"must be > 0, got {iteration_scale!r}", field="speed_model.params.iteration_scale")
        if table not in TABLES:
            raise LoomInputError(f"must be one of {', '.join(TABLES)}, got {table!r}", field="speed_model.params.table")
        if fallback not in FALLBACKS:
            raise LoomInputError(f"must be one of {', '.join(FALLBACKS)}, got {fallback!r}",
                                 field="speed_model.params.fallback")
        if not 0.0 < locality_scale <= 1.0:
            raise LoomInputError(f"must be in (0, 1], got {locality_scale!r}",
                                 field="speed_model.params.locality_scale")
        self.path = Path(path).expanduser()
        self.iteration_scale = float(iteration_scale)
        self.locality_scale = float(locality_scale)
        self.fallback = fallback
        self.unmapped_gpu_types: set[str] = set()
        self.fallbacks: set[tuple[str, int | None, str, int]] = set()
        self.index, self.table = self._load(table)
        self._estimator: Any = None
        self._ctx: Any = None
        self._per_node: tuple[Topology | None, dict[str, int]] = (None, {})

    # -- hooks the engine calls ------------------------------------------------
    def bind(self, ctx: Any) -> None:
        self._ctx = ctx
        if self._estimator is not None:
            self._estimator.bind(ctx)

    def prepare(self, specs: Sequence[JobSpec], topology: Topology) -> list[JobSpec]:
        """Give every job without a duration one: iterations × iteration_scale × t(requested)."""

        def seconds(spec: JobSpec, gpu_type: str) -> float:
            found = self.requested_seconds(spec, gpu_type, topology)
            if found is None:
                self._missed(spec, gpu_type)
                found = self._fallback_model().iteration_seconds(spec, gpu_type, spec.gpus, topology)
            return found

        return derive_durations(specs, topology, self.iteration_scale, seconds)

    def rate(self, job: Job, allocation: Allocation, topology: Topology) -> float:
        spec = job.spec
        if not spec.model:
            return allocation.total / spec.gpus
        gpu_type = topology.gpu_types[int(topology.node_type[allocation.nodes[0]])]
        reference = self.requested_seconds(spec, spec.gpu_type or gpu_type, topology)
        actual = self.allocated_seconds(spec, gpu_type, allocation)
        if reference is not None and actual is not None:
            return reference / actual
        self._missed(spec, gpu_type if reference is not None else (spec.gpu_type or gpu_type),
                     allocation.total if reference is not None else spec.gpus)
        return self._fallback_model().rate(job, allocation, topology)

    # -- lookups -------------------------------------------------------------------
    def requested_seconds(self, spec: JobSpec, gpu_type: str, topology: Topology) -> float | None:
        """Iteration time on the requested GPUs packed as Arena's best locality (None: not profiled)."""
        per_node = self._gpus_per_node(topology, gpu_type)
        per_host = min(spec.gpus, per_node)
        hosts = -(-spec.gpus // per_host)
        return self.lookup(spec.model, spec.batch_size, gpu_type, hosts, per_host, spec.gpus)

    def _gpus_per_node(self, topology: Topology, gpu_type: str) -> int:
        """`topology.gpus_per_node`, remembered per type (it scans the nodes; rate() asks on every start)."""
        if self._per_node[0] is not topology:
            self._per_node = (topology, {})
        known = self._per_node[1]
        if (found := known.get(gpu_type)) is None:
            found = known[gpu_type] = topology.gpus_per_node(gpu_type)
        return found

    def allocated_seconds(self, spec: JobSpec, gpu_type: str, allocation: Allocation) -> float | None:
        shares = [int(g) for g in allocation.gpus if g]
        return self.lookup(spec.model, spec.batch_size, gpu_type, len(shares), min(shares), allocation.total)

    def lookup(self, model: str | None, batch: int | None, gpu_type: str, hosts: int, per_host: int,
               total: int | None = None) -> float | None:
        """Seconds per iteration by the documented rules, None when not in the database."""
        if not model or not batch:
            return None
        entries = self.index.get((model, int(batch), gpu_type))
        if not entries:
            return None
        total = hosts * per_host if total is None else total
        if hosts * per_host == total and (hosts, per_host) in entries:
            return entries[(hosts, per_host)]
        packed = [(p, t) for (h, p), t in entries.items() if h * p == total and p >= per_host]
        if not packed:
            return None
        best_per_host, seconds = max(packed)
        return seconds / self.locality_scale ** math.log2(best_per_host / per_host)

    # -- fallback ------------------------------------------------------------------
    def _missed(self, spec: JobSpec, gpu_type: str, gpus: int | None = None) -> None:
        key = (spec.model or "", spec.batch_size, gpu_type, spec.gpus if gpus is None else gpus)
        if self.fallback == "error":
            raise LoomInputError(
                f"no entry in the Arena profile database for model {key[0]}, batch {key[1]}, "
                f"{key[3]} × {key[2]}", source=str(self.path), field=f"job {spec.job_id}")
        self.fallbacks.add(key)

    def _fallback_model(self) -> Any:
        if self._estimator is None:
            from loom.sim.estimator_speed import EstimatorSpeed

            self._estimator = EstimatorSpeed()
            if self._ctx is not None:
                self._estimator.bind(self._ctx)
        return self._estimator

    # -- loading -------------------------------------------------------------------
    def _load(self, table: str) -> tuple[Index, str]:
        source = str(self.path)
        try:
            if self.path.suffix.lower() == ".json":
                data = json.loads(self.path.read_text(encoding="utf-8"))
            else:
                with self.path.open("rb") as fh:
                    data = pickle.load(fh)  # trusted source only: see the module docstring
        except OSError as exc:
            raise LoomInputError(f"cannot read the Arena profile database: {exc.strerror or exc}",
                                 source=source, field="speed_model.params.path") from None
        except (pickle.UnpicklingError, ValueError, EOFError, TypeError, AttributeError, ImportError,
                IndexError, KeyError) as exc:  # what a corrupt or foreign pickle/JSON file raises
            raise LoomInputError(f"not an Arena profile database (cannot decode: {type(exc).__name__}: {exc})",
                                 source=source, field="speed_model.params.path") from None
        if not isinstance(data, Mapping) or not ({"optimal", "all"} & set(data)):
            raise LoomInputError("not an Arena profile database: expected a dict with an 'optimal' or 'all' table",
                                 source=source, field="speed_model.params.path")
        chosen = table if table != "auto" else ("optimal" if "optimal" in data else "all")
        if chosen not in data:
            raise LoomInputError(f"the database has no '{chosen}' table (has: {', '.join(map(str, data))})",
                                 source=source, field="speed_model.params.table")
        return self._index(data[chosen], chosen, source), chosen

    def _index(self, rows: Any, table: str, source: str) -> Index:
        if not isinstance(rows, Mapping):
            raise LoomInputError(f"table '{table}' must map model keys to entries", source=source, field=table)
        index: Index = {}
        resolved: dict[str, str | None] = {}
        for l1, by_device in rows.items():
            m = _L1.match(str(l1))
            if not m or not isinstance(by_device, Mapping):
                raise LoomInputError("expected '{model}_{params}_{batch}' mapping to device entries",
                                     source=source, field=f"{table}.{l1}")
            model = f"{m['model']}__{m['param']}"
            batch = int(m['batch'])
            for l2, value in by_device.items():
                d = _L2.match(str(l2))
                if not d:
                    raise LoomInputError("expected a '{hosts}_{gpu}_{hosts}_n_{per_host}_d' key",
                                         source=source, field=f"{table}.{l1}.{l2}")
                seconds = _seconds(value, source, f"{table}.{l1}.{l2}")
                gpu = d["gpu"]
                if gpu not in resolved:
                    try:
                        resolved[gpu] = resolve_gpu_type(gpu, source=source)
                    except LoomInputError:
                        resolved[gpu] = None
                        self.unmapped_gpu_types.add(gpu)
                loom_type = resolved[gpu]
                if loom_type is None or seconds is None:
                    continue
                index.setdefault((model, batch, loom_type), {})[(int(d["hosts"]), int(d["per"]))] = seconds
        if not index:
            raise LoomInputError(f"table '{table}' has no usable entries", source=source, field=table)
        return index


def _seconds(value: Any, source: str, where: str) -> float | None:
    """E2E iteration seconds of one entry, None for a non-positive (infeasible) time."""
    if isinstance(value, Mapping):  # 'all' table: parallel degrees -> (comp, intra, inter, e2e)
        times = [_seconds(v, source, f"{where}.{k}") for k, v in value.items()]
        feasible = [t for t in times if t is not None]
        return min(feasible) if feasible else None
    if isinstance(value, (list, tuple)):
        if len(value) == 4:  # (comp, intra-stage comm, inter-stage comm, e2e)
            value = value[3]
        elif len(value) == 6:  # revision: [niter, e2e, avg_lat, local_total, local_avg_lat, max_mem_gb]
            value = value[1]
        else:
            raise LoomInputError(f"unexpected entry of {len(value)} items", source=source, field=where)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or math.isnan(float(value)):
        raise LoomInputError(f"expected an iteration time in seconds, got {value!r}", source=source, field=where)
    return float(value) if float(value) > 0 else None
