"""What the reports read of every job of a finished run, as columns, read once.

`summary`, the energy figures, the sanity checks and `job_records` all walk every job
of a run; for a 100k-job run each walk costs tens of milliseconds, mostly cache misses
on job objects scattered over the heap by the simulation. `JobTable` reads each field
once (one list comprehension per field: cheaper than a row loop or `attrgetter`) and
derives NumPy columns on demand. `loom.run` builds one per written run and hands it to
each of them; called alone, each builds its own.

A table describes the run as it was when the table was built: the result of a finished
run does not change.
"""

from __future__ import annotations

from functools import cached_property

import numpy as np

from loom.core.jobs import JobState
from loom.hardware.state import Allocation
from loom.hardware.topology import Topology
from loom.sim.engine import SimulationResult


class JobTable:
    """Per-job fields of `result.jobs` as lists (in job order) and, on demand, NumPy columns."""

    def __init__(self, result: SimulationResult) -> None:
        jobs = result.jobs
        self.topology = result.topology
        self.jobs = jobs
        self.state = [j.state for j in jobs]
        self.first_start = [j.first_start for j in jobs]
        self.end_time = [j.end_time for j in jobs]
        self.allocation = [j.allocation for j in jobs]
        self.gpu_seconds = [j.gpu_seconds for j in jobs]
        self.setup_s = [j.setup_s for j in jobs]
        self.preemptions = [j.preemptions for j in jobs]
        self.migrations = [j.migrations for j in jobs]
        self.resizes = [j.resizes for j in jobs]
        self.failures = [j.failures for j in jobs]
        self.reason = [j.reason for j in jobs]
        specs = [j.spec for j in jobs]
        self.submit_time = [s.submit_time for s in specs]
        self.duration = [s.duration for s in specs]
        self.gpus = [s.gpus for s in specs]
        self.job_id = [s.job_id for s in specs]
        self.job_class = [s.job_class for s in specs]
        self.vc = [s.vc for s in specs]
        self.gpu_type = [s.gpu_type for s in specs]

    def __len__(self) -> int:
        return len(self.jobs)

    def is_state(self, state: JobState) -> np.ndarray:
        """Mask of the jobs in `state`."""
        return self.state_codes == int(state)

    @cached_property
    def state_codes(self) -> np.ndarray:
        """`JobState` values (int8)."""
        return np.array(self.state, dtype=np.int8).reshape(len(self))

    @cached_property
    def submit(self) -> np.ndarray:
        return np.array(self.submit_time, dtype=np.float64).reshape(len(self))

    @cached_property
    def first(self) -> np.ndarray:
        """First start times (NaN: never started)."""
        return _floats(self.first_start)

    @cached_property
    def end(self) -> np.ndarray:
        """End times (NaN: not ended)."""
        return _floats(self.end_time)

    @cached_property
    def started(self) -> np.ndarray:
        return ~np.isnan(self.first)

    @cached_property
    def node_types(self) -> np.ndarray:
        """Index into `topology.gpu_types` of the first node each job holds (or last held); -1: none."""
        return first_node_types(self.topology, self.allocation)


def _floats(values: list[float | None]) -> np.ndarray:
    """A float64 column, None as NaN (NumPy's own conversion of None is a slow path)."""
    nan = float("nan")
    return np.array([nan if v is None else v for v in values], dtype=np.float64).reshape(len(values))


def first_node_types(topology: Topology, allocations: list[Allocation | None]) -> np.ndarray:
    """Index into `topology.gpu_types` of each allocation's first node (-1: no allocation)."""
    first = np.array([-1 if a is None else a.nodes[0] for a in allocations], dtype=np.int64).reshape(
        len(allocations))
    if not (first >= 0).any():
        return np.full(len(first), -1, dtype=np.int64)
    return np.where(first < 0, -1, topology.node_type.astype(np.int64)[np.maximum(first, 0)])
